"""The local Kafka broker: a real KRaft broker+controller in its own JVM, on 127.0.0.1.

Its jars come from ``org.apache.kafka:kafka_2.13`` on Maven Central (the ``kafka`` jar profile)
and never share a classpath with Spark. Storage is formatted on first start. Everything lives in
``$FLOW_HOME/services/kafka``: ``server.properties``, ``data/`` and ``broker.log``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid

from flow.config import LOOPBACK, StackConfig
from flow.errors import ServiceError, ServiceStartError
from flow.stack import jars, process
from flow.stack.java import find_java
from flow.stack.kafka import broker_answers
from flow.stack.service import Launch, ManagedService, Progress

__all__ = ["KafkaService"]

_ROTATE_LOG_BYTES = 50 * 1024 * 1024


def new_cluster_id() -> str:
    """A random Kafka cluster id: a UUID, base64url-encoded without padding.

    An id that starts with "-" is drawn again, as Kafka's own ``Uuid.randomUuid`` does: the
    storage tool's argument parser reads such a value as an option and refuses to format (one
    first start in 64 failed that way).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaService(ManagedService):
    """``flow services`` for the broker."""

    name = "kafka"
    title = "the Kafka broker"
    noun = "broker"
    starts = "a KRaft broker"
    start_timeout_s = 90.0
    # Kafka shuts down cleanly on SIGTERM (flushes logs, leaves the quorum) in a few s.
    stop_timeout_s = 30.0

    def __init__(self, stack: StackConfig) -> None:
        folder = stack.services_dir / "kafka"
        super().__init__(folder, folder / "broker.log")
        self.stack = stack
        self.config = stack.kafka
        self.data = self.dir / "data"

    @property
    def address(self) -> str:
        return self.config.bootstrap_servers

    @property
    def managed(self) -> bool:
        return self.config.managed

    def answers(self, timeout: float) -> bool:
        # The port first: a metadata request to a closed port takes the whole timeout.
        return (
            process.port_open(LOOPBACK, self.config.port)
            and broker_answers(self.config, timeout=timeout) is not None
        )

    def external_detail(self) -> str:
        answers = broker_answers(self.config, timeout=3.0)
        return f"{answers} broker(s) answer" if answers else "does not answer"

    def ports(self) -> list[tuple[int, str]]:
        return [
            (self.config.port, "FLOW_KAFKA_PORT"),
            (self.config.controller_port, "FLOW_KAFKA_CONTROLLER_PORT"),
        ]

    def prepare(self, progress: Progress) -> Launch:
        java = find_java()
        resolved = jars.resolve(
            "kafka", self.stack, progress=lambda f: progress(f"kafka: fetched {f}")
        )
        (self.dir / "server.properties").write_text(self._server_properties())
        (self.dir / "log4j2.properties").write_text(_LOG4J2.format(level="INFO"))
        self._format_storage(str(java.executable), resolved.classpath, progress)
        self._rotate_log()
        return Launch(
            [
                str(java.executable),
                "-Xms128m",
                f"-Xmx{self.config.heap}",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                "-cp",
                resolved.classpath,
                "kafka.Kafka",
                str(self.dir / "server.properties"),
            ]
        )

    def _server_properties(self) -> str:
        controller = f"{LOOPBACK}:{self.config.controller_port}"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": controller,
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.config.port},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.config.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "1",
            # Topics are created on purpose (flow.stack.kafka.ensure_topics): a typo in a topic name
            # must fail rather than create an empty topic a pipeline then waits on forever.
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "168",
        }
        return "".join(f"{k}={v}\n" for k, v in lines.items())

    def _format_storage(self, java: str, classpath: str, progress: Progress) -> None:
        """Format ``data/`` once; refuse to reuse storage formatted for other ports."""
        formatted = self.dir / "formatted.json"
        wanted = {"port": self.config.port, "controller_port": self.config.controller_port}
        if (self.data / "meta.properties").exists():
            try:
                previous = json.loads(formatted.read_text())
            except (OSError, ValueError):
                previous = wanted
            if previous != wanted:
                raise ServiceError(
                    f"the broker storage in {self.data} was formatted for ports {previous}, "
                    f"but the settings now ask for {wanted}. Set FLOW_KAFKA_PORT and "
                    "FLOW_KAFKA_CONTROLLER_PORT back, or delete that folder to start empty"
                )
            return
        cluster_id = new_cluster_id()
        progress("kafka: formatting broker storage (first start)")
        done = subprocess.run(
            [
                java,
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                # "=" binds the value even if it ever started with "-".
                f"--cluster-id={cluster_id}",
                "--config",
                str(self.dir / "server.properties"),
                "--standalone",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ServiceStartError(
                f"formatting the broker storage in {self.data} failed:\n"
                f"{(done.stdout + done.stderr).strip()[-3000:]}"
            )
        formatted.write_text(json.dumps(wanted))

    def _rotate_log(self) -> None:
        if self.log.exists() and self.log.stat().st_size > _ROTATE_LOG_BYTES:
            self.log.replace(self.log.with_suffix(".log.1"))


_LOG4J2 = """\
# Generated by `flow services up`; the broker's output goes to broker.log beside this file.
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
"""
