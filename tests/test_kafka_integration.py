"""runstate on a real Kafka broker: CLI end to end, dead letters, scale-out with SIGKILL,
broker restart under load. Real processes, no mocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import ev, fact, patch, start
from runstate.compose.kafka_local import LocalKafka

from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import KafkaLog
from runstate.producers.run_producer import Receipt, RunProducer
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import replay, verify
from runstate.cli import main
from runstate.schemas.codec import decode, encode
from runstate.schemas.patch import Author, Patch
from runstate.schemas import structs

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def kenv(bootstrap: str, topics: TopicNames, state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RUNSTATE_LOG": f"kafka://{bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(state),
    }


def cli(env: dict[str, str], *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)


def wait_drained(log: KafkaLog, state: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ends = log.end_offsets(log.topics.events)
        if (state / "layout.json").exists():
            with Projection(state) as proj:
                pos = proj.positions()
            if all(pos.get(p, 0) >= e for p, e in ends.items()):
                return
        time.sleep(0.5)
    raise AssertionError(f"projection did not catch up: ends {ends}")


def test_cli_end_to_end_on_kafka_with_dead_letters_and_lag(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    env = kenv(kafka_bootstrap, kafka_topics, tmp_path / "state")
    r = cli(env, "project", "--until-caught-up")
    assert r.exit_code == 1 and "does not exist" in r.output and "runstate topics create" in r.output
    r = cli(env, "topics", "create", "--partitions", "3")
    assert r.exit_code == 0 and all(f"{name}: created" in r.output for name in kafka_topics.all()), r.output
    assert "exists" in cli(env, "topics", "create", "--partitions", "3").output
    assert cli(env, "topics", "check").exit_code == 0

    cli(env, "publish", "run_a", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    # A garbage record straight on the events topic, between two patches of run_a.
    from confluent_kafka import Producer

    raw = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    raw.produce(kafka_topics.events, key=b"run_a", value=b"\x00garbage, not a patch")
    raw.flush(10)
    cli(env, "publish", "run_a", "-", input=json.dumps({"expected_revision": 1, "events": [fact("f1")]}))
    cli(env, "publish", "run_a", "-", input=json.dumps({"expected_revision": 1, "events": [fact("f2")]}))
    lag_before = json.loads(cli(env, "status", "--json").output)
    assert sum(row["end_offset"] for row in lag_before) == 4
    assert sum(row["lag"] for row in lag_before) == 4  # nothing projected yet

    r = cli(env, "project", "--until-caught-up", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.splitlines()[-1]) == {
        "records": 4,
        "accepted": 2,
        "rejected": 1,
        "duplicates": 0,
        "dead_letters": 1,
        "events": 2,
    }
    st = json.loads(cli(env, "state", "run_a", "--json").output)
    assert st["revision"] == 2 and [f["id"] for f in st["confirmed_facts"]] == ["f1"]
    assert json.loads(cli(env, "state", "run_a", "--json", "--revision", "1").output)["confirmed_facts"] == []
    assert "revision_conflict" in cli(env, "history", "run_a").output
    assert "not_avro_single_object" in cli(env, "deadletters").output
    assert "run_a" in cli(env, "context", "run_a").output
    assert cli(env, "runs").output.startswith("run_a\trunning")
    v = cli(env, "verify")
    assert v.exit_code == 0 and "projection equals replay" in v.output
    snap = cli(env, "snapshot", "--until-caught-up", "--quiet")
    assert snap.exit_code == 0 and json.loads(snap.output.splitlines()[-1])["checkpoints"] >= 1
    assert "run_started" in cli(env, "checkpoints", "run_a").output
    assert "verdict: SAFE" in cli(env, "resume", "run_a").output

    # publish --wait against a projector consuming from Kafka.
    from runstate.eventlog import open_log
    from runstate.projector.runtime.loop import Projector

    klog = open_log(f"kafka://{kafka_bootstrap}", topics=kafka_topics)
    stop = threading.Event()
    t = threading.Thread(
        target=Projector(klog, str(tmp_path / "state")).run, kwargs={"stop": stop, "poll_timeout_s": 0.05}
    )
    t.start()
    try:
        r = cli(
            env,
            "publish",
            "run_a",
            "-",
            "--wait",
            "--timeout",
            "30",
            input=json.dumps({"expected_revision": 2, "events": [fact("f3")]}),
        )
        assert r.exit_code == 0 and json.loads(r.output)["revision"] == 3, r.output
    finally:
        stop.set()
        t.join()
        klog.close()
    rows = json.loads(cli(env, "status", "--json").output)
    assert all(row["lag"] == 0 for row in rows)
    deadline = time.monotonic() + 10  # the group's mirror is committed asynchronously
    while (
        any(row["committed"] != row["end_offset"] for row in rows if row["end_offset"]) and time.monotonic() < deadline
    ):
        time.sleep(0.5)
        rows = json.loads(cli(env, "status", "--json").output)
    assert all(row["committed"] == row["end_offset"] for row in rows if row["end_offset"])

    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    dead = [
        r
        for p in range(3)
        for r in log.scan(kafka_topics.deadletter, p, 0, log.end_offsets(kafka_topics.deadletter)[p])
    ]
    assert len(dead) == 1 and dict(dead[0].headers)["reason"] == b"not_avro_single_object"
    assert dead[0].value == b"\x00garbage, not a patch"
    log.close()


def chains(runs: int, per_run: int) -> list[Patch]:
    """Valid chains interleaved across runs, with a resend of every 10th patch."""
    out: list[Patch] = []
    for r in range(runs):
        out.append(patch(f"run_{r}", 0, start()))
    for i in range(per_run):
        for r in range(runs):
            out.append(patch(f"run_{r}", i + 1, fact(f"f{i}"), ev("BudgetConsumed", tokens=1)))
            if i % 10 == 0:
                out.append(out[-1])
    return out


def spawn_projector(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runstate.cli", "-v", "project", "--batch-size", "50", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log_path, "ab"),
    )


def check_decided_once(log: KafkaLog, state: Path, runs: int) -> None:
    ends = log.end_offsets(log.topics.events)
    book = replay(
        rec for p in range(log.partitions(log.topics.events)) for rec in log.scan(log.topics.events, p, 0, ends[p])
    )
    with Projection(state) as proj:
        for r in range(runs):
            hist = proj.history(f"run_{r}")
            assert len({d.patch_id for d in hist}) == len(hist), "a patch was decided twice"
            assert hist == sorted(
                (structs.to_model(d) for (run, _), d in book.decided.items() if run == f"run_{r}"),
                key=lambda d: d.offset,
            )


def test_two_projectors_share_partitions_and_survive_sigkill(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = kenv(kafka_bootstrap, kafka_topics, state)
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(6)
    patches = chains(runs=24, per_run=40)
    a = spawn_projector(env, tmp_path / "a.log")
    b = spawn_projector(env, tmp_path / "b.log")
    sent = threading.Event()

    def agents() -> None:
        prod = log.producer()
        for i, p in enumerate(patches):
            prod.append_async(log.topics.events, p.run_id, encode(p), lambda w, e: None if e is None else sent.set())
            if i % 50 == 0:
                prod.flush()
                time.sleep(0.1)
        assert prod.flush(60) == 0
        prod.close()

    agent = threading.Thread(target=agents)
    agent.start()
    try:
        # Both members own partitions before one dies.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (state / "layout.json").exists():
                with Projection(state) as proj:
                    if len([p for p, o in proj.positions().items() if o > 0]) == 6:
                        break
            time.sleep(0.3)
        else:
            raise AssertionError("the two projectors did not both start projecting")
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        agent.join()
        assert not sent.is_set(), "an append was not acknowledged"
        wait_drained(log, state, timeout_s=120)  # the survivor took the dead member's partitions
        assert b.poll() is None
    finally:
        for p_ in (a, b):
            if p_.poll() is None:
                p_.send_signal(signal.SIGTERM)
                p_.wait(30)
    report = verify(log, str(state))
    assert report.ok, report.mismatches[:3]
    assert report.records == len(patches)
    check_decided_once(log, state, 24)
    with Projection(state) as proj:
        assert all(proj.state(f"run_{r}").revision == 41 for r in range(24))
    log.close()


@pytest.fixture
def own_broker() -> Iterator[LocalKafka]:
    """A broker of this test's own: it is restarted under load."""
    broker = LocalKafka(tempfile.mkdtemp(prefix="runstate-kafka-restart-"))
    broker.start()
    yield broker
    broker.stop()


