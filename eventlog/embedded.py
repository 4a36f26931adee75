"""The embedded log: one SQLite file with Kafka's semantics (partitions, offsets, keys).

Why SQLite: multi-process safe with WAL (agents append while a projector reads), in the
standard library, one file. Durability comes from group commit: ``append_async`` records
are written in one transaction at ``flush`` (or every ``linger_records``), like Kafka's
``linger.ms``; ``synchronous=FULL`` means an acknowledged append is on disk.

A compacted topic (the checkpoints) is cleaned like Kafka's log cleaner: every
``COMPACT_EVERY`` appends, records older than the newest ``COMPACTION_LAG`` offsets of a
partition are deleted when a newer record with the same key exists. Offsets are never
reused; readers see gaps, as on Kafka.

Every record carries a CRC-32 of its key and value, checked when it is read (a mismatch
reaches the projector as a record that fails its checksum, a dead letter). The file has an
identity, made once when it is created, that projections record: a log re-created empty or
swapped for another is then refused instead of silently projected.

A consumer group on the embedded log has exactly one member: ``subscribe`` takes an
exclusive ``flock`` on ``<file>.<group>.lock`` (released by the kernel if the process dies,
even by SIGKILL) and gets every partition. Scale-out is Kafka's job.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import sqlite3
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from runstate.eventlog.base import (
    MIRROR_EVERY_S,
    Appended,
    DeliveryCallback,
    EventLog,
    GroupMember,
    Headers,
    LogConsumer,
    LogProducer,
    LogReader,
    OnAssign,
    OnRevoke,
    Record,
    TopicNames,
    raise_unreported,
)
from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import DeliveryError, LogConfigError, LogError, LostAcknowledged

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics(
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, compacted INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS heads(
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY(topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records(
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB, value BLOB NOT NULL, ts INTEGER NOT NULL, headers BLOB,
    PRIMARY KEY(topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commits(
    group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    offset INTEGER NOT NULL, PRIMARY KEY(group_id, topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
"""


