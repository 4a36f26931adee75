"""Where a handle sends patches and reads state: the local log in a directory (a projector in
this process) or a ``runstate serve``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from runstate.schemas.errors import (
    DecisionTimeout,
    LogError,
    RunNotFound,
)
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import RunState

log = logging.getLogger("runstate.agent")
#: How long opening a handle waits for its projector to hold the log's group (or find it taken).
_JOIN_S = 10.0


class Backend(Protocol):
    """Where a :class:`Run` sends patches and reads state: the local log or a serve."""

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision: ...
    def state(self, run_id: str, min_revision: int | None) -> RunState: ...
    def context(self, run_id: str, min_revision: int | None) -> str: ...
    def history(self, run_id: str) -> list[Decision]: ...
    def erase(self, run_id: str, reason: str) -> bool: ...
    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]: ...
    def run_ids(self) -> list[str]: ...
    def close(self) -> None: ...


class _Live:
    """The in-process projector's hooks, for the local backend: a decision reaches its
    waiter when its batch is stored (no polling of the projection), and reads use the
    projector's own stores (no read-only store opened per read)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.stores: dict[int, Any] = {}
        self.changed = threading.Condition()
        #: decisions awaited by a submit in this process, once made
        self.awaited: dict[tuple[str, str], Decision | None] = {}
        #: set once the projector holds every partition's store, or found the group taken
        self.ready = threading.Event()

    def on_assign(self, partition: int, store: Any) -> None:
        self.stores[partition] = store
        if len(self.stores) >= self.partitions:
            self.ready.set()

    def on_accepted(self, partition: int, patch: Any, decision: Any, doc: Any, batch: Any) -> None:
        pass

    def after_write(self, partition: int, batch: Any, store: Any) -> None:
        from runstate.schemas import structs

        with self.changed:
            for d in batch.decisions:
                key = (d.run_id, d.patch_id)
                if key in self.awaited:
                    self.awaited[key] = structs.to_model(d)
            self.changed.notify_all()


