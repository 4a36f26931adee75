"""SealedLog: the log with every run's content sealed by the run's key (crypto-shredding).

Wraps any :class:`EventLog`. What it writes to the events, checkpoints, decisions and
dead-letter topics is sealed (:mod:`runstate.schemas.sealed`) with the key of the run the
record is keyed by; what it reads from them is opened again, so the projector, the
snapshotter, recovery and the replay tools see plain records and never know. A record it
cannot open reaches them unchanged, with a ``runstate-key`` header that says why
(``erased``, ``missing``, ``damaged``): the core answers an erased run's patch from its
readable envelope and dead-letters the others, and the rest of the partition goes on.

A record with the header ``runstate-content: none`` holds no content (an erasure, an erased
run's checkpoint or decision): written and read as it is, and readable after the run's
keys are gone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

from runstate.eventlog.base import (
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
)
from runstate.eventlog.keystore import Keyring
from runstate.schemas import sealed
from runstate.schemas.codec import encode
from runstate.schemas.errors import DecodeError, RunErased, RunNotFound
from runstate.schemas.events import RunErased as RunErasedEvent
from runstate.schemas.patch import Author, Patch

CONTENT = "runstate-content"
#: The header of a record that holds no content of its run.
CONTENT_FREE: Headers = ((CONTENT, b"none"),)
KEY_HEADER = "runstate-key"


def run_of_key(key: str) -> str:
    """The run a record is keyed by: its key up to the first NUL (a checkpoint's pieces are
    keyed ``<run>\\0<piece>``; ids hold no control characters; '' for a coverage record)."""
    return key.partition("\0")[0]


def is_content_free(headers: Headers) -> bool:
    return bool(headers) and (CONTENT, b"none") in headers


class SealedLog(EventLog):
    """``inner`` with its runs' content sealed by ``keyring``'s keys."""

    def __init__(self, inner: EventLog, keyring: Keyring) -> None:
        self.inner = inner
        self.keyring = keyring
        self.topics = inner.topics
        self._sealed_topics = frozenset(inner.topics.all())

    # -- writing ---------------------------------------------------------------------------

    def seal(self, topic: str, key: str, value: bytes, headers: Headers) -> bytes:
        """The value as stored. Raises :class:`RunErased` for a record of an erased run
        (nothing of it is written any more)."""
        if topic not in self._sealed_topics or is_content_free(headers) or sealed.is_sealed(value):
            return value
        if topic == self.topics.events:
            kid, k = self.keyring.for_sealing(key)
            try:
                envelope = sealed.envelope_of(value)
            except DecodeError:
                envelope = None  # not a patch: sealed whole, and dead-lettered as it would have been
        else:
            key = run_of_key(key)
            got = self.keyring.for_copies(key) if key else None
            if got is None:
                return value  # a run without a key (sealing came later), or not a run
            kid, k = got
            envelope = None
        return sealed.seal(value, key, kid, k, os.urandom(sealed.NONCE_BYTES), envelope)

    def erase(
        self,
        run_id: str,
        reason: str,
        by: str,
        author: Author,
        revision: int,
        *,
        patch_id: str | None = None,
        now: datetime | None = None,
    ) -> tuple[dict[str, str], str | None]:
        """Erase a run: the erasure (a content-free ``RunErased`` patch, readable for good)
        appended to its events, then its keys destroyed, which leaves every copy of its
        content on the log unreadable. Returns the erasure record that stands and the
        patch id appended (None: the run was erased before, and that record stands).
        Raises :class:`RunNotFound` for a run the key store holds no key of."""
        entry = self.keyring.store.run(run_id, refresh=True)
        if entry is not None and entry.erased is not None:
            # The first record stands; a key made since (by a process that had not seen the
            # erasure) is destroyed all the same.
            return self.keyring.erase(run_id, entry.erased), None
        if entry is None or not entry.keys:
            raise RunNotFound(run_id)
        at = now or datetime.now(UTC)
        patch = Patch(
            patch_id=patch_id or uuid.uuid4().hex,
            run_id=run_id,
            expected_revision=revision,
            events=[RunErasedEvent(reason=reason, erased_by=by)],
            author=author,
            created_at=at,
        )
        producer = self.inner.producer()
        try:
            producer.append(self.topics.events, run_id, encode(patch), CONTENT_FREE)
        finally:
            producer.close()
        return self.keyring.erase(run_id, {"at": at.isoformat(), "by": by, "reason": reason}), patch.patch_id

    # -- reading ---------------------------------------------------------------------------

    def open(self, rec: Record) -> Record:
        """The record with its content opened, or unchanged with the reason it cannot be."""
        if rec.topic not in self._sealed_topics or not rec.checksum_ok or not sealed.is_sealed(rec.value):
            if rec.headers and rec.topic == self.topics.events and is_content_free(rec.headers) and rec.key:
                self.keyring.forget(rec.key.decode(errors="replace"))  # an erasure: its keys are gone
            return rec
        try:
            s = sealed.split(rec.value)
            named = None if rec.key is None else rec.key.decode(errors="replace")
            if named is not None and rec.topic != self.topics.events:
                named = run_of_key(named)
            if named != s.run_id:
                return rec  # keyed by another run than it names: the core dead-letters it, no key is looked up
            key = self.keyring.for_opening(s.run_id, s.kid)
            if len(key) != sealed.KEY_BYTES:
                return rec._replace(headers=(*rec.headers, (KEY_HEADER, key)))
            return rec._replace(value=sealed.unseal(s, key))
        except DecodeError:
            return rec._replace(headers=(*rec.headers, (KEY_HEADER, b"damaged")))

    def _open_all(self, records: list[Record]) -> list[Record]:
        return [self.open(r) for r in records]

    # -- the log interface -----------------------------------------------------------------

    def identity(self) -> str:
        return self.inner.identity()

    def partitions(self, topic: str) -> int:
        return self.inner.partitions(topic)

    def create_topics(self, partitions: int, replication: int = 1) -> list[str]:
        return self.inner.create_topics(partitions, replication)

    def check_topics(self) -> None:
        self.inner.check_topics()
        self.inner.partitions(self.topics.keys)

    def producer(self) -> LogProducer:
        return _SealingProducer(self, self.inner.producer())

    def consumer(self, group_id: str, topic: str, *, client_id: str | None = None) -> LogConsumer:
        return _OpeningConsumer(self, self.inner.consumer(group_id, topic, client_id=client_id))

    def reader(self, topic: str, positions: dict[int, int]) -> LogReader:
        return _OpeningReader(self, self.inner.reader(topic, positions))

    def group_members(self, group_id: str) -> list[GroupMember] | None:
        return self.inner.group_members(group_id)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self.inner.end_offsets(topic)

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        return self.inner.committed(group_id, topic)

    def read(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        return self._open_all(self.inner.read(topic, partition, offsets))

    def scan(self, topic: str, partition: int, start: int, end: int, batch: int = 1000) -> Iterator[Record]:
        return (self.open(r) for r in self.inner.scan(topic, partition, start, end, batch))

    def purge_superseded(self, topic: str, key: str) -> None:
        self.inner.purge_superseded(topic, key)

    def check_integrity(self) -> list[str]:
        return self.inner.check_integrity()

    def describe(self) -> str:
        return f"{self.inner.describe()} (content sealed)"

    def __getattr__(self, name: str) -> object:
        # What a backend has beyond the interface (the embedded log's path, its wake-ups).
        return getattr(self.inner, name)

    def close(self) -> None:
        try:
            self.keyring.store.close()
        finally:
            self.inner.close()


class _SealingProducer(LogProducer):
    def __init__(self, log: SealedLog, inner: LogProducer) -> None:
        self._log = log
        self._inner = inner

    def append(
        self, topic: str, key: str, value: bytes, headers: Headers = (), *, partition: int | None = None
    ) -> Appended:
        return self._inner.append(topic, key, self._log.seal(topic, key, value, headers), headers, partition=partition)

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
        try:
            value = self._log.seal(topic, key, value, headers)
        except RunErased as e:
            # Reported as a delivery failure, as the log reports any other: a copy of an erased
            # run's content (a checkpoint or decision made before the erasure) is never written.
            if on_delivery is None:
                raise
            on_delivery(None, e)
            return
        self._inner.append_async(topic, key, value, on_delivery, headers, partition=partition)

    def flush(self, timeout_s: float = 30.0) -> int:
        return self._inner.flush(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        self._inner.close(timeout_s)


class _OpeningConsumer(LogConsumer):
    def __init__(self, log: SealedLog, inner: LogConsumer) -> None:
        self._log = log
        self._inner = inner

    def subscribe(self, on_assign: OnAssign, on_revoke: OnRevoke) -> None:
        self._inner.subscribe(on_assign, on_revoke)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        return self._log._open_all(self._inner.poll(max_records, timeout_s))

    def assignment(self) -> list[int]:
        return self._inner.assignment()

    def end_offsets(self) -> dict[int, int | None]:
        return self._inner.end_offsets()

    def commit(self, positions: dict[int, int]) -> None:
        self._inner.commit(positions)

    def close(self) -> None:
        self._inner.close()


class _OpeningReader(LogReader):
    def __init__(self, log: SealedLog, inner: LogReader) -> None:
        self._log = log
        self._inner = inner

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        return self._log._open_all(self._inner.poll(max_records, timeout_s))

    def close(self) -> None:
        self._inner.close()
