"""Recovery: a partition with no local store is rebuilt from checkpoints + the log's tail.

``restore_partition`` reads the partition of the checkpoints topic (its partition number
is the events partition: same key, same partitioner, same count), takes the newest
*valid* checkpoint of each run (bad digest, other format/reducer version, unmigratable
schema, unsigned while a key is configured: skipped and reported), hands those runs to
the store (:meth:`ProjectionStore.restore`, which writes them exactly as live patches do,
with the patch ids each run decided, so old resends stay duplicates), and sets the store's
position to the oldest offset still needed. The projector then replays the tail through
the same driver as always; records of a run up to its checkpoint's ``covers_offset`` are
skipped by key.

Where the tail starts: a run without any checkpoint must be replayed from its first
record. The partition's coverage record says below which offset every run has one (the
snapshotter publishes it after the checkpoints), and (``dense``) that each run's records
below it are all in its newest checkpoint: the tail starts there, or at a lower run's
``covers_offset + 1`` where a run had to fall back to an older checkpoint. A record
without the dense promise (an older runstate's) starts the tail at the lowest of its offset
and every restored run's ``covers_offset + 1``. The coverage record also names how
many runs had checkpoints when it was written, and a digest of their ids: where the runs
with checkpoints on the topic are not those (one run's checkpoints were deleted, say), the
tail starts at offset 0, as it does with no valid coverage record or a run whose
checkpoints are all invalid. Never trusted blindly, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pydantic

from runstate.eventlog.base import EventLog
from runstate.projector.core.working import RunDoc
from runstate.projector.store.partition import ProjectionStore, RestoredRun
from runstate.schemas.errors import CheckpointInvalid, describe_validation_error
from runstate.snapshotter.checkpoint import (
    Coverage, SigningKey, is_coverage_key, restore_data, runs_digest, validate, validate_coverage,
)  # fmt: skip

log = logging.getLogger("runstate.recovery")

#: ``on_progress(checkpoint records read, records in the partition)``
RestoreProgress = Callable[[int, int], None]


@dataclass
class RestoreReport:
    partition: int
    runs: int = 0
    start_offset: int = 0
    checkpoints_read: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (checkpoint record offset, reason)
    #: below this offset every run of the partition has a published checkpoint (None: unknown)
    coverage: int | None = None
    #: why the coverage was not trusted (the tail then starts at offset 0), or None
    distrust: str | None = None


#: Runs written to the store per WriteBatch during a restore: what a restore holds at once.
RESTORE_CHUNK = 2_000


def _checkpoint_offsets(log_: EventLog, partition: int, end: int, on_progress: RestoreProgress | None,
                        report: RestoreReport) -> tuple[dict[str, list[int]], list[tuple[int, bytes]]]:  # fmt: skip
    """One pass over a partition of the checkpoints topic, up to ``end``: each run's
    checkpoint offsets (oldest first; only offsets are kept, never the checkpoints) and the
    coverage records."""
    topic = log_.topics.checkpoints
    offsets: dict[str, list[int]] = {}
    coverage: list[tuple[int, bytes]] = []
    for rec in log_.scan(topic, partition, 0, end):
        report.checkpoints_read += 1
        if is_coverage_key(rec.key):
            coverage.append((rec.offset, rec.value))
            continue
        run = rec.key.decode(errors="replace") if rec.key is not None else "?"
        offsets.setdefault(run, []).append(rec.offset)
        if on_progress is not None and report.checkpoints_read % 1000 == 0:
            on_progress(rec.offset + 1, end)
    if on_progress is not None:
        on_progress(end, end)
    return offsets, coverage


def _newest_coverage(coverage: list[tuple[int, bytes]], partition: int, key: SigningKey,
                     report: RestoreReport) -> Coverage | None:  # fmt: skip
    for offset, value in reversed(coverage):  # the newest valid one
        try:
            promise = validate_coverage(value, partition, key)
            report.coverage = promise.covers_below
            return promise
        except CheckpointInvalid as e:
            report.rejected.append((offset, e.reason))
            log.warning("coverage record p%d@%d skipped: %s", partition, offset, e.reason)
    return None


def _restored(value: bytes, run: str, partition: int, key: SigningKey) -> RestoredRun:
    """A checkpoint record as the run to write, validated as plain data, piece by piece.
    Raises :class:`CheckpointInvalid`."""
    data = restore_data(value, key)
    if data.run_id != run or data.partition != partition:
        raise CheckpointInvalid(data.run_id, f"keyed {run!r} on partition {partition}, "
                                             f"but is for {data.run_id!r} p{data.partition}")  # fmt: skip
    try:
        changes = RunDoc.from_state_data(data.state).as_changes()
    except pydantic.ValidationError as e:
        raise CheckpointInvalid(run, f"not a checkpoint: {describe_validation_error(e)[1]}") from e
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointInvalid(run, f"not a checkpoint: state: {e!r}") from e
    return RestoredRun(run, changes, data.covers_offset, data.decisions, data.patch_ids)


def restore_partition(log_: EventLog, partition: int, store: ProjectionStore,
                      on_progress: RestoreProgress | None = None, key: SigningKey = None) -> RestoreReport:  # fmt: skip
    """Fill a brand-new partition store from checkpoints (see the module docstring).
    ``key``: checkpoints must be signed with it (``RUNSTATE_CHECKPOINT_KEY``).

    Memory stays bounded by :data:`RESTORE_CHUNK` runs, whatever the partition holds: a
    first pass keeps only each run's checkpoint offsets; a second reads each run's newest,
    validates it and writes the runs in chunks; a run whose newest checkpoint is invalid
    takes its next older one in a further pass (rare: damage)."""
    report = RestoreReport(partition)
    topic = log_.topics.checkpoints
    end = log_.end_offsets(topic).get(partition, 0)  # both passes read up to the same end
    offsets, coverage = _checkpoint_offsets(log_, partition, end, on_progress, report)
    promise = _newest_coverage(coverage, partition, key, report)
    if promise is not None:
        report.distrust = _distrust(promise, set(offsets))
        if report.distrust is not None:
            log.warning("coverage of partition %d not trusted: %s; replaying the partition from its start",
                        partition, report.distrust)  # fmt: skip
    want = {offs[-1]: run for run, offs in offsets.items()}  # newest first
    unusable = 0
    lowest_cover: int | None = None
    lowest_older: int | None = None  # of the runs restored from an older than their newest checkpoint
    newest = True
    chunk: list[RestoredRun] = []
    while want:
        older: dict[int, str] = {}
        for rec in log_.scan(topic, partition, min(want), end):
            run = want.pop(rec.offset, None)
            if run is None:
                continue
            try:
                restored = _restored(rec.value, run, partition, key)
            except CheckpointInvalid as e:
                report.rejected.append((rec.offset, e.reason))
                log.warning("checkpoint p%d@%d of %r skipped: %s", partition, rec.offset, run, e.reason)
                before = [o for o in offsets[run] if o < rec.offset]
                if before:
                    older[before[-1]] = run
                else:
                    unusable += 1
            else:
                chunk.append(restored)
                lowest_cover = min(restored.covers_offset, restored.covers_offset if lowest_cover is None else lowest_cover)
                if not newest:
                    lowest_older = min(restored.covers_offset, restored.covers_offset if lowest_older is None else lowest_older)
                if len(chunk) >= RESTORE_CHUNK:
                    report.runs += store.restore(chunk)
                    chunk = []
            if not want:
                break
        want = older
        newest = False
    if chunk:
        report.runs += store.restore(chunk)
    if lowest_cover is None:
        return report
    if unusable or report.coverage is None or report.distrust is not None:
        start = 0
    elif promise is not None and promise.dense:
        # Below the coverage every run's records are in its newest checkpoint: the tail
        # starts there, unless a run had to take an older one.
        start = report.coverage if lowest_older is None else min(report.coverage, lowest_older + 1)
    else:
        start = min(report.coverage, lowest_cover + 1)
    store.restore((), start)
    report.start_offset = start
    log.info("partition %d restored: %d runs from checkpoints, tail from offset %d (%d checkpoints rejected)",
             partition, report.runs, start, len(report.rejected))  # fmt: skip
    return report


def _distrust(promise: Coverage, found: set[str]) -> str | None:
    """Why the runs with checkpoints on the topic do not account for the runs the coverage
    record was written over (one went missing: its checkpoints were deleted, tombstoned or
    expired), or None. Runs checkpointed after the record (a batch whose coverage was not
    published) also differ: the safe answer is the same, a replay from the start."""
    if promise.runs is None:
        return "the coverage record does not name the runs it covers (written by an older runstate)"
    if len(found) != promise.runs or runs_digest(found) != promise.runs_digest:
        return (f"it was written over {promise.runs} runs with checkpoints, the topic holds checkpoints of "
                f"{len(found)} runs, not the same ones")
    return None


def check_checkpoints(log_: EventLog, key: SigningKey = None) -> list[str]:
    """Every record of the checkpoints topic that does not validate (run checkpoints and
    coverage records), as problems for ``verify --deep``. Older checkpoints of a run that
    compaction has not removed yet are checked too."""
    topic = log_.topics.checkpoints
    problems = []
    for p, end in sorted(log_.end_offsets(topic).items()):
        for rec in log_.scan(topic, p, 0, end):
            try:
                if is_coverage_key(rec.key):
                    validate_coverage(rec.value, p, key)
                else:
                    cp = validate(rec.value, key)
                    if rec.key != cp.run_id.encode() or cp.partition != p:
                        raise CheckpointInvalid(cp.run_id, f"keyed {rec.key!r} on partition {p}")
            except CheckpointInvalid as e:
                problems.append(f"checkpoint {topic}[{p}]@{rec.offset}: {e.reason}")
    return problems
