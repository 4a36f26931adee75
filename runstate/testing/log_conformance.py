"""The log conformance suite: the semantics of :mod:`runstate.eventlog.base` every backend keeps.

Subclass :class:`LogConformance` in a pytest module and provide a ``log`` fixture that
returns a fresh :class:`EventLog` whose topics exist and are unique to the test. The
checkpoints topic must be compacted with settings that let the cleaner run within
``compaction_timeout_s`` (on Kafka: a small ``segment.ms`` and
``min.cleanable.dirty.ratio``; the active segment is never cleaned). The same tests run
against the embedded log and a real Kafka broker; a third backend runs them unchanged.

Every method of the interface is exercised, including what recovery and exactly-once
rest on: a consumer starts where its owner says (positions live with the owner's state),
revocation comes before another member reads the partition and after the owner's last
batch, so positions stored at revocation hand over with no gap and no duplicate, and a
compacted topic keeps the newest record of every key.
"""

from __future__ import annotations

import time

from runstate.eventlog.base import Appended, EventLog, LogConsumer, Record
from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import LogConfigError, LogError


def drain(consumer: LogConsumer, n: int, timeout_s: float = 30.0) -> list[Record]:
    """Poll until ``n`` records were returned or ``timeout_s`` passed."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.poll(500, 0.2))
    return out


def _fill(log: EventLog, n: int, keys: int = 7, topic: str | None = None) -> dict[int, int]:
    prod = log.producer()
    for i in range(n):
        prod.append(topic or log.topics.events, f"r{i % keys}", str(i).encode())
    prod.close()
    return log.end_offsets(topic or log.topics.events)


class _Owner:
    """What a projector does with positions, reduced to a dict: it stores the next offset
    of each partition after every batch, starts there on assignment, and notes revocation."""

    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = positions
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.records: list[Record] = []

    def on_assign(self, partitions: list[int]) -> dict[int, int]:
        self.assigned.append(sorted(partitions))
        return {p: self.positions.get(p, 0) for p in partitions}

    def on_revoke(self, partitions: list[int]) -> None:
        self.revoked.append(sorted(partitions))

    def process(self, records: list[Record]) -> None:
        for r in records:
            self.records.append(r)
            self.positions[r.partition] = r.offset + 1


class LogConformance:
    """The contract of a log backend. ``log`` is the fixture the subclass provides."""

    #: How long the compacted topic may take to be cleaned on this backend.
    compaction_timeout_s: float = 60.0

    # -- EventLog: topics -----------------------------------------------------------------

    def test_create_topics_is_idempotent_and_check_names_what_is_missing(self, log: EventLog) -> None:
        assert log.create_topics(log.partitions(log.topics.events)) == []
        log.check_topics()
        n = log.partitions(log.topics.events)
        assert n >= 1 and log.partitions(log.topics.checkpoints) == n
        try:
            log.partitions("runstate.no-such-topic")
        except LogConfigError as e:
            assert "runstate.no-such-topic" in str(e)
        else:
            raise AssertionError("a missing topic must raise LogConfigError")

    def test_describe_names_the_backend(self, log: EventLog) -> None:
        text = log.describe()
        assert isinstance(text, str) and text.strip()

    # -- producer ---------------------------------------------------------------------------

    def test_offsets_are_dense_per_partition_and_follow_the_key_hash(self, log: EventLog) -> None:
        topic = log.topics.events
        n = log.partitions(topic)
        prod = log.producer()
        seen: dict[int, list[int]] = {}
        for i in range(40):
            key = f"run_{i % 7}"
            a = prod.append(topic, key, f"v{i}".encode())
            assert a.partition == partition_for(key, n) and a.topic == topic
            seen.setdefault(a.partition, []).append(a.offset)
        prod.close()
        for offs in seen.values():
            assert offs == list(range(len(offs)))
        ends = log.end_offsets(topic)
        assert set(ends) == set(range(n))
        assert {p: len(v) for p, v in seen.items()} == {p: e for p, e in ends.items() if e}

    def test_records_read_back_byte_for_byte_with_headers(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        value = bytes(range(256)) * 3
        a = prod.append(topic, "run_x", value, (("reason", b"r\x00"), ("n", b"1")))
        prod.close()
        [rec] = log.read(topic, a.partition, [a.offset])
        assert (rec.key, rec.value, rec.offset, rec.partition, rec.topic) == (
            b"run_x",
            value,
            a.offset,
            a.partition,
            topic,
        )
        assert dict(rec.headers) == {"reason": b"r\x00", "n": b"1"}
        assert rec.timestamp_ms > 0

    def test_async_appends_keep_per_key_order_and_report_delivery(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        got: list[Appended] = []
        errors: list[Exception] = []

        def cb(a: Appended | None, e: Exception | None) -> None:
            if e is not None:
                errors.append(e)
            else:
                assert a is not None
                got.append(a)

        for i in range(300):
            prod.append_async(topic, f"k{i % 3}", str(i).encode(), cb)
        assert prod.flush(30) == 0
        prod.close()
        assert not errors and len(got) == 300
        for key in ("k0", "k1", "k2"):
            p = partition_for(key, log.partitions(topic))
            vals = [int(r.value) for r in log.scan(topic, p, 0, log.end_offsets(topic)[p]) if r.key == key.encode()]
            assert vals == sorted(vals) and len(vals) == 100

    def test_close_delivers_what_is_queued(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        delivered: list[Appended | None] = []
        for i in range(25):
            prod.append_async(topic, "queued", str(i).encode(), lambda a, e: delivered.append(a if e is None else None))
        prod.close()  # no flush: close must deliver, never drop
        p = partition_for("queued", log.partitions(topic))
        assert [int(r.value) for r in log.scan(topic, p, 0, log.end_offsets(topic)[p])] == list(range(25))
        assert len(delivered) == 25 and None not in delivered

    def test_appends_without_a_callback_land_in_order_and_flush_raises_nothing(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        reported: list[Appended | None] = []
        for i in range(40):
            # every other record without a callback: both kinds share one queue and commit
            cb = None if i % 2 else (lambda a, e: reported.append(a if e is None else None))
            prod.append_async(topic, "quiet", str(i).encode(), cb)
        assert prod.flush(30) == 0
        prod.close()
        p = partition_for("quiet", log.partitions(topic))
        assert [int(r.value) for r in log.scan(topic, p, 0, log.end_offsets(topic)[p])] == list(range(40))
        assert len(reported) == 20 and None not in reported

    # -- reading ----------------------------------------------------------------------------

    def test_scan_and_random_read(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        offs = [prod.append(topic, "one", str(i).encode()).offset for i in range(10)]
        prod.close()
        p = partition_for("one", log.partitions(topic))
        assert [int(r.value) for r in log.scan(topic, p, 3, 7, batch=2)] == [3, 4, 5, 6]
        assert list(log.scan(topic, p, 7, 7)) == []
        assert [int(r.value) for r in log.read(topic, p, [offs[8], offs[1], 10_000])] == [8, 1]
        assert log.read(topic, p, []) == []

    # -- consumer -----------------------------------------------------------------------------

    def test_consumer_starts_where_the_owner_says_and_mirrors_commits(self, log: EventLog) -> None:
        topic = log.topics.events
        n = log.partitions(topic)
        ends = _fill(log, 30)
        owner = _Owner({p: min(2, ends[p]) for p in range(n)})
        starts = dict(owner.positions)
        consumer = log.consumer("g-conf", topic)
        consumer.subscribe(owner.on_assign, owner.on_revoke)
        expected = sum(ends[p] - starts[p] for p in range(n))
        recs = drain(consumer, expected)
        assert sorted(p for ps in owner.assigned for p in ps) == list(range(n))
        assert consumer.assignment() == list(range(n))
        assert len(recs) == expected
        for p in range(n):
            assert [r.offset for r in recs if r.partition == p] == list(range(starts[p], ends[p]))
        consumer.commit(ends)
        consumer.close()
        deadline = time.monotonic() + 10
        while log.committed("g-conf", topic) != ends and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.committed("g-conf", topic) == ends
        assert log.committed("g-never-committed", topic) == {}

    def test_a_busy_consumers_mirror_waits_for_an_idle_poll(self, log: EventLog) -> None:
        """A second ``commit`` within ``MIRROR_EVERY_S`` of the first is not written until
        the consumer's next idle poll (a projector commits after every batch)."""
        topic = log.topics.events
        n = log.partitions(topic)
        ends = _fill(log, 20)
        owner = _Owner({p: 0 for p in range(n)})
        consumer = log.consumer("g-mirror", topic)
        consumer.subscribe(owner.on_assign, owner.on_revoke)
        assert len(drain(consumer, sum(ends.values()))) == sum(ends.values())
        first = {p: 1 for p in range(n)}
        consumer.commit(first)
        consumer.commit(ends)  # deferred: no poll in between
        deadline = time.monotonic() + 10
        while log.committed("g-mirror", topic) != first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.committed("g-mirror", topic) == first
        assert consumer.poll(10, 0.2) == []  # idle: the last positions go out
        deadline = time.monotonic() + 10
        while log.committed("g-mirror", topic) != ends and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.committed("g-mirror", topic) == ends
        consumer.close()

    def test_reader_follows_from_given_offsets_and_sees_later_appends(self, log: EventLog) -> None:
        topic = log.topics.decisions
        n = log.partitions(topic)
        ends = _fill(log, 20, topic=topic)
        reader = log.reader(topic, {p: max(0, ends[p] - 1) for p in range(n)})
        try:
            got = []
            deadline = time.monotonic() + 15
            wanted = sum(1 for p in range(n) if ends[p])
            while len(got) < wanted and time.monotonic() < deadline:
                got.extend(reader.poll(100, 0.2))
            assert sorted((r.partition, r.offset) for r in got) == sorted((p, ends[p] - 1) for p in range(n) if ends[p])
            prod = log.producer()
            a = prod.append(topic, "later", b"x")
            prod.close()
            later: list[Record] = []
            while not later and time.monotonic() < deadline:
                later.extend(reader.poll(100, 0.2))
            assert [(r.partition, r.offset, r.value) for r in later] == [(a.partition, a.offset, b"x")]
        finally:
            reader.close()

    def test_group_members_name_the_client_and_its_partitions(self, log: EventLog) -> None:
        topic = log.topics.events
        n = log.partitions(topic)
        assert log.group_members("g-members-none") == []
        consumer = log.consumer("g-members", topic, client_id="member@http://127.0.0.1:1")
        owner = _Owner({})
        consumer.subscribe(owner.on_assign, owner.on_revoke)
        try:
            deadline = time.monotonic() + 30
            members = None
            while time.monotonic() < deadline:
                consumer.poll(10, 0.2)  # Kafka: the group forms while the member polls
                members = log.group_members("g-members")
                if members:
                    break
            assert members is not None and [(m.client_id, m.partitions) for m in members] == [
                ("member@http://127.0.0.1:1", tuple(range(n)))
            ]
        finally:
            consumer.close()

    def test_poll_returns_empty_after_its_timeout_when_nothing_is_new(self, log: EventLog) -> None:
        topic = log.topics.events
        consumer = log.consumer("g-idle", topic)
        owner = _Owner({})
        consumer.subscribe(owner.on_assign, owner.on_revoke)
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            assert consumer.poll(10, 0.2) == []  # joins the group (Kafka assigns during poll)
        assert consumer.assignment()
        t = time.monotonic()
        assert consumer.poll(10, 0.3) == []
        assert time.monotonic() - t < 10
        consumer.close()

    def test_consumer_end_offsets_is_its_view_of_the_log_end(self, log: EventLog) -> None:
        topic = log.topics.events
        ends = _fill(log, 20)
        consumer = log.consumer("g-ends", topic)
        owner = _Owner({})
        consumer.subscribe(owner.on_assign, owner.on_revoke)
        drain(consumer, sum(ends.values()))
        view = consumer.end_offsets()
        assert set(view) == set(consumer.assignment())
        for p, e in view.items():
            assert e is None or 0 <= e <= ends[p]
        deadline = time.monotonic() + 10  # cheap and may trail the log, but catches up
        while view != ends and time.monotonic() < deadline:
            consumer.poll(10, 0.2)
            view = consumer.end_offsets()
        assert view == ends
        consumer.close()

    def test_close_revokes_and_positions_stored_then_hand_over_exactly(self, log: EventLog) -> None:
        """Exactly-once rests on this: an owner that stores its positions after each batch
        and is revoked (close) hands every partition to the next owner, who starts where
        the first stopped: every record is read once over both owners."""
        topic = log.topics.events
        ends = _fill(log, 60)
        positions: dict[int, int] = {}
        first = _Owner(positions)
        c1 = log.consumer("g-handover", topic)
        c1.subscribe(first.on_assign, first.on_revoke)
        while len(first.records) < 20:
            first.process(c1.poll(7, 0.2))
        owned = c1.assignment()
        c1.close()
        assert first.revoked and sorted(p for ps in first.revoked for p in ps) == owned
        second = _Owner(positions)
        c2 = log.consumer("g-handover", topic)
        c2.subscribe(second.on_assign, second.on_revoke)
        left = sum(ends.values()) - len(first.records)
        deadline = time.monotonic() + 30
        while len(second.records) < left and time.monotonic() < deadline:
            second.process(c2.poll(500, 0.2))
        c2.close()
        seen = [(r.partition, r.offset) for r in first.records + second.records]
        assert len(seen) == len(set(seen)) == sum(ends.values())

    def test_a_second_member_shares_the_partitions_or_is_refused(self, log: EventLog) -> None:
        """A second member of a group either takes some partitions over through revocation
        (each record still read once over both members), or is refused with LogError."""
        topic = log.topics.events
        ends = _fill(log, 80)
        total = sum(ends.values())
        positions: dict[int, int] = {}
        a, b = _Owner(positions), _Owner(positions)
        ca = log.consumer("g-members", topic)
        ca.subscribe(a.on_assign, a.on_revoke)
        while len(a.records) < 10:
            a.process(ca.poll(5, 0.2))
        cb = log.consumer("g-members", topic)
        try:
            cb.subscribe(b.on_assign, b.on_revoke)
        except LogError as e:
            assert "g-members" in str(e)
            ca.close()
            return
        deadline = time.monotonic() + 60
        while (len(a.records) + len(b.records) < total or not b.assigned) and time.monotonic() < deadline:
            a.process(ca.poll(5, 0.1))
            b.process(cb.poll(5, 0.1))
        ca.close()
        cb.close()
        assert a.revoked, "the first member must be revoked before the second reads"
        assert b.assigned and any(b.assigned), "the second member never got a partition"
        seen = [(r.partition, r.offset) for r in a.records + b.records]
        assert len(seen) == len(set(seen)) == total

    # -- compaction ---------------------------------------------------------------------------

    def test_compacted_topic_keeps_the_newest_record_per_key(self, log: EventLog) -> None:
        topic = log.topics.checkpoints
        n = log.partitions(topic)
        # Two keys on every partition, so that every partition has something to clean.
        keys: list[str] = []
        for p in range(n):
            keys += [k for k in (f"run_{i}" for i in range(10_000)) if partition_for(k, n) == p][:2]
        newest: dict[bytes, bytes] = {}
        prod = log.producer()
        sent = 0

        def put(i: int) -> None:
            nonlocal sent
            key = keys[i % len(keys)]
            prod.append_async(topic, key, str(i).encode(), lambda a, e: None)
            newest[key.encode()] = str(i).encode()
            sent += 1

        for i in range(1600 * n):
            put(i)
        prod.flush(30)

        def records() -> list[Record]:
            ends = log.end_offsets(topic)
            return [r for p in range(n) for r in log.scan(topic, p, 0, ends[p])]

        deadline = time.monotonic() + self.compaction_timeout_s
        i = sent
        while len(records()) >= sent and time.monotonic() < deadline:
            for _ in range(len(keys)):  # new records roll segments (segment.ms) on every partition
                put(i)
                i += 1
            prod.flush(30)
            time.sleep(0.3)
        prod.close()
        kept = records()
        assert len(kept) < sent, f"the cleaner never ran within {self.compaction_timeout_s}s"
        by_key: dict[bytes, bytes] = {}
        for r in kept:  # per partition, in offset order: the last one wins
            assert r.key is not None
            by_key[r.key] = r.value
        assert by_key == newest
        for p in range(n):
            offs = [r.offset for r in kept if r.partition == p]
            assert offs == sorted(offs)
        assert sum(log.end_offsets(topic).values()) == sent  # offsets are never reused
