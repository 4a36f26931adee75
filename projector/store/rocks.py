"""What every room of a partition's store shares: its RocksDB handle, checked reads (a
corrupt block or an I/O error is a :class:`StoreError`, never a shorter answer) and the
one way a WriteBatch is applied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocksdict import Rdict, WriteBatch, WriteOptions

from runstate.schemas.errors import StoreError


def write_error(path: Path, e: Exception) -> StoreError:
    """A failed write as the error to raise (a full disk named as such)."""
    text = str(e)
    if "No space left" in text or "ENOSPC" in text:
        return StoreError(
            f"no space left on the device of {path}: free space there, then start again. "
            f"Nothing is lost: what was not stored is read again from the log. ({text})"
        )
    return StoreError(f"write to {path} failed: {text}")


_UNLOGGED = WriteOptions()
_UNLOGGED.disable_wal = True


class RocksStore:
    """A partition store's RocksDB (opened by :class:`~runstate.projector.store.partition.ProjectionStore`)."""

    path: Path
    read_only: bool
    _db: Rdict
    _wopts: WriteOptions
    #: A read-only store's one iterator, reused by :meth:`_scan`.
    _iter: Any

    def _apply(self, wb: WriteBatch, *, logged: bool = True) -> None:
        """Write ``wb`` atomically. ``logged=False``: without the write-ahead log, for what a
        crash may lose because it is written again (a restore, marked until it is flushed).
        Raises :class:`StoreError`."""
        try:
            self._db.write(wb, self._wopts if logged else _UNLOGGED)
        except Exception as e:
            raise write_error(self.path, e) from e

    def _get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)  # type: ignore[no-any-return]
        except Exception as e:  # a RocksDB status error (corruption, I/O)
            raise self._read_error(e) from e

    def _multi_get(self, wanted: list[bytes]) -> list[bytes | None]:
        try:
            return self._db.get(wanted)  # type: ignore[arg-type,return-value]  # a list of keys: MultiGet
        except Exception as e:  # a RocksDB status error (corruption, I/O)
            raise self._read_error(e) from e

    def _read_error(self, e: Exception) -> StoreError:
        return StoreError(
            f"projection store {self.path} cannot be read: {e}. If it is corrupt, delete "
            f"{self.path} (or the whole state directory) to rebuild it from the log."
        )

    def _prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._prefix_from(prefix, prefix)

    def _prefix_from(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The entries under ``prefix`` from ``start`` on."""
        it = self._db.iter()
        it.seek(start)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            yield k, it.value()
            it.next()
        # An iterator stops at a corrupt block as if the data ended there: only its status
        # tells, and a shorter answer must never pass for the whole one.
        self._check(it)

    def _scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """The entries under ``prefix``, read at once and checked like :meth:`_prefix`. A
        read-only store reuses one iterator: its view is fixed when it is opened, so a new
        iterator would see the same data, and making one was a sixth of a small run's
        state query. Not for concurrent use, as a read-only store is not (it serves one
        :class:`~runstate.projector.read.queries.Projection`, which is not thread-safe)."""
        it = self._iter
        if it is None:
            it = self._db.iter()
            if self.read_only:
                self._iter = it
        out = []
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            out.append((k, it.value()))
            it.next()
        try:
            self._check(it)
        except StoreError:
            self._iter = None  # a fresh one next time, its status unknown
            raise
        return out

    def _prefix_reversed(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The entries under ``prefix`` from ``start`` (or the last key before it) backwards;
        checked like :meth:`_prefix` when the iteration runs out."""
        it = self._db.iter()
        it.seek_for_prev(start)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            yield k, it.value()
            it.prev()
        self._check(it)

    def _check(self, it: object) -> None:
        try:
            it.status()  # type: ignore[attr-defined]
        except Exception as e:
            raise StoreError(
                f"projection store {self.path} is corrupt: {e}. Delete {self.path} "
                "(or the whole state directory) to rebuild it from the log."
            ) from e
