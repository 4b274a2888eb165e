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
RUN pip install --no-cache-dir -c requirements/constraints.txt '.[spark,prod]'

ENV FLOW_HOME=/var/lib/flow \
    FLOW_JAR_CACHE=/opt/primus-flow/jars \
    PYTHONUNBUFFERED=1
RUN flow jars fetch --profile spark --profile spark-s3 --profile kafka
ENV FLOW_OFFLINE=1

ENTRYPOINT ["tini", "--", "flow"]
CMD ["--help"]
