"""decide: the projector's verdict on one patch, deterministically, from state + patch.

Order of checks (first that fails decides):

1. ``unknown_run`` — no state and the patch does not start the run at revision 0.
2. ``run_terminal`` — the run is completed, failed or cancelled.
3. revision check — ``expected_revision == revision``, except:
   - a patch of control events only (cancel, goal change) applies whatever it was based on,
     except that a goal change based before the last control event is ``superseded`` (control
     events conflict with each other; a cancel always applies);
   - any other patch based on a revision before the last control event is ``superseded``;
   - a ``rebase`` patch whose events all commute is re-validated on the current state;
   - otherwise ``revision_conflict``.
4. every event, in order, against the draft → ``invalid`` with the rule and event index.
5. accepted: revision + 1 (one revision per patch), ``agent_version`` from the author.

Rules of individual events are not here: each event's reducer checks its own rules while
it applies the event to a draft (:mod:`runstate.projector.core.reducer`); decide runs them in
order and turns the first :class:`RuleViolation` into ``invalid``. Duplicate ``patch_id``
handling needs the decision store, so it is the caller's first step
(:class:`runstate.projector.core.runbook.RunBook`).
"""

from __future__ import annotations

import functools
from datetime import datetime

from runstate.projector.core.outcomes import Decided
from runstate.projector.core.reducer import Ctx, RuleViolation, apply_event, input_recorders
from runstate.projector.core.working import Changes, Draft, Item, RunDoc
from runstate.schemas import events as ev

# The core's decisions are the msgspec struct of Decision (schemas/generated/structs.py): one
# per patch, written to the store as the model's JSON; the model is made where decisions leave
# the core for callers (structs.to_model).
from runstate.schemas.generated.structs import Decision as DecisionStruct
from runstate.schemas.generated.structs import Erasure as ErasureStruct
from runstate.schemas.generated.structs import FactConfirmed, RunPolicy
from runstate.schemas.generated.structs import GoalSpec as GoalSpecStruct
from runstate.schemas.generated.structs import Patch as PatchStruct
from runstate.schemas.generated.structs import RunErased as RunErasedStruct
from runstate.schemas.generated.structs import RunHeader as Header
from runstate.schemas.patch import RejectReason
from runstate.schemas.sealed import PatchEnvelope
from runstate.schemas.state import FINISHED_STATUSES

#: Events that commute with any concurrent patch (fresh ids are still checked): the event
#: catalogue's traits say which.
COMMUTING: frozenset[str] = ev.COMMUTING_EVENT_TYPES


def commutes(event: Item) -> bool:
    """True when ``event`` can be re-applied on a newer revision than it was based on."""
    if isinstance(event, FactConfirmed):
        return event.replaces_hypothesis_id is None
    return getattr(event, "type") in COMMUTING


def _decision(
    patch: PatchStruct,
    partition: int,
    offset: int,
    revision: int,
    *,
    reason: RejectReason | None = None,
    rule: str | None = None,
    message: str | None = None,
    event_index: int | None = None,
    rebased: bool = False,
    digest: str | None = None,
) -> DecisionStruct:
    # Every field, from the validated patch and the core's own values: not validated again
    # (tests hold each decision equal to its validated round trip, with every field set).
    return DecisionStruct(
        patch_id=patch.patch_id,
        run_id=patch.run_id,
        outcome="rejected" if reason else "accepted",
        revision=revision,
        expected_revision=patch.expected_revision,
        reason=reason,
        rule=rule,
        message=message,
        event_index=event_index,
        rebased=rebased,
        partition=partition,
        offset=offset,
        agent_id=patch.author.agent_id,
        agent_version=patch.author.agent_version,
        event_types=[e.type for e in patch.events],
        created_at=patch.created_at,
        content_digest=digest,
    )


def _erased_message(run_id: str, header: object) -> str:
    erasure = getattr(header, "erasure", None)
    if erasure is None:
        return f"run {run_id!r} was erased; nothing is accepted for it"
    return f"run {run_id!r} was erased at {erasure.at.isoformat()} by {erasure.by}; nothing is accepted for it"


