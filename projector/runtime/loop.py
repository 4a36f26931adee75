"""The consume loop: log -> decode -> decide/reduce -> one WriteBatch per partition per poll.

Commit order (the one place it is written down):

1. ``poll`` up to ``batch_size`` records from the assigned partitions;
2. decode every record of the batch (a record that is not a patch of the run it is
   keyed by becomes a dead letter with its reason); per partition, read ahead in one
   batched read each what deciding the patches reads from the store (the runs not
   cached, the stored decisions of their patch ids, the items their events' reducers read
   first); then per patch, in log order, decide against the cached working state. A
   run whose stored state cannot be read stops the projector with :class:`StoreError`
   before anything of the batch is written: that is the store's fault, not the record's;
3. per partition: write state changes + decisions + dead letters + the next offset in
   one RocksDB WriteBatch (the position lives with the state, never apart from it);
4. only then: mark the cache settled, copy dead letters to the dead-letter topic (best
   effort, waiting at most ``DEAD_LETTER_FLUSH_S``: the store keeps every one, and a
   crash between 3 and 4 leaves the topic without that copy), and mirror positions to the
   log for lag monitoring.

A crash anywhere before 3 completes loses nothing: on restart the stored offset is where
the batch started, and decide is deterministic, so the batch is decided again identically.
If the WriteBatch fails the cache is discarded (it may hold unwritten changes) and the
error propagates: the projector never continues past state it could not store.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event
from typing import Protocol

from runstate.eventlog.base import EventLog, LogConsumer, Record
from runstate.eventlog.instancekey import InstanceKeys
from runstate.eventlog.sealed import CONTENT_FREE, SealedLog
from runstate.projector.core.outcomes import DeadLetter, Erased
from runstate.projector.core.runbook import InternalErrorPolicy, RunBook, read_record
from runstate.projector.core.working import RunDoc
from runstate.projector.runtime import gc_policy
from runstate.projector.store.keys import patch_id_digest
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.projector.store.statedir import Layout
from runstate.schemas import codec
from runstate.schemas.codec import encode_decision
from runstate.schemas.errors import LogError, LostRecords, StoreError, StoreLocked
from runstate.schemas.patch import Decision, Patch

log = logging.getLogger("runstate.projector")

DEFAULT_GROUP = "runstate-projector"
#: How long a batch (or the shutdown) waits for dead letters to reach the dead-letter topic.
DEAD_LETTER_FLUSH_S = 5.0


@dataclass
class ProjectorStats:
    """Counters since the projector started."""

    records: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    events: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    #: when the first batch was processed (after the group join / restore)
    first_batch_at: float | None = None
    last_batch_at: float | None = None

    def rate(self) -> float:
        """Events per second since the first batch."""
        if self.first_batch_at is None or self.last_batch_at is None:
            return 0.0
        return self.events / max(1e-9, self.last_batch_at - self.first_batch_at)


def _log_failed_decision(_where: object, err: Exception | None) -> None:
    if err is not None:  # the store holds the decision; a waiter elsewhere falls back to asking its owner
        log.warning("could not publish a decision: %s", err)


class _Partition:
    def __init__(self, store: ProjectionStore, cache_runs: int, cache_items_per_run: int) -> None:
        self.store = store
        restored = store.restored()

        def decided_before_restore(run_id: str, patch_id: str) -> bool:
            return run_id in restored and store.decided_before_restore(run_id, patch_id_digest(patch_id))

        self.book = RunBook(
            store.load_doc,
            store.decision,
            max_cached=cache_runs,
            max_items=cache_items_per_run,
            decided_before_restore=decided_before_restore,
            load_docs=store.load_docs,
            load_decisions=store.decisions,
            load_items=store.load_items,
        )
        self.next_offset = store.next_offset()
        # Runs restored from checkpoints: their records up to this offset are already in
        # the restored state and are skipped (by key, without decoding).
        self.skip: dict[bytes, int] = {k.encode(): v for k, v in restored.items() if v >= self.next_offset}
        #: erasures left pending by a key store that could not be written: retried after each batch
        self.erasing = False


class ProjectorHooks(Protocol):
    """Extension points used by the snapshotter (same loop, same pure core)."""

    def on_assign(self, partition: int, store: ProjectionStore) -> None:
        """A partition's store was opened."""

    def on_accepted(self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch) -> None:
        """A patch was accepted; ``doc`` is the run after it. May add to ``batch``."""

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        """``batch`` is stored (called before the next poll)."""


