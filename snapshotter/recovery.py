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

import itertools
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from runstate.eventlog.base import EventLog
from runstate.projector.core.working import RunDoc
from runstate.projector.store.partition import ProjectionStore, RestoredRun
from runstate.projector.store.restoring import RestoredPieces
from runstate.schemas.errors import CheckpointInvalid, describe_validation_error
from runstate.snapshotter import pieces
from runstate.snapshotter.pieces import Head, load_head
from runstate.snapshotter.checkpoint import (
    Coverage,
    SigningKey,
    is_coverage_key,
    restore_data,
    runs_digest,
    validate,
    validate_coverage,
)

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
RESTORE_CHUNK = 1_000


def _checkpoint_offsets(
    log_: EventLog, partition: int, end: int, on_progress: RestoreProgress | None, report: RestoreReport
) -> tuple[set[str], dict[str, list[int]], dict[str, tuple[int, bytes]], list[tuple[int, bytes]]]:
    """One pass over a partition of the checkpoints topic, up to ``end``: the runs with a
    checkpoint; for each run whose newest is a whole checkpoint (format 2), the offsets of
    its whole checkpoints since its last head (oldest first; only offsets); for each run
    whose newest is a head (format 3, small), that head; and the coverage records.
    Pieces are counted only."""
    topic = log_.topics.checkpoints
    found: set[str] = set()
    offsets: dict[str, list[int]] = {}
    heads: dict[str, tuple[int, bytes]] = {}
    coverage: list[tuple[int, bytes]] = []
    for rec in log_.scan(topic, partition, 0, end):
        report.checkpoints_read += 1
        if on_progress is not None and report.checkpoints_read % 1000 == 0:
            on_progress(rec.offset + 1, end)
        if is_coverage_key(rec.key):
            coverage.append((rec.offset, rec.value))
            continue
        run, piece = pieces.split_key(rec.key)
        if piece is not None:
            continue
        found.add(run)
        if pieces.is_head_record(rec.value):
            heads[run] = (rec.offset, rec.value)
            offsets.pop(run, None)  # whole checkpoints before a head are superseded
        else:
            heads.pop(run, None)  # a whole checkpoint (format 2, or what claims to be) came after
            offsets.setdefault(run, []).append(rec.offset)
    if on_progress is not None:
        on_progress(end, end)
    return found, offsets, heads, coverage


def _newest_coverage(
    coverage: list[tuple[int, bytes]], partition: int, key: SigningKey, report: RestoreReport
) -> Coverage | None:
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
        raise CheckpointInvalid(
            data.run_id, f"keyed {run!r} on partition {partition}, but is for {data.run_id!r} p{data.partition}"
        )
    try:
        changes = RunDoc.from_state_data(data.state).as_changes()
    except pydantic.ValidationError as e:
        raise CheckpointInvalid(run, f"not a checkpoint: {describe_validation_error(e)[1]}") from e
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointInvalid(run, f"not a checkpoint: state: {e!r}") from e
    return RestoredRun(run, changes, data.covers_offset, data.decisions, data.patch_ids)


