"""One ``runstate serve`` instance: the projector (and the snapshotter) in background
threads, an appender thread that group-commits patches, and the hub that tells waiting
requests about decisions.

Threads and who owns what:

- the **projector** thread is the single writer of the partitions this instance owns (a
  member of the projector's consumer group). ``Projector.lock`` is held while a batch is
  written and while its set of partitions changes; a reader holding it sees whole batches
  of partitions it owns, never a store being closed under it;
- the **snapshotter** thread writes checkpoints (its own consumer group);
- the **appender** thread owns the log producer: requests queue patches, it appends all
  that are queued and flushes once (group commit), then resolves each request;
- the **decision feed** thread (when decisions are published, i.e. on Kafka) follows the
  decisions topic, so a decision made by another instance reaches its waiter here;
- the asyncio loop (uvicorn) runs the handlers; the other threads reach the :class:`Hub`
  only through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runstate.app import make_projector, make_snapshotter, nearest_checkpoint, open_settings_log
from runstate.eventlog.base import EventLog
from runstate.eventlog.partitioner import partition_for
from runstate.producers.decisions import DecisionFeed
from runstate.producers.run_producer import Receipt, RunProducer
from runstate.projector.read.replay import NearestCheckpoint
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.projector.core.working import RunDoc
from runstate.schemas import codec, structs
from runstate.schemas.errors import RunstateError
from runstate.schemas.patch import Author, Decision, Patch
from runstate.settings import Settings
from runstate.snapshotter.loop import Snapshotter

log = logging.getLogger("runstate.serve")
T = TypeVar("T")

#: The client id prefix by which serve instances advertise their address in the group.
CLIENT_ID_PREFIX = "runstate-serve|"


def _name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (Linux; 15 bytes), so that
    ``top -H``, ``ps -L`` and a bench's per-thread CPU tell an instance's threads apart
    (librdkafka names its own). Elsewhere, nothing."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class NotOwner(RunstateError):
    """This instance does not (or not yet) own the run's partition."""

    def __init__(self, partition: int, why: str = "owned by another instance") -> None:
        super().__init__(f"partition {partition} is {why}")
        self.partition = partition


