# Spark + Primus Flow: pipeline drivers (`flow submit`), Spark master and workers, and the
# MLflow server of docker/compose.yaml. JVM jars are resolved at build time; at run time the
# image never contacts Maven (FLOW_OFFLINE=1).
#   docker build -f docker/spark.Dockerfile -t primus-flow/spark:0.1.0 .
FROM python:3.11.12-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/primus-flow
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY flow/ flow/
COPY spark_jobs/ spark_jobs/
COPY trainers/ trainers/
COPY pipelines/ pipelines/
# EXTRAS=spark,train,prod adds torch for `flow retrain`, which runs the backfill and
# a trainer in one container (examples/schedulers/retrain-cronjob.yaml):
#   docker build -f docker/spark.Dockerfile --build-arg EXTRAS=spark,train,prod \
#       -t primus-flow/retrain:0.1.0 .
ARG EXTRAS=spark,prod
RUN pip install --no-cache-dir -c requirements/constraints.txt ".[${EXTRAS}]"

# Containers run as `flow`, not root. The folders it writes are made here, owned by it, so a
# named volume mounted on one of them starts with that owner (compose copies it on first use).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/flow flow \
 && install -d -o flow -g flow /var/lib/flow /lake /opt/primus-flow/jars
USER flow

ENV FLOW_HOME=/var/lib/flow \
    FLOW_JAR_CACHE=/opt/primus-flow/jars \
    PYTHONUNBUFFERED=1
RUN flow jars fetch --profile spark --profile spark-s3 --profile kafka
ENV FLOW_OFFLINE=1

ENTRYPOINT ["tini", "--", "flow"]
CMD ["--help"]
