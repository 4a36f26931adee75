"""The checkpoint format: "is it safe to resume from here?", not only "what is the state".

A checkpoint is JSON (``Checkpoint.model_dump_json``), keyed by ``run_id`` on the
compacted checkpoints topic and kept per revision in the snapshotter's local store. It is
trusted only after :func:`validate`: the format and reducer versions must be current, an
older state schema is migrated (``schemas.migrations``), and the digest must match the
state it carries.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

import pydantic
from pydantic import AwareDatetime

from runstate.schemas.errors import CheckpointInvalid, MigrationRequired, describe_validation_error
from runstate.schemas.events import Model
from runstate.schemas.migrations import load_state
from runstate.schemas.patch import Decision
from runstate.schemas.state import (
    CURRENT_SCHEMA_VERSION,
    Effect,
    Observation,
    RunState,
    ToolCall,
    WorkspaceRef,
    raw_state_digest,
    state_digest,
)

#: Version of this checkpoint format.
FORMAT_VERSION = 1
#: Version of the reducer's semantics: bump when a reducer change would make the same log
#: give a different state, so that older checkpoints are not trusted.
REDUCER_VERSION = 1
#: Recent decisions carried by a checkpoint, so that a restored projector still answers a
#: producer's retry of a recent patch with its decision (older resends meet the revision check).
RECENT_DECISIONS = 4

#: A checkpoint's answer to "is it safe to resume from here?" (the ``verdict`` field).
ResumeVerdict = Literal["safe", "needs_reconciliation", "migration_required"]


class Reconciliation(Model):
    """What must be checked before resuming from this checkpoint."""

    #: side effects started and not recorded as committed or failed: outcome unknown.
    effects: list[Effect] = []
    #: side-effecting or costly tool calls still in flight at the checkpoint.
    tool_calls: list[ToolCall] = []
    #: observations of external systems: re-read (and compare versions) before a risky write.
    observations: list[Observation] = []


class Checkpoint(Model):
    """One run at one revision, with what a resume needs."""

    format_version: int = FORMAT_VERSION
    reducer_version: int = REDUCER_VERSION
    run_id: str
    revision: int
    #: the log position this checkpoint covers: every record of this run at an offset
    #: <= ``covers_offset`` of ``partition`` is included in ``state``.
    partition: int
    covers_offset: int
    schema_version: int
    agent_version: str
    workspace_ref: WorkspaceRef | None
    effect_ledger: list[Effect]
    pending_tool_calls: list[ToolCall]
    digest: str
    triggers: list[str]
    verdict: ResumeVerdict
    reconcile: Reconciliation
    recent_decisions: list[Decision] = []
    #: the patch time of the revision (never the snapshotter's clock); None for states
    #: migrated from schema v1, which did not record it.
    at: AwareDatetime | None
    state: RunState


def verdict_of(state: RunState) -> tuple[ResumeVerdict, Reconciliation]:
    """``needs_reconciliation`` exactly when an effect was started and not recorded as
    committed/failed, or a side-effecting call is still in flight; else ``safe``."""
    if state.schema_version != CURRENT_SCHEMA_VERSION:
        return "migration_required", Reconciliation()
    effects = [e for e in state.effect_ledger if e.status == "started"]
    calls = [c for c in state.pending_tool_calls if c.side_effect]
    if effects or calls:
        return "needs_reconciliation", Reconciliation(
            effects=effects, tool_calls=calls, observations=list(state.environment_observations)
        )
    return "safe", Reconciliation(observations=list(state.environment_observations))


def make_checkpoint(state: RunState, *, partition: int, covers_offset: int, triggers: list[str],
                    recent: list[Decision]) -> Checkpoint:  # fmt: skip
    verdict, reconcile = verdict_of(state)
    return Checkpoint(
        run_id=state.run_id, revision=state.revision, partition=partition, covers_offset=covers_offset,
        schema_version=state.schema_version, agent_version=state.agent_version,
        workspace_ref=state.workspace_ref, effect_ledger=state.effect_ledger,
        pending_tool_calls=state.pending_tool_calls, digest=state_digest(state), triggers=triggers,
        verdict=verdict, reconcile=reconcile, recent_decisions=recent[-RECENT_DECISIONS:],
        at=state.updated_at or state.created_at, state=state,
    )  # fmt: skip


def encode(cp: Checkpoint) -> bytes:
    return cp.model_dump_json().encode()


def validate_raw(raw: bytes) -> dict[str, Any]:
    """Check a checkpoint record and return it as a JSON document with a current-schema
    state. Raises :class:`CheckpointInvalid` when it is not JSON/not a checkpoint, from
    another format or reducer version, cannot be migrated, or its digest does not match
    its state. Cheap: the state is parsed into models only when it must be migrated."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CheckpointInvalid(None, f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise CheckpointInvalid(None, "not a JSON object")
    run_id = doc.get("run_id")
    if doc.get("format_version") != FORMAT_VERSION:
        raise CheckpointInvalid(run_id, f"format_version {doc.get('format_version')!r}, this runstate reads {FORMAT_VERSION}")
    if doc.get("reducer_version") != REDUCER_VERSION:
        raise CheckpointInvalid(run_id, f"reducer_version {doc.get('reducer_version')!r} != {REDUCER_VERSION}: "
                                        "its state may differ from a replay with today's rules")  # fmt: skip
    state_doc = doc.get("state")
    if not isinstance(state_doc, dict):
        raise CheckpointInvalid(run_id, "no state")
    if raw_state_digest(state_doc) != doc.get("digest"):
        raise CheckpointInvalid(run_id, "digest does not match the state (corrupted or edited)")
    if state_doc.get("run_id") != run_id or state_doc.get("revision") != doc.get("revision"):
        raise CheckpointInvalid(run_id, "state does not belong to this checkpoint's run/revision")
    if state_doc.get("schema_version") != CURRENT_SCHEMA_VERSION:
        try:
            migrated = load_state(state_doc)  # deterministic, or MIGRATION_REQUIRED
        except MigrationRequired as e:
            raise CheckpointInvalid(run_id, str(e)) from e
        state_json = migrated.model_dump(mode="json")
        doc = {**doc, "state": state_json, "schema_version": CURRENT_SCHEMA_VERSION, "digest": raw_state_digest(state_json)}
    return doc  # type: ignore[no-any-return]


def validate(raw: bytes) -> Checkpoint:
    """:func:`validate_raw`, then the whole checkpoint as models."""
    doc = validate_raw(raw)
    try:
        return Checkpoint.model_validate(doc)
    except pydantic.ValidationError as e:
        raise CheckpointInvalid(doc.get("run_id"), f"not a checkpoint: {describe_validation_error(e)[1]}") from e