def erased_envelope_decision(
    run_id: str, env: PatchEnvelope, doc: RunDoc | None, partition: int, offset: int
) -> DecisionStruct:
    """The decision on a patch whose content cannot be read any more because its run was
    erased (its key is destroyed): ``run_erased``, from its readable envelope."""
    return DecisionStruct(
        patch_id=env.patch_id,
        run_id=run_id,
        outcome="rejected",
        revision=0 if doc is None else doc.header.revision,
        expected_revision=env.expected_revision,
        reason="run_erased",
        rule=None,
        message=_erased_message(run_id, None if doc is None else doc.header),
        event_index=None,
        rebased=False,
        partition=partition,
        offset=offset,
        agent_id=env.agent_id,
        agent_version=env.agent_version,
        event_types=list(env.event_types),
        created_at=datetime.fromisoformat(env.created_at),
        content_digest=None,
    )


def _erase(doc: RunDoc | None, patch: PatchStruct, partition: int, offset: int, digest: str | None) -> Decided:
    """An erasure alone in its patch: the run becomes a tombstone (its header names the
    erasure, nothing else is left), built from the patch alone so that a replay that could
    not read the run's earlier patches (their keys destroyed) makes the same one."""
    e = patch.events[0]
    assert isinstance(e, RunErasedStruct)  # decide() calls this for a patch of one RunErased
    header = Header(
        run_id=patch.run_id,
        revision=patch.expected_revision,
        goal=GoalSpecStruct(statement="(erased)"),
        status="erased",
        agent_version=patch.author.agent_version,
        updated_at=patch.created_at,
        last_control_revision=patch.expected_revision,
        erasure=ErasureStruct(at=patch.created_at, by=e.erased_by, reason=e.reason, revision=patch.expected_revision),
    )
    decision = _decision(patch, partition, offset, digest=digest, revision=patch.expected_revision)
    return Decided(decision, RunDoc(header), Changes(header, wipe=True))


def _channel_inputs(policy: RunPolicy, patch: PatchStruct) -> bool:
    """Whether ``patch`` is only inputs its author may record: a channel (the user's, an
    approver's) writes those to a run whose writers do not name it."""
    agent = patch.author.agent_id
    return all(
        e.type == "InputRecorded" and agent in (input_recorders(policy, e.input.origin) or ()) for e in patch.events
    )


def _refused(
    patch: PatchStruct,
    partition: int,
    offset: int,
    digest: str | None,
    revision: int,
    reason: RejectReason,
    message: str,
    rule: str | None = None,
    event_index: int | None = None,
) -> Decided:
    """A rejection of ``patch`` at ``revision``, for ``reason``, said in ``message`` (for an
    ``invalid`` one, the ``rule`` and the event that broke it)."""
    return Decided(
        _decision(
            patch,
            partition,
            offset,
            revision,
            reason=reason,
            rule=rule,
            message=message,
            event_index=event_index,
            digest=digest,
        )
    )


