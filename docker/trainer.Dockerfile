# GPU trainer: CUDA PyTorch (PyPI's Linux torch wheel carries the CUDA 12 runtime; the host's
# NVIDIA driver comes in through the container toolkit) and the trainers package.
#   docker build -f docker/trainer.Dockerfile -t primus-flow/trainer:0.1.0 .
#   docker run --gpus all primus-flow/trainer:0.1.0 doctor --require-gpu
FROM python:3.11.12-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/primus-flow
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY flow/ flow/
COPY spark_jobs/ spark_jobs/
COPY trainers/ trainers/
COPY pipelines/ pipelines/
RUN pip install --no-cache-dir -c requirements/constraints.txt '.[train,prod]'

# As in spark.Dockerfile: a `flow` user owning the folders it writes.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/flow flow \
 && install -d -o flow -g flow /var/lib/flow
USER flow

ENV FLOW_HOME=/var/lib/flow \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["tini", "--", "python", "-m", "trainers"]
CMD ["doctor", "--require-gpu"]
