"""Read-side queries over the projection stores (state, context, lists, history, dead letters).

A :class:`Projection` opens each partition's store read-only on first use and keeps it
open: the view is consistent as of that open (RocksDB read-only instances include the
writer's WAL); a long-lived reader closes and reopens it to see newer writes. Opening
read-only never blocks or disturbs the projector.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from runstate.projector.core.outcomes import DeadLetter
from runstate.projector.read.context import render_context
from runstate.projector.store.partition import ProjectionStore, ReadOnlyStores
from runstate.projector.store.statedir import Layout
from runstate.schemas.errors import RunNotFound, StoreError
from runstate.schemas.patch import Decision
from runstate.schemas.state import RunHeader, RunState, state_digest

__all__ = ["Projection", "decision_reader", "state_digest"]

T = TypeVar("T")


class Projection:
    """Queries over ``state_dir``. Not thread-safe; cheap to create. ``live``: a projector's
    own open stores by partition, read instead of opening one read-only (they see its writes
    as they land) and never closed here."""

    def __init__(self, state_dir: str | os.PathLike[str], live: Mapping[int, ProjectionStore] | None = None) -> None:
        self.layout = Layout(state_dir)
        self._stores = ReadOnlyStores(self.layout)
        self._live = live or {}

    def _store(self, partition: int) -> ProjectionStore | None:
        return self._live.get(partition) or self._stores.get(partition)

    def partitions(self) -> int:
        return self.layout.read()[1]

    def header(self, run_id: str) -> RunHeader | None:
        st = self._store(self.layout.partition_of(run_id))
        return None if st is None else st.header(run_id)

    def state(self, run_id: str) -> RunState:
        """The run's current state: :meth:`state_json` validated. Raises :class:`RunNotFound`."""
        return self._state(run_id, lambda st: st.read_state(run_id))

    def state_json(self, run_id: str) -> bytes:
        """The run's current state as JSON, the document :meth:`state` validates and
        :meth:`state_data` parses, joined from the stored records and not validated again:
        for records this runstate stored, the validated state's ``model_dump_json`` byte for
        byte (a property test holds it). Raises :class:`RunNotFound`, and
        :class:`StoreError` for a header of another schema version or not JSON."""
        return self._state(run_id, lambda st: st.read_state(run_id, "json"))

    def state_data(self, run_id: str) -> dict[str, Any]:
        """The run's current state as plain JSON data: the document :meth:`state` validates
        (equal to its ``model_dump(mode="json")``, keys in the same order), without
        building the models; for callers that pass the state on as JSON (serve, prompts).
        Raises :class:`RunNotFound`."""
        return self._state(run_id, lambda st: st.read_state(run_id, "data"))

    def context(self, run_id: str, *, now: datetime | None = None, max_tokens: int | None = None) -> str:
        """The run's compact context for a prompt (:func:`render_context` of its current
        state; ``now`` enables the stale flags), rendered from :meth:`state_json` decoded
        into the state's msgspec struct, with no model built. Raises :class:`RunNotFound`,
        and :class:`StoreError` where :meth:`state` would."""
        return render_context(
            self._state(run_id, lambda st: st.read_state(run_id, "struct")), now=now, max_tokens=max_tokens
        )

    def _state(self, run_id: str, read: Callable[[ProjectionStore], T | None]) -> T:
        """``read`` on the run's partition store; :class:`RunNotFound` where it gives None."""
        st = self._store(self.layout.partition_of(run_id))
        got = None if st is None else read(st)
        if got is None:
            raise RunNotFound(run_id)
        return got

    def graph_checkpoints(
        self,
        run_id: str,
        ns: str | None,
        *,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[bytes]:
        """The run's LangGraph checkpoints as stored JSON, newest first
        (:meth:`ProjectionStore.graph_checkpoints`); an unknown run has none, and so has
        every run before the projector made its state directory."""
        if not self.layout.file.exists():
            return []
        st = self._store(self.layout.partition_of(run_id))
        if st is None:
            return []
        return st.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit)

    def decision(self, run_id: str, patch_id: str) -> Decision | None:
        st = self._store(self.layout.partition_of(run_id))
        return None if st is None else st.decision(run_id, patch_id)

    def decision_at(self, run_id: str, offset: int) -> Decision | None:
        """The decision on the run's record at ``offset``, or None."""
        st = self._store(self.layout.partition_of(run_id))
        return None if st is None else st.decision_at(run_id, offset)

    def history(self, run_id: str) -> list[Decision]:
        """Every decided patch of the run in log order (empty if none)."""
        st = self._store(self.layout.partition_of(run_id))
        return [] if st is None else st.history(run_id)

    def accepted_since(self, run_id: str, after_revision: int) -> list[Decision]:
        """The run's accepted decisions above ``after_revision``, in log order (see
        :meth:`ProjectionStore.accepted_since`)."""
        st = self._store(self.layout.partition_of(run_id))
        return [] if st is None else st.accepted_since(run_id, after_revision)

    def accepted_positions(
        self, run_id: str, after_revision: int, up_to_revision: int | None = None
    ) -> list[tuple[int, int, int]]:
        """``(revision, partition, offset)`` of those decisions, up to ``up_to_revision`` (see
        :meth:`ProjectionStore.accepted_positions`)."""
        st = self._store(self.layout.partition_of(run_id))
        return [] if st is None else st.accepted_positions(run_id, after_revision, up_to_revision)

    def runs(self, status: str | None = None) -> list[RunHeader]:
        """Headers of every run (sorted by run id), optionally of one status."""
        out: list[RunHeader] = []
        for p in range(self.partitions()):
            st = self._store(p)
            if st is not None:
                out.extend(h for h in st.headers() if status is None or h.status == status)
        return sorted(out, key=lambda h: h.run_id)

    def positions(self) -> dict[int, int]:
        """Next offset to apply, per partition with a store."""
        out = {}
        for p in range(self.partitions()):
            st = self._store(p)
            if st is not None:
                out[p] = st.next_offset()
        return out

    def restored(self) -> dict[str, int]:
        """Runs restored from checkpoints -> offset covered (their earlier history is absent)."""
        out: dict[str, int] = {}
        for p in range(self.partitions()):
            st = self._store(p)
            if st is not None:
                out.update(st.restored())
        return out

    def dead_letters(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for p in range(self.partitions()):
            st = self._store(p)
            if st is not None:
                out.extend(st.dead_letters())
        return out

    def erasing(self) -> list[str]:
        """Runs whose erasure this projection stored but has not finished."""
        out: list[str] = []
        for p in range(self.partitions()):
            st = self._store(p)
            if st is not None:
                out.extend(st.erasing())
        return sorted(out)

    def digests(self) -> dict[str, str]:
        """State digest per run."""
        out = {}
        for p in range(self.partitions()):
            st = self._store(p)
            if st is None:
                continue
            for h in st.headers():
                # What a query reads is what is proved equal to the replay.
                state = st.read_state(h.run_id, erased=True)
                if state is None:  # pragma: no cover - header without state cannot happen
                    raise StoreError(f"run {h.run_id!r} has a header but no state")
                out[h.run_id] = state_digest(state)
        return out

    def close(self) -> None:
        self._stores.close()

    def __enter__(self) -> Projection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _from_projection(state_dir: str | os.PathLike[str], read: Callable[[Projection], T | None]) -> T | None:
    """``read`` on the projection in ``state_dir`` opened now (a read-only RocksDB view is
    fixed at open: a poll reopens it to see new writes), or None while there is none."""
    if not (Path(state_dir) / "layout.json").exists():
        return None  # no projector has started yet
    try:
        with Projection(state_dir) as proj:
            return read(proj)
    except StoreError:
        return None  # the partition's store is not created yet


def decision_at_reader(state_dir: str | os.PathLike[str]) -> Callable[[str, int], Decision | None]:
    """``RunProducer``'s ``decisions_at``: the decision on a run's record at an offset, read
    from the projection in ``state_dir`` (None while there is none)."""
    return lambda run_id, offset: _from_projection(state_dir, lambda proj: proj.decision_at(run_id, offset))


def decision_reader(state_dir: str | os.PathLike[str]) -> Callable[[str, str], Decision | None]:
    """A decision source for :class:`runstate.producers.RunProducer` (``decisions=``): reads
    the decision on ``(run_id, patch_id)`` from the projection in ``state_dir``, or None
    while there is none (no projector has started, or it has not decided yet)."""
    return lambda run_id, patch_id: _from_projection(state_dir, lambda proj: proj.decision(run_id, patch_id))
