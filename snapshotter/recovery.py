"""Recovery: a partition with no local store is rebuilt from checkpoints + the log's tail.

``restore_partition`` reads the partition of the checkpoints topic (its partition number
is the events partition: same key, same partitioner, same count), keeps the newest
*valid* checkpoint of each run (bad digest, other format/reducer version, unmigratable
schema: skipped and reported), writes those states into the new store, and sets the
store's position to the oldest offset still needed. Records of a run up to its
checkpoint's ``covers_offset`` are then skipped by key. A run whose checkpoints are all
invalid forces the partition back to offset 0: never trusted blindly, never lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from eventlog.base import EventLog
from projector.doc import RunDoc
from projector.store import PendingBatch, ProjectionStore
from snapshotter.checkpoint import Checkpoint, CheckpointInvalid, validate

log = logging.getLogger("runstate.recovery")


@dataclass
class RestoreReport:
    partition: int
    runs: int = 0
    start_offset: int = 0
    checkpoints_read: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (checkpoint record offset, reason)


def latest_valid_checkpoints(log_: EventLog, partition: int) -> tuple[dict[str, Checkpoint], set[str], RestoreReport]:
    """Newest valid checkpoint per run in one partition of the checkpoints topic, and the
    runs that have checkpoints but none valid."""
    report = RestoreReport(partition)
    topic = log_.topics.checkpoints
    end = log_.end_offsets(topic).get(partition, 0)
    latest: dict[str, Checkpoint] = {}
    seen_runs: set[str] = set()
    for rec in log_.scan(topic, partition, 0, end):
        report.checkpoints_read += 1
        run = rec.key.decode(errors="replace") if rec.key is not None else "?"
        seen_runs.add(run)
        try:
            cp = validate(rec.value)
            if cp.run_id != run or cp.partition != partition:
                raise CheckpointInvalid(cp.run_id, f"keyed {run!r} on partition {partition}, but is for {cp.run_id!r} p{cp.partition}")
        except CheckpointInvalid as e:
            report.rejected.append((rec.offset, e.reason))
            log.warning("checkpoint p%d@%d of %r skipped: %s", partition, rec.offset, run, e.reason)
            continue
        cur = latest.get(run)
        if cur is None or cp.covers_offset > cur.covers_offset:
            latest[run] = cp
    return latest, seen_runs - set(latest), report


def restore_partition(log_: EventLog, partition: int, store: ProjectionStore) -> RestoreReport:
    """Fill a brand-new partition store from checkpoints (see the module docstring)."""
    latest, unusable, report = latest_valid_checkpoints(log_, partition)
    if not latest:
        return report
    start = 0 if unusable else min(cp.covers_offset for cp in latest.values()) + 1
    batch = PendingBatch(next_offset=start)
    for run, cp in latest.items():
        batch.add_changes(run, RunDoc.from_state(cp.state).as_changes())
        batch.decisions.extend(cp.recent_decisions)
        batch.restored[run] = cp.covers_offset
    store.write(batch)
    report.runs = len(latest)
    report.start_offset = start
    log.info("partition %d restored: %d runs from checkpoints, tail from offset %d (%d checkpoints rejected)",
             partition, len(latest), start, len(report.rejected))  # fmt: skip
    return report