class Unavailable(RunstateError):
    """No instance can answer now (rebalancing, owner gone, this one stopping); retry after
    ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Watch:
    min_revision: int
    future: asyncio.Future[None]


class Hub:
    """Decisions -> the requests waiting for them (loop thread only).

    - ``wait_decision``: a future per ``(run_id, patch_id)``, registered before the append;
    - ``wait_revision``: wakes ``min_revision`` readers when an accepted decision reaches it;
    - ``subscribe``: a queue per SSE stream of a run.
    """

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], list[asyncio.Future[Decision]]] = {}
        #: run -> how many of its patches ``decisions`` waits for (what :meth:`follows` reads)
        self._waited: dict[str, int] = {}
        self.watches: dict[str, list[_Watch]] = {}
        self.streams: dict[str, set[asyncio.Queue[Decision]]] = {}
        self.on_decision: list[Callable[[Decision, bool], None]] = []
        #: why the instance stops (a thread of it died), once it does: see :meth:`fail`
        self.failed: str | None = None

    def follows(self, run_id: str) -> bool:
        """Whether a request here waits for a decision of ``run_id`` (a patch, a revision,
        an event stream): the decision feed decodes only those runs' decisions. Read from
        the feed's thread: each look-up is one dict membership test, and a waiter registers
        before its patch is appended, so no decision it waits for can pass unseen."""
        return run_id in self._waited or run_id in self.watches or run_id in self.streams

    def _unwait(self, run_id: str, n: int) -> None:
        left = self._waited.get(run_id, 0) - n
        if left > 0:
            self._waited[run_id] = left
        else:
            self._waited.pop(run_id, None)

    def publish(self, decisions: list[Decision], local: bool) -> None:
        """``local``: decided by this instance's projector (counted once, in metrics)."""
        for d in decisions:
            self.answer(d)
            for w in self.watches.get(d.run_id, ()):
                if d.revision >= w.min_revision and not w.future.done():
                    w.future.set_result(None)
            for q in self.streams.get(d.run_id, ()):
                q.put_nowait(d)
            for cb in self.on_decision:
                cb(d, local)

    def answer(self, d: Decision) -> None:
        """Resolve the requests waiting for ``d``'s patch, and only them (what a decision
        found in the store, rather than made by a batch, is owed: see ``Node.on_assign``)."""
        waiting = self.decisions.pop((d.run_id, d.patch_id), ())
        if waiting:
            self._unwait(d.run_id, len(waiting))
        for f in waiting:
            if not f.done():
                f.set_result(d)

    def awaited(self) -> list[tuple[str, str]]:
        """The ``(run_id, patch_id)`` of every patch a request here waits for."""
        return list(self.decisions)

    def fail(self, why: str) -> None:
        """The instance stops (a thread of it died, so no decision will come here): every
        request waiting for one is answered :class:`Unavailable` at once, and so is every
        later one, rather than waiting out the shutdown's grace and being cancelled."""
        self.failed = why
        for f in [
            *(f for fs in self.decisions.values() for f in fs),
            *(w.future for ws in self.watches.values() for w in ws),
        ]:
            self._refuse(f)

    def stopping(self) -> Unavailable:
        """What a request is answered once the instance stops (see :meth:`fail`)."""
        return Unavailable(
            f"this instance is stopping ({self.failed}); a patch it appended is decided by "
            "whichever instance projects its partition next: send it again with the same patch_id"
        )

    def _refuse(self, f: asyncio.Future[Any]) -> None:
        if not f.done() and self.failed is not None:
            f.set_exception(self.stopping())
            f.exception()  # retrieved: a request that stopped waiting is no error to log

    def expect(self, run_id: str, patch_id: str) -> asyncio.Future[Decision]:
        f: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.decisions.setdefault((run_id, patch_id), []).append(f)
        self._waited[run_id] = self._waited.get(run_id, 0) + 1
        self._refuse(f)
        return f

    def forget(self, run_id: str, patch_id: str, f: asyncio.Future[Decision]) -> None:
        waiting = self.decisions.get((run_id, patch_id))
        if waiting is not None and f in waiting:
            waiting.remove(f)
            self._unwait(run_id, 1)
            if not waiting:
                del self.decisions[(run_id, patch_id)]

    def watch(self, run_id: str, min_revision: int) -> _Watch:
        w = _Watch(min_revision, asyncio.get_running_loop().create_future())
        self.watches.setdefault(run_id, []).append(w)
        self._refuse(w.future)
        return w

    def unwatch(self, run_id: str, w: _Watch) -> None:
        ws = self.watches.get(run_id)
        if ws is not None and w in ws:
            ws.remove(w)
            if not ws:
                del self.watches[run_id]

    def subscribe(self, run_id: str) -> asyncio.Queue[Decision]:
        q: asyncio.Queue[Decision] = asyncio.Queue()
        self.streams.setdefault(run_id, set()).add(q)
        return q

    def unsubscribe(self, run_id: str, q: asyncio.Queue[Decision]) -> None:
        qs = self.streams.get(run_id)
        if qs is not None:
            qs.discard(q)
            if not qs:
                del self.streams[run_id]


@dataclass
class RestoreProgress:
    done: int = 0
    total: int = 0


@dataclass
class NodeHealth:
    failed: str | None = None
    restoring: dict[int, RestoreProgress] = field(default_factory=dict)


