"""Replay tooling: state at any revision, and proof that the projection equals a replay.

Both go back to the log, the source of truth, and run the same pure core (RunBook ->
decide -> reducers) that the projector runs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlog.base import EventLog
from projector.book import RunBook
from projector.doc import RunDoc
from projector.loop import Projector
from projector.queries import Projection, state_digest
from schemas.codec import decode
from schemas.errors import DecodeError, RevisionNotFound, RunNotFound
from schemas.patch import Decision, Patch
from schemas.state import RunState


def fold(patches: Iterable[tuple[Patch, int, int]]) -> RunBook:
    """Decide ``(patch, partition, offset)`` in order from empty state (pure, in memory)."""
    book = RunBook()
    for patch, partition, offset in patches:
        book.apply(patch, partition, offset)
    return book


#: ``nearest(run_id, revision)`` -> a trusted state at the newest checkpoint <= revision, or None.
NearestCheckpoint = Callable[[str, int], RunState | None]


def state_at(log: EventLog, projection: Projection, run_id: str, revision: int,
             nearest: NearestCheckpoint | None = None) -> RunState:  # fmt: skip
    """The run's state as it was at ``revision``, rebuilt from the log.

    Starts from the nearest checkpoint at or below ``revision`` when ``nearest`` gives one
    (else from nothing), reads back only the run's accepted patches after it (their
    offsets come from the projection's history) and decides them again with the pure
    core. Raises :class:`RunNotFound` / :class:`RevisionNotFound`.
    """
    history = projection.history(run_id)
    header = projection.header(run_id)
    if header is None:
        raise RunNotFound(run_id)
    current = header.revision
    if not 1 <= revision <= current:
        raise RevisionNotFound(run_id, revision, current)
    base = nearest(run_id, revision) if nearest is not None else None
    if base is not None and base.revision == revision:
        return base
    after = base.revision if base is not None else 0
    wanted = [d for d in history if d.outcome == "accepted" and after < d.revision <= revision]
    if len(wanted) != revision - after:
        raise RevisionNotFound(run_id, revision, current)  # history before a restore is not local
    start = None if base is None else RunDoc.from_state(base)
    book = RunBook(load_doc=lambda r: start if r == run_id else None)
    if wanted:
        records = log.read(log.topics.events, wanted[0].partition, [d.offset for d in wanted])
        for r in records:
            book.apply(decode(r.value), r.partition, r.offset)
    doc = book.doc(run_id)
    if doc is None or doc.header.revision != revision:
        raise RevisionNotFound(run_id, revision, current)
    return doc.to_state()


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


def field_value(state_json: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of a state document; list items are addressed by
    their id (``tasks.task_3.status``, ``goal.constraints.timeout.value``)."""
    cur: Any = state_json
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part, _ABSENT)
        elif isinstance(cur, list):
            cur = next((x for x in cur if isinstance(x, dict) and part in
                        (x.get("id"), x.get("key"), x.get("subject"), x.get("call_id"))), _ABSENT)  # fmt: skip
        else:
            cur = _ABSENT
        if cur is _ABSENT:
            return None
    return cur


def explain(log: EventLog, projection: Projection, run_id: str, path: str) -> list[FieldChange]:
    """Why ``path`` has its value: every accepted patch that changed it, with its author,
    agent version and events, replayed from the log. Raises :class:`RunNotFound`."""
    history = [d for d in projection.history(run_id) if d.outcome == "accepted"]
    if not history:
        raise RunNotFound(run_id)
    if history[0].revision != 1:
        raise RevisionNotFound(run_id, 1, history[-1].revision)  # restored: early history is not local
    records = log.read(log.topics.events, history[0].partition, [d.offset for d in history])
    book = RunBook()
    changes: list[FieldChange] = []
    before: Any = None
    for rec, dec in zip(records, history):
        book.apply(decode(rec.value), rec.partition, rec.offset)
        doc = book.docs.get(run_id)
        after = None if doc is None else field_value(doc.to_state().model_dump(mode="json"), path)
        if after != before:
            changes.append(FieldChange(dec.revision, dec.offset, dec.agent_id, dec.agent_version, dec.event_types,
                                       before, after))  # fmt: skip
        before = after
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

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _first_difference(a: list[Decision], b: list[Decision]) -> int | None:
    for x, y in zip(a, b):
        if x != y:
            return x.offset
    if len(a) != len(b):
        longer = a if len(a) > len(b) else b
        return longer[min(len(a), len(b))].offset
    return None


def verify(log: EventLog, state_dir: str, *, scratch_dir: str | None = None,
           on_progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Replay the log from offset 0 into a scratch store, up to the positions the live
    projection has reached, and compare every run: state digest and decision history.

    ``on_progress(done, total)`` reports records replayed.
    """
    report = VerifyReport()
    live = Projection(state_dir)
    positions = live.positions()
    report.positions = positions
    scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="runstate-verify-"))
    try:
        replayer = Projector(log, str(scratch), group_id="runstate-verify", publish_dead_letters=False)
        replayer.layout.ensure(log.topics.events, log.partitions(log.topics.events))
        replayer._on_assign(sorted(positions))
        total = sum(positions.values())
        done = 0
        for p, end in sorted(positions.items()):
            chunk = []
            for rec in log.scan(log.topics.events, p, 0, end):
                chunk.append(rec)
                if len(chunk) >= 2000:
                    replayer.process(chunk)
                    done += len(chunk)
                    chunk = []
                    if on_progress:
                        on_progress(done, total)
            if chunk:
                replayer.process(chunk)
                done += len(chunk)
        report.records = done
        replayer._on_revoke(sorted(positions))
        replay = Projection(str(scratch))
        live_digests, replay_digests = live.digests(), replay.digests()
        restored = live.restored()
        report.runs = len(set(live_digests) | set(replay_digests))
        for run_id in sorted(set(live_digests) | set(replay_digests)):
            lh, rh = live.history(run_id), replay.history(run_id)
            if run_id in restored:  # restored from a checkpoint: compare the history after it
                lh = [d for d in lh if d.offset > restored[run_id]]
                rh = [d for d in rh if d.offset > restored[run_id]]
            if live_digests.get(run_id) == replay_digests.get(run_id) and lh == rh:
                continue
            lhead, rhead = live.header(run_id), replay.header(run_id)
            report.mismatches.append(Mismatch(
                run_id,
                None if lhead is None else lhead.revision,
                None if rhead is None else rhead.revision,
                _first_difference(lh, rh),
                "decision histories differ" if lh != rh else "state differs with equal histories",
            ))  # fmt: skip
        replay.close()
    finally:
        live.close()
        if scratch_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return report


__all__ = ["DecodeError", "FieldChange", "Mismatch", "VerifyReport", "explain", "fold", "state_at", "state_digest", "verify"]
