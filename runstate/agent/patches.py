"""Patch drafts from events, and the errors a rejected patch raises (the handles' common ground)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic
from pydantic import TypeAdapter

from runstate.schemas import events
from runstate.schemas.errors import (
    ContractError,
    RunstateError,
    describe_validation_error,
)
from runstate.schemas.events import Model
from runstate.schemas.patch import Decision

#: Event types that commute with any concurrent patch (the catalogue's traits; here they
#: choose the default of ``rebase``, which the projector grants for the same set).
_COMMUTING = events.COMMUTING_EVENT_TYPES

_EVENT: TypeAdapter[Any] = TypeAdapter(events.Event)


def _event(data: dict[str, Any]) -> Model:
    """An event from its JSON form. Raises ``ContractError`` naming the field."""
    try:
        return _EVENT.validate_python(data)  # type: ignore[no-any-return]
    except pydantic.ValidationError as e:
        field_, msg = describe_validation_error(e)
        raise ContractError(f"invalid event: {msg}", field=field_) from e


def _draft(revision: int, evs: Sequence[Model | dict[str, Any]], rebase: bool | None) -> dict[str, Any]:
    """The patch draft of ``evs`` based on ``revision``; ``rebase`` defaults to whether every
    event commutes. Raises ``ContractError`` for an event that is not valid."""
    built = [e if isinstance(e, Model) else _event(e) for e in evs]
    if rebase is None:
        rebase = all(e.type in _COMMUTING for e in built) and revision > 0  # type: ignore[attr-defined]
    return {
        "expected_revision": revision,
        "events": [e.model_dump(mode="json", exclude_none=True) for e in built],
        "rebase": rebase,
    }


def _since(decision: Decision, history: list[Decision]) -> list[Decision]:
    return [d for d in history if d.outcome == "accepted" and d.revision > decision.expected_revision]


def _settled(decision: Decision, revision: int) -> int:
    """The handle's revision after an accepted ``decision``; raises :class:`PatchRejected`."""
    if decision.outcome != "accepted":
        raise PatchRejected(decision)
    return max(revision, decision.revision)


class PatchRejected(RunstateError):
    """The run refused a patch: ``decision`` says why (``reason``, ``rule``, ``message``)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        rule = f" [{decision.rule}]" if decision.rule else ""
        super().__init__(
            f"patch {decision.patch_id} of run {decision.run_id!r} rejected: "
            f"{decision.reason}{rule}: {decision.message or ''}".rstrip(": ")
        )


class RevisionConflict(PatchRejected):
    """The patch was based on ``expected`` but the run is at ``current``: read again (the
    decisions accepted since are in ``since``) and propose anew; nothing is retried for you."""

    def __init__(self, decision: Decision, since: list[Decision]) -> None:
        super().__init__(decision)
        self.expected = decision.expected_revision
        self.current = decision.revision
        self.since = since
