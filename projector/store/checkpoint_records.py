"""The snapshotter's records in its own partition store: each run's checkpoint history
(whole checkpoints and heads, by revision), the pieces those heads stand for, the digest
state of the newest, and the outbox of checkpoints stored but not yet published."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rocksdict import WriteBatch

from runstate.projector.store import keys
from runstate.projector.store.rocks import RocksStore


class CheckpointRecords(RocksStore):
    """The snapshotter's part of a partition store (written with the projector's batch)."""

    def outbox(self) -> list[tuple[str, int, bytes]]:
        """Checkpoints stored but not yet published: ``(run_id, revision, records)``."""
        return [(*keys.run_and_revision(k, keys.OUTBOX), v) for k, v in self._prefix(keys.OUTBOX)]

    def clear_outbox(self, published: Iterable[tuple[str, int]]) -> None:
        """Those checkpoints are published (acknowledged by the log)."""
        wb = WriteBatch(raw_mode=True)
        for run, rev in published:
            wb.delete(keys.outbox_key(run, rev))
        self._apply(wb)

    def checkpoints(self, run_id: str) -> list[tuple[int, bytes]]:
        """The run's stored checkpoints as ``(revision, encoded)``, oldest first."""
        return [
            (keys.run_and_revision(k, keys.CHECKPOINTS)[1], v) for k, v in self._prefix(keys.checkpoints_prefix(run_id))
        ]

    def checkpoints_at_or_below(self, run_id: str, revision: int) -> Iterator[tuple[int, bytes]]:
        """The run's stored checkpoints at or below ``revision``, newest first, read one at
        a time (a caller that takes the first valid one reads only that one)."""
        for k, v in self._prefix_reversed(keys.checkpoints_prefix(run_id), keys.checkpoint_key(run_id, revision)):
            yield keys.run_and_revision(k, keys.CHECKPOINTS)[1], v

    def pieces_at(self, run_id: str, revision: int | None = None) -> dict[str, tuple[int, bytes]]:
        """Each piece of the run as its newest checkpoint at or below ``revision`` (None:
        the newest) published it: ``name -> (revision, value)``."""
        out: dict[str, tuple[int, bytes]] = {}
        prefix = keys.pieces_prefix(run_id)
        n = len(prefix)
        # A version's revision is fixed-width hex: compared as bytes, in order.
        upto = None if revision is None else keys.revision_suffix(revision)
        for k, v in self._prefix(prefix):
            piece, rev = k[n:].rsplit(b"\0", 1)
            if upto is None or rev <= upto:
                out[piece.decode()] = (int(rev, 16), v)  # versions of a piece come oldest first
        return out

    def piece(self, run_id: str, piece: str) -> bytes | None:
        """The newest published value of one piece of the run, or None."""
        start = keys.piece_version_key(run_id, piece, 0)
        for k, v in self._prefix_reversed(start[:-16], start[:-16] + b"\xff"):
            return v
        return None

    def tally(self, run_id: str) -> bytes | None:
        """The digest state of the run's newest checkpoint (opaque), or None."""
        return self._get(keys.tally_key(run_id))

    def all_checkpoints(self) -> Iterator[tuple[str, bytes]]:
        """Every stored checkpoint as ``(run_id, encoded)``, by run then revision."""
        for k, v in self._prefix(keys.CHECKPOINTS):
            yield keys.run_of(k, keys.CHECKPOINTS), v
