"""What the core hands out: the outcome of deciding one patch (:class:`Decided`), of folding
one log record (:class:`Applied`), and a record that could not be decided
(:class:`DeadLetter`). The driver, the store and the read side all import them from here.
Patches and decisions are in the core's one form, the generated structs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from runstate.projector.core.working import Changes, RunDoc
from runstate.schemas.generated.structs import Decision, Patch
from runstate.schemas.sealed import PatchEnvelope


class Decided(NamedTuple):
    """What :func:`decide` returns: the decision and, when accepted, the run's new
    working state and what changed. (Not to be confused with a checkpoint's resume
    verdict, :data:`runstate.snapshotter.checkpoint.ResumeVerdict`.) A named tuple:
    immutable, and made in half a frozen dataclass's time (one per patch)."""

    decision: Decision
    doc: RunDoc | None = None
    changes: Changes | None = None


class Applied(NamedTuple):
    """The outcome of one patch: its decision, and what changed (None unless accepted now).
    (A named tuple, immutable as a frozen dataclass, made in half the time: one per patch.)"""

    patch: Patch
    #: None only for a duplicate of a patch decided before its run was restored from a
    #: checkpoint (known by id; its decision is not kept)
    decision: Decision | None
    changes: Changes | None
    duplicate: bool = False


class Erased(NamedTuple):
    """A patch of an erased run: its content cannot be read any more (the run's keys are
    destroyed), its envelope can."""

    run_id: str
    envelope: PatchEnvelope


@dataclass
class DeadLetter:
    """A record that could not be turned into a decision, and why."""

    partition: int
    offset: int
    reason: str
    detail: str
    key: str | None
    size: int