class _AckedMark:
    """``<log>.acked``: how far the log has acknowledged appends, kept outside SQLite's
    files. SQLite drops every write-ahead-log frame from the first one that fails its
    checksum, so one damaged byte there would silently take acknowledged appends with it;
    the mark lets an open notice. The value is the sum of every partition's next offset
    (offsets are never reused, so it only grows), written after each commit and before
    the append is acknowledged, under an exclusive lock, in place (one small write) and
    synced. It names the log it belongs to: a log re-created under the same name starts
    a mark of its own."""

    _FORMAT = struct.Struct("<8s8sQ")
    _MAGIC = b"RSACKED2"

    def __init__(self, path: Path, log_id: str) -> None:
        self.path = path
        self._owner = hashlib.blake2b(log_id.encode(), digest_size=8).digest()
        self._fd: int | None
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            log.warning(
                "cannot open %s (%s): acknowledged appends lost from a damaged write-ahead log will not be noticed",
                path,
                e.strerror,
            )
            self._fd = None

    def _read(self) -> int | None:
        assert self._fd is not None
        raw = os.pread(self._fd, self._FORMAT.size + 4, 0)
        if not raw:
            return None
        body, crc = raw[: self._FORMAT.size], raw[self._FORMAT.size :]
        if len(body) != self._FORMAT.size or zlib.crc32(body).to_bytes(4, "little") != crc:
            raise LogConfigError(
                f"{self.path} (how far the embedded log acknowledged appends) is damaged: delete it "
                "to trust the log as it is (appends lost from a damaged write-ahead log would "
                "then go unnoticed)"
            )
        magic, owner, value = self._FORMAT.unpack(body)
        if magic != self._MAGIC or owner != self._owner:
            return None  # another log's (re-created under this name): this log starts its own
        return int(value)

    def read(self) -> int | None:
        """The mark, or None where there is none yet (a new file)."""
        if self._fd is None:
            return None
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        try:
            return self._read()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def advance(self, total: int, *, reset: bool = False) -> None:
        """Raise the mark to ``total`` (never lower it, another process may be ahead, unless
        ``reset``)."""
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            current = None if reset else self._read()
            if current is None or total > current:
                body = self._FORMAT.pack(self._MAGIC, self._owner, total)
                os.pwrite(self._fd, body + zlib.crc32(body).to_bytes(4, "little"), 0)
                os.fdatasync(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _crc(key: bytes | None, value: bytes) -> int:
    """The checksum each record carries (as Kafka's record batches do): CRC-32 of key and value."""
    return zlib.crc32(value, zlib.crc32(key or b""))


log = logging.getLogger("runstate.eventlog")

COMPACT_EVERY = 1000
COMPACTION_LAG = 1000


def _pack_headers(headers: Headers) -> bytes | None:
    if not headers:
        return None
    out = bytearray()
    for k, v in headers:
        kb = k.encode()
        out += len(kb).to_bytes(2, "big") + kb + len(v).to_bytes(4, "big") + v
    return bytes(out)


def _unpack_headers(raw: bytes | None) -> Headers:
    if not raw:
        return ()
    out = []
    i = 0
    while i < len(raw):
        kl = int.from_bytes(raw[i : i + 2], "big")
        k = raw[i + 2 : i + 2 + kl].decode()
        i += 2 + kl
        vl = int.from_bytes(raw[i : i + 4], "big")
        out.append((k, raw[i + 4 : i + 4 + vl]))
        i += 4 + vl
    return tuple(out)


def _record(topic: str, partition: int, row: tuple[int, bytes | None, bytes, int, bytes | None, int | None]) -> Record:
    offset, key, value, ts, headers, crc = row
    if not isinstance(value, bytes) or not isinstance(key, bytes | None):
        # A value (or key) of another SQLite type, written by hand: damaged, and dead-lettered
        # as such, never a reason for the reader to fail.
        key = None if key is None else str(key).encode() if not isinstance(key, bytes) else key
        value = b"" if value is None else str(value).encode() if not isinstance(value, bytes) else value
        return Record(topic, partition, offset, key, value, ts, (), checksum_ok=False)
    damaged = crc is not None and crc != _crc(key, value)
    try:
        parsed = _unpack_headers(headers)
    except (UnicodeDecodeError, IndexError, ValueError):
        parsed, damaged = (), True
    return Record(topic, partition, offset, key, value, ts, parsed, checksum_ok=not damaged)


#: Offsets per SELECT in :meth:`EmbeddedLog.read` (well under SQLite's bound on parameters).
_READ_CHUNK = 500


class _Wakeup:
    """Appends in this process wake the readers of the same file in this process at once
    (``runstate serve``: appender -> projector -> snapshotter); appends by other processes
    are seen by the readers' 10 ms polling. ``seq`` counts commits, so that a reader that
    fetched nothing waits only if nothing was committed since it looked."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seq = 0
        #: per topic, per partition: the next offset after this process's latest commit there
        self.ends: dict[str, dict[int, int]] = {}

    def bump(self, heads: dict[tuple[str, int], int]) -> None:
        """A commit by this process, which left each ``(topic, partition)`` of ``heads``
        ending before that offset."""
        with self.cond:
            self.seq += 1
            for (topic, partition), end in heads.items():
                ends = self.ends.setdefault(topic, {})
                if end > ends.get(partition, 0):
                    ends[partition] = end
            self.cond.notify_all()

    def ends_of(self, topic: str) -> dict[int, int]:
        with self.cond:
            return dict(self.ends.get(topic, ()))

    def wait(self, seen: int, timeout_s: float) -> None:
        with self.cond:
            if self.seq == seen:
                self.cond.wait(timeout_s)


_wakeups: dict[tuple[Path, str], _Wakeup] = {}
_wakeups_lock = threading.Lock()


def _wakeup_for(path: Path, log_id: str) -> _Wakeup:
    """The readers' wake-up of one log: a file re-created under the same name has its own
    (its offsets start again)."""
    key = (path.resolve(), log_id)
    with _wakeups_lock:
        return _wakeups.setdefault(key, _Wakeup())


class EmbeddedLog(EventLog):
    """A log in one SQLite file. ``partitions`` is used when the file's topics are created;
    an existing file keeps the count it was created with."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        partitions: int = 4,
        topics: TopicNames | None = None,
        *,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.topics = topics or TopicNames()
        if not create and not self.path.exists():
            raise LogConfigError(
                f"embedded log {self.path} does not exist (a write makes it: `runstate publish`, "
                "`runstate topics create`)"
            )
        if not create and self.path.stat().st_size == 0:
            # SQLite would take an empty file for a new database: a log cut to nothing would
            # pass for a log with no runs.
            raise LogConfigError(
                f"embedded log {self.path} is empty (0 bytes): truncated, or not a runstate log. "
                "Restore it from a copy; only a write makes a new log where none exists."
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._parts: dict[str, int] = {}
        self._compacted: set[str] | None = None
        #: per compacted (topic, partition): below this offset, the keys of records are compacted
        self._compacted_upto: dict[tuple[str, int], int] = {}
        self._since_compaction = 0
        self._db = _Serialized(self._connect(create))
        self._acked = _AckedMark(self.path.with_name(self.path.name + ".acked"), self.identity())
        try:
            self._check_acked()
        except BaseException:
            self.close()
            raise
        self.wakeup = _wakeup_for(self.path, self.identity())
        if create:
            self.create_topics(partitions)

    def _appended_total(self) -> int:
        return int(self._db.execute("SELECT COALESCE(SUM(next_offset), 0) FROM heads").fetchone()[0])

    def _check_acked(self) -> None:
        """Refuse a log that ends before what it acknowledged (:class:`LostAcknowledged`)."""
        mark = self._acked.read()
        total = self._appended_total()
        if mark is None:
            self._acked.advance(total, reset=True)
        elif total < mark:
            heads = {f"{t}[{p}]": o for t, p, o in self._db.execute("SELECT topic, partition, next_offset FROM heads")}
            raise LostAcknowledged(str(self.path), mark - total, heads, str(self._acked.path))

    def _connect(self, create: bool = True) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            if not create:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if not {"topics", "heads", "records"} <= tables:
                    db.close()
                    raise LogConfigError(
                        f"{self.path} is not a runstate log (an SQLite file without its tables); "
                        "point --log at the log, or restore it from a copy"
                    )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            # One write transaction: processes opening a new file at once must not both add a column.
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
                if "crc" not in columns:  # a file from before checksums: its old records have none
                    db.execute("ALTER TABLE records ADD COLUMN crc INTEGER")
                db.execute("INSERT OR IGNORE INTO meta VALUES ('log_id', ?)", (f"embedded:{uuid.uuid4().hex}",))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as e:
            raise LogConfigError(f"cannot open embedded log {self.path}: {e}") from e
        return db

    def check_integrity(self) -> list[str]:
        """SQLite's ``quick_check`` of the file, and every record's checksum."""
        try:
            problems = [f"{self.path}: {row[0]}" for row in self._db.execute("PRAGMA quick_check") if row[0] != "ok"]
        except sqlite3.Error as e:
            return [f"{self.path}: quick_check failed: {e}"]
        for topic in self.topics.all():
            for p, end in self.end_offsets(topic).items():
                for rec in self.scan(topic, p, 0, end):
                    if not rec.checksum_ok:
                        problems.append(f"{topic}[{p}]@{rec.offset}: the record does not match its checksum")
        return problems

    def identity(self) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE name='log_id'").fetchone()
        return str(row[0])

    def describe(self) -> str:
        return f"embedded log {self.path}"

    # -- topics ----------------------------------------------------------------------------

    def create_topics(self, partitions: int, replication: int = 1) -> list[str]:
        if partitions < 1:
            raise LogConfigError(f"partitions must be >= 1, got {partitions}")
        created = []
        with _txn(self._db):
            for name in (*self.topics.all(), self.topics.keys):
                row = self._db.execute("SELECT partitions FROM topics WHERE name=?", (name,)).fetchone()
                if row is None:
                    self._db.execute(
                        "INSERT INTO topics VALUES (?,?,?)",
                        (name, partitions, int(name in (self.topics.checkpoints, self.topics.keys))),
                    )
                    self._db.executemany("INSERT INTO heads VALUES (?,?,0)", [(name, p) for p in range(partitions)])
                    created.append(name)
        return created

    def check_topics(self) -> None:
        for name in self.topics.all():
            self.partitions(name)

    def partitions(self, topic: str) -> int:
        n = self._parts.get(topic)
        if n is None:
            row = self._db.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone()
            if row is None:
                raise LogConfigError(f"topic {topic!r} does not exist in {self.path}")
            n = int(row[0])
            self._parts[topic] = n
        return n

    # -- reading -----------------------------------------------------------------------------

    def end_offsets(self, topic: str) -> dict[int, int]:
        self.partitions(topic)
        try:
            rows = self._db.execute("SELECT partition, next_offset FROM heads WHERE topic=?", (topic,)).fetchall()
        except sqlite3.Error as e:
            raise LogError(f"cannot read {self.path}: {e}") from e
        return {int(p): int(o) for p, o in rows}

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        rows = self._db.execute(
            "SELECT partition, offset FROM commits WHERE group_id=? AND topic=?", (group_id, topic)
        ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def read(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        # One SELECT per chunk of offsets rather than per offset (a rebuild reads all of a
        # run's accepted patches); the order asked for is kept.
        found: dict[int, Record] = {}
        try:
            for i in range(0, len(offsets), _READ_CHUNK):
                chunk = offsets[i : i + _READ_CHUNK]
                rows = self._db.execute(
                    "SELECT offset, key, value, ts, headers, crc FROM records WHERE topic=? AND partition=? "
                    f"AND offset IN ({','.join('?' * len(chunk))})",
                    (topic, partition, *chunk),
                ).fetchall()
                for row in rows:
                    found[row[0]] = _record(topic, partition, row)
        except sqlite3.Error as e:
            raise LogError(f"cannot read {topic}[{partition}] in {self.path}: {e}") from e
        return [found[off] for off in offsets if off in found]

    def scan(self, topic: str, partition: int, start: int, end: int, batch: int = 1000) -> Iterator[Record]:
        pos = start
        while pos < end:
            rows = self._fetch(topic, partition, pos, min(batch, end - pos))
            if not rows:
                return
            yield from rows
            pos = rows[-1].offset + 1

    def _fetch(self, topic: str, partition: int, start: int, limit: int) -> list[Record]:
        try:
            rows = self._db.execute(
                "SELECT offset, key, value, ts, headers, crc FROM records "
                "WHERE topic=? AND partition=? AND offset>=? ORDER BY offset LIMIT ?",
                (topic, partition, start, limit),
            ).fetchall()
        except sqlite3.Error as e:
            raise LogError(f"cannot read {topic}[{partition}] at offset {start} in {self.path}: {e}") from e
        return [_record(topic, partition, row) for row in rows]

    # -- writing -----------------------------------------------------------------------------

    def _append_many(self, items: Sequence[tuple[str, str, bytes, Headers, int | None]]) -> list[Appended]:
        """Append records in one transaction (group commit); each with the partition it goes
        to, or None for its key's partition."""
        now = int(time.time() * 1000)
        out = []
        placed = [(t, self._partition(t, k, p), k, v, h) for t, k, v, h, p in items]
        try:
            with _txn(self._db):
                heads: dict[tuple[str, int], int] = {}
                rows = []
                for topic, p, key, value, headers in placed:
                    hk = (topic, p)
                    if hk not in heads:
                        heads[hk] = self._db.execute(
                            "SELECT next_offset FROM heads WHERE topic=? AND partition=?", hk
                        ).fetchone()[0]
                    off = heads[hk]
                    heads[hk] = off + 1
                    kb = key.encode()
                    rows.append((topic, p, off, kb, value, now, _pack_headers(headers), _crc(kb, value)))
                    out.append(Appended(topic, p, off))
                self._db.executemany(
                    "INSERT INTO records(topic, partition, offset, key, value, ts, headers, crc) "
                    "VALUES (?,?,?,?,?,?,?,?)",
                    rows,
                )
                self._db.executemany(
                    "UPDATE heads SET next_offset=? WHERE topic=? AND partition=?",
                    [(o, t, p) for (t, p), o in heads.items()],
                )
                total = self._appended_total()
                compacted = self._compacted_topics()
                n = sum(1 for t, *_ in items if t in compacted)
                if n:
                    self._since_compaction += n
                    if self._since_compaction >= COMPACT_EVERY:
                        self._since_compaction = 0
                        for (t, p), end in heads.items():
                            if t in compacted:
                                self._compact(t, p, end)
        except sqlite3.Error as e:
            raise LogError(f"append to {self.path} failed: {e}") from e
        try:
            self._acked.advance(total)  # before the append is acknowledged
        except OSError as e:
            raise LogError(
                f"append to {self.path}: cannot record it as acknowledged in {self._acked.path}: {e.strerror}"
            ) from e
        self.wakeup.bump(heads)  # committed: readers in this process need not wait for their next poll
        return out

    def _partition(self, topic: str, key: str, partition: int | None) -> int:
        """The partition a record goes to: its key's, or the one named, which the topic must have."""
        n = self.partitions(topic)
        if partition is None:
            return partition_for(key, n)
        if not 0 <= partition < n:
            raise LogConfigError(f"topic {topic!r} in {self.path} has {n} partitions, not partition {partition}")
        return partition

    def _compacted_topics(self) -> set[str]:
        if self._compacted is None:
            rows = self._db.execute("SELECT name FROM topics WHERE compacted=1").fetchall()
            self._compacted = {r[0] for r in rows}
            for name in self._compacted:
                # A compaction finds a key's older records through this index (built once).
                self._db.execute(
                    f'CREATE INDEX IF NOT EXISTS "compact:{name}" ON records(partition, key, offset) '
                    f"WHERE topic={_literal(name)}"
                )
        return self._compacted

    def _compact(self, topic: str, partition: int, end: int) -> None:
        """Keep the newest record per key; records within the lag window are not cleaned.
        Only the keys appended since the last compaction (and those in its lag window) are
        looked at, each through the topic's key index: a compaction costs what was
        appended, not the partition. The first one of a process looks at every key."""
        t = _literal(topic)  # a literal, for SQLite to use the topic's partial index
        since = self._compacted_upto.get((topic, partition), 0)
        self._db.execute(
            f'DELETE FROM records INDEXED BY "compact:{topic}" WHERE topic={t} AND partition=?1 AND offset < ?2 '
            f"AND key IN (SELECT key FROM records WHERE topic={t} AND partition=?1 AND offset >= ?3) AND offset < "
            f"(SELECT MAX(m.offset) FROM records AS m WHERE m.topic={t} AND m.partition=?1 AND m.key=records.key)",
            (partition, end - COMPACTION_LAG, since),
        )
        self._compacted_upto[(topic, partition)] = max(0, end - COMPACTION_LAG)

    def purge_superseded(self, topic: str, key: str) -> None:
        """Delete the key's older records with SQLite's ``secure_delete`` on (their bytes are
        overwritten with zeros, free pages included), then fold the write-ahead log into
        the file and truncate it (it still held the old pages)."""
        try:
            with _txn(self._db):
                self._db.execute("PRAGMA secure_delete=ON")
                try:
                    # Per partition, as Kafka's cleaner: one key may live on several partitions.
                    self._db.execute(
                        "DELETE FROM records AS r WHERE topic=?1 AND key=?2 AND offset < "
                        "(SELECT MAX(offset) FROM records WHERE topic=?1 AND key=?2 AND partition=r.partition)",
                        (topic, key.encode()),
                    )
                finally:
                    self._db.execute("PRAGMA secure_delete=OFF")
            for _ in range(50):  # a reader in another process may hold the WAL for a moment
                busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")[0][0]
                if not busy:
                    return
                time.sleep(0.1)
            raise LogError(
                f"cannot fold the write-ahead log of {self.path} into it (readers hold it); "
                "the erased key's old bytes stay in it until the next checkpoint of the file"
            )
        except sqlite3.Error as e:
            raise LogError(f"cannot purge {topic} records of {key!r} in {self.path}: {e}") from e

    def _commit(self, group_id: str, topic: str, positions: dict[int, int]) -> None:
        """Mirror a group's positions (for lag and status; each projection keeps its own).
        Not synced: a mirror that a power loss takes back a little shows more lag until
        the next one, and a sync here held the log's one writer lock from the next append."""
        try:
            with self._db.lock:
                self._db.execute("PRAGMA synchronous=NORMAL")
                try:
                    with _txn(self._db):
                        self._db.executemany(
                            "INSERT INTO commits VALUES (?,?,?,?) ON CONFLICT DO UPDATE SET offset=excluded.offset",
                            [(group_id, topic, p, o) for p, o in positions.items()],
                        )
                finally:
                    self._db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as e:
            raise LogError(f"cannot mirror positions in {self.path}: {e}") from e

    def producer(self) -> LogProducer:
        return EmbeddedProducer(self)

    def consumer(self, group_id: str, topic: str, *, client_id: str | None = None) -> LogConsumer:
        return EmbeddedConsumer(EmbeddedLog(self.path, topics=self.topics, create=False), group_id, topic, client_id)

    def reader(self, topic: str, positions: dict[int, int]) -> LogReader:
        self.partitions(topic)
        return EmbeddedReader(EmbeddedLog(self.path, topics=self.topics, create=False), topic, positions, own_log=True)

    def _group_lock_path(self, group_id: str) -> str:
        return f"{self.path}.{group_id}.lock"

    def group_members(self, group_id: str) -> list[GroupMember] | None:
        """The group's one member (the holder of its lock file), or none."""
        path = self._group_lock_path(group_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: there is a member
                lines = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
                client_id = lines[1] if len(lines) > 1 else (lines[0] if lines else "")
                return [GroupMember(client_id, tuple(range(self.partitions(self.topics.events))))]
            fcntl.flock(fd, fcntl.LOCK_UN)
            return []
        finally:
            os.close(fd)

    def close(self) -> None:
        self._db.close()
        self._acked.close()


class _Rows(list[Any]):
    """A statement's rows, read whole while the connection was held."""

    def fetchall(self) -> list[Any]:
        return list(self)

    def fetchone(self) -> Any:
        return self[0] if self else None


class _Serialized:
    """One SQLite connection shared by the threads of one log object (a producer in one, the
    projector in another; LangGraph's thread pool): each statement runs whole, its rows read,
    and each transaction whole, while the connection is held, so that no thread's statement
    lands inside another's transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.raw = db
        self.lock = threading.RLock()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Rows:
        with self.lock:
            return _Rows(self.raw.execute(sql, params).fetchall())

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.lock:
            self.raw.executemany(sql, rows)

    def close(self) -> None:
        with self.lock:
            self.raw.close()


class _txn:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``/``ROLLBACK`` (takes the write lock up front, so
    concurrent appenders queue on SQLite's busy timeout instead of failing on upgrade),
    holding the connection for the whole transaction."""

    def __init__(self, db: _Serialized) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.db.lock.release()
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.db.lock.release()


class EmbeddedProducer(LogProducer):
    """Producer over an :class:`EmbeddedLog`; ``append_async`` records are group-committed."""

    def __init__(self, log: EmbeddedLog, linger_records: int = 500) -> None:
        self._log = log
        self._linger = linger_records
        self._queue: list[tuple[str, str, bytes, Headers, DeliveryCallback | None, int | None]] = []
        self._failures: list[DeliveryError] = []

    def append(
        self, topic: str, key: str, value: bytes, headers: Headers = (), *, partition: int | None = None
    ) -> Appended:
        try:
            return self._log._append_many([(topic, key, value, headers, partition)])[0]
        except LogError as e:
            raise DeliveryError(key, str(e)) from e

    def append_async(
        self,
        topic: str,
        key: str,
        value: bytes,
        on_delivery: DeliveryCallback | None,
        headers: Headers = (),
        *,
        partition: int | None = None,
    ) -> None:
        self._queue.append((topic, key, value, headers, on_delivery, partition))
        if len(self._queue) >= self._linger:
            # A group commit, not a flush: failures of records without a callback are
            # raised by the caller's next flush, as on Kafka, never by this append.
            self._commit()

    def flush(self, timeout_s: float = 30.0) -> int:
        if self._queue:
            self._commit()
        raise_unreported(self._failures)
        return 0

    def _commit(self) -> None:
        """Write the queue in one transaction and report each record (a failure of one
        appended without a callback is kept for :meth:`flush` to raise)."""
        queue, self._queue = self._queue, []
        try:
            done = self._log._append_many([(t, k, v, h, p) for t, k, v, h, _, p in queue])
        except LogError as e:
            for _t, key, _v, _h, cb, _p in queue:
                if cb is None:
                    self._failures.append(DeliveryError(key, str(e)))
                else:
                    cb(None, DeliveryError(key, str(e)))
            return
        for (*_rest, cb, _p), where in zip(queue, done):
            if cb is not None:
                cb(where, None)

    def close(self, timeout_s: float = 60.0) -> None:
        self.flush(timeout_s)


#: Least seconds between two reads of the partitions' ends from the file by one reader (how
#: soon it sees another process's appends).
ASK_EVERY_S = 0.01


class EmbeddedReader(LogReader):
    """Follows partitions of one topic by polling the file (every 10 ms while idle, at once
    after an append by this process).

    It fetches only from partitions it knows to hold records past its position. What it
    knows: the partitions' ends as last read from the file, raised by the commits of this
    process (:class:`_Wakeup`); the file's ends are read again at most every
    :data:`ASK_EVERY_S`, busy or idle. So a reader that an appender in this process keeps
    busy (a serve's projector and snapshotter) does not query them around every append, and
    appends by other processes are seen within that time, as the idle polling saw them
    before."""

    def __init__(self, log: EmbeddedLog, topic: str, positions: dict[int, int], own_log: bool = False) -> None:
        self._log = log
        self._topic = topic
        self.positions = dict(positions)
        self._own_log = own_log
        self._rr = 0
        self._ends: dict[int, int] = {}
        self._asked_at = float("-inf")

    def _pending(self, parts: list[int]) -> list[int]:
        return [p for p in parts if self._ends.get(p, 0) > self.positions[p]]

    def _known_ends(self, parts: list[int]) -> list[int]:
        """The partitions with records past this reader's position: from this process's
        commits and, at most every :data:`ASK_EVERY_S`, from the file."""
        for p, end in self._log.wakeup.ends_of(self._topic).items():
            if end > self._ends.get(p, 0):
                self._ends[p] = end
        if time.monotonic() - self._asked_at >= ASK_EVERY_S:  # busy or not: another process may have appended
            self._ends.update(self._log.end_offsets(self._topic))
            self._asked_at = time.monotonic()
        return self._pending(parts)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self._log.wakeup.seq
            out: list[Record] = []
            parts = sorted(self.positions)
            pending = self._known_ends(parts) if len(parts) > 1 else parts
            if pending:
                share = max(1, max_records // len(pending))
                # Round-robin start so that one busy partition cannot starve the others.
                self._rr = (self._rr + 1) % len(pending)
                for p in pending[self._rr :] + pending[: self._rr]:
                    if len(out) >= max_records:
                        break
                    rows = self._log._fetch(self._topic, p, self.positions[p], min(share, max_records - len(out)))
                    if rows:
                        self.positions[p] = rows[-1].offset + 1
                        out.extend(rows)
                    else:  # nothing there after all (its records compacted away): ask the file next time
                        self._ends[p] = self.positions[p]
            if out or time.monotonic() >= deadline:
                return out
            self._log.wakeup.wait(seen, min(0.01, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        if self._own_log:
            self._log.close()


def _lock_holder(content: bytes) -> str:
    """Who holds a group lock, from what its holder wrote into it (``<pid>\\n<client id>\\n``):
    ``runstate serve at <url> (pid N)`` for a serve instance, else ``pid N``."""
    lines = content.decode(errors="replace").splitlines()
    pid = lines[0].strip() if lines and lines[0].strip() else "?"
    client = lines[1].strip() if len(lines) > 1 else ""
    if client.startswith("runstate-serve|"):
        return f"runstate serve at {client.removeprefix('runstate-serve|')} (pid {pid})"
    return f"pid {pid}"


class EmbeddedConsumer(LogConsumer):
    """The single member of a consumer group on the embedded log."""

    def __init__(self, log: EmbeddedLog, group_id: str, topic: str, client_id: str | None = None) -> None:
        self._log = log
        self._group = group_id
        self._topic = topic
        self._client_id = client_id or f"pid-{os.getpid()}"
        self._reader = EmbeddedReader(log, topic, {})
        self._positions = self._reader.positions  # shared: the reader advances them
        self._lock_fd: int | None = None
        self._on_revoke: OnRevoke | None = None
        #: positions given to ``commit`` and not yet written, and when the mirror was written
        self._unmirrored: dict[int, int] | None = None
        self._mirrored_at = 0.0

    def subscribe(self, on_assign: OnAssign, on_revoke: OnRevoke) -> None:
        n = self._log.partitions(self._topic)
        lock_path = self._log._group_lock_path(self._group)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # no room for a new file, or not ours
            raise LogError(
                f"cannot write the lock file {lock_path} of consumer group {self._group!r}: {e.strerror}"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = _lock_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise LogError(
                f"consumer group {self._group!r} on {self._log.path} already has a member: {holder}. The embedded "
                "log allows one projector per group: stop that process, ask it (runstate serve answers over "
                "HTTP), or move to Kafka to run several"
            ) from e
        holder = f"{os.getpid()}\n{self._client_id}\n".encode()
        try:
            os.pwrite(fd, holder, 0)
            os.ftruncate(fd, len(holder))
        except OSError as e:  # a full disk, say: no member without its name in the file
            os.close(fd)
            raise LogError(
                f"cannot write the lock file {lock_path} of consumer group {self._group!r}: {e.strerror}"
            ) from e
        self._lock_fd = fd
        self._on_revoke = on_revoke
        parts = list(range(n))
        starts = on_assign(parts)
        self._positions.update({p: int(starts.get(p, 0)) for p in parts})

    def assignment(self) -> list[int]:
        return sorted(self._positions)

    def end_offsets(self) -> dict[int, int | None]:
        ends = self._log.end_offsets(self._topic)
        return {p: ends.get(p) for p in self._positions}

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        records = self._reader.poll(max_records, timeout_s)
        if not records:  # idle: the mirror catches up (what `runstate status` shows)
            try:
                self._flush_mirror()
            except LogError as e:  # monitoring only: the next idle poll tries again
                log.warning("cannot mirror positions: %s", e)
        return records

    def commit(self, positions: dict[int, int]) -> None:
        """Written at most every ``MIRROR_EVERY_S`` while busy, then on the next idle poll
        and on close: each write is a SQLite write transaction competing with the appender
        for the file's one writer lock (29.7 % of ``runstate serve``'s samples at 500
        patches/s when it was written per batch)."""
        self._unmirrored = dict(positions)
        if time.monotonic() - self._mirrored_at >= MIRROR_EVERY_S:
            self._flush_mirror()

    def _flush_mirror(self) -> None:
        if self._unmirrored is not None:
            self._log._commit(self._group, self._topic, self._unmirrored)  # kept when it fails
            self._unmirrored = None
            self._mirrored_at = time.monotonic()

    def close(self) -> None:
        try:
            try:
                self._flush_mirror()
            except LogError as e:  # monitoring only: leaving the group matters more
                log.warning("cannot mirror positions on close: %s", e)
            if self._on_revoke is not None and self._positions:
                self._on_revoke(sorted(self._positions))
        finally:
            self._positions.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._log.close()