def restore_partition(
    log_: EventLog,
    partition: int,
    store: ProjectionStore,
    on_progress: RestoreProgress | None = None,
    key: SigningKey = None,
) -> RestoreReport:
    """Fill a brand-new partition store from checkpoints (see the module docstring).
    ``key``: checkpoints must be signed with it (``RUNSTATE_CHECKPOINT_KEY``).

    A first pass over the partition of the checkpoints topic keeps each run's heads (and
    the coverage records); a second writes the pieces of every run whose newest head is
    sound into the store as they come, the store's own bytes, in chunks; then each run's
    pieces are checked against its head's digest, and a run whose pieces do not match is
    dropped (replayed). Runs whose newest checkpoint is of format 2 (a whole state) are
    restored as before, taking an older one where the newest is invalid."""
    report = RestoreReport(partition)
    topic = log_.topics.checkpoints
    end = log_.end_offsets(topic).get(partition, 0)  # both passes read up to the same end
    store.begin_restore()
    found, offsets, heads, coverage = _checkpoint_offsets(log_, partition, end, on_progress, report)
    promise = _newest_coverage(coverage, partition, key, report)
    if promise is not None:
        report.distrust = _distrust(promise, found)
        if report.distrust is not None:
            log.warning(
                "coverage of partition %d not trusted: %s; replaying the partition from its start",
                partition,
                report.distrust,
            )
    unusable = 0
    trusted: dict[str, Head] = {}
    for run, (offset, raw) in heads.items():
        try:
            head = load_head(raw, key)
            if head.run_id != run or head.partition != partition:
                raise CheckpointInvalid(
                    head.run_id, f"keyed {run!r} on partition {partition}, but is for {head.run_id!r} p{head.partition}"
                )
            trusted[run] = head
        except CheckpointInvalid as e:
            report.rejected.append((offset, e.reason))
            log.warning("checkpoint head p%d@%d of %r skipped: %s", partition, offset, run, e.reason)
            unusable += 1
    restored, bad = _restore_pieces(log_, partition, end, store, trusted, report)
    unusable += bad
    lowest_cover = min((h.covers_offset for h in restored), default=None)
    n2, lowest2, lowest_older, unusable2 = _restore_whole(log_, partition, end, store, offsets, key, report)
    unusable += unusable2
    report.runs += len(restored) + n2
    if lowest2 is not None:
        lowest_cover = lowest2 if lowest_cover is None else min(lowest_cover, lowest2)
    if lowest_cover is None:
        store.finish_restore(0)
        return report
    if unusable or report.coverage is None or report.distrust is not None:
        start = 0
    elif promise is not None and promise.dense:
        # Below the coverage every run's records are in its newest checkpoint: the tail
        # starts there, unless a run had to take an older one.
        start = report.coverage if lowest_older is None else min(report.coverage, lowest_older + 1)
    else:
        start = min(report.coverage, lowest_cover + 1)
    store.finish_restore(start)
    report.start_offset = start
    log.info(
        "partition %d restored: %d runs from checkpoints, tail from offset %d (%d checkpoints rejected)",
        partition,
        report.runs,
        start,
        len(report.rejected),
    )
    return report


