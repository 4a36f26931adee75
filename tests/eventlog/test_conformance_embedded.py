"""The log conformance suite against the embedded SQLite log, plus what only it has."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from runstate.testing import LogConformance

from runstate.eventlog import open_log
from runstate.eventlog.embedded import EmbeddedLog
from runstate.schemas.errors import LogConfigError, LogError


class TestEmbeddedLog(LogConformance):
    """Embedded compaction runs every COMPACT_EVERY appends, right away."""

    compaction_timeout_s = 5.0

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[EmbeddedLog]:
        log = EmbeddedLog(tmp_path / "log.db", partitions=3)
        yield log
        log.close()


def test_one_consumer_per_group_on_the_embedded_log(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    a = log.consumer("g", log.topics.events)
    a.subscribe(lambda ps: {}, lambda ps: None)
    b = log.consumer("g", log.topics.events)
    with pytest.raises(LogError, match="already has a member"):
        b.subscribe(lambda ps: {}, lambda ps: None)
    a.close()
    b.subscribe(lambda ps: {}, lambda ps: None)  # free again once the first member left
    b.close()


def test_existing_file_keeps_its_partition_count(tmp_path: Path) -> None:
    EmbeddedLog(tmp_path / "log.db", partitions=2).close()
    log = EmbeddedLog(tmp_path / "log.db", partitions=8)
    assert log.partitions(log.topics.events) == 2


def test_log_urls(tmp_path: Path) -> None:
    assert isinstance(open_log(f"sqlite://{tmp_path}/a.db"), EmbeddedLog)
    assert isinstance(open_log(str(tmp_path / "b.db")), EmbeddedLog)
    with pytest.raises(LogConfigError, match="unknown log URL scheme"):
        open_log("redis://127.0.0.1:6379")
    with pytest.raises(LogConfigError, match="does not exist"):
        open_log(str(tmp_path / "missing.db"), create=False)


def test_not_a_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LogConfigError, match="cannot open embedded log"):
        EmbeddedLog(bad)


def _refuse_appends(path: Path) -> sqlite3.Connection:
    """Make the log file refuse every append (a real SQLite error, the message a full disk
    gives), through a trigger; :func:`_accept_appends` takes it away."""
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON records BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    db.commit()
    return db


def _accept_appends(db: sqlite3.Connection) -> None:
    db.execute("DROP TRIGGER refuse")
    db.commit()
    db.close()


def test_a_failed_group_commit_of_records_without_a_callback_is_raised_by_flush(tmp_path: Path) -> None:
    """The log file refuses the commit (a real SQLite error, as a full disk gives; injected
    with a trigger): records appended without a callback are not silently lost, the flush
    raises a DeliveryError naming the first run; those with a callback get the error. Once
    the file accepts writes again the same producer appends."""
    from runstate.schemas.errors import DeliveryError

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    topic = log.topics.events
    db = _refuse_appends(tmp_path / "log.db")
    prod = log.producer()
    reported: list[Exception | None] = []
    prod.append_async(topic, "run_a", b"1", None)
    prod.append_async(topic, "run_b", b"2", lambda a, e: reported.append(e))
    prod.append_async(topic, "run_c", b"3", None)
    with pytest.raises(DeliveryError) as e:
        prod.flush()
    assert e.value.run_id == "run_a" and "disk is full" in str(e.value) and "1 more" in str(e.value)
    assert len(reported) == 1 and isinstance(reported[0], DeliveryError) and reported[0].run_id == "run_b"
    assert prod.flush() == 0  # raised once
    _accept_appends(db)
    prod.append_async(topic, "run_a", b"4", None)
    prod.close()
    assert sum(log.end_offsets(topic).values()) == 1
    log.close()


def test_a_group_commit_between_flushes_keeps_its_failures_for_the_next_flush(tmp_path: Path) -> None:
    """A producer commits every ``linger_records`` appends by itself; a commit refused then
    does not raise out of the append that triggered it (as on Kafka, failures of records
    without a callback are raised by the caller's next flush), and nothing is forgotten."""
    from runstate.eventlog.embedded import EmbeddedProducer
    from runstate.schemas.errors import DeliveryError

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    db = _refuse_appends(tmp_path / "log.db")
    prod = EmbeddedProducer(log, linger_records=2)
    for run in ("run_a", "run_b", "run_c"):  # the second append commits the first two, refused
        prod.append_async(log.topics.events, run, b"x", None)
    _accept_appends(db)
    with pytest.raises(DeliveryError) as e:
        prod.flush()  # commits run_c, then raises what the group commit could not write
    assert e.value.run_id == "run_a" and "1 more" in str(e.value)
    assert sum(log.end_offsets(log.topics.events).values()) == 1
    log.close()


def test_one_log_object_is_safe_to_share_between_threads(tmp_path: Path) -> None:
    """One EmbeddedLog serves a producer and a reader in different threads (runstate.agent's
    local backend; LangGraph writes a step's tasks from a thread pool): appends from 8
    threads at once all land, once each, and a reader never fails or sees a record twice."""
    import threading

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    producer = log.producer()
    errors: list[BaseException] = []

    def write(t: int) -> None:
        try:
            for i in range(50):
                producer.append(log.topics.events, f"run-{t}", f"{t}:{i}".encode())
        except BaseException as e:
            errors.append(e)

    def read() -> None:
        try:
            for _ in range(200):
                for p in range(2):
                    log.scan(log.topics.events, p, 0, log.end_offsets(log.topics.events)[p])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(8)] + [threading.Thread(target=read)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    ends = log.end_offsets(log.topics.events)
    values = [r.value for p in range(2) for r in log.scan(log.topics.events, p, 0, ends[p])]
    assert sorted(values) == sorted(f"{t}:{i}".encode() for t in range(8) for i in range(50))
    log.close()


def test_a_poll_reads_only_the_partitions_with_new_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A serve's readers poll after every append: one read of the partitions' ends, then a
    fetch only where a record lies past the reader's position, not one per partition."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=4)
    topic = log.topics.events
    reader = log.reader(topic, {p: 0 for p in range(4)})
    fetched: list[int] = []
    inner = reader._log._fetch  # type: ignore[attr-defined]

    def counting(t: str, p: int, start: int, limit: int) -> object:
        fetched.append(p)
        return inner(t, p, start, limit)

    monkeypatch.setattr(reader._log, "_fetch", counting)  # type: ignore[attr-defined]
    assert reader.poll(100, 0) == []
    assert fetched == []
    producer = log.producer()
    producer.append_async(topic, "run_a", b"x", lambda w, e: None)
    producer.flush(5)
    got = reader.poll(100, 1)
    assert [r.value for r in got] == [b"x"]
    assert fetched == [got[0].partition]
    reader.close()
    producer.close()
    log.close()


def test_a_reader_kept_busy_by_this_process_still_sees_another_process_appends(tmp_path: Path) -> None:
    """A reader learns of this process's appends without reading the file; it must still
    read the file's ends often enough to see another process's, even while this process
    keeps it busy: another process's record comes within a few polls."""
    import subprocess
    import sys
    import time

    from runstate.eventlog.partitioner import partition_for

    path = tmp_path / "log.db"
    log = EmbeddedLog(path, partitions=4)
    topic = log.topics.events
    ours = "run_ours"
    theirs = next(k for k in (f"run_{i}" for i in range(100)) if partition_for(k, 4) != partition_for(ours, 4))
    reader = log.reader(topic, {p: 0 for p in range(4)})
    producer = log.producer()
    producer.append_async(topic, ours, b"first", lambda w, e: None)
    producer.flush(5)
    assert [r.value for r in reader.poll(100, 1)] == [b"first"]
    code = (
        "from runstate.eventlog.embedded import EmbeddedLog\n"
        f"log = EmbeddedLog({str(path)!r}, create=False)\n"
        "p = log.producer()\n"
        f"p.append_async(log.topics.events, {theirs!r}, b'theirs', lambda w, e: None)\n"
        "p.flush(5)\n"
        "log.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    seen: list[bytes] = []
    deadline = time.monotonic() + 2.0
    while b"theirs" not in seen and time.monotonic() < deadline:
        producer.append_async(topic, ours, b"more", lambda w, e: None)  # this process keeps it busy
        producer.flush(5)
        seen += [r.value for r in reader.poll(100, 0)]
    assert b"theirs" in seen
    reader.close()
    producer.close()
    log.close()


def test_an_append_to_a_partition_the_topic_lacks_is_refused_alone(tmp_path: Path) -> None:
    """A record for a partition the topic does not have is a typed error naming the topic's
    partitions (it was a TypeError from the log's internals), and the log takes the next
    append."""
    from runstate.schemas.errors import DeliveryError

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    producer = log.producer()
    with pytest.raises(DeliveryError, match="has 2 partitions, not partition 5"):
        producer.append(log.topics.events, "run-a", b"x", partition=5)
    assert producer.append(log.topics.events, "run-a", b"y", partition=1).offset == 0
    log.close()
