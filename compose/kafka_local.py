"""A real single-node Apache Kafka broker (KRaft) without Docker, from Maven Central jars.

    python compose/kafka_local.py run            # start, print the bootstrap address, stop on Ctrl-C
    python compose/kafka_local.py start --dir D  # start in the background, write D/broker.json
    python compose/kafka_local.py stop --dir D   # stop the broker started there (by its PID)

Needs Java 17+ and Maven. The broker jars (``org.apache.kafka:kafka_2.13`` with its runtime
dependencies and a log4j2 binding) are resolved once into ``~/.cache/runstate/kafka-<v>``
(``RUNSTATE_KAFKA_CACHE`` overrides). Listeners are on free loopback ports chosen at
start, so two brokers never collide. Used by the test suite's session fixture.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

KAFKA_VERSION = os.environ.get("RUNSTATE_KAFKA_VERSION", "4.1.1")
LOG4J_VERSION = "2.24.3"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>runstate</groupId><artifactId>{name}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

#: The broker: ``kafka_2.13`` with its runtime dependencies and a log4j2 binding.
BROKER_ARTIFACTS = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
)
AVRO_VERSION = "1.12.1"
#: The reference implementations the interop tests run (tests/schemas/test_interop_java.py): Apache
#: Avro's Java library and Kafka's Java client and console tools.
INTEROP_ARTIFACTS = (
    f"org.apache.avro:avro:{AVRO_VERSION}",
    f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
    f"org.apache.kafka:kafka-clients:{KAFKA_VERSION}",
    "org.slf4j:slf4j-nop:2.0.17",
)

#: A registry-aware Java consumer (tests/schemas/test_schema_registry.py): Apicurio Registry's Avro
#: deserializer (its 2.6 line, which reads the Confluent framing) with Kafka's Java client.
REGISTRY_SERDE_ARTIFACTS = (
    "io.apicurio:apicurio-registry-serdes-avro-serde:2.6.13.Final",
    f"org.apache.kafka:kafka-clients:{KAFKA_VERSION}",
    "org.slf4j:slf4j-nop:2.0.17",
)

_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="err" target="SYSTEM_ERR"><PatternLayout pattern="[kafka] %d %p %c: %m%n"/></Console>
  </Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="err"/></Root></Loggers>
</Configuration>
"""


