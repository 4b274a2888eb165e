"""The one place where the versions of the stack are pinned.

Python packages are pinned in ``pyproject.toml`` and ``requirements/constraints.txt``; the JVM
artifacts, which pip knows nothing about, are pinned here. ``docs/versions.md`` records why each
pairing was chosen and how it was verified. Change a version here only together with that page.
"""

from __future__ import annotations

__all__ = [
    "AWS_SDK",
    "DELTA",
    "HADOOP",
    "ICEBERG",
    "KAFKA_BROKER",
    "KAFKA_TOKEN_PROVIDER",
    "LOG4J",
    "MAVEN_CENTRAL",
    "SCALA",
    "SPARK",
    "SQLITE_JDBC",
]

#: Spark, and the pyspark wheel that must match it exactly (the connectors are built per minor).
SPARK = "4.1.3"
SCALA = "2.13"
#: ``iceberg-spark-runtime-4.1_2.13``: Iceberg publishes no runtime for Spark 4.2+.
ICEBERG = "1.11.0"
#: ``delta-spark_4.1_2.13``. 4.4.1 exists on PyPI but its Spark-4.1 jar was never published to
#: Maven Central, and the unsuffixed ``delta-spark_2.13`` is the Spark 4.2 build; 4.4.0 is the
#: newest Delta for Spark 4.1.
DELTA = "4.4.0"
#: ``spark-token-provider-kafka-0-10_2.13`` is a compile dependency of ``spark-sql-kafka`` but
#: Maven Central holds it only up to 4.0.0. Every member spark-sql-kafka 4.1.3 calls exists in
#: 4.0.0 with the same signature; only Kafka delegation tokens (Kerberos) are unavailable.
KAFKA_TOKEN_PROVIDER = "4.0.0"
#: The xerial SQLite JDBC driver for Iceberg's JdbcCatalog on the Spark driver.
SQLITE_JDBC = "3.51.1.0"
#: The local broker, run from ``org.apache.kafka:kafka_2.13`` jars in its own JVM.
KAFKA_BROKER = "4.1.2"
#: The slf4j-1 binding the broker's logging needs (the Kafka distribution ships the same).
LOG4J = "2.25.3"

#: The Hadoop of pyspark's ``hadoop-client-api`` jar: ``hadoop-aws`` (S3A, for streaming
#: checkpoints on S3) must be the same release.
HADOOP = "3.4.2"
#: The AWS SDK v2 inside ``iceberg-aws-bundle`` (ICEBERG): S3A's transfer manager, which the
#: bundle lacks, is added at that version, and S3A uses the bundle's SDK rather than the 600 MB
#: ``software.amazon.awssdk:bundle`` its POM names (verified against moto: checkpoints, state
#: stores, Parquet through ``s3a://``).
AWS_SDK = "2.44.4"

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
