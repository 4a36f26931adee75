"""The local checkpoint history (in the snapshotter's stores): list, latest, nearest <= N."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from runstate.eventlog.partitioner import partition_for
from runstate.projector.store.statedir import Layout
from runstate.projector.store.partition import ProjectionStore
from runstate.schemas.errors import CheckpointInvalid
from runstate.snapshotter.checkpoint import Checkpoint, SigningKey, state_data_of, validate

#: What a check of a checkpoint record gives.
T = TypeVar("T")


class CheckpointHistory:
    """Read-only view of the checkpoints the snapshotter wrote under ``<state_dir>/snapshotter``."""

    def __init__(self, snapshotter_dir: str | os.PathLike[str], key: SigningKey = None) -> None:
        self.layout = Layout(snapshotter_dir)
        self.key = key
        self._stores: dict[int, ProjectionStore] = {}

    def available(self) -> bool:
        return self.layout.file.exists()

    def _store(self, run_id: str) -> ProjectionStore | None:
        if not self.available():
            return None
        p = partition_for(run_id, self.layout.read()[1])
        if p not in self._stores:
            path = self.layout.store_path(p)
            if not (path / "CURRENT").exists():
                return None
            self._stores[p] = ProjectionStore(path, read_only=True)
        return self._stores[p]

    def of(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, oldest first."""
        st = self._store(run_id)
        if st is None:
            return []
        return [Checkpoint.model_validate_json(v) for _, v in st.checkpoints(run_id)]

    def nearest(self, run_id: str, revision: int) -> Checkpoint | None:
        """The newest *valid* checkpoint at or below ``revision`` (see
        :func:`~runstate.snapshotter.checkpoint.validate`; with this history's key), or None."""
        return self._newest_valid(run_id, revision, validate)

    def nearest_state_data(self, run_id: str, revision: int) -> dict[str, Any] | None:
        """The state of :meth:`nearest`'s checkpoint as plain JSON data
        (:func:`~runstate.snapshotter.checkpoint.state_data_of`: the same checks, no models
        built), or None."""
        return self._newest_valid(run_id, revision, state_data_of)

    def _newest_valid(self, run_id: str, revision: int, check: Callable[[bytes, bytes | None], T]) -> T | None:
        """``check(raw, key)`` of the newest checkpoint at or below ``revision`` that it does
        not refuse (:class:`CheckpointInvalid`: the next older one is tried), or None."""
        st = self._store(run_id)
        if st is None:
            return None
        for _rev, raw in st.checkpoints_at_or_below(run_id, revision):
            try:
                return check(raw, self.key)
            except CheckpointInvalid:
                continue
        return None

    def latest(self, run_id: str) -> Checkpoint | None:
        cps = self.of(run_id)
        return cps[-1] if cps else None

    def close(self) -> None:
        for st in self._stores.values():
            st.close()
        self._stores.clear()

    def __enter__(self) -> CheckpointHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