class _Local:
    """The embedded log and projections under one directory (``log.db``, ``state/``); with
    ``project``, a projector runs in this process for as long as the backend is open."""

    def __init__(self, where: Path, author: Author, project: bool) -> None:
        from runstate.app import open_settings_log
        from runstate.producers import RunProducer
        from runstate.projector import Projector, decision_at_reader, decision_reader
        from runstate.settings import Settings

        where.mkdir(parents=True, exist_ok=True)
        self.state_dir = str(where / "state")
        self.author = author
        # RUNSTATE_MASTER_KEY (or _FILE) seals the runs' content, as everywhere: then erasable.
        settings = Settings(log=str(where / "log.db"), state_dir=self.state_dir)
        self.log = open_settings_log(settings)
        # RUNSTATE_MAX_PATCH_BYTES holds here as everywhere (the error names it).
        self.producer = RunProducer(
            self.log,
            author,
            decisions=decision_reader(self.state_dir),
            decisions_at=decision_at_reader(self.state_dir),
            max_patch_bytes=settings.max_patch_bytes,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: _Live | None = None
        self._layout: Any = None
        if project:
            live = _Live(self.log.partitions(self.log.topics.events))
            projector = Projector(
                self.log, self.state_dir, publish_dead_letters=False, hooks=live, destroy_erased_keys=True
            )
            taken: list[str] = []

            def run() -> None:
                try:
                    projector.run(stop=self._stop, poll_timeout_s=0.02)
                except LogError as e:
                    if "already has a member" not in str(e):
                        raise
                    taken.append(str(e))
                    live.ready.set()

            self._thread = threading.Thread(target=run, name="runstate-projector", daemon=True)
            self._thread.start()
            # Until the projector holds the log's group, or another process (or handle) does:
            # then that one decides, and this handle appends and reads its decisions from
            # the projection (as with project=False), instead of waiting on a dead thread.
            live.ready.wait(_JOIN_S)
            if taken:
                log.info(
                    "another projector decides %s (%s): this handle appends and reads its decisions",
                    where,
                    taken[0].split(": ", 1)[-1].split(".", 1)[0],
                )
                self._thread = None
            else:
                self._live = live

    def _store(self, run_id: str) -> Any:
        """The in-process projector's store of the run's partition, or None (no projector here, or not yet assigned)."""
        if self._live is None or not self._live.stores:
            return None
        from runstate.projector.store.statedir import Layout

        if self._layout is None:
            self._layout = Layout(self.state_dir)
        return self._live.stores.get(self._layout.partition_of(run_id))

    def _read(self, run_id: str, min_revision: int | None, how: str, timeout_s: float = 10.0) -> Any:
        """``Projection.<how>(run_id)``, once the projection holds ``min_revision`` (the
        handle's own writes); without one, as it is now. Raises ``RunNotFound``."""
        import time

        from runstate.projector import Projection

        deadline = time.monotonic() + timeout_s
        live = self._live.stores if self._live is not None else None
        while True:
            # The in-process projector's stores where it has them, else opened anew each time:
            # a read-only store sees the projection as of its opening.
            with Projection(self.state_dir, live) as proj:
                try:
                    if min_revision is None or proj.state_data(run_id)["revision"] >= min_revision:
                        return getattr(proj, how)(run_id)
                except RunNotFound:
                    if min_revision is None or time.monotonic() > deadline:
                        raise
                if time.monotonic() > deadline:
                    return getattr(proj, how)(run_id)
            if self._live is not None:  # woken by the projector's next stored batch
                with self._live.changed:
                    self._live.changed.wait(0.02)
            else:
                time.sleep(0.02)

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        patch = self.producer.build(run_id, draft)
        live = self._live
        if live is None:
            return self.producer.submit(patch, timeout_s=timeout_s)
        import time

        key = (run_id, patch.patch_id)
        with live.changed:
            live.awaited[key] = None
        try:
            self.producer.append(patch)
            deadline = time.monotonic() + timeout_s
            with live.changed:
                while (d := live.awaited[key]) is None and time.monotonic() < deadline:
                    live.changed.wait(0.05)
                    if live.awaited[key] is None and (st := self._store(run_id)) is not None:
                        # A resent patch id gets no new decision: the earlier one is the answer.
                        live.awaited[key] = st.decision(run_id, patch.patch_id)
            if d is not None:
                return d
            try:  # the projection's answer, last (a decision stored before this wait began)
                return self.producer.wait(run_id, patch.patch_id, 0.0)
            except DecisionTimeout:
                raise DecisionTimeout(run_id, patch.patch_id, timeout_s) from None
        finally:
            with live.changed:
                live.awaited.pop(key, None)

    def state(self, run_id: str, min_revision: int | None) -> RunState:
        return self._read(run_id, min_revision, "state")  # type: ignore[no-any-return]

    def context(self, run_id: str, min_revision: int | None) -> str:
        return self._read(run_id, min_revision, "context")  # type: ignore[no-any-return]

    def history(self, run_id: str) -> list[Decision]:
        return self._read(run_id, None, "history")  # type: ignore[no-any-return]

    def erase(self, run_id: str, reason: str) -> bool:
        """Erase the run (False: content is not sealed here, no master key; nothing done)."""
        from runstate.app import erase_run
        from runstate.eventlog.sealed import SealedLog

        if not isinstance(self.log, SealedLog):
            return False
        try:
            done = erase_run(self.log, run_id, reason, self.author.agent_id, self.author, 0)
        except RunNotFound:
            return True  # nothing of it was ever sealed: nothing to erase
        if done.first and done.patch_id is not None:
            self.producer.wait(run_id, done.patch_id, 10.0)
        return True

    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        import orjson

        from runstate.projector import Projection

        st = self._store(run_id)
        if st is not None:  # the projector's own store: what it decided is there
            raw = st.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit)
        else:
            with Projection(self.state_dir) as proj:
                raw = proj.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit)
        return [orjson.loads(r) for r in raw]

    def run_ids(self) -> list[str]:
        """Every run of the projection (what LangGraph's ``delete_for_runs`` searches)."""
        from runstate.projector import Projection

        with Projection(self.state_dir) as proj:
            return [h.run_id for h in proj.runs()]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.producer.close()
        self.log.close()


class _Remote:
    """A ``runstate serve`` at ``url`` (``runstate.client.Client``): the author is the token's."""

    def __init__(self, url: str, token: str | None, author: Author) -> None:
        from runstate.client import Client

        self.client = Client(url, token)
        self.author = author

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        return self.client.submit(run_id, {**draft, "author": self.author.model_dump()}, timeout_s=timeout_s)

    def state(self, run_id: str, min_revision: int | None) -> RunState:
        return self.client.state(run_id, min_revision=min_revision)

    def context(self, run_id: str, min_revision: int | None) -> str:
        return self.client.context(run_id, min_revision=min_revision)

    def history(self, run_id: str) -> list[Decision]:
        return self.client.history(run_id)

    def erase(self, run_id: str, reason: str) -> bool:
        from runstate.client import ServiceError

        try:
            self.client.erase(run_id, reason)
        except ServiceError as e:
            if e.status == 409:
                return False  # the deployment seals no content
            if e.status != 404:
                raise
        return True

    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        return self.client.graph_checkpoints(run_id, ns=ns, checkpoint_id=checkpoint_id, before=before, limit=limit)

    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.client.runs()]

    def close(self) -> None:
        self.client.close()


def backend(where: str | Path, author: Author, *, token: str | None = None, project: bool = True) -> Backend:
    """The backend for ``where``: a ``runstate serve`` for an ``http(s)://`` URL (``token``
    if it needs one), else the embedded log and projections in that directory (created if
    missing; ``project``: with a projector in this process while the backend is open)."""
    text = str(where)
    if text.startswith(("http://", "https://")):
        return _Remote(text, token, author)
    return _Local(Path(text), author, project)
