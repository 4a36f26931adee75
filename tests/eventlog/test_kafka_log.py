"""The log conformance suite against a real Apache Kafka broker, plus Kafka-only checks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from runstate.testing import LogConformance

from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import KafkaLog
from runstate.eventlog.partitioner import partition_for
from runstate.producers.run_producer import RunProducer
from runstate.projector.runtime.loop import Projector
from runstate.schemas.errors import LogConfigError
from runstate.schemas.patch import Author

pytestmark = pytest.mark.kafka


class TestKafkaLog(LogConformance):
    """Kafka never cleans the active segment: the checkpoints topic of these tests rolls
    segments every 100 ms and is cleanable at once (the broker's cleaner backs off 1 s)."""

    compaction_timeout_s = 60.0

    @pytest.fixture
    def log(self, kafka_bootstrap: str, kafka_topics: TopicNames) -> Iterator[KafkaLog]:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        compact = {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": "0",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
        }
        topics = [
            NewTopic(kafka_topics.events, 3, 1, config={"message.timestamp.type": "LogAppendTime"}),
            NewTopic(kafka_topics.checkpoints, 3, 1, config=compact),
            NewTopic(kafka_topics.deadletter, 3, 1),
        ]
        for f in admin.create_topics(topics).values():
            f.result()
        log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
        log.create_topics(3)  # they exist: checked, not changed
        yield log
        log.close()


def test_java_default_partitioner_agrees_with_ours(kafka_bootstrap: str, kafka_topics: TopicNames) -> None:
    """A plain librdkafka producer with Java's partitioner (murmur2_random) places keys where
    partition_for says, for a prime partition count."""
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(7)
    got: dict[str, int] = {}
    p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    keys = [f"run_{i}" for i in range(50)] + ["", "运行-7", "a" * 300]
    for k in keys:
        p.produce(
            kafka_topics.events,
            key=k.encode(),
            value=b"x",
            on_delivery=lambda err, msg, k=k: got.__setitem__(k, msg.partition()),
        )
    p.flush(30)
    assert got == {k: partition_for(k, 7) for k in keys}
    log.close()


def test_missing_and_incompatible_topics_are_clear_errors(kafka_bootstrap: str, kafka_topics: TopicNames) -> None:
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    with pytest.raises(LogConfigError, match="does not exist.*runstate topics create"):
        log.check_topics()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics(
        [
            NewTopic(kafka_topics.events, 3, 1),
            NewTopic(kafka_topics.checkpoints, 3, 1),
            NewTopic(kafka_topics.deadletter, 3, 1),
            NewTopic(kafka_topics.decisions, 3, 1),
        ]
    ).values():
        f.result()
    # A created topic reaches the broker's metadata a moment after the admin's answer.
    deadline = time.monotonic() + 30
    while True:
        log2 = KafkaLog(kafka_bootstrap, topics=kafka_topics)
        with pytest.raises(LogConfigError) as refused:
            log2.check_topics()
        if "does not exist" not in str(refused.value) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "cleanup.policy=compact" in str(refused.value), refused.value
    # Compacted, but the events carry the client's time: refused too (time rules use the log's).
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    altered = admin.incremental_alter_configs(
        [
            ConfigResource(
                "topic",
                kafka_topics.checkpoints,
                incremental_configs=[
                    ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
                ],
            )
        ]
    )
    for f in altered.values():
        f.result()
    log3 = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    with pytest.raises(LogConfigError, match="LogAppendTime"):
        log3.check_topics()
    log3.close()
    log.close()
    log2.close()


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    """The storage tool reads ``-t -abc`` as a missing argument, and the broker never starts:
    one random id in 64 did that."""
    import base64
    import uuid

    from runstate.compose.kafka_local import cluster_id

    def b64(u: uuid.UUID) -> str:
        return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()

    dash, plain = uuid.UUID(bytes=b"\xf8" + b"\x01" * 15), uuid.UUID(bytes=b"\x01" * 16)
    assert b64(dash).startswith("-")  # what the tool refused
    draws = iter([dash, plain])
    assert cluster_id(lambda: next(draws)) == b64(plain)


def _small_records_only(bootstrap: str, topics: TopicNames) -> tuple[KafkaLog, RunProducer]:
    """An events topic of one partition whose records may be at most 300 bytes (the broker
    refuses a bigger one after the producer queued it), and a producer for it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics(
        [NewTopic(topics.events, 1, 1, config={"max.message.bytes": "300", "message.timestamp.type": "LogAppendTime"})]
    ).values():
        f.result()
    log = KafkaLog(bootstrap, topics=topics, config={"producer.compression.type": "none"})
    log.create_topics(1)
    return log, RunProducer(log, Author(agent_id="t", agent_version="1"))


def test_a_record_the_broker_refuses_reaches_its_callback_as_a_delivery_error(
    kafka_bootstrap: str, kafka_topics: TopicNames
) -> None:
    """A topic whose records may be at most 300 bytes: the broker refuses a bigger patch
    after the producer queued it. Its callback gets a DeliveryError naming the run and the
    broker's reason, and no receipt; a small record on the same producer still lands."""
    from runstate.producers.run_producer import Receipt
    from runstate.schemas.errors import DeliveryError

    log, prod = _small_records_only(kafka_bootstrap, kafka_topics)
    big = prod.events("run_big", 0, [{"type": "RunStarted", "goal": {"statement": "x" * 400}}])
    got: list[tuple[Receipt | None, Exception | None]] = []
    prod.append_async(big, lambda r, e: got.append((r, e)))
    prod.flush(30)
    assert len(got) == 1 and got[0][0] is None
    err = got[0][1]
    assert isinstance(err, DeliveryError) and "run_big" in str(err) and "MSG_SIZE_TOO_LARGE" in str(err)
    small = prod.append(prod.events("run_small", 0, [{"type": "RunStarted", "goal": {"statement": "x"}}]))
    assert (small.run_id, small.partition) == ("run_small", 0)
    prod.close()
    log.close()


def test_a_refused_record_appended_without_a_callback_is_raised_by_flush_once(
    kafka_bootstrap: str, kafka_topics: TopicNames
) -> None:
    """Fire-and-forget appends (no callback, no receipt) still never lose a failure: the
    broker refuses two oversized patches, and the next flush raises one DeliveryError that
    names the first run, the broker's reason and how many more failed. Raised once: the
    flush after it, and close, raise nothing more; a small patch after them lands. (The
    broker refuses a whole batch that is too big, so the small one is sent after the flush.)"""
    from runstate.schemas.errors import DeliveryError

    log, prod = _small_records_only(kafka_bootstrap, kafka_topics)
    prod.append_async(prod.events("run_big", 0, [{"type": "RunStarted", "goal": {"statement": "x" * 400}}]))
    prod.append_async(prod.events("run_bigger", 0, [{"type": "RunStarted", "goal": {"statement": "y" * 800}}]))
    with pytest.raises(DeliveryError) as e:
        prod.flush(30)
    assert e.value.run_id == "run_big" and "MSG_SIZE_TOO_LARGE" in str(e.value) and "1 more" in str(e.value)
    assert prod.flush(30) == 0
    prod.append_async(prod.events("run_small", 0, [{"type": "RunStarted", "goal": {"statement": "x"}}]))
    prod.close()
    assert [r.key for r in log.scan(kafka_topics.events, 0, 0, log.end_offsets(kafka_topics.events)[0])] == [
        b"run_small"
    ]
    log.close()


def test_the_log_end_of_topics_just_created_is_read_while_their_leaders_are_elected(kafka_bootstrap: str) -> None:
    """Right after ``create_topics`` a partition's leader may not be elected yet, and the
    broker answers NOT_LEADER_FOR_PARTITION (measured here: 12 times in 20). That clears by
    itself: the log end is read once it does, not refused. Five fresh sets of topics."""
    for _ in range(5):
        log = KafkaLog(kafka_bootstrap, topics=TopicNames.with_prefix(f"t{uuid.uuid4().hex[:10]}"))
        try:
            log.create_topics(6)
            assert log.end_offsets(log.topics.events) == {p: 0 for p in range(6)}
        finally:
            log.close()


def test_a_projector_started_right_after_creating_its_topics_catches_up(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The projector reads the log end when its partitions are assigned (to refuse a store
    ahead of the log): a leader not yet elected must not end it. Before, it died with
    ``LogError: ... Not leader for partition`` (bench/bench_kafka.py's latency run did)."""
    for i in range(3):
        log = KafkaLog(kafka_bootstrap, topics=TopicNames.with_prefix(f"t{uuid.uuid4().hex[:10]}"))
        try:
            log.create_topics(6)
            stats = Projector(log, str(tmp_path / f"state{i}"), publish_dead_letters=False).run(
                until_caught_up=True, poll_timeout_s=0.05
            )
            assert stats.records == 0
        finally:
            log.close()


@pytest.mark.parametrize(
    "config",
    [
        {"consumer.partition.assignment.strategy": "cooperative-sticky", "consumer.session.timeout.ms": 6000},
        {"consumer.group.protocol": "consumer"},
    ],
    ids=["cooperative-sticky", "kip-848"],
)
def test_with_incremental_assignment_a_member_keeps_its_partitions_while_another_joins_and_leaves(
    kafka_bootstrap: str, config: dict[str, Any]
) -> None:
    """``consumer.partition.assignment.strategy=cooperative-sticky``, or KIP-848's
    ``consumer.group.protocol=consumer`` (RUNSTATE_KAFKA_CONFIG), whose session timeout and
    heartbeat are the broker's: a rebalance moves only the partitions that change hands
    (incremental assignment), so a member's own partitions are never revoked when another
    joins or dies; only what moves is handed to on_assign / on_revoke."""
    import time

    topics = TopicNames.with_prefix(f"t{uuid.uuid4().hex[:10]}")
    log = KafkaLog(kafka_bootstrap, topics=topics, config=config)
    log.create_topics(4)
    seen: dict[str, list[tuple[str, list[int]]]] = {"a": [], "b": []}

    def member(name: str) -> Any:
        c = log.consumer("coop", topics.events, client_id=name)
        c.subscribe(
            lambda ps: (seen[name].append(("assign", sorted(ps))), {})[1],
            lambda ps: seen[name].append(("revoke", sorted(ps))),
        )
        return c

    def until(cond: Callable[[], bool], *members: Any) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, seen
            for m in members:
                m.poll(10, 0.1)

    a = member("a")
    until(lambda: a.assignment() == [0, 1, 2, 3], a)
    b = member("b")
    until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, a, b)
    kept = a.assignment()
    b.close()  # it leaves the group: its partitions move back to a
    until(lambda: a.assignment() == [0, 1, 2, 3], a)
    # a never gave up the partitions it kept; it revoked only what moved to b
    revoked = [p for op, ps in seen["a"] if op == "revoke" for p in ps]
    assert not set(revoked) & set(kept), seen["a"]
    a.close()
    log.close()


def test_a_patch_up_to_the_configured_limit_goes_through_kafka(kafka_bootstrap: str) -> None:
    """RUNSTATE_MAX_PATCH_BYTES is the limit on Kafka too: the topics runstate creates and its
    producer take a record of that size (librdkafka's own default stops at 1,000,000 bytes,
    the broker's at 1 MiB), so a patch of 1.5 MB under a 2 MiB limit is appended and decided;
    one over the limit is PatchTooLarge naming the setting, before anything is sent."""
    from runstate.eventlog import open_log
    from runstate.projector.read.queries import Projection
    from runstate.schemas.errors import PatchTooLarge

    topics = TopicNames.with_prefix(f"t{uuid.uuid4().hex[:10]}")
    limit = 2 * 1024 * 1024
    log = open_log(f"kafka://{kafka_bootstrap}", topics=topics, max_patch_bytes=limit)
    log.create_topics(1)
    prod = RunProducer(log, Author(agent_id="a", agent_version="1"), max_patch_bytes=limit)
    big = {"type": "RunStarted", "goal": {"statement": "x" * 1_500_000}}
    prod.append(prod.events("big", 0, [big]))
    with pytest.raises(PatchTooLarge, match="RUNSTATE_MAX_PATCH_BYTES"):
        prod.append(prod.events("big", 1, [{"type": "PhaseChanged", "phase": "y" * (limit + 1)}]))
    prod.close()
    import tempfile

    with tempfile.TemporaryDirectory() as state:
        Projector(log, state, group_id=f"g-{uuid.uuid4().hex[:8]}").run(until_caught_up=True, poll_timeout_s=0.1)
        with Projection(state) as proj:
            assert len(proj.state("big").goal.statement) == 1_500_000
    log.close()
