"""The log conformance suite: the semantics of ``eventlog.base`` every backend must keep.

Subclass :class:`LogConformance` and provide a ``log`` fixture returning a fresh
:class:`EventLog` whose topics exist (unique per test). The same tests run against the
embedded log and a real Kafka broker.
"""

from __future__ import annotations

import time

from runstate.eventlog.base import Appended, EventLog, LogConsumer, Record
from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import LogConfigError


def drain(consumer: LogConsumer, n: int, timeout_s: float = 30.0) -> list[Record]:
    out: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.poll(500, 0.2))
    return out


class LogConformance:
    def test_offsets_are_dense_per_partition_and_follow_the_key_hash(self, log: EventLog) -> None:
        topic = log.topics.events
        n = log.partitions(topic)
        prod = log.producer()
        seen: dict[int, list[int]] = {}
        for i in range(40):
            key = f"run_{i % 7}"
            a = prod.append(topic, key, f"v{i}".encode())
            assert a.partition == partition_for(key, n)
            seen.setdefault(a.partition, []).append(a.offset)
        prod.close()
        for offs in seen.values():
            assert offs == list(range(len(offs)))
        ends = log.end_offsets(topic)
        assert {p: len(v) for p, v in seen.items()} == {p: e for p, e in ends.items() if e}

    def test_records_read_back_byte_for_byte_with_headers(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        value = bytes(range(256)) * 3
        a = prod.append(topic, "run_x", value, (("reason", b"r\x00"), ("n", b"1")))
        prod.close()
        [rec] = log.read(topic, a.partition, [a.offset])
        assert (rec.key, rec.value, rec.offset, rec.partition) == (b"run_x", value, a.offset, a.partition)
        assert dict(rec.headers) == {"reason": b"r\x00", "n": b"1"}

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

    def test_consumer_starts_where_the_owner_says_and_mirrors_commits(self, log: EventLog) -> None:
        topic = log.topics.events
        n = log.partitions(topic)
        prod = log.producer()
        for i in range(30):
            prod.append(topic, f"r{i}", str(i).encode())
        prod.close()
        ends = log.end_offsets(topic)
        starts = {p: min(2, ends[p]) for p in range(n)}
        assigned: list[int] = []
        consumer = log.consumer("g-conf", topic)
        consumer.subscribe(lambda ps: (assigned.extend(ps), {p: starts[p] for p in ps})[1], lambda ps: None)
        expected = sum(ends[p] - starts[p] for p in range(n))
        recs = drain(consumer, expected)
        assert sorted(assigned) == list(range(n))
        assert len(recs) == expected
        for p in range(n):
            offs = [r.offset for r in recs if r.partition == p]
            assert offs == list(range(starts[p], ends[p]))
        consumer.commit(ends)
        consumer.close()
        deadline = time.monotonic() + 10
        while log.committed("g-conf", topic) != ends and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.committed("g-conf", topic) == ends

    def test_scan_and_random_read(self, log: EventLog) -> None:
        topic = log.topics.events
        prod = log.producer()
        offs = [prod.append(topic, "one", str(i).encode()).offset for i in range(10)]
        prod.close()
        p = partition_for("one", log.partitions(topic))
        assert [int(r.value) for r in log.scan(topic, p, 3, 7, batch=2)] == [3, 4, 5, 6]
        assert [int(r.value) for r in log.read(topic, p, [offs[8], offs[1], 10_000])] == [8, 1]

    def test_create_topics_is_idempotent_and_check_names_what_is_missing(self, log: EventLog) -> None:
        assert log.create_topics(log.partitions(log.topics.events)) == []
        log.check_topics()
        try:
            log.partitions("runstate.no-such-topic")
        except LogConfigError as e:
            assert "runstate.no-such-topic" in str(e)
        else:
            raise AssertionError("a missing topic must raise LogConfigError")