def test_broker_restart_while_producing_loses_and_duplicates_nothing(
    own_broker: LocalKafka, tmp_path: Path, kafka_bootstrap: str
) -> None:
    topics = TopicNames()
    log = KafkaLog(own_broker.bootstrap, topics=topics)
    log.create_topics(3)
    state = tmp_path / "state"
    env = {**os.environ, "RUNSTATE_LOG": f"kafka://{own_broker.bootstrap}", "RUNSTATE_STATE_DIR": str(state)}
    projector = spawn_projector(env, tmp_path / "p.log")
    producer = RunProducer(log, Author(agent_id="a", agent_version="1"))
    patches = chains(runs=10, per_run=60)
    receipts: list[Receipt] = []
    errors: list[Exception] = []
    try:
        for i, p in enumerate(patches):
            producer.append_async(p, lambda r, e: errors.append(e) if e else receipts.append(r))  # type: ignore[arg-type]
            if i == len(patches) // 3:
                producer.flush(30)
                # The projector running (not still starting: one that starts while the broker
                # is down gives up after its probe window), then the restart.
                wait_drained(log, state, timeout_s=120)
                own_broker.restart()  # in-flight and queued records must be retried, not lost or doubled
            if i % 25 == 0:
                time.sleep(0.02)
        assert producer.flush(120) == 0
        assert not errors, errors[:3]
        try:
            wait_drained(log, state, timeout_s=120)  # the projector resumed by itself
        except AssertionError as e:
            raise AssertionError(
                f"{e}; projector exit {projector.poll()}; its log ends: "
                f"{(tmp_path / 'p.log').read_text(errors='replace')[-3000:]}"
            ) from e
        assert projector.poll() is None
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)
        producer.close()
    ends = log.end_offsets(topics.events)
    assert sum(ends.values()) == len(patches)  # resends are separate appends; the broker added none
    assert len(receipts) == len(patches)
    seen: dict[str, int] = {}
    for p in range(3):
        for rec in log.scan(topics.events, p, 0, ends[p]):
            pid = decode(rec.value).patch_id
            seen[pid] = seen.get(pid, 0) + 1
    expected: dict[str, int] = {}
    for p in patches:
        expected[p.patch_id] = expected.get(p.patch_id, 0) + 1
    assert seen == expected
    assert verify(log, str(state)).ok
    check_decided_once(log, state, 10)
    log.close()