def cluster_id(draw: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, never starting with ``-``.

    One id in 64 would start with ``-``, which the storage tool's argument parser reads as an
    option (``--cluster-id: expected one argument``) and the broker then never starts; Kafka's
    own ``Uuid.randomUuid`` draws again for the same reason."""
    while True:
        cluster = base64.urlsafe_b64encode(draw().bytes).rstrip(b"=").decode()
        if not cluster.startswith("-"):
            return cluster


class BrokerError(RuntimeError):
    """The broker could not be provisioned or started; the message says what is missing."""


def missing_tools() -> list[str]:
    """What this machine lacks to run a broker (empty when it can)."""
    return [t for t in ("java", "mvn") if shutil.which(t) is None]


def cache_dir(name: str | None = None) -> Path:
    """Where the jars of ``name`` (default: the broker's) are cached:
    ``~/.cache/runstate/<name>``, under ``RUNSTATE_KAFKA_CACHE``'s parent when that is set."""
    broker = Path(
        os.environ.get("RUNSTATE_KAFKA_CACHE", Path.home() / ".cache" / "runstate" / f"kafka-{KAFKA_VERSION}")
    )
    return broker if name is None else broker.parent / name


def resolve_jars() -> Path:
    """The directory of the broker's jars, resolved from Maven Central on first use."""
    return resolve_maven(None, BROKER_ARTIFACTS)


def resolve_interop_jars() -> Path:
    """The directory of the Java reference implementations' jars (Avro, Kafka's client and
    tools), resolved from Maven Central on first use."""
    return resolve_maven(f"interop-avro{AVRO_VERSION}-kafka{KAFKA_VERSION}", INTEROP_ARTIFACTS)


def resolve_registry_serde_jars() -> Path:
    """The jars of a registry-aware Java consumer (:data:`REGISTRY_SERDE_ARTIFACTS`),
    resolved from Maven Central on first use."""
    return resolve_maven(f"registry-serde-kafka{KAFKA_VERSION}", REGISTRY_SERDE_ARTIFACTS)


def resolve_maven(name: str | None, artifacts: tuple[str, ...]) -> Path:
    """A directory holding ``artifacts`` (``group:artifact:version``) with their runtime
    dependencies, resolved once by Maven into :func:`cache_dir` and reused after.

    Raises :class:`BrokerError` naming what is missing (Java, Maven) or what Maven said."""
    libs = cache_dir(name) / "libs"
    done = cache_dir(name) / ".complete"
    wanted = "\n".join(artifacts)
    if done.exists() and done.read_text() in (wanted, KAFKA_VERSION):
        return libs
    cache_dir(name).mkdir(parents=True, exist_ok=True)
    # Several processes (test workers) may ask at once: one resolves, the others wait for it.
    with open(cache_dir(name) / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and done.read_text() in (wanted, KAFKA_VERSION):
            return libs
        return _resolve(name, artifacts, libs, done, wanted)


def _resolve(name: str | None, artifacts: tuple[str, ...], libs: Path, done: Path, wanted: str) -> Path:
    if missing := missing_tools():
        raise BrokerError(
            f"cannot provision {', '.join(artifacts)}: {', '.join(missing)} not found on PATH (need Java 17+ and Maven)"
        )
    cache_dir(name).mkdir(parents=True, exist_ok=True)
    deps = "\n".join(
        "    <dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
            *a.split(":")
        )
        for a in artifacts
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pom.xml").write_text(_POM.format(name=name or "kafka-broker", dependencies=deps))
        staging = Path(tmp) / "libs"
        cmd = [
            "mvn",
            "-B",
            "-q",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise BrokerError(
                f"maven could not resolve {', '.join(artifacts)}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
            )
        if libs.exists():
            shutil.rmtree(libs)
        shutil.move(str(staging), libs)
    done.write_text(wanted)
    return libs


def _own_session_and_die_with_parent() -> None:
    """preexec for the JVM: its own session (a terminal's Ctrl-C goes to the owner, which
    stops it cleanly) and SIGTERM when the owning process dies, even by SIGKILL, so a
    broker never outlives the test run or tool that started it (Linux prctl)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float = 30.0) -> None:
    """End a process this module started: SIGTERM (a JVM shuts down cleanly), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a process this module started (fault tests)."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalKafka:
    """One KRaft broker+controller JVM in ``workdir``. ``start()`` returns the bootstrap
    address once the broker answers; ``stop()`` ends the JVM it started (by PID). Alone by
    default; a node of a :class:`LocalKafkaCluster` when given its id, ports, the quorum's
    voters and the cluster id."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        heap: str = "-Xmx1g",
        node_id: int = 1,
        ports: tuple[int, int] | None = None,
        voters: str | None = None,
        cluster: str | None = None,
        replication: int = 1,
    ) -> None:
        self.workdir = Path(workdir)
        self.heap = heap
        self.node_id = node_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.port, self.controller_port = ports if ports is not None else (0, 0)
        self.voters = voters
        self.cluster = cluster
        self.replication = replication

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, libs: Path, *args: str) -> list[str]:
        return [
            "java",
            "-Xms256m" if self.voters else "-Xms512m",
            self.heap,
            "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.xml'}",
            "-cp",
            f"{libs}/*",
            *args,
        ]

    def start(self, timeout_s: float = 120.0) -> str:
        self.configure()
        self.launch()
        self._wait_ready(timeout_s)
        return self.bootstrap

    def configure(self) -> None:
        """Choose ports (unless given), write the properties and format the storage."""
        libs = resolve_jars()
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.workdir / "data"
        if not self.port:
            self.port, self.controller_port = free_port(), free_port()
        voters = self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        rf, isr = self.replication, min(2, self.replication)
        props = self.workdir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    f"controller.quorum.voters={voters}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    "num.partitions=1",
                    f"offsets.topic.replication.factor={rf}",
                    f"transaction.state.log.replication.factor={rf}",
                    f"transaction.state.log.min.isr={isr}",
                    "group.initial.rebalance.delay.ms=0",
                    "offsets.topic.num.partitions=4",
                    "auto.create.topics.enable=false",
                    "log.cleaner.backoff.ms=1000",
                    # KIP-848's groups (consumer.group.protocol=consumer) as docs/kafka.md
                    # recommends: a dead member's partitions move 3 s after its last heartbeat.
                    "group.consumer.min.session.timeout.ms=3000",
                    "group.consumer.session.timeout.ms=3000",
                    "group.consumer.min.heartbeat.interval.ms=500",
                    "group.consumer.heartbeat.interval.ms=500",
                ]
            )
            + "\n"
        )
        (self.workdir / "log4j2.xml").write_text(_LOG4J2)
        if not (data / "meta.properties").exists():
            cluster = self.cluster or cluster_id()
            fmt = subprocess.run(
                self._java(libs, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(props)),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if fmt.returncode != 0:
                raise BrokerError(f"kafka storage format failed: {fmt.stdout[-2000:]}{fmt.stderr[-2000:]}")

    def launch(self) -> None:
        """Start the JVM (configured); :meth:`_wait_ready` waits for it."""
        libs = resolve_jars()
        log = open(self.workdir / "broker.log", "ab")
        self.proc = subprocess.Popen(
            self._java(libs, "kafka.Kafka", str(self.workdir / "server.properties")),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_and_die_with_parent,
        )

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"the Kafka JVM exited with {self.proc.returncode}; see {self.workdir / 'broker.log'}:\n"
                    + (self.workdir / "broker.log").read_text(errors="replace")[-3000:]
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                if md.brokers:
                    return
            except (OSError, Exception):  # not listening yet / metadata not ready yet
                time.sleep(0.3)
        self.stop()
        raise BrokerError(f"Kafka did not become ready on {self.bootstrap} within {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the JVM this object started: SIGTERM (clean shutdown), then SIGKILL."""
        stop_process(self.proc, timeout_s)

    def kill(self) -> None:
        """SIGKILL the broker (fault tests)."""
        kill_process(self.proc)

    def restart(self, timeout_s: float = 120.0) -> None:
        """Stop and start again on the same ports and data (the log survives)."""
        self.stop()
        self.launch()
        self._wait_ready(timeout_s)


class LocalKafkaCluster:
    """``n`` KRaft nodes (each broker and controller) on loopback, one quorum: production's
    shape for the replication tests (``n`` = 3: replication factor 3, ``min.insync.replicas``
    2, so an acknowledged append survives the loss of any one broker)."""

    def __init__(self, workdir: str | os.PathLike[str], n: int = 3, *, heap: str = "-Xmx512m") -> None:
        ports = [(free_port(), free_port()) for _ in range(n)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        cluster = cluster_id()
        self.nodes = [
            LocalKafka(
                Path(workdir) / f"node{i + 1}",
                heap=heap,
                node_id=i + 1,
                ports=ports[i],
                voters=voters,
                cluster=cluster,
                replication=min(3, n),
            )
            for i in range(n)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self, timeout_s: float = 180.0) -> str:
        """Every node (the quorum forms once a majority runs); returns the bootstrap list
        once every broker is in the cluster's metadata."""
        for node in self.nodes:
            node.configure()
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node._wait_ready(timeout_s)
        self.wait_brokers(len(self.nodes), timeout_s)
        return self.bootstrap

    def wait_brokers(self, n: int, timeout_s: float = 120.0) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if len(AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5).brokers) >= n:
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise BrokerError(f"fewer than {n} brokers in the cluster after {timeout_s:.0f}s")

    def wait_in_sync(self, topic: str, timeout_s: float = 120.0) -> None:
        """Until every partition of ``topic`` has a leader and every replica in sync (after
        a restart: the node caught up again), so that the next fault starts from a whole cluster."""
        from confluent_kafka.admin import AdminClient

        self.wait_brokers(len(self.nodes), timeout_s)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                parts = admin.list_topics(topic, timeout=5).topics[topic].partitions.values()
                if all(p.leader >= 0 and len(p.isrs) == len(p.replicas) for p in parts):
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise BrokerError(f"{topic}: replicas not back in sync after {timeout_s:.0f}s")

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``partition`` of ``topic`` now."""
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=10)
        return int(md.topics[topic].partitions[partition].leader)

    def controller(self) -> int:
        """The node id of the active controller."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # kept alive until the answer: its future needs it
        return int(admin.describe_cluster(request_timeout=10).result().controller.id)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["run", "start", "stop", "jars", "interop-jars"])
    ap.add_argument("--dir", default=".runstate/kafka", help="broker work directory")
    args = ap.parse_args()
    workdir = Path(args.dir)
    if args.command in ("jars", "interop-jars"):
        print(resolve_jars() if args.command == "jars" else resolve_interop_jars())
        return 0
    if args.command == "stop":
        info = json.loads((workdir / "broker.json").read_text())
        os.kill(int(info["pid"]), signal.SIGTERM)
        print(f"sent SIGTERM to broker pid {info['pid']}")
        return 0
    broker = LocalKafka(workdir)
    bootstrap = broker.start()
    assert broker.proc is not None
    (workdir / "broker.json").write_text(json.dumps({"pid": broker.proc.pid, "bootstrap": bootstrap}))
    print(f"kafka://{bootstrap}", flush=True)
    if args.command == "start":
        return 0
    try:
        broker.proc.wait()
    except KeyboardInterrupt:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