#: ``restore(partition, store)``: fill a partition's brand-new store from checkpoints.
Restorer = Callable[[int, ProjectionStore], object]
#: ``on_replay_progress(records done, records total)``
ReplayProgress = Callable[[int, int], None]


class Projector:
    """Consumes the events topic into per-partition projection stores.

    ``on_progress(stats, lag)`` is called at most every ``progress_every_s`` seconds.
    """

    def __init__(
        self,
        log_: EventLog,
        state_dir: str,
        *,
        group_id: str = DEFAULT_GROUP,
        batch_size: int = 2000,
        cache_runs: int = 10_000,
        cache_items_per_run: int = 1_000,
        on_progress: Callable[[ProjectorStats, int], None] | None = None,
        progress_every_s: float = 1.0,
        lag_every_s: float = 0.2,
        publish_dead_letters: bool = True,
        hooks: ProjectorHooks | None = None,
        restore: Restorer | None = None,
        on_internal_error: InternalErrorPolicy = "dead_letter",
        stall_timeout_s: float = 30.0,
        tune_gc: bool = False,
        publish_decisions: bool = False,
        client_id: str | None = None,
        destroy_erased_keys: bool = False,
        decision_keys: InstanceKeys | None = None,
        linger_s: float = 0.0,
    ) -> None:
        self.log = log_
        #: After a batch smaller than ``batch_size`` that drained the log, wait this long
        #: before the next poll, so that records gather into fewer, larger batches (each
        #: batch has a fixed cost: the store's write, the hooks, the commit). For a consumer
        #: nobody waits on (the snapshotter); the projector answers callers and never lingers.
        self.linger_s = linger_s
        #: A live projector (not a replay) finishes the erasures it takes: the run's keys
        #: destroyed, whoever appended the erasure and whether or not it lived to do so.
        self.destroy_erased_keys = destroy_erased_keys
        self.layout = Layout(state_dir)
        self.group_id = group_id
        self.batch_size = batch_size
        self.cache_runs = cache_runs
        self.cache_items_per_run = cache_items_per_run
        self.on_progress = on_progress
        self.progress_every_s = progress_every_s
        self.lag_every_s = lag_every_s
        #: Long-running processes only (serve, ``runstate project``): see projector/runtime/gc_policy.py.
        self.tune_gc = tune_gc
        self.stats = ProjectorStats()
        self.parts: dict[int, _Partition] = {}
        self._consumer: LogConsumer | None = None
        #: Copies every decision to the decisions topic after its batch is stored (a
        #: notification for waiters elsewhere; at least once, best effort like dead letters).
        self.publish_decisions = publish_decisions
        #: Signs what it copies there, so that a waiter can tell a projector's decision from
        #: anyone else's record on the topic.
        self.decision_keys = decision_keys
        self.publish_dead_letters = publish_dead_letters
        #: Producer of the dead-letter and decisions topics.
        self._out = log_.producer() if publish_dead_letters or publish_decisions else None
        self.client_id = client_id
        #: Held while ``parts`` changes and while a batch is written, so that an in-process
        #: reader (``runstate serve``) holding it sees whole batches of partitions it owns.
        self.lock = threading.RLock()
        self.hooks = hooks
        self.restore = restore
        self.on_internal_error = on_internal_error
        #: ``run(until_caught_up=True)`` gives up (LogError) when records the log says it
        #: has cannot be read for this long: a damaged log must not make a command hang.
        self.stall_timeout_s = stall_timeout_s

    # -- assignment --------------------------------------------------------------------------

    def assign(self, partitions: list[int]) -> dict[int, int]:
        """Open (restoring from checkpoints when new) the stores of ``partitions`` and
        return where each one resumes. The consumer calls this on assignment; a replay
        calls it directly."""
        starts = {}
        ends = self.log.end_offsets(self.log.topics.events) if partitions else {}
        for p in partitions:
            if p not in self.parts:
                fresh = not (self.layout.store_path(p) / "CURRENT").exists()
                store = self._open_store(p)
                if not fresh and self.restore is not None and store.restoring():
                    # A restore a crash interrupted: what it wrote is not a whole state; again.
                    store.close()
                    shutil.rmtree(self.layout.store_path(p))
                    fresh, store = True, self._open_store(p)
                if fresh and self.restore is not None:
                    # New machine, lost disk or moved partition: checkpoints + tail, not offset 0.
                    with gc_policy.batch():
                        self.restore(p, store)
                part = _Partition(store, self.cache_runs, self.cache_items_per_run)
                if part.next_offset > ends.get(p, 0):
                    # Read again: a restore takes checkpoints of records appended since the
                    # ends were read (a snapshotter beside this projector decides them too).
                    ends = self.log.end_offsets(self.log.topics.events)
                if part.next_offset > ends.get(p, 0):
                    store.close()
                    raise LostRecords(
                        p, ends.get(p, 0), part.next_offset, f"the projection ({self.layout.store_path(p)})"
                    )
                with self.lock:
                    self.parts[p] = part
                self._finish_erasures(p, store)  # what a crash left half done
                if self.hooks is not None:
                    self.hooks.on_assign(p, store)
            starts[p] = self.parts[p].next_offset
        log.info("assigned partitions %s at %s", partitions, starts)
        return starts

    def _finish_erasures(self, partition: int, store: ProjectionStore) -> None:
        """Finish every erasure the store holds as pending: the runs' keys destroyed (a live
        projector on a sealed log; idempotent, so one the erasing process finished costs a
        read), their bytes compacted out of the store's files, the marks cleared. A key
        store that cannot be written now leaves the marks, retried after the next batch."""
        runs = store.erasing()
        part = self.parts.get(partition)
        if not runs:
            if part is not None:
                part.erasing = False
            return
        if self.destroy_erased_keys and isinstance(self.log, SealedLog):
            for run_id in runs:
                header = store.header(run_id)
                erasure = None if header is None else header.erasure
                record = (
                    {"at": "", "by": "unknown", "reason": "erasure finished after a restart"}
                    if erasure is None
                    else {"at": erasure.at.isoformat(), "by": erasure.by, "reason": erasure.reason}
                )
                try:
                    self.log.keyring.erase(run_id, record)
                except LogError as e:
                    log.warning("erasure of run %r: its keys could not be destroyed yet (%s); retried", run_id, e)
                    if part is not None:
                        part.erasing = True
                    return
        with self.lock:
            store.finish_erasures(runs)
        if part is not None:
            part.erasing = False

    def _open_store(self, partition: int, wait_s: float = 30.0) -> ProjectionStore:
        """Open a partition's store; when another local projector is still handing it over
        (it finishes and stores its batch before releasing), wait for its lock."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return ProjectionStore(self.layout.store_path(partition))
            except StoreLocked:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def release(self, partitions: list[int]) -> None:
        """Close the stores of ``partitions`` (revocation, end of a replay)."""
        # Every poll batch is stored before the next poll, so nothing is in hand here.
        failed: StoreError | None = None
        for p in partitions:
            with self.lock:
                part = self.parts.pop(p, None)
                if part is not None:
                    try:
                        part.store.close()
                    except StoreError as e:  # close the others all the same
                        failed = failed or e
        log.info("revoked partitions %s", partitions)
        if failed is not None:
            raise failed

    # -- the loop --------------------------------------------------------------------------

    def run(
        self, *, until_caught_up: bool = False, stop: Event | None = None, poll_timeout_s: float = 0.2
    ) -> ProjectorStats:
        """Consume until ``stop`` is set or, with ``until_caught_up``, until every assigned
        partition has reached the end of the log as seen after an empty poll."""
        topic = self.log.topics.events
        self.log.check_topics()
        self.layout.ensure(topic, self.log.partitions(topic), self.log.identity())
        consumer = self.log.consumer(self.group_id, topic, client_id=self.client_id)
        self._consumer = consumer
        codec.prepare()  # before the group join, not in the first batch
        if self.tune_gc:
            gc_policy.settle()
        last_progress = 0.0
        last_lag = 0.0
        last_read = time.monotonic()
        try:
            # Inside the try: a store that cannot be opened on assignment (damaged, locked)
            # must not leave this consumer holding its group membership.
            consumer.subscribe(self.assign, self.release)
            linger = False
            # Catching up, the log may be drained already (at the start, after a restore, after
            # a small batch): look without waiting, and check the lag at once if nothing came.
            glance = until_caught_up
            while stop is None or not stop.is_set():
                records = consumer.poll(self.batch_size, 0.0 if linger or glance else poll_timeout_s)
                glanced, glance = glance, until_caught_up and bool(records)
                if linger and not records:
                    # The log is drained: let the next records gather. (A poll gives less than
                    # the batch size while records wait, a share per partition: a backlog
                    # is read on at once.) Stopped meanwhile, what gathered is decided first,
                    # as it would have been without the wait (an erasure, say).
                    linger = False
                    if stop is None:
                        time.sleep(self.linger_s)
                        continue
                    if not stop.wait(self.linger_s):
                        continue
                    records = consumer.poll(self.batch_size, 0.0)
                linger = False
                if records:
                    with gc_policy.batch():
                        self.process(records)
                    try:
                        consumer.commit({p: part.next_offset for p, part in self.parts.items()})
                    except LogError as e:  # the mirror is for lag monitoring; positions live in the stores
                        log.warning("cannot mirror positions: %s", e)
                    linger = bool(self.linger_s) and len(records) < self.batch_size and not until_caught_up
                now = time.monotonic()
                if not records and self.tune_gc:
                    gc_policy.collect_when_idle()
                if not records and self.hooks is not None and (idle := getattr(self.hooks, "on_idle", None)):
                    idle()  # an optional hook: work that waits for a quiet moment (retention)
                if records or not self.parts:
                    last_read = now
                # Reading the log end costs broker round trips: at most every lag_every_s,
                # and only when idle or when progress is due (never between busy batches).
                want_progress = self.on_progress is not None and now - last_progress >= self.progress_every_s
                if (not records and (glanced or now - last_lag >= self.lag_every_s)) or want_progress:
                    last_lag = now
                    try:
                        lag = self.lag()
                    except LogError as e:
                        # Lag is monitoring: a broker that is restarting must not stop the
                        # projector, which resumes consuming by itself when it is back.
                        log.warning("cannot read the log end to compute lag: %s", e)
                        lag = None
                    caught_up = not records and lag == 0 and bool(consumer.assignment())
                    if self.on_progress and lag is not None and (want_progress or caught_up):
                        self.on_progress(self.stats, lag)
                        last_progress = now
                    if until_caught_up and caught_up:
                        break
                    if until_caught_up and lag and now - last_read > self.stall_timeout_s:
                        self._stalled(lag)
        except BaseException:
            # Already failing (a store that cannot write, a signal): release what can be
            # released, but let the first error be the one the user sees.
            self._shutdown(consumer, quiet=True)
            raise
        self._shutdown(consumer, quiet=False)
        return self.stats

    def _shutdown(self, consumer: LogConsumer, *, quiet: bool) -> None:
        """Leave the group (revoking: stores close) and close the dead-letter producer.
        ``quiet``: log errors instead of raising them."""
        first: Exception | None = None

        def attempt(step: Callable[[], object]) -> None:
            nonlocal first
            try:
                step()
            except Exception as e:  # keep closing the rest
                log.error("shutting down: %s", e)
                first = first or e

        attempt(consumer.close)  # revokes: release() closes the stores it still holds
        if self._out is not None:
            dlq = self._out
            attempt(lambda: dlq.close(DEAD_LETTER_FLUSH_S))
        with self.lock:
            for part in list(self.parts.values()):  # those the revocation did not reach
                attempt(part.store.close)
            self._consumer = None
            self.parts.clear()
        if first is not None and not quiet:
            raise first

    def _stalled(self, lag: int) -> None:
        ends = dict(self.log.end_offsets(self.log.topics.events))
        behind = [
            (p, part.next_offset, ends.get(p))
            for p, part in sorted(self.parts.items())
            if ends.get(p) is not None and ends[p] > part.next_offset
        ]
        where = ", ".join(f"cannot read offset {o} of partition {p} (the log's end is {e})" for p, o, e in behind)
        raise LogError(
            f"no record read for {self.stall_timeout_s:g}s while {lag} are behind: {where}. "
            "The log may be damaged: run `runstate verify --deep`."
        )

    def lag(self) -> int | None:
        """Records behind the log end over the owned partitions (the consumer's view; None
        while a partition's end is not known yet)."""
        if self._consumer is None:
            ends: dict[int, int | None] = dict(self.log.end_offsets(self.log.topics.events))
        else:
            ends = self._consumer.end_offsets()
        total = 0
        for p, part in self.parts.items():
            end = ends.get(p)
            if end is None:
                return None
            total += max(0, end - part.next_offset)
        return total

    def lags(self) -> dict[int, int | None]:
        """Records behind the log's end per owned partition, as the consumer last saw the
        end (no broker round trip; None where it is not known yet). Safe from any thread."""
        consumer = self._consumer
        ends = consumer.end_offsets() if consumer is not None else {}
        with self.lock:
            positions = {p: part.next_offset for p, part in self.parts.items()}
        out: dict[int, int | None] = {}
        for p, pos in positions.items():
            end = ends.get(p)
            out[p] = None if end is None else max(0, end - pos)
        return out

    def replay(self, until: dict[int, int], *, chunk: int = 2000, on_progress: ReplayProgress | None = None) -> int:
        """Project partitions straight from the log, without a consumer group: for each
        ``partition: end`` of ``until``, the records from the store's position up to
        ``end`` (exclusive), in chunks of ``chunk`` records, each stored like a poll batch.
        Used by ``verify`` (into a scratch directory) and the benchmarks. Returns the
        number of records read; ``on_progress(done, total)`` after each chunk."""
        topic = self.log.topics.events
        self.layout.ensure(topic, self.log.partitions(topic), self.log.identity())
        parts = sorted(until)
        starts = self.assign(parts)
        total = sum(max(0, until[p] - starts[p]) for p in parts)
        done = 0
        try:
            for p in parts:
                pending: list[Record] = []
                for rec in self.log.scan(topic, p, starts[p], until[p]):
                    pending.append(rec)
                    if len(pending) >= chunk:
                        self.process(pending)
                        done += len(pending)
                        pending = []
                        if on_progress is not None:
                            on_progress(done, total)
                if pending:
                    self.process(pending)
                    done += len(pending)
                    if on_progress is not None:
                        on_progress(done, total)
        finally:
            self.release(parts)
        return done

    def process(self, records: list[Record]) -> None:
        """Decide and store one poll batch (see the module docstring for the order)."""
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = time.monotonic()
        batches: dict[int, PendingBatch] = {}
        todo: list[tuple[_Partition, PendingBatch, Record]] = []
        for rec in records:
            part = self.parts.get(rec.partition)
            if part is None:  # revoked while polling; the new owner will process it
                continue
            if rec.offset < part.next_offset:  # already applied (redelivery after a seek)
                continue
            batch = batches.get(rec.partition)
            if batch is None:
                batch = batches[rec.partition] = PendingBatch(next_offset=part.next_offset)
            batch.next_offset = rec.offset + 1
            self.stats.records += 1
            if part.skip and rec.key is not None and rec.offset <= part.skip.get(rec.key, -1):
                continue
            todo.append((part, batch, rec))
        # Stage by stage over the batch: read every record, read ahead what deciding them
        # reads from the store (batched), then decide in log order. A stage's code and data
        # stay in the CPU's caches; interleaved per record they evicted each other (the
        # measurement is on the performance page).
        reads = [read_record(rec) for _, _, rec in todo]
        self._prefetch(todo, reads)
        for (part, batch, rec), read in zip(todo, reads):
            applied = part.book.apply_record(rec, self.on_internal_error, read)
            if isinstance(applied, DeadLetter):
                batch.dead.append(applied)
                continue
            if applied.duplicate:
                self.stats.duplicates += 1
                continue
            assert applied.decision is not None  # only duplicates lack one
            batch.decisions.append(applied.decision)
            if applied.changes is not None:
                patch = applied.patch
                batch.add_changes(patch.run_id, applied.changes)
                self.stats.accepted += 1
                self.stats.events += len(patch.events)
                if self.hooks is not None:
                    doc = part.book.docs[patch.run_id]
                    assert doc is not None
                    batch.record_bytes = len(rec.value)
                    batch.changes = applied.changes
                    self.hooks.on_accepted(rec.partition, patch, applied.decision, doc, batch)
            else:
                self.stats.rejected += 1
        for p, batch in batches.items():
            part = self.parts[p]
            try:
                with self.lock:
                    part.store.write(batch)
            except Exception:
                part.book.discard()
                raise
            part.next_offset = batch.next_offset
            part.book.settle()
            if batch.erased or part.erasing:
                self._finish_erasures(p, part.store)
            if part.skip and part.next_offset > max(part.skip.values()):
                part.skip = {}
            if self.hooks is not None:
                self.hooks.after_write(p, batch, part.store)
            self.stats.dead_letters += len(batch.dead)
            if self.publish_decisions and self._out is not None:
                for d in batch.decisions:
                    # An erasure's decisions hold no content: readable after the run's keys are gone.
                    free = CONTENT_FREE if d.reason == "run_erased" or d.event_types == ["RunErased"] else ()
                    value = encode_decision(d)
                    if self.decision_keys is not None:
                        free += self.decision_keys.record_headers(self.log.topics.decisions, d.run_id, value)
                    self._out.append_async(self.log.topics.decisions, d.run_id, value, _log_failed_decision, free)
            if self.publish_dead_letters and self._out is not None and batch.dead:
                for dl in batch.dead:
                    self._publish_dead_letter(dl, records)
                # Bounded: the store holds every dead letter; a broker that is down must not
                # hold the batch (and a SIGTERM) for the producer's delivery timeout.
                left = self._out.flush(DEAD_LETTER_FLUSH_S)
                if left:
                    log.warning("%d dead letters not yet in %s (kept in the store)", left, self.log.topics.deadletter)
        self.stats.batches += 1
        self.stats.last_batch_at = time.monotonic()

    def _prefetch(self, todo: list[tuple[_Partition, PendingBatch, Record]], reads: list[Patch | DeadLetter]) -> None:
        """Read ahead, per partition, what deciding the batch's patches reads from the store,
        before deciding any of them (see :meth:`RunBook.prefetch`)."""
        by_part: dict[int, tuple[_Partition, list[Patch]]] = {}  # ordered: a batch reads in log order
        for (part, _, rec), read in zip(todo, reads):
            if not isinstance(read, (DeadLetter, Erased)):
                by_part.setdefault(rec.partition, (part, []))[1].append(read)
        for part, patches in by_part.values():
            part.book.prefetch(patches)

    def _publish_dead_letter(self, dl: DeadLetter, records: list[Record]) -> None:
        assert self._out is not None
        original = next((r for r in records if r.partition == dl.partition and r.offset == dl.offset), None)
        value = original.value if original is not None else b""
        headers = (
            ("reason", dl.reason.encode()),
            ("detail", dl.detail.encode()[:1000]),
            ("source_partition", str(dl.partition).encode()),
            ("source_offset", str(dl.offset).encode()),
        )
        log.warning("dead letter p%d@%d: %s %s", dl.partition, dl.offset, dl.reason, dl.detail)

        def delivered(_where: object, err: Exception | None) -> None:
            if err is not None:  # the store already holds the dead letter; the topic copy is best effort
                log.error("could not publish dead letter p%d@%d: %s", dl.partition, dl.offset, err)

        try:
            self._out.append_async(self.log.topics.deadletter, dl.key or "", value, delivered, headers)
        except Exception as e:
            delivered(None, e)
