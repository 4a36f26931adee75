"""A partition store filled from checkpoints (``snapshotter/recovery.py``): the restore's
marks, the pieces it writes as the store's own bytes, and what it remembers of each
restored run (the offset its checkpoint covered, the patch ids it had decided)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from rocksdict import WriteBatch

from runstate.projector.store import keys
from runstate.projector.store.rocks import RocksStore, write_error


class RestoredPieces(NamedTuple):
    """A run as a restore from checkpoints' pieces writes it."""

    run_id: str
    #: its header, as the store holds it
    header: bytes
    #: its items: ``("<kind>\0<id>", body as the store holds it)``
    items: list[tuple[str, bytes]]
    #: the last log offset its checkpoint covered
    covers_offset: int
    #: the digests of the patch ids it decided, concatenated
    patch_ids: bytes
    #: its last decisions: ``(offset, patch id, reused, decision JSON)``
    decisions: Sequence[tuple[int, str, bool, bytes]]


class Restoring(RocksStore):
    """The restore's part of a partition store."""

    #: run -> the digests of the patch ids it decided before its restore (read once)
    _restored_ids: dict[str, frozenset[bytes]]

    def begin_restore(self) -> None:
        """Mark this (new) store as being restored, until :meth:`finish_restore`: a store a
        crash left half restored is started over, never used."""
        self._db[keys.RESTORING] = b"1"

    def restoring(self) -> bool:
        return self._get(keys.RESTORING) is not None

    def finish_restore(self, next_offset: int) -> None:
        """The restore is complete; the projector goes on from ``next_offset``. What it
        wrote (without the write-ahead log) is flushed to table files first: a crash before
        the mark is cleared starts the restore over, never trusts half of it."""
        try:
            self._db.flush()
        except Exception as e:
            raise write_error(self.path, e) from e
        wb = WriteBatch(raw_mode=True)
        wb.put(keys.NEXT_OFFSET, keys.encode_int(next_offset))
        wb.delete(keys.RESTORING)
        self._apply(wb)
        self._restored_ids.clear()

    def restore_pieces(self, runs: Iterable[RestoredPieces]) -> None:
        """Write runs restored from checkpoints' pieces, as the store's own bytes, in one
        batch: each run's header, its items, the patch ids it had decided (digests), its
        last decisions, and the mark that it is restored up to ``covers_offset``."""
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        for run_id, header, items, covers_offset, patch_ids, decisions in runs:
            put(keys.header_key(run_id), header)
            prefix = keys.run_items_prefix(run_id)
            for tail, body in items:
                put(prefix + tail.encode(), body)
            for offset, patch_id, reused, raw in decisions:
                put(keys.history_key(run_id, offset), raw)
                if not reused:
                    put(keys.dedupe_key(run_id, patch_id), keys.encode_int(offset))
            put(keys.restored_key(run_id), keys.encode_int(covers_offset))
            put(keys.restored_ids_key(run_id), patch_ids)
        self._apply(wb, logged=False)

    def stored_pieces(self) -> Iterator[tuple[str, str | None, str, bytes]]:
        """Every run's header and items: ``(run, kind, id, body)``, ``kind`` None for the
        header (headers first)."""
        for k, v in self._prefix(keys.HEADERS):
            yield keys.run_of(k, keys.HEADERS), None, "", v
        for k, v in self._prefix(b"i:"):
            run, kind, id_ = k[2:].split(b"\0", 2)
            yield run.decode(), kind.decode(), id_.decode(), v

    def drop_runs(self, runs: Iterable[str]) -> None:
        """Delete everything stored of ``runs`` (a restore that could not trust them)."""
        wb = WriteBatch(raw_mode=True)
        for run_id in runs:
            for start, end in keys.run_ranges(run_id):
                wb.delete_range(start, end)
        self._apply(wb)

    def restored(self) -> dict[str, int]:
        """Runs restored from checkpoints -> the last offset their checkpoint covered. Their
        decisions before that offset are not in this store (only the checkpoint's)."""
        return {keys.run_of(k, keys.RESTORED): keys.decode_int(v) for k, v in self._prefix(keys.RESTORED)}

    def restored_patch_ids(self, run_id: str) -> bytes:
        """The digests of the patch ids decided before the run was restored (empty if it
        was not)."""
        return self._get(keys.restored_ids_key(run_id)) or b""

    def decided_before_restore(self, run_id: str, digest: bytes) -> bool:
        """Whether a patch id (its digest) was decided before the run was restored here."""
        ids = self._restored_ids.get(run_id)
        if ids is None:
            ids = self._restored_ids[run_id] = keys.split_patch_ids(self.restored_patch_ids(run_id))
        return digest in ids
