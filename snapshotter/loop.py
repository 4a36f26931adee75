"""The snapshotter: its own consumer group and projection, the projector's pure core, and
checkpoints written at the policy's boundaries.

Write/publish order (what recovery relies on):

1. per accepted patch that hits a trigger, the checkpoint (state at that revision,
   covering the patch's offset, with every patch id the run decided so far) goes into the
   same RocksDB WriteBatch as the snapshotter's own state and position, under its local
   history key and an *outbox* key;
2. after the batch is stored, everything in the outbox is published to the checkpoints
   topic keyed by run_id (compacted on Kafka) and, once the log acknowledged all of it,
   the outbox keys are cleared;
3. only then the partition's *coverage* record is published (after checkpoints went out,
   or every ``COVERAGE_EVERY`` records): every checkpoint made for records below the
   batch's end is out, so recovery may start runs without one there.

A crash anywhere leaves the outbox to publish on restart, before new work (at least once;
a checkpoint is idempotent). A delivery failure keeps the outbox and the coverage where
they were; the next batch tries again.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from runstate.eventlog.base import Appended, EventLog
from runstate.eventlog.sealed import CONTENT_FREE, SealedLog
from runstate.projector.runtime.loop import Projector, ProjectorStats
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Decision, Patch
from runstate.snapshotter.checkpoint import (
    RECENT_DECISIONS, Checkpoint, SigningKey, coverage_keys, encode, make_checkpoint, make_coverage,
)  # fmt: skip
from runstate.schemas.errors import KeyStoreError, RunNotFound
from runstate.schemas.state import status_span
from runstate.schemas.patch import Author
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.retention import RetentionPolicy

log = logging.getLogger("runstate.snapshotter")

#: How an erased run's tombstone checkpoint shows in its JSON.
_ERASED = status_span("erased")

GROUP = "runstate-snapshotter"
#: Who an erasure by retention is recorded as.
_RETENTION = Author(agent_id="runstate-retention", agent_version="1")
#: Without new checkpoints, the coverage record is republished only after this many records
#: (a batch without checkpoints then costs no round trip to the log).
COVERAGE_EVERY = 1000


def snapshotter_dir(state_dir: str | Path) -> Path:
    """Where the snapshotter keeps its projection and checkpoint history."""
    return Path(state_dir) / "snapshotter"


class CheckpointWriter:
    """The projector hooks that turn accepted patches into checkpoints. ``key`` signs
    them (HMAC-SHA256; ``RUNSTATE_CHECKPOINT_KEY``)."""

    def __init__(self, log_: EventLog, policy: CheckpointPolicy, key: SigningKey = None,
                 retention: RetentionPolicy | None = None, retention_every_s: float = 60.0) -> None:  # fmt: skip
        self.log = log_
        self.policy = policy
        self.key = key
        self.retention = retention
        self.retention_every_s = retention_every_s
        self._retention_checked: dict[int, float] = {}
        #: per partition, the runs the last retention check found due; erased since start
        self.retention_due: dict[int, int] = {}
        self.retention_erased = 0
        #: per partition, per run: the bytes of its records since its last checkpoint, that
        #: checkpoint's bytes, and how much it grew per byte of records (the policy's byte
        #: budget); in memory only: after a restart a run's next trigger is taken
        self._weights: dict[int, dict[str, list[Any]]] = {}
        #: bytes of the checkpoints published since start
        self.written_bytes = 0
        #: the partitions the projector owns now (set by :class:`Snapshotter`)
        self.owned: Callable[[], set[int]] = lambda: set(self.stores)
        self.producer = log_.producer()
        self.stores: dict[int, ProjectionStore] = {}
        #: newest covered offset per run, per partition
        self.covered: dict[int, dict[str, int]] = {}
        #: per partition, the runs with records their newest checkpoint does not cover, and
        #: the first such record's offset: the coverage record promises nothing past the
        #: lowest (its ``dense`` promise), and the ``age`` trigger checkpoints those that
        #: wait too long; a run whose records are all covered costs neither. Kept in offset
        #: order (a run enters with a record newer than every one there), so the lowest is
        #: the first, read per batch in O(1)
        self.dirty: dict[int, OrderedDict[str, int]] = {}
        self._age_checked: dict[int, int] = {}
        #: per partition, the offset the last coverage record published promised
        self._coverage_sent: dict[int, int] = {}
        #: partitions whose outbox is known to be empty (the last publish cleared it): their
        #: next outbox is exactly what the next batch adds, no scan needed. A scan is not
        #: free: it seeks over the tombstones of every cleared entry not yet compacted away
        #: (36 % of this thread's time in serve at 500 patches/s on 10,000 runs).
        self._outbox_empty: set[int] = set()
        self.written = 0

    def on_assign(self, partition: int, store: ProjectionStore) -> None:
        self.stores[partition] = store
        covered: dict[str, int] = {}
        for run, value in store.all_checkpoints():
            covers = int(orjson.loads(value)["covers_offset"])
            covered[run] = max(covers, covered.get(run, -1))
        self.covered[partition] = covered
        found = []
        for run, covers in covered.items():  # one seek per run: which have records past their checkpoint
            first = store.first_decision_after(run, covers)
            if first is not None:
                found.append((first, run))
        self.dirty[partition] = OrderedDict((run, first) for first, run in sorted(found))
        self._outbox_empty.discard(partition)
        self._publish(partition, store, self._covers_below(partition, store.next_offset()), None)  # what a crash left

    def on_accepted(self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch) -> None:
        run = doc.header.run_id
        weights = self._weights.setdefault(partition, {})
        w = weights.get(run)
        if w is None:
            w = weights[run] = [0, 0, 0]  # records' bytes since the last checkpoint, its bytes, growth per byte
        w[0] += batch.record_bytes
        if doc.header.status == "erased":
            # An erased run's tombstone replaces its checkpoints (on the compacted topic too),
            # so that a restore knows the run and never brings it back.
            triggers = ["erased"]
        else:
            triggers = self.policy.triggers(patch, decision.revision, doc)
            if triggers and self.policy.budgeted(triggers) and not self.policy.within_budget(w[0], w[1], w[2]):
                return  # the run's checkpoints would outweigh its records: the next trigger in budget
        if triggers:
            self._checkpoint(partition, doc, decision.offset, triggers, batch)

    def _checkpoint(self, partition: int, doc: RunDoc, covers: int, triggers: list[str],
                    batch: PendingBatch | None) -> tuple[Checkpoint, bytes]:  # fmt: skip
        run = doc.header.run_id
        store = self.stores[partition]
        # Decisions: the stored ones, then those of the batch not yet written.
        unwritten = [d for d in batch.decisions if d.run_id == run] if batch is not None else []
        recent = unwritten
        if doc.header.status == "erased":
            patch_ids: list[str] = []  # nothing of the erased run's history travels on
        else:
            if len(recent) < RECENT_DECISIONS:
                recent = store.recent_history(run, RECENT_DECISIONS) + recent
            patch_ids = [*store.patch_ids(run), *(d.patch_id for d in unwritten)]
        cp = make_checkpoint(doc.to_state(), partition=partition, covers_offset=covers, triggers=triggers,
                             recent=recent, patch_ids=patch_ids, key=self.key)  # fmt: skip
        blob = encode(cp)
        if batch is not None:
            batch.checkpoints[(run, cp.revision)] = blob
        self.covered.setdefault(partition, {})[run] = covers
        weights = self._weights.setdefault(partition, {})
        since, last, _ = weights.get(run, (0, 0, 0))
        growth = max(0.0, (len(blob) - last) / since) if last and since else 0.0
        weights[run] = [0, len(blob), growth]
        return cp, blob

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        self._track(partition, batch)
        aged = self._age(partition, batch.next_offset, store)
        self._publish(partition, store, self._covers_below(partition, batch.next_offset), {**batch.checkpoints, **aged})
        self.apply_retention(partition, store)

    def _track(self, partition: int, batch: PendingBatch) -> None:
        """Which runs have records past their newest checkpoint, after ``batch`` (whose
        checkpoints are already in :attr:`covered`). A run never started (its patches
        refused ``unknown_run``) has no checkpoint and is not tracked, as before."""
        covered = self.covered.get(partition, {})
        dirty = self.dirty.setdefault(partition, OrderedDict())
        fresh: dict[str, int] = {}
        for d in batch.decisions:  # in log order: the first uncovered one of each run
            c = covered.get(d.run_id)
            if c is not None and d.offset > c and d.run_id not in fresh:
                fresh[d.run_id] = d.offset
        for run, _revision in batch.checkpoints:
            dirty.pop(run, None)
        for run, offset in fresh.items():
            dirty.setdefault(run, offset)

    def _covers_below(self, partition: int, next_offset: int) -> int:
        """What the partition's coverage may promise: below the first record a run's newest
        checkpoint does not cover (the position, when none)."""
        dirty = self.dirty.get(partition)
        return next(iter(dirty.values()), next_offset) if dirty else next_offset

    def on_idle(self) -> None:
        owned = self.owned()
        for partition, store in list(self.stores.items()):
            if partition in owned:  # a revoked partition's store is closed
                self.apply_retention(partition, store)

    def apply_retention(self, partition: int, store: ProjectionStore, now: datetime | None = None) -> int:
        """Erase the partition's runs the retention policy has due (at most every
        ``retention_every_s`` per partition); returns how many were erased now."""
        if self.retention is None or not isinstance(self.log, SealedLog):
            return 0
        clock = time.monotonic()
        if now is None and clock - self._retention_checked.get(partition, -1e9) < self.retention_every_s:
            return 0
        self._retention_checked[partition] = clock
        at = now or datetime.now(UTC)
        due = []
        for status in self.retention.keep:
            for run_id, raw in store.headers_json(status):
                header = orjson.loads(raw)
                ended = header.get("updated_at")
                if self.retention.due(status, None if ended is None else datetime.fromisoformat(ended), at):
                    due.append((run_id, status, int(header["revision"])))
        self.retention_due[partition] = len(due)
        erased = 0
        for run_id, status, revision in due:
            try:
                self.log.erase(run_id, f"retention: {self.retention.rule(status)}", "retention", _RETENTION, revision)
                erased += 1
            except RunNotFound:  # stored before content was sealed: its content cannot be erased from the log
                log.warning("retention: run %r is due but was stored before content was sealed; not erasable", run_id)
        self.retention_erased += erased
        return erased

    def _publish(self, partition: int, store: ProjectionStore, covers_below: int,
                 added: dict[tuple[str, int], bytes] | None) -> None:
        """Publish the outbox, clear what the log acknowledged, then (all out) the coverage.
        ``added``: the checkpoints stored since the last publish (None: unknown, read the
        outbox)."""
        topic = self.log.topics.checkpoints
        if added is not None and partition in self._outbox_empty:
            pending = [(run, rev, blob) for (run, rev), blob in added.items()]
        else:
            pending = store.outbox()
        self._outbox_empty.discard(partition)
        failed: list[Exception] = []

        def delivered(_where: Appended | None, err: Exception | None) -> None:
            if err is not None:
                failed.append(err)

        for run, _rev, blob in pending:
            # An erased run's tombstone holds no content: written readable, to outlive its keys.
            self.producer.append_async(topic, run, blob, delivered, CONTENT_FREE if _ERASED in blob else ())
        left = self.producer.flush(60)
        if failed or left:
            # Kept in the outbox: the next batch (or a restart) publishes them again.
            log.error("%d checkpoints of partition %d not published (%s); kept in the outbox",
                      len(failed) + left, partition, failed[0] if failed else "flush timed out")  # fmt: skip
            return
        if pending:
            store.clear_outbox((run, rev) for run, rev, _ in pending)
            self.written += len(pending)
            self.written_bytes += sum(len(blob) for _, _, blob in pending)
        self._outbox_empty.add(partition)
        if not pending and covers_below - self._coverage_sent.get(partition, -COVERAGE_EVERY) < COVERAGE_EVERY:
            return  # nothing new to promise yet; a coverage that lags only lengthens a restore's tail
        self._coverage_sent[partition] = covers_below
        key = coverage_keys(self.log.partitions(topic))[partition]
        covered = self.covered.get(partition, {}).keys()  # every run of it with a checkpoint: all published now
        self.producer.append_async(topic, key, make_coverage(partition, covers_below, self.key, covered, dense=True),
                                   delivered)  # fmt: skip
        if self.producer.flush(60) or failed:
            log.error("coverage of partition %d not published; the next batch tries again", partition)

    def _age(self, partition: int, next_offset: int, store: ProjectionStore) -> dict[tuple[str, int], bytes]:
        """Checkpoint runs with a record their newest checkpoint does not cover, older than
        ``max_age`` records (stored, and returned): what holds the coverage, and so a
        restore's tail, back. A run whose records are all covered is never checkpointed
        again for its age. The walk is done every ``max_age / 10`` records, not per batch."""
        if next_offset - self._age_checked.get(partition, 0) < max(1, self.policy.max_age // 10):
            return {}
        self._age_checked[partition] = next_offset
        dirty = self.dirty.setdefault(partition, OrderedDict())
        limit = next_offset - 1 - self.policy.max_age
        stale = [r for r, _ in itertools.takewhile(lambda e: e[1] < limit, dirty.items())]  # offset order
        extra = {}
        for run in stale:
            doc = store.load_doc(run)
            if doc is None:
                continue
            cp, blob = self._checkpoint(partition, doc, next_offset - 1, ["age"], None)
            extra[(run, cp.revision)] = blob
            dirty.pop(run, None)
        if extra:
            store.put_checkpoints(extra)
        return extra

    def close(self) -> None:
        self.producer.close()


class Snapshotter:
    """``run()`` consumes the events topic with its own group into its own store and
    writes checkpoints. Same loop and pure core as the projector."""

    def __init__(self, log_: EventLog, state_dir: str, *, policy: CheckpointPolicy | None = None,
                 batch_size: int = 2000, group_id: str = GROUP, key: SigningKey = None,
                 retention: RetentionPolicy | None = None, retention_every_s: float = 60.0) -> None:  # fmt: skip
        if retention is not None and not isinstance(log_, SealedLog):
            raise KeyStoreError("RUNSTATE_RETENTION erases runs, which needs sealed content: set RUNSTATE_MASTER_KEY "
                                "(or RUNSTATE_MASTER_KEY_FILE)")  # fmt: skip
        self.writer = CheckpointWriter(log_, policy or CheckpointPolicy(), key, retention, retention_every_s)
        self.projector = Projector(log_, str(snapshotter_dir(state_dir)), group_id=group_id, batch_size=batch_size,
                                   publish_dead_letters=False, hooks=self.writer, destroy_erased_keys=True)  # fmt: skip
        self.writer.owned = lambda: set(self.projector.parts)

    def run(self, *, until_caught_up: bool = False, **kw: object) -> ProjectorStats:
        try:
            return self.projector.run(until_caught_up=until_caught_up, **kw)  # type: ignore[arg-type]
        finally:
            self.writer.close()
