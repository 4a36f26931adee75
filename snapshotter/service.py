"""The snapshotter: its own consumer group and projection, the projector's pure core, and
checkpoints written at the policy's boundaries.

Per accepted patch that hits a trigger, the checkpoint (state at that revision, covering
the patch's offset) goes into the same RocksDB WriteBatch as the snapshotter's own state
and position (key ``c:<run>\\0<revision>``: the local history used by time travel,
``checkpoints`` and ``resume``); after the batch is stored it is published to the
checkpoints topic keyed by run_id (compacted on Kafka). A crash between the two publishes
again on restart (at least once; a checkpoint is idempotent).
"""

from __future__ import annotations

import logging
from pathlib import Path

from runstate.eventlog.base import EventLog
from runstate.projector.working import RunDoc
from runstate.projector.loop import Projector, ProjectorStats
from runstate.projector.store import PendingBatch, ProjectionStore
from runstate.schemas.errors import DeliveryError
from runstate.schemas.patch import Decision, Patch
from runstate.snapshotter.checkpoint import RECENT_DECISIONS, Checkpoint, encode, make_checkpoint
from runstate.snapshotter.policy import CheckpointPolicy

log = logging.getLogger("runstate.snapshotter")

GROUP = "runstate-snapshotter"


def snapshotter_dir(state_dir: str | Path) -> Path:
    """Where the snapshotter keeps its projection and checkpoint history."""
    return Path(state_dir) / "snapshotter"


class CheckpointWriter:
    """The projector hooks that turn accepted patches into checkpoints."""

    def __init__(self, log_: EventLog, policy: CheckpointPolicy) -> None:
        self.log = log_
        self.policy = policy
        self.producer = log_.producer()
        self.pending: dict[int, list[Checkpoint]] = {}
        self.stores: dict[int, ProjectionStore] = {}
        #: newest covered offset per run, per partition (for the ``age`` trigger)
        self.covered: dict[int, dict[str, int]] = {}
        self._age_checked: dict[int, int] = {}
        self.written = 0

    def on_assign(self, partition: int, store: ProjectionStore) -> None:
        self.stores[partition] = store
        covered: dict[str, int] = {}
        for run, value in store.all_checkpoints():
            covers = Checkpoint.model_validate_json(value).covers_offset
            covered[run] = max(covers, covered.get(run, -1))
        self.covered[partition] = covered

    def on_accepted(self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch) -> None:
        triggers = self.policy.triggers(patch, decision.revision, doc)
        if triggers:
            self._checkpoint(partition, doc, decision.offset, triggers, batch)

    def _checkpoint(self, partition: int, doc: RunDoc, covers: int, triggers: list[str],
                    batch: PendingBatch | None) -> Checkpoint:  # fmt: skip
        run = doc.header.run_id
        # Recent decisions: the stored ones, then those of the batch not yet written.
        recent = [d for d in batch.decisions if d.run_id == run] if batch is not None else []
        if len(recent) < RECENT_DECISIONS:
            recent = self.stores[partition].recent_history(run, RECENT_DECISIONS) + recent
        cp = make_checkpoint(doc.to_state(), partition=partition, covers_offset=covers, triggers=triggers, recent=recent)
        if batch is not None:
            batch.checkpoints[(run, cp.revision)] = encode(cp)
        self.pending.setdefault(partition, []).append(cp)
        self.covered.setdefault(partition, {})[run] = covers
        return cp

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        self._age(partition, batch.next_offset, store)
        cps = self.pending.pop(partition, [])
        for cp in cps:
            self.producer.append_async(self.log.topics.checkpoints, cp.run_id, encode(cp), self._delivered)
        if cps:
            self.producer.flush(60)
            self.written += len(cps)

    def _age(self, partition: int, next_offset: int, store: ProjectionStore) -> None:
        """Checkpoint runs whose newest checkpoint is older than ``max_age`` records. The
        walk over the partition's runs is done every ``max_age / 10`` records, not per batch."""
        if next_offset - self._age_checked.get(partition, 0) < max(1, self.policy.max_age // 10):
            return
        self._age_checked[partition] = next_offset
        covered = self.covered.setdefault(partition, {})
        stale = [r for r, c in covered.items() if next_offset - 1 - c > self.policy.max_age]
        extra = {}
        for run in stale:
            doc = store.load_doc(run)
            if doc is None:
                continue
            cp = self._checkpoint(partition, doc, next_offset - 1, ["age"], None)
            extra[(run, cp.revision)] = encode(cp)
        if extra:
            store.put_checkpoints(extra)

    def _delivered(self, where: object, err: Exception | None) -> None:
        if err is not None:
            # The local history has it; the next trigger publishes a newer one.
            log.error("checkpoint not published: %s", err)
            if not isinstance(err, DeliveryError):
                raise err

    def close(self) -> None:
        self.producer.close()


class Snapshotter:
    """``run()`` consumes the events topic with its own group into its own store and
    writes checkpoints. Same loop and pure core as the projector."""

    def __init__(self, log_: EventLog, state_dir: str, *, policy: CheckpointPolicy | None = None,
                 batch_size: int = 2000, group_id: str = GROUP) -> None:  # fmt: skip
        self.writer = CheckpointWriter(log_, policy or CheckpointPolicy())
        self.projector = Projector(log_, str(snapshotter_dir(state_dir)), group_id=group_id, batch_size=batch_size,
                                   publish_dead_letters=False, hooks=self.writer)  # fmt: skip

    def run(self, *, until_caught_up: bool = False, **kw: object) -> ProjectorStats:
        try:
            return self.projector.run(until_caught_up=until_caught_up, **kw)  # type: ignore[arg-type]
        finally:
            self.writer.close()
