"""Replay tooling: state at any revision, why a field changed, and proof that the
projection equals a replay.

All of it goes back to the log, the source of truth, and folds records through the one
driver of the pure core, :meth:`RunBook.apply_record` — in memory here (:func:`replay`),
or into a scratch store for ``verify`` (:meth:`Projector.replay`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from runstate.eventlog.base import EventLog, Record
from runstate.projector.core.outcomes import Applied, DeadLetter
from runstate.projector.core.runbook import UNREADABLE, RunBook
from runstate.projector.core.working import RunDoc
from runstate.projector.read.queries import Projection
from runstate.projector.runtime.loop import Projector
from runstate.schemas import structs
from runstate.schemas.errors import LostRecords, RevisionNotFound, RunErased, RunNotFound
from runstate.schemas.patch import Decision
from runstate.schemas.state import COLLECTIONS, Goal, RunHeader, RunState, state_digest

#: ``on_record(record, outcome, book)`` after each record of a replay.
OnRecord = Callable[[Record, Applied | DeadLetter, RunBook], None]


def replay(records: Iterable[Record], book: RunBook | None = None, *, on_record: OnRecord | None = None) -> RunBook:
    """Fold log records in order through the pure core, in memory, starting from ``book``
    (default: empty). Returns the book: its working states and decisions."""
    book = book if book is not None else RunBook()
    for rec in records:
        outcome = book.apply_record(rec)
        if on_record is not None:
            on_record(rec, outcome, book)
    return book


#: ``nearest(run_id, revision)`` -> the state at the newest trusted checkpoint <= revision,
#: as plain JSON data (``CheckpointHistory.nearest_state_data``), or None.
NearestCheckpoint = Callable[[str, int], dict[str, Any] | None]


def _accepted_records(log: EventLog, positions: list[tuple[int, int, int]]) -> list[Record]:
    """The log records at ``(revision, partition, offset)`` positions (one run's: one partition)."""
    if not positions:
        return []
    return log.read(log.topics.events, positions[0][1], [off for _, _, off in positions])


class RunRecords(Protocol):
    """What :func:`state_at` and :func:`explain` read of a projection: a
    :class:`~runstate.projector.read.queries.Projection`, or serve's live stores."""

    def header(self, run_id: str) -> RunHeader | None: ...

    def history(self, run_id: str) -> list[Decision]: ...

    def accepted_positions(
        self, run_id: str, after_revision: int, up_to_revision: int | None = None
    ) -> list[tuple[int, int, int]]: ...


def state_at(
    log: EventLog, projection: RunRecords, run_id: str, revision: int, nearest: NearestCheckpoint | None = None
) -> RunState:
    """The run's state as it was at ``revision``, rebuilt from the log (see
    :func:`state_data_at`), validated. Raises :class:`RunNotFound` / :class:`RevisionNotFound`."""
    got = _rebuilt(log, projection, run_id, revision, nearest)
    # A replayed doc validates its items one by one as it assembles the state (the ones the
    # tail touched are models already); a checkpoint's state is validated whole.
    return got.to_state() if isinstance(got, RunDoc) else RunState.model_validate(got)


def state_data_at(
    log: EventLog, projection: RunRecords, run_id: str, revision: int, nearest: NearestCheckpoint | None = None
) -> dict[str, Any]:
    """The run's state as it was at ``revision``, rebuilt from the log, as plain JSON data
    (equal to :func:`state_at`'s ``model_dump(mode="json")``, without building the state).

    Starts from the nearest checkpoint at or below ``revision`` when ``nearest`` gives one
    (else from nothing), reads back only the run's accepted patches after it (their
    offsets come from the projection's history) and decides them again with the pure
    core; the checkpoint's items that those patches do not touch are never validated
    (:meth:`RunDoc.from_state_data`). Raises :class:`RunNotFound` / :class:`RevisionNotFound`.
    """
    got = _rebuilt(log, projection, run_id, revision, nearest)
    return got.to_state_data() if isinstance(got, RunDoc) else got


def _live_header(projection: RunRecords, run_id: str) -> RunHeader:
    """The run's header; :class:`RunNotFound` / :class:`RunErased` (its past is gone too)."""
    header = projection.header(run_id)
    if header is None:
        raise RunNotFound(run_id)
    if header.erasure is not None:
        raise RunErased(run_id, header.erasure.model_dump(mode="json"))
    return header


def _rebuilt(
    log: EventLog, projection: RunRecords, run_id: str, revision: int, nearest: NearestCheckpoint | None
) -> RunDoc | dict[str, Any]:
    """The checkpoint's state as plain data when one is at ``revision``, else the run's
    working form at ``revision`` (from the nearest checkpoint below it, or from nothing)."""
    header = _live_header(projection, run_id)
    current = header.revision
    if not 1 <= revision <= current:
        raise RevisionNotFound(run_id, revision, current)
    base = nearest(run_id, revision) if nearest is not None else None
    if base is not None and base["revision"] == revision:
        return base
    after = base["revision"] if base is not None else 0
    wanted = projection.accepted_positions(run_id, after, revision)
    if len(wanted) != revision - after:
        raise RevisionNotFound(run_id, revision, current)  # history before a restore is not local
    start = None if base is None else RunDoc.from_state_data(base)
    book = replay(_accepted_records(log, wanted), RunBook(load_doc=lambda r: start if r == run_id else None))
    doc = book.doc(run_id)
    if doc is None or doc.header.revision != revision:
        raise RevisionNotFound(run_id, revision, current)
    return doc


def accepted_after(
    log: EventLog,
    state: RunState,
    partition: int,
    covers_offset: int,
    decided: Callable[[str], bool] = lambda _p: False,
) -> list[Decision]:
    """The run's patches the log accepts after a checkpoint: the log read from
    ``covers_offset + 1`` (not the projection, which may lag) and decided from ``state``
    with the pure core. ``decided(patch_id)`` names the ids decided before the checkpoint
    (their resends are duplicates). Accepted decisions in log order."""
    run_id = state.run_id
    key = run_id.encode()
    start = RunDoc.from_state(state)
    book = RunBook(
        load_doc=lambda r: start if r == run_id else None,
        decided_before_restore=lambda r, p: r == run_id and decided(p),
    )
    end = log.end_offsets(log.topics.events).get(partition, 0)
    replay((r for r in log.scan(log.topics.events, partition, covers_offset + 1, end) if r.key == key), book)
    accepted = sorted((d for d in book.decided.values() if d.outcome == "accepted"), key=lambda d: d.offset)
    return [structs.to_model(d) for d in accepted]  # the core's structs (projector/core/decide.py) as models


@dataclass(frozen=True)
class FieldChange:
    """One accepted patch that changed the explained field."""

    revision: int
    offset: int
    agent_id: str
    agent_version: str
    event_types: list[str]
    before: Any
    after: Any


_ABSENT = object()


def _walk(value: Any, parts: list[str]) -> Any:
    """Follow ``parts`` into a JSON value; list items are addressed by their id."""
    cur = value
    for part in parts:
        if isinstance(cur, dict):
            cur = cur.get(part, _ABSENT)
        elif isinstance(cur, list):
            cur = next(
                (
                    x
                    for x in cur
                    if isinstance(x, dict) and part in (x.get("id"), x.get("key"), x.get("subject"), x.get("call_id"))
                ),
                _ABSENT,
            )
        else:
            cur = _ABSENT
        if cur is _ABSENT:
            return None
    return cur


def field_value(doc: RunDoc, path: str) -> Any:
    """The JSON value at a dotted ``path`` of a run's state, read from its working form:
    only the header field or the one item the path names is serialised, so the cost does
    not grow with the size of the run. List items are addressed by their id
    (``tasks.task_3.status``, ``goal.constraints.timeout.value``); a whole collection
    (``tasks``) is assembled when asked for."""
    parts = path.split(".")
    head, rest = parts[0], parts[1:]
    if head == "goal" and rest[:1] == ["constraints"]:
        head, rest = "constraints", rest[1:]
    if head in COLLECTIONS:
        if not rest:
            return [item.model_dump(mode="json") for item in doc.sorted_items(head)]
        entry = doc.entry(head, rest[0])
        # The struct's JSON values are the model's (schemas/structs.py).
        return None if entry is None else _walk(msgspec.to_builtins(entry[1]), rest[1:])
    if head == "goal" and not rest:
        return Goal.model_validate(
            {**msgspec.to_builtins(doc.header.goal), "constraints": doc.sorted_items("constraints")}
        ).model_dump(mode="json")
    if head not in RunHeader.model_fields:
        return None
    # The struct's JSON values are the model's (schemas/structs.py).
    return _walk(msgspec.to_builtins(getattr(doc.header, head)), rest)


def explain(log: EventLog, projection: RunRecords, run_id: str, path: str) -> list[FieldChange]:
    """Why ``path`` has its value: every accepted patch that changed it, with its author,
    agent version and events, replayed from the log. Raises :class:`RunNotFound`,
    :class:`RunErased`."""
    _live_header(projection, run_id)
    history = [d for d in projection.history(run_id) if d.outcome == "accepted"]
    if not history:
        raise RunNotFound(run_id)
    if history[0].revision != 1:
        raise RevisionNotFound(run_id, 1, history[-1].revision)  # restored: early history is not local
    by_offset = {d.offset: d for d in history}
    changes: list[FieldChange] = []
    before: list[Any] = [None]

    def look(rec: Record, _outcome: Applied | DeadLetter, book: RunBook) -> None:
        doc = book.docs.get(run_id)
        after = None if doc is None else field_value(doc, path)
        if after != before[0]:
            dec = by_offset[rec.offset]
            changes.append(
                FieldChange(
                    dec.revision, dec.offset, dec.agent_id, dec.agent_version, dec.event_types, before[0], after
                )
            )
        before[0] = after

    replay(_accepted_records(log, [(d.revision, d.partition, d.offset) for d in history]), on_record=look)
    return changes


@dataclass
class Mismatch:
    run_id: str
    projection_revision: int | None
    replay_revision: int | None
    first_differing_offset: int | None
    detail: str


@dataclass
class VerifyReport:
    runs: int = 0
    records: int = 0
    positions: dict[int, int] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    #: ``(partition, offset)`` of log records that fail their checksum (damaged on disk)
    damaged: list[tuple[int, int]] = field(default_factory=list)
    #: problems found by ``--deep`` (the log file's own check, checkpoints that do not validate)
    problems: list[str] = field(default_factory=list)
    #: partition -> (the projection's position, the log's end) where records are not decided
    #: yet: the projector is behind or stopped on them, and what it did not decide is not verified
    undecided: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.damaged and not self.problems and not self.undecided


def _first_difference(a: list[Decision], b: list[Decision]) -> int | None:
    for x, y in zip(a, b):
        if x != y:
            return x.offset
    if len(a) != len(b):
        longer = a if len(a) > len(b) else b
        return longer[min(len(a), len(b))].offset
    return None


#: ``deep_check(log) -> problems``: what ``verify --deep`` adds (the snapshotter's layer
#: passes its checkpoint validation here; the projector does not import it).
DeepCheck = Callable[[EventLog], list[str]]


def verify(
    log: EventLog,
    state_dir: str,
    *,
    scratch_dir: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    deep: DeepCheck | None = None,
) -> VerifyReport:
    """Replay the log from offset 0 into a scratch store, up to the positions the live
    projection has reached, and compare every run: state digest and decision history.
    Records that fail their checksum are reported as damaged. With ``deep``, also the
    log's own integrity check and what ``deep`` finds.

    ``on_progress(done, total)`` reports records replayed. Raises :class:`StoreError`
    when the live projection cannot be read (corrupt), :class:`LostRecords` when the log ends
    before records the projection saw.
    """
    report = VerifyReport()
    if deep is not None:
        report.problems = [*log.check_integrity(), *deep(log)]
    live = Projection(state_dir)
    positions = live.positions()
    report.positions = positions
    ends = log.end_offsets(log.topics.events)
    for p, end in sorted(ends.items()):
        if positions.get(p, 0) > end:
            live.close()
            raise LostRecords(p, end, positions[p], "the projection")
    report.undecided = {p: (positions.get(p, 0), end) for p, end in sorted(ends.items()) if positions.get(p, 0) < end}
    scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="runstate-verify-"))
    try:
        replayer = Projector(log, str(scratch), group_id="runstate-verify", publish_dead_letters=False)
        report.records = replayer.replay(positions, on_progress=on_progress)
        rebuilt = Projection(str(scratch))
        report.damaged = sorted((d.partition, d.offset) for d in rebuilt.dead_letters() if d.reason == "checksum")
        report.problems += [
            f"p{d.partition}@{d.offset} (run {d.key!r}) is unreadable: {d.reason}: {d.detail}"
            for d in live.dead_letters()
            if d.reason in UNREADABLE
        ]
        live_digests, replay_digests = live.digests(), rebuilt.digests()
        restored = live.restored()
        report.runs = len(set(live_digests) | set(replay_digests))
        for run_id in sorted(set(live_digests) | set(replay_digests)):
            lh, rh = live.history(run_id), rebuilt.history(run_id)
            if run_id in restored:  # restored from a checkpoint: compare the history after it
                lh = [d for d in lh if d.offset > restored[run_id]]
                rh = [d for d in rh if d.offset > restored[run_id]]
            if live_digests.get(run_id) == replay_digests.get(run_id) and lh == rh:
                continue
            lhead, rhead = live.header(run_id), rebuilt.header(run_id)
            report.mismatches.append(
                Mismatch(
                    run_id,
                    None if lhead is None else lhead.revision,
                    None if rhead is None else rhead.revision,
                    _first_difference(lh, rh),
                    "decision histories differ" if lh != rh else "state differs with equal histories",
                )
            )
        rebuilt.close()
    finally:
        live.close()
        if scratch_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return report


__all__ = [
    "FieldChange",
    "Mismatch",
    "VerifyReport",
    "explain",
    "field_value",
    "replay",
    "state_at",
    "state_data_at",
    "state_digest",
    "verify",
]