def _restore_pieces(
    log_: EventLog, partition: int, end: int, store: ProjectionStore, heads: dict[str, Head], report: RestoreReport
) -> tuple[list[Head], int]:
    """Write the runs with a sound head into ``store``, each from the bundles its head
    names (by slot, and the epoch and revision a bundle says it is of), as soon as the
    last of them is read, :data:`RESTORE_CHUNK` runs a batch; returns the heads of the
    runs restored and how many were dropped (a bundle missing, bundles whose SHA-256s are
    not the head's, or pieces that do not add up to the head's)."""
    if not heads:
        return [], 0
    restored: list[Head] = []
    dropped: list[str] = []
    want: dict[str, dict[int, Any]] = {}  # run -> slot -> what its bundle must be named
    chunk: list[RestoredPieces] = []
    for run, head in heads.items():
        if head.erased is not None:  # its header is the content-free tombstone
            chunk.append(RestoredPieces(run, head.erased.encode(), [], head.covers_offset, b"", ()))
            restored.append(head)
            continue
        # by its epoch and revision (format 5: by its SHA-256)
        slots = {slot: (head.epoch, name) if head.header5 is None else name for slot, name in head.bundles}
        if len(slots) != len(head.bundles) or not slots:
            _reject(report, partition, run, "its head names a slot twice, or none", dropped)
            continue
        want[run] = slots
    # run -> slot -> the records named as its head's bundle there (one, unless another was
    # planted under that name: then the head's digest of its bundles tells which)
    found: dict[str, dict[int, list[bytes]]] = {}
    contested: set[str] = set()

    def take(run: str, bundles: list[bytes]) -> None:
        nonlocal chunk
        try:
            chunk.append(_run_pieces(heads[run], bundles))
            restored.append(heads[run])
        except CheckpointInvalid as e:
            _reject(report, partition, run, e.reason, dropped)
        if len(chunk) >= RESTORE_CHUNK:
            store.restore_pieces(chunk)
            chunk = []

    for rec in log_.scan(log_.topics.checkpoints, partition, 0, end):
        run, suffix = pieces.split_key(rec.key)
        slots = want.get(run)
        if slots is None or suffix is None or (slot := pieces.slot_of(suffix)) is None or slot not in slots:
            continue
        named = slots[slot]
        if (pieces.bundle_name(rec.value) if type(named) is tuple else pieces.bundle_digest(rec.value)) != named:
            continue  # an older or newer bundle of that slot: not this head's
        got = found.setdefault(run, {})
        got.setdefault(slot, []).append(rec.value)
        if len(got) == len(slots) and run not in contested:
            bundles = [got[s][-1] for s, _name in heads[run].bundles]
            if _sound(heads[run], bundles):
                del want[run], found[run]
                take(run, bundles)
            else:  # looked for again once the partition is read
                contested.add(run)
    for run in contested:
        head, got = heads[run], found.pop(run)
        del want[run]
        choices = itertools.islice(itertools.product(*(got[s] for s, _name in head.bundles)), MAX_CONTESTED)
        bundles = next((list(c) for c in choices if _sound(head, list(c))), None)
        if bundles is None:
            _reject(report, partition, run, NOT_THE_HEADS, dropped)
        else:
            take(run, bundles)
    store.restore_pieces(chunk)
    for run in want:  # a head whose bundles never all arrived (a snapshotter SIGKILLed while publishing)
        _reject(report, partition, run, "a bundle its head names is missing or is not the head's", dropped)
    if dropped:
        store.drop_runs(dropped)
    return restored, len(dropped)


def _run_pieces(head: Head, bundles: list[bytes]) -> RestoredPieces:
    """A run's pieces (its bundles folded in order) as the store writes them. Raises
    :class:`CheckpointInvalid` where they are not its head's."""
    run = head.run_id
    live: dict[str, bytes] = {}
    try:
        for value in bundles:
            live.update(pieces.bundle_entries(value))
        decisions = [(o, p, reused, raw.encode()) for o, p, reused, raw in head.recent]
        items: list[tuple[str, bytes]] = []
        ids: list[tuple[str, bytes]] = []
        cut = len(pieces.ITEM_PREFIX)
        for n, b in live.items():  # one pass: this is per piece of every run restored
            if b and n.startswith(pieces.ITEM_PREFIX):
                items.append((n[cut:], b))
            elif b and n.startswith(pieces.IDS_PREFIX):
                ids.append((n, b))
        ids.sort()
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointInvalid(run, f"not a bundle's entries: {e}") from e
    if not all("\0" in tail for tail, _b in items):
        raise CheckpointInvalid(run, "an item piece without a kind and an id")
    try:
        header = pieces.header_of(head, live.get(pieces.HEADER_PIECE) or None)
    except ValueError as e:
        raise CheckpointInvalid(run, f"its header: {e}") from e
    held = len(items) + len(ids) + (head.header5 is None)  # and the header's (format 6)
    if held != head.pieces:
        raise CheckpointInvalid(run, f"its bundles hold {held} pieces, its head {head.pieces}")
    return RestoredPieces(run, header, items, head.covers_offset, b"".join(b for _n, b in ids), decisions)


#: Why a run whose head's bundles are all there, by name, is replayed.
NOT_THE_HEADS = "its bundles are not the ones its head names (damaged, or not this checkpoint's)"
#: Combinations of the records named as a head's bundles tried when some name was written
#: twice (a bundle planted under it): each is a SHA-256 over the run's bundles.
MAX_CONTESTED = 64


