"""The log interface: the same small contract over Kafka and over the embedded log.

Semantics every backend keeps (pinned by the conformance suite, ``runstate.testing``):

- a topic has N partitions; a record's partition is ``partition_for(key, N)``;
- offsets are dense per partition, start at 0 and only grow; a record, once
  acknowledged, is read back byte for byte at its offset;
- records of one key are read in the order they were appended;
- a consumer's *position* belongs to its owner (the projector stores it in RocksDB with
  the state): ``subscribe`` asks the owner where each assigned partition starts, and
  ``commit`` only mirrors positions for lag monitoring.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from runstate.schemas.errors import DeliveryError

Headers = tuple[tuple[str, bytes], ...]

#: The logger that receives the Kafka client's (librdkafka's) own log lines: quiet unless
#: the CLI runs with ``-v``.
LIBRDKAFKA_LOGGER = "runstate.kafka.librdkafka"


#: Least seconds between two writes of a busy consumer's position mirror (``commit``).
MIRROR_EVERY_S = 1.0


class Record(NamedTuple):
    """One log record as read back. (A named tuple: the projector builds one per record
    read, and a named tuple is several times cheaper to build than a frozen dataclass.)"""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: Headers = ()
    #: False when the backend found the record damaged (its checksum does not match).
    checksum_ok: bool = True


class Appended(NamedTuple):
    """Where an acknowledged record landed. (A named tuple: one is built per delivery
    report, and a frozen dataclass costs three times as much to build.)"""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The four topics of a deployment. ``decisions`` carries every decision, keyed by run
    id on the run's partition number: how a worker that is not the projector awaits its
    decision (a notification stream; the projection stays the record of decisions)."""

    events: str = "runstate.events"
    checkpoints: str = "runstate.checkpoints"
    deadletter: str = "runstate.deadletter"
    decisions: str = "runstate.decisions"
    #: The run keys (compacted), when content is sealed (``RUNSTATE_MASTER_KEY``); not one
    #: of :meth:`all`: a deployment without a master key needs no key store.
    keys: str = "runstate.keys"

    @classmethod
    def with_prefix(cls, prefix: str) -> TopicNames:
        return cls(
            f"{prefix}.events", f"{prefix}.checkpoints", f"{prefix}.deadletter", f"{prefix}.decisions", f"{prefix}.keys"
        )

    def all(self) -> tuple[str, str, str, str]:
        return (self.events, self.checkpoints, self.deadletter, self.decisions)


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member of a consumer group as the log's coordinator sees it."""

    client_id: str
    partitions: tuple[int, ...]


DeliveryCallback = Callable[[Appended | None, Exception | None], None]
#: ``on_assign(partitions) -> {partition: start offset}``; called before records of a newly
#: assigned partition are returned by ``poll``.
OnAssign = Callable[[list[int]], dict[int, int]]
#: ``on_revoke(partitions)``; called before partitions are taken away. The owner finishes
#: and stores the batch in hand before it returns.
OnRevoke = Callable[[list[int]], None]


class LogProducer(ABC):
    """Appends keyed records. Thread-compatible, not thread-safe."""

    @abstractmethod
    def append(
        self, topic: str, key: str, value: bytes, headers: Headers = (), *, partition: int | None = None
    ) -> Appended:
        """Append one record and wait for its acknowledgement. ``partition``: where, instead
        of the key's partition (the key store keeps a run's keys on the run's partition
        under keys of their own).

        Raises :class:`schemas.errors.DeliveryError` when it is not acknowledged.
        """

    @abstractmethod
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
        """Queue one record; ``on_delivery`` is called (from ``flush``/``poll``) with where
        it landed or the error. Records queued together may be written in one group commit.
        ``partition``: where, instead of the key's partition (a checkpoint's pieces go to
        their run's partition under keys of their own).

        ``on_delivery=None``: no report for this record when it lands (the cheap path for
        a caller that needs no receipt); if it fails, the next :meth:`flush` or
        :meth:`close` raises :class:`DeliveryError`. A failure is never dropped silently."""

    @abstractmethod
    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait until every queued record is acknowledged or failed; returns how many are
        still queued (0 on success). Raises :class:`DeliveryError` when records appended
        without a callback failed since the last flush (each failure is raised once)."""

    @abstractmethod
    def close(self, timeout_s: float = 60.0) -> None:
        """Flush (waiting at most ``timeout_s``) and release resources. Raises
        :class:`DeliveryError` when records were left undelivered, or failed without a
        callback to report them to."""


def raise_unreported(failures: list[DeliveryError]) -> None:
    """Raise the failures of records appended without a callback (see
    :meth:`LogProducer.append_async`), once: ``failures`` is emptied. The error names the
    first failed record's run and says how many failed."""
    if not failures:
        return
    first, n = failures[0], len(failures)
    failures.clear()
    more = f" (and {n - 1} more records appended without a callback)" if n > 1 else ""
    raise DeliveryError(first.run_id, first.reason + more)


