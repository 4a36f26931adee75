"""The patch envelope (one log record) and the decision the projector takes on it."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import pydantic
from pydantic import AwareDatetime, Field

from runstate.schemas.errors import ContractError, UnknownEventType, describe_validation_error
from runstate.schemas.events import EVENT_TYPE_NAMES, OPERATOR_EVENT_TYPES, Event, Id, Model, Revision

M = TypeVar("M", bound=Model)


class Author(Model):
    """Who proposed a patch: the agent and the version (prompt/skills/tools) it ran."""

    agent_id: Id
    agent_version: str = Field(min_length=1)


class PatchDraft(Model):
    """What an agent (or a patch file) states; the producer completes it into a :class:`Patch`.

    The client's example (``{"expected_revision": 18, "events": [...]}``) is a valid draft
    as written: ``run_id`` comes from the caller, ``patch_id``/``author``/``created_at``
    from the producer when absent.
    """

    expected_revision: Revision
    events: list[Event] = Field(min_length=1)
    rebase: bool = False
    patch_id: Id | None = None
    run_id: Id | None = None
    author: Author | None = None
    created_at: AwareDatetime | None = None


class Patch(Model):
    """One log record: events applied all or none on top of ``expected_revision``.

    ``patch_id`` is the idempotency key: a patch id already decided gets the earlier
    decision and is applied once. ``rebase`` asks the projector to re-apply the patch on the
    current revision when all its events commute.
    """

    patch_id: Id
    run_id: Id
    expected_revision: Revision
    events: list[Event] = Field(min_length=1)
    author: Author
    created_at: AwareDatetime
    rebase: bool = False


Outcome = Literal["accepted", "rejected"]
RejectReason = Literal[
    "revision_conflict",
    "superseded",
    "invalid",
    "unknown_run",
    "run_terminal",
    "patch_id_reused",
    "unauthorized",
    "run_erased",
]


class Decision(Model):
    """The projector's verdict on one patch. Stored with the state; awaited by producers.

    ``revision`` is the run's revision after the decision: the new one when accepted, the
    current one when rejected. ``rule`` names the failed rule and ``event_index`` the event
    that broke it, for ``invalid``.
    """

    patch_id: str
    run_id: str
    outcome: Outcome
    revision: int
    expected_revision: int
    reason: RejectReason | None = None
    rule: str | None = None
    message: str | None = None
    event_index: int | None = None
    rebased: bool = False
    partition: int
    offset: int
    agent_id: str
    agent_version: str
    event_types: list[str]
    created_at: AwareDatetime
    #: blake2b-128 of the patch's log record: the same ``patch_id`` with other content is
    #: rejected as ``patch_id_reused``, not answered with this decision. None when the
    #: patch was decided without its record (in-memory tools).
    content_digest: str | None = None


def parse_draft(data: Any, *, where: str | None = None) -> PatchDraft:
    """Validate a patch draft (parsed JSON).

    Raises :class:`UnknownEventType` (with the catalogue) for an unknown ``type`` and
    :class:`ContractError` naming the first bad field otherwise.
    """
    if not isinstance(data, dict):
        check_draft_shape(data, where=where)  # raises: not a JSON object
    return validated(PatchDraft, data, where=where, drafted=True)


def check_draft_shape(data: Any, *, where: str | None = None) -> None:
    """The checks on a draft that come before its validation: a JSON object, and no event
    of an unknown ``type`` (named with the catalogue rather than as a union mismatch).
    Raises :class:`ContractError` / :class:`UnknownEventType`."""
    if not isinstance(data, dict):
        raise ContractError(f"a patch must be a JSON object, got {type(data).__name__}", where=where)
    events = data.get("events")
    if isinstance(events, list):
        for i, ev in enumerate(events):
            t = ev.get("type") if isinstance(ev, dict) else None
            if t is not None and t not in EVENT_TYPE_NAMES:
                raise UnknownEventType(str(t), list(EVENT_TYPE_NAMES), where=f"{where or 'patch'} events[{i}]")


def validated(model: type[M], data: dict[str, Any], *, where: str | None = None, drafted: bool = False) -> M:
    """``model.model_validate(data)``, a validation error raised as :class:`ContractError`
    naming the first bad field (the one wording for drafts and patches).

    ``drafted``: ``data`` is a draft or a patch completed from one, and a failure checks
    :func:`check_draft_shape` first, so an unknown event type is named with the catalogue
    (:class:`UnknownEventType`). Only on failure: a model that validates cannot hold an
    unknown type (the events union is tagged by it), so valid patches skip the scan."""
    try:
        got = model.model_validate(data)
    except pydantic.ValidationError as e:
        if drafted:
            check_draft_shape(data, where=where)
        field, msg = describe_validation_error(e)
        raise ContractError(f"invalid patch: {msg}", where=where, field=field) from e
    if drafted:
        for i, ev in enumerate(getattr(got, "events", ())):
            if ev.type in OPERATOR_EVENT_TYPES:
                raise ContractError(
                    f"{ev.type} is an operator's act, not a patch an agent proposes: use "
                    "`runstate erase RUN_ID --reason TEXT` or DELETE /runs/{id}",
                    where=where,
                    field=f"events[{i}]",
                )
    return got