def test_new_machine_restores_from_the_compacted_checkpoints_topic(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    from runstate.snapshotter.policy import CheckpointPolicy
    from runstate.snapshotter.loop import Snapshotter
    from runstate.snapshotter.recovery import restore_partition

    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(3)
    patches = chains(runs=9, per_run=30)
    prod = log.producer()
    for p in patches:
        prod.append_async(log.topics.events, p.run_id, encode(p), lambda w, e: None)
    assert prod.flush(60) == 0
    # Machine A runs the snapshotter (its own group and store) into the checkpoints topic.
    Snapshotter(log, str(tmp_path / "a"), policy=CheckpointPolicy(every=8, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.05
    )
    # Machine B has no local state at all: it restores from Kafka, then reads the tail.
    reports = []
    from runstate.projector.runtime.loop import Projector

    b = Projector(log, str(tmp_path / "b"), restore=lambda p, s: reports.append(restore_partition(log, p, s)))
    b.run(until_caught_up=True, poll_timeout_s=0.05)
    assert sum(r.runs for r in reports) == 9 and not any(r.rejected for r in reports)
    assert b.stats.records < len(patches) / 3
    # Same digests as a full replay, and the same decisions after each restore point.
    full = tmp_path / "full"
    Projector(log, str(full)).run(until_caught_up=True, poll_timeout_s=0.05)
    with Projection(tmp_path / "b") as pb, Projection(full) as pf:
        assert pb.digests() == pf.digests()
    assert verify(log, str(tmp_path / "b")).ok
    log.close()


def test_on_kafka_a_record_checkpointed_while_its_partition_is_being_assigned_is_no_lost_record(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    """As on the embedded log (tests/snapshotter/test_recovery.py): a take-over restores the
    partitions it is given while a snapshotter goes on deciding and checkpointing what is
    appended meanwhile; the restored store standing past the ends read at the assignment
    is not a loss (it stopped the instance taking over)."""
    from runstate.projector.runtime.loop import Projector
    from runstate.snapshotter.loop import Snapshotter
    from runstate.snapshotter.recovery import restore_partition

    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(1)
    restored = []

    def restore(p: int, store: Any) -> Any:
        prod = log.producer()
        p0 = patch("r1", 0, start())
        prod.append_async(log.topics.events, p0.run_id, encode(p0), lambda w, e: None)
        assert prod.flush(60) == 0
        Snapshotter(log, str(tmp_path / "snap")).run(until_caught_up=True, poll_timeout_s=0.05)
        report = restore_partition(log, p, store)
        restored.append(report.runs)
        return report

    Projector(log, str(tmp_path / "b"), restore=restore).run(until_caught_up=True, poll_timeout_s=0.05)
    assert restored == [1]
    with Projection(tmp_path / "b") as pb:
        assert [h.run_id for h in pb.runs()] == ["r1"]
    assert verify(log, str(tmp_path / "b")).ok
    log.close()


def test_snapshotter_and_projector_killed_then_state_lost_and_recovered_on_kafka(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    """The drill of tests/faultkit.py on a real broker: 0 runs lost, 0 patches decided twice
    or unlike a clean replay, verify passes."""
    from faultkit import drill

    seed = int(os.environ.get("RUNSTATE_FAULT_SEED", time.time_ns() % 10_000))
    state = tmp_path / "state"
    env = kenv(kafka_bootstrap, kafka_topics, state)
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(4)
    report = drill(log, env, state, runs=16, per_run=40, seed=seed, min_kills=3)
    print(f"fault drill (Kafka, seed {seed}): {report.line()}")
    assert report.projector_kills >= 3 and report.snapshotter_kills >= 3, report.line()
    assert report.restored_runs > 0, report.line()
    assert (report.lost_runs, report.decided_twice, report.differing) == (0, 0, 0), (seed, report.line())
    assert report.verify_exit == 0, (seed, report.verify_output)
    log.close()


def test_a_consumer_closes_promptly_with_its_position_mirror_unsent_and_the_broker_down(
    own_broker: LocalKafka,
) -> None:
    """librdkafka's close waits for an offset commit it cannot send (librdkafka#3740: for as
    long as the coordinator stays away): the mirror is monitoring, so close gives up on it."""
    log = KafkaLog(own_broker.bootstrap, topics=TopicNames())
    log.create_topics(3)
    consumer = log.consumer("closing", log.topics.events, client_id="closing")
    consumer.subscribe(lambda ps: {p: 0 for p in ps}, lambda ps: None)
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(10, 0.2)
    assert consumer.assignment()
    consumer.commit({p: 0 for p in consumer.assignment()})
    consumer.commit({p: 1 for p in consumer.assignment()})  # a busy consumer's: not sent yet
    own_broker.stop()
    t0 = time.monotonic()
    consumer.close()
    elapsed = time.monotonic() - t0
    print(f"closed after {elapsed:.1f}s")
    assert elapsed < 8, f"close waited {elapsed:.1f}s on a broker that is down"


@pytest.mark.parametrize("when", ["after_restart", "while_down"])
def test_sigterm_ends_the_projector_promptly_around_a_broker_restart(
    own_broker: LocalKafka, tmp_path: Path, when: str
) -> None:
    """SIGTERM finishes the batch in hand and exits: right after a broker restart, and
    while the broker is down (the group is left as well as it can be, never waited on)."""
    log = KafkaLog(own_broker.bootstrap, topics=TopicNames())
    log.create_topics(3)
    state = tmp_path / "state"
    env = {**os.environ, "RUNSTATE_LOG": f"kafka://{own_broker.bootstrap}", "RUNSTATE_STATE_DIR": str(state)}
    projector = spawn_projector(env, tmp_path / "p.log")
    try:
        prod = log.producer()
        for p in chains(runs=6, per_run=20):
            prod.append_async(log.topics.events, p.run_id, encode(p), lambda w, e: None)
        assert prod.flush(60) == 0
        prod.close()
        wait_drained(log, state, timeout_s=120)
        if when == "after_restart":
            own_broker.restart()
            time.sleep(1.0)
        else:
            own_broker.stop()
        t0 = time.monotonic()
        projector.send_signal(signal.SIGTERM)
        try:
            projector.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the projector was still running 20 s after SIGTERM ({when}):\n"
                + (tmp_path / "p.log").read_text()[-2000:]
            )
        elapsed = time.monotonic() - t0
        print(f"SIGTERM {when}: exited {projector.returncode} after {elapsed:.1f}s")
        assert projector.returncode == 0, (tmp_path / "p.log").read_text()[-2000:]
    finally:
        if projector.poll() is None:
            projector.kill()
            projector.wait()
        if when == "while_down":
            own_broker.restart()  # already stopped: starts it again on the same ports and data
    assert verify(log, str(state)).ok
    log.close()
