"""Production's shape: three Kafka brokers (KRaft, each also a controller) on loopback,
topics with replication factor 3 and min.insync.replicas 2. Under a writer and a running
two `runstate project` processes (one consumer group, one state directory), the leader of
the busiest partition is SIGKILLed twice and the active controller twice (each restarted):
every acknowledged patch is decided exactly once, and `verify` passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need_java_and_maven
from helpers import fact, start

from runstate.compose.kafka_local import BrokerError, LocalKafkaCluster
from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import KafkaLog
from runstate.producers.run_producer import RunProducer
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import verify
from runstate.schemas.errors import DeliveryError
from runstate.schemas.patch import Author

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
RUNS = 12


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """Three brokers for one test: they are stopped as soon as it ends (three JVMs on two
    cores slow every other test while they run)."""
    need_java_and_maven("the cluster test needs Java 17+ and Maven ({missing} not on PATH)")
    c = LocalKafkaCluster(tmp_path_factory.mktemp("kafka3"))
    try:
        c.start()
    except BrokerError as e:
        c.stop()
        pytest.fail(f"the three-broker cluster did not start: {e}")
    yield c
    c.stop()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstate.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_topics_are_replicated_and_acknowledged_appends_survive_broker_and_controller_kills(
    cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    prefix = f"rs3-{uuid.uuid4().hex[:8]}"
    topics = TopicNames.with_prefix(prefix)
    env = {
        "RUNSTATE_LOG": f"kafka://{cluster.bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": prefix,
        "RUNSTATE_STATE_DIR": str(tmp_path / "state"),
    }
    made = _cli(env, "topics", "create", "--partitions", "3", "--replication", "3")
    assert made.returncode == 0, made.stderr
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    md = admin.list_topics(timeout=10).topics
    for name in topics.all():
        assert {len(p.replicas) for p in md[name].partitions.values()} == {3}, name
    res = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in (topics.events, topics.checkpoints)]
    got = {r.name: c.result() for r, c in admin.describe_configs(res).items()}
    assert got[topics.events]["min.insync.replicas"].value == "2"
    assert got[topics.events]["message.timestamp.type"].value == "LogAppendTime"
    assert got[topics.checkpoints]["cleanup.policy"].value == "compact"
    assert _cli(env, "topics", "check").returncode == 0

    projectors = [
        subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", "project"],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"project{i}.log", "wb"),
        )
        for i in range(2)
    ]

    def logs() -> str:
        return "\n".join((tmp_path / f"project{i}.log").read_text()[-2000:] for i in range(2))

    try:
        log = KafkaLog(cluster.bootstrap, topics=topics)
        producer = RunProducer(log, Author(agent_id="writer", agent_version="1"))
        acked: dict[str, list[str]] = {f"r{i}": [] for i in range(RUNS)}
        failed: list[str] = []
        stop = threading.Event()

        def write() -> None:
            for run in acked:
                producer.append(producer.build(run, {"expected_revision": 0, "events": [start()]}))
            n = 0
            while not stop.is_set():
                run = f"r{n % RUNS}"
                try:
                    producer.append(
                        producer.build(run, {"expected_revision": 0, "rebase": True, "events": [fact(f"f{n}")]})
                    )
                    acked[run].append(f"f{n}")
                except DeliveryError as e:  # not acknowledged: may or may not be in the log
                    failed.append(str(e))
                n += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:
            for what in ("leader", "leader", "controller", "controller"):
                time.sleep(6)
                ends = log.end_offsets(topics.events)
                busiest = max(ends, key=lambda p: ends[p])
                victim = cluster.leader_of(topics.events, busiest) if what == "leader" else cluster.controller()
                cluster.node(victim).kill()
                print(f"killed node {victim} ({what}{f' of partition {busiest}' if what == 'leader' else ''})")
                time.sleep(5)
                cluster.node(victim).restart()
                cluster.wait_in_sync(topics.events)
            time.sleep(3)
        finally:
            stop.set()
            writer.join(180)
        producer.close()
        assert not failed, failed[:3]
        total = sum(len(v) for v in acked.values())
        assert total > 50, total
        ends = log.end_offsets(topics.events)
        deadline = time.monotonic() + 180
        while True:  # the projector reaches the log's end
            assert all(p.poll() is None for p in projectors), logs()
            try:
                with Projection(tmp_path / "state") as proj:
                    if proj.positions() == ends:
                        break
            except Exception:
                pass
            assert time.monotonic() < deadline, "the projector did not catch up"
            time.sleep(0.5)
        for p in projectors:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(60) for p in projectors] == [0, 0], logs()
        with Projection(tmp_path / "state") as proj:
            for run, facts in acked.items():
                kept = [f.id for f in proj.state(run).confirmed_facts]
                # Every acknowledged patch decided (0 lost) and applied once (0 decided twice).
                assert sorted(kept) == sorted(facts), (run, set(facts) ^ set(kept))
        report = verify(log, str(tmp_path / "state"))
        assert report.ok, (report.mismatches[:3], report.damaged, report.undecided)
        log.close()
    finally:  # a failed test leaves no projector running
        for p in projectors:
            if p.poll() is None:
                p.kill()