class LogConsumer(ABC):
    """Reads one topic for one owner (a consumer group member)."""

    @abstractmethod
    def subscribe(self, on_assign: OnAssign, on_revoke: OnRevoke) -> None:
        """Join the group. Partitions are assigned now (embedded) or during ``poll`` (Kafka)."""

    @abstractmethod
    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Up to ``max_records`` records from the assigned partitions, each partition in
        offset order; empty after ``timeout_s`` when there is nothing new."""

    @abstractmethod
    def assignment(self) -> list[int]:
        """Partitions currently owned."""

    @abstractmethod
    def end_offsets(self) -> dict[int, int | None]:
        """Log end per owned partition as this consumer last saw it: cheap (no round trip
        to a broker), may trail the log slightly; None where not known yet."""

    @abstractmethod
    def commit(self, positions: dict[int, int]) -> None:
        """Mirror the owner's positions (next offset per partition) for lag monitoring. A
        backend may defer the write (the embedded log writes a busy consumer's mirror at
        most every second); the last positions given are written by an idle poll and by
        ``close``."""

    @abstractmethod
    def close(self) -> None:
        """Leave the group (revoking partitions) and release resources."""


class LogReader(ABC):
    """Follows partitions of one topic from given offsets without joining a group (tails,
    notification streams). Not thread-safe."""

    @abstractmethod
    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Up to ``max_records`` new records (each partition in offset order); empty after
        ``timeout_s`` when there is nothing new."""

    @abstractmethod
    def close(self) -> None: ...


class EventLog(ABC):
    """A partitioned log. One instance per process; producers/consumers are made from it."""

    topics: TopicNames

    @abstractmethod
    def identity(self) -> str:
        """What names this log for as long as it exists: made when the log is created,
        different for a log re-created under the same name. Projections record it, so that
        they are never applied to another log. Raises :class:`LogError`."""

    @abstractmethod
    def partitions(self, topic: str) -> int:
        """Partition count of ``topic``. Raises :class:`LogConfigError` if it does not exist."""

    @abstractmethod
    def create_topics(self, partitions: int, replication: int = 1) -> list[str]:
        """Create the events, checkpoints (compacted), dead-letter and decisions topics if absent.
        Returns the names created. Raises :class:`LogConfigError` when an existing topic
        has an incompatible partition count."""

    @abstractmethod
    def check_topics(self) -> None:
        """Raise :class:`LogConfigError` naming what is missing or incompatible."""

    @abstractmethod
    def producer(self) -> LogProducer: ...

    @abstractmethod
    def consumer(self, group_id: str, topic: str, *, client_id: str | None = None) -> LogConsumer:
        """A member of ``group_id`` on ``topic``; ``client_id`` is how the member is seen
        by :meth:`group_members` (``runstate serve`` advertises its address in it)."""

    @abstractmethod
    def reader(self, topic: str, positions: dict[int, int]) -> LogReader:
        """Follow ``topic`` from ``{partition: offset}``."""

    @abstractmethod
    def group_members(self, group_id: str) -> list[GroupMember] | None:
        """The group's members and their partitions, or None while the group is
        rebalancing (its assignment is not settled). Raises :class:`LogError`."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition."""

    @abstractmethod
    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        """Positions mirrored by ``commit`` for ``group_id`` (missing partitions: none yet)."""

    @abstractmethod
    def read(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        """Records at the given offsets of one partition (random access, for replay tools).
        Offsets not present are skipped."""

    @abstractmethod
    def scan(self, topic: str, partition: int, start: int, end: int, batch: int = 1000) -> Iterator[Record]:
        """Iterate records ``start <= offset < end`` of one partition in order."""

    def purge_superseded(self, topic: str, key: str) -> None:
        """Remove the records of ``key`` older than its newest from ``topic`` (a compacted
        topic), so that their bytes leave the storage now. Kafka's log cleaner does it within
        the topic's ``max.compaction.lag.ms``; the embedded log does it here."""

    def check_integrity(self) -> list[str]:
        """Problems the backend finds in its own storage (``verify --deep``); empty when
        sound or when the backend checks itself (Kafka verifies record CRCs on read)."""
        return []

    def describe(self) -> str:
        return type(self).__name__

    def close(self) -> None:
        """Release resources."""