class Node:
    """See the module docstring. ``advertise`` is the URL other instances forward to."""

    def __init__(
        self,
        settings: Settings,
        advertise: str,
        *,
        snapshotter: bool = True,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.advertise = advertise
        self.log: EventLog = open_settings_log(settings)
        self.log.check_topics()
        self.partitions = self.log.partitions(self.log.topics.events)
        self.hub = Hub()
        self.health = NodeHealth()
        self.on_fatal = on_fatal
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.projector = make_projector(
            settings,
            self.log,
            hooks=self,
            client_id=CLIENT_ID_PREFIX + advertise,
            on_restore_progress=self._restore_progress,
            tune_gc=True,
        )
        self.snapshotter: Snapshotter | None = None
        if snapshotter:
            self.snapshotter = make_snapshotter(settings, open_settings_log(settings))
        # Generated here, before uvicorn accepts: on the first request it held the event
        # loop long enough to queue every request behind it.
        codec.prepare(writer=True)
        self.producer = RunProducer(
            self.log,
            Author(agent_id=settings.agent_id, agent_version=settings.agent_version),
            max_patch_bytes=settings.max_patch_bytes,
        )
        self._feed: DecisionFeed | None = None
        self._appends: queue.Queue[tuple[Patch, bytes, Future[Receipt]] | None] = queue.Queue()

    # -- life cycle ----------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._spawn("projector", lambda: self.projector.run(stop=self._stop))
        if self.snapshotter is not None:
            snap = self.snapshotter
            self._spawn("snapshotter", lambda: snap.run(stop=self._stop))
        self._spawn("appender", self._append_loop)
        if self.settings.decisions_published():
            # Positioned now, before the first request is served: no decision slips past it.
            feed_log = open_settings_log(self.settings)
            feed = DecisionFeed(feed_log, keys=self.settings.instance_keys())
            self._feed = feed
            self._spawn("decisions", lambda: self._feed_loop(feed, feed_log))

    def _spawn(self, name: str, target: Callable[[], object]) -> None:
        def run() -> None:
            _name_os_thread(f"rs-{name}")
            try:
                target()
            except BaseException as e:  # a dead projector must not leave a server answering
                log.exception("%s thread failed", name)
                self.health.failed = f"{name}: {type(e).__name__}: {e}"
                if self.loop is not None:
                    with contextlib.suppress(RuntimeError):  # a loop already closed: nobody waits
                        self.loop.call_soon_threadsafe(self.hub.fail, self.health.failed)
                if self.on_fatal is not None:
                    self.on_fatal(self.health.failed)

        t = threading.Thread(target=run, name=f"runstate-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish and store the batch in hand, leave the groups, deliver queued patches."""
        self._stop.set()
        self._appends.put(None)
        for t in self._threads:
            t.join(timeout_s)
        try:
            self.producer.close()
        finally:
            self.log.close()
            if self.snapshotter is not None:
                self.snapshotter.projector.log.close()

    @property
    def decisions_ignored(self) -> int:
        """Records on the decisions topic no projector holding the instance secret signed."""
        return 0 if self._feed is None else self._feed.ignored

    # -- ownership and reads --------------------------------------------------------------

    def partition_of(self, run_id: str) -> int:
        return partition_for(run_id, self.partitions)

    def owned(self) -> list[int]:
        with self.projector.lock:
            return sorted(self.projector.parts)

    def read(self, run_id: str, fn: Callable[[ProjectionStore], T]) -> T:
        """``fn(store)`` on the run's partition store, if this instance owns it. Raises
        :class:`NotOwner`."""
        p = self.partition_of(run_id)
        with self.projector.lock:
            part = self.projector.parts.get(p)
            if part is None:
                raise NotOwner(p, self._not_open_why(p))
            return fn(part.store)

    def _not_open_why(self, partition: int) -> str:
        """Why this instance holds no store of ``partition``, as a :class:`NotOwner` says it."""
        if partition in self.health.restoring:
            return "being restored"
        if not self.settings.log.startswith("kafka://"):
            return "not open yet: this instance is starting"  # the embedded log's one projector
        return "owned by another instance"

    def nearest_checkpoint(self) -> NearestCheckpoint:
        """Time travel's checkpoint look-up (:func:`runstate.app.nearest_checkpoint`), read
        from this instance's snapshotter store where it holds the run's partition (under its
        lock, which a revocation takes to close the store): no store opened per request, and
        what the snapshotter wrote a moment ago (an erasure) seen at once."""
        elsewhere = nearest_checkpoint(self.settings)
        snap = self.snapshotter
        if snap is None:
            return elsewhere

        def nearest(run_id: str, revision: int) -> dict[str, Any] | None:
            with snap.projector.lock:
                part = snap.projector.parts.get(self.partition_of(run_id))
                if part is not None:
                    store = part.store
                    return nearest_checkpoint(self.settings, lambda _p: store)(run_id, revision)
            return elsewhere(run_id, revision)

        return nearest

    def caught_up(self, run_id: str) -> bool:
        """Whether the projector has applied everything the log holds (as its consumer last
        saw the log's end) on the run's partition. Raises :class:`NotOwner`."""
        p = self.partition_of(run_id)
        lags = self.projector.lags()
        if p not in lags:
            raise NotOwner(p)
        return lags[p] == 0

    def read_partitions(self, fn: Callable[[int, ProjectionStore], T]) -> dict[int, T]:
        """``fn`` on every owned partition's store."""
        with self.projector.lock:
            return {p: fn(p, part.store) for p, part in sorted(self.projector.parts.items())}

    # -- writes -----------------------------------------------------------------------------

    def append(self, patch: Patch, data: bytes) -> Future[Receipt]:
        """Queue an encoded patch for the appender; the future gets its receipt."""
        f: Future[Receipt] = Future()
        self._appends.put((patch, data, f))
        return f

    def _append_loop(self) -> None:
        while True:
            item = self._appends.get()
            items = [item]
            while True:  # everything queued meanwhile goes in the same commit
                try:
                    items.append(self._appends.get_nowait())
                except queue.Empty:
                    break
            # A request given up on meanwhile (an MCP cancellation, a shutdown's deadline)
            # cancelled its future: its patch is not appended, and a future marked running
            # can no longer be cancelled, so answering it cannot raise in this thread.
            live = [i for i in items if i is not None and i[2].set_running_or_notify_cancel()]
            for patch, data, fut in live:

                def done(r: Receipt | None, err: Exception | None, fut: Future[Receipt] = fut) -> None:
                    if err is not None:
                        fut.set_exception(err)
                    else:
                        assert r is not None
                        fut.set_result(r)

                try:
                    self.producer.append_async(patch, done, data)
                except Exception as e:
                    fut.set_exception(e)
            if live:
                self.producer.flush(30.0)
            if None in items:
                return

    # -- projector hooks (projector thread) ----------------------------------------------------

    def on_assign(self, partition: int, store: ProjectionStore) -> None:
        self.health.restoring.pop(partition, None)
        if self.loop is not None:
            # A restore takes decisions from the checkpoints and replays what they hold as
            # duplicates, and neither tells a waiting request: a patch appended as this
            # instance started, which the snapshotter checkpointed first, would leave its
            # request to wait out its wait. Such requests are answered from the store.
            self.loop.call_soon_threadsafe(self._answer_from_store, partition)

    def _answer_from_store(self, partition: int) -> None:
        """(Loop thread.) Answer each request waiting for a patch of ``partition`` whose
        decision the store holds."""
        for run_id, patch_id in self.hub.awaited():
            if self.partition_of(run_id) != partition:
                continue
            try:
                d = self.read(run_id, lambda st, r=run_id, q=patch_id: st.decision(r, q))
            except NotOwner:
                return  # revoked meanwhile: the next owner's decision reaches the feed
            if d is not None:
                self.hub.answer(d)

    def on_accepted(self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch) -> None:
        pass

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        if batch.decisions and self.loop is not None:
            # The core's decisions are structs (projector/core/decide.py); waiters get models.
            self.loop.call_soon_threadsafe(self.hub.publish, [structs.to_model(d) for d in batch.decisions], True)

    def _restore_progress(self, partition: int, done: int, total: int) -> None:
        self.health.restoring[partition] = RestoreProgress(done, total)

    def _feed_loop(self, feed: DecisionFeed, feed_log: EventLog) -> None:
        try:
            while not self._stop.is_set():
                decisions = feed.poll(0.2, wanted=self.hub.follows)
                if decisions and self.loop is not None:
                    self.loop.call_soon_threadsafe(self.hub.publish, decisions, False)
        finally:
            feed.close()
            feed_log.close()