def decide(
    doc: RunDoc | None,
    patch: PatchStruct,
    partition: int,
    offset: int,
    digest: str | None = None,
    log_time_ms: int | None = None,
) -> Decided:
    """Decide ``patch`` against the run's current working state ``doc`` (None: no state).

    Deterministic (no clock, randomness or I/O: the same ``doc`` and ``patch`` give the
    same decision and changes), but not side-effect free: a rejected patch leaves ``doc``
    untouched; an accepted one moves ``doc`` forward *in place* (the working state is owned
    by its single writer, and copying it per patch would cost its size) and returns it, or
    a new doc for ``RunStarted``, with ``changes`` listing what to persist.
    """
    types = [e.type for e in patch.events]
    # Every refusal below is of this patch, where it stands in the log.
    refuse = functools.partial(_refused, patch, partition, offset, digest)
    if doc is not None and doc.header.status == "erased":
        return refuse(
            doc.header.revision,
            "run_erased",
            message=_erased_message(patch.run_id, doc.header),
        )
    if types == ["RunErased"]:
        return _erase(doc, patch, partition, offset, digest)
    if doc is None:
        if types[0] != "RunStarted" or patch.expected_revision != 0:
            return refuse(
                0,
                "unknown_run",
                message=f"run {patch.run_id!r} was never started (first event must be RunStarted at revision 0)",
            )
        header = None
        current = 0
    else:
        header = doc.header
        current = header.revision
        # Deleting a LangGraph thread or some of its checkpoints is accepted in any status
        # (what LangGraph deletes must go).
        if header.status in FINISHED_STATUSES and not set(types) <= ev.ANY_STATUS_EVENT_TYPES:
            return refuse(
                current,
                "run_terminal",
                message=f"run {patch.run_id!r} is {header.status}; nothing is accepted after a terminal status",
            )

    if header is not None and patch.author.agent_id in header.revoked_agents:
        return refuse(
            current,
            "unauthorized",
            message=f"agent {patch.author.agent_id!r}'s permission to write run {patch.run_id!r} was revoked",
        )
    if (
        header is not None
        and header.policy.writers
        and patch.author.agent_id not in header.policy.writers
        and not _channel_inputs(header.policy, patch)
    ):
        return refuse(
            current,
            "unauthorized",
            message=f"agent {patch.author.agent_id!r} may not write run {patch.run_id!r} "
            f"(its writers: {', '.join(header.policy.writers)})",
        )

    if header is not None and "PermissionRevoked" in types:
        # Revocation is an administrator's act: the policy's revokers, else the run's creator
        # (a run whose creator was not recorded keeps the earlier rule: any writer).
        revokers = header.policy.revokers or ([header.created_by] if header.created_by else [])
        if revokers and patch.author.agent_id not in revokers:
            return refuse(
                current,
                "unauthorized",
                message=f"agent {patch.author.agent_id!r} may not revoke permissions on run "
                f"{patch.run_id!r} (its revokers: {', '.join(revokers)})",
            )

    rebased = False
    if patch.expected_revision != current:
        control_only = all(t in ev.CONTROL_EVENT_TYPES for t in types)
        # Control events win over the revision check but not over each other: a goal change
        # based before the last control event would silently undo it. A cancel always applies.
        wins = control_only and "GoalChanged" not in types
        if header is not None and patch.expected_revision < header.last_control_revision and not wins:
            return refuse(
                current,
                "superseded",
                message=f"based on revision {patch.expected_revision}, "
                f"before the control event at revision {header.last_control_revision}",
            )
        if control_only:
            pass  # control events win over the revision check
        elif patch.rebase and patch.expected_revision < current and all(commutes(e) for e in patch.events):
            rebased = True
        else:
            return refuse(
                current,
                "revision_conflict",
                message=f"expected revision {patch.expected_revision}, run is at {current}",
            )

    new_revision = current + 1
    ctx = Ctx(
        new_revision,
        patch.created_at,
        patch.patch_id,
        patch.author.agent_id,
        patch.author.agent_version,
        patch.expected_revision,
        log_time_ms,
    )
    draft = Draft(doc, header)
    for i, event in enumerate(patch.events):
        try:
            if i > 0 and draft.hget("status") in FINISHED_STATUSES:
                status = draft.hget("status")
                raise RuleViolation("run.terminal", f"event {i} ({event.type}) comes after the run became {status}")
            apply_event(draft, event, ctx)
        except RuleViolation as v:
            return refuse(
                current,
                "invalid",
                rule=v.rule,
                message=v.message,
                event_index=i,
            )
        if i == 0 and types[0] == "RunStarted":
            draft.hset(run_id=patch.run_id)

    update: dict[str, object] = {
        "revision": new_revision,
        "updated_at": patch.created_at,
        "agent_version": patch.author.agent_version,
    }
    if any(t in ev.CONTROL_EVENT_TYPES for t in types):
        update["last_control_revision"] = new_revision
    draft.hset(**update)
    new_doc, changes = draft.commit()
    return Decided(
        _decision(patch, partition, offset, digest=digest, revision=new_revision, rebased=rebased), new_doc, changes
    )