def _sound(head: Head, bundles: list[bytes]) -> bool:
    """Whether ``bundles`` are the ones ``head`` names: their SHA-256s, digested in order,
    are its digest of them (a format 5 head's were each found by its own SHA-256)."""
    return head.header5 is not None or pieces.bundles_digest(map(pieces.bundle_digest, bundles)) == head.bundles_digest


def _reject(report: RestoreReport, partition: int, run: str, reason: str, dropped: list[str]) -> None:
    report.rejected.append((-1, reason))
    log.warning("checkpoint of %r on partition %d skipped: %s", run, partition, reason)
    dropped.append(run)


def _restore_whole(
    log_: EventLog,
    partition: int,
    end: int,
    store: ProjectionStore,
    offsets: dict[str, list[int]],
    key: SigningKey,
    report: RestoreReport,
) -> tuple[int, int | None, int | None, int]:
    """Restore the runs whose newest checkpoint is of format 2 (the whole state in one
    record), each from its newest valid one; returns how many, the lowest offset they
    cover, the lowest of those restored from an older than their newest, and how many
    had none valid."""
    topic = log_.topics.checkpoints
    want = {offs[-1]: run for run, offs in offsets.items()}  # newest first
    unusable = runs = 0
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
                lowest_cover = min(
                    restored.covers_offset, restored.covers_offset if lowest_cover is None else lowest_cover
                )
                if not newest:
                    lowest_older = min(
                        restored.covers_offset, restored.covers_offset if lowest_older is None else lowest_older
                    )
                if len(chunk) >= RESTORE_CHUNK:
                    runs += store.restore(chunk)
                    chunk = []
            if not want:
                break
        want = older
        newest = False
    if chunk:
        runs += store.restore(chunk)
    return runs, lowest_cover, lowest_older, unusable


def _distrust(promise: Coverage, found: set[str]) -> str | None:
    """Why the runs with checkpoints on the topic do not account for the runs the coverage
    record was written over (one went missing: its checkpoints were deleted, tombstoned or
    expired), or None. Runs checkpointed after the record (a batch whose coverage was not
    published) also differ: the safe answer is the same, a replay from the start."""
    if promise.runs is None:
        return "the coverage record does not name the runs it covers (written by an older runstate)"
    if len(found) != promise.runs or runs_digest(found) != promise.runs_digest:
        return (
            f"it was written over {promise.runs} runs with checkpoints, the topic holds checkpoints of "
            f"{len(found)} runs, not the same ones"
        )
    return None


def check_checkpoints(log_: EventLog, key: SigningKey = None) -> list[str]:
    """Every record of the checkpoints topic that does not validate, as problems for
    ``verify --deep``: coverage records and whole checkpoints (format 2, older ones that
    compaction has not removed yet included) one by one; each run's newest head and its
    pieces as a restore checks them, by restoring the partition into a scratch store."""
    topic = log_.topics.checkpoints
    problems = []
    for p, end in sorted(log_.end_offsets(topic).items()):
        for rec in log_.scan(topic, p, 0, end):
            run, piece = pieces.split_key(rec.key)
            if piece is not None or pieces.is_head_record(rec.value):
                continue  # checked by the restore below
            try:
                if is_coverage_key(rec.key):
                    validate_coverage(rec.value, p, key)
                else:
                    cp = validate(rec.value, key)
                    if rec.key != cp.run_id.encode() or cp.partition != p:
                        raise CheckpointInvalid(cp.run_id, f"keyed {rec.key!r} on partition {p}")
            except CheckpointInvalid as e:
                problems.append(f"checkpoint {topic}[{p}]@{rec.offset}: {e.reason}")
        with tempfile.TemporaryDirectory(prefix="runstate-verify-") as tmp, ProjectionStore(tmp) as scratch:
            report = restore_partition(log_, p, scratch, key=key)
        for offset, reason in report.rejected:  # -1: a run's pieces, which have no one offset
            line = f"checkpoint {topic}[{p}]{'' if offset < 0 else f'@{offset}'}: {reason}"
            if line not in problems:  # a whole checkpoint is rejected by both
                problems.append(line)
    return problems
