"""The Run State: "where is this run now?", with the client's reference field names.

The projection store keeps a run as a small *header* (:class:`RunHeader`: everything but
the growing collections) plus one record per collection item, so that an event writes
only what it changed. :class:`RunState` is the assembled, public document; its lists keep
the order in which items were added.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson

from pydantic import AwareDatetime

from runstate.schemas.events import (
    Blob,
    ChannelVersion,
    EffectSpec,
    GoalSpec,
    GraphValue,
    GraphWrite,
    Model,
    ObservationSpec,
    RunPolicy,
    WaitingSpec,
    WorkspaceRefSpec,
)

#: The state schema version this code writes. Older documents are migrated
#: (``schemas.migrations``); newer ones are refused as MIGRATION_REQUIRED.
CURRENT_SCHEMA_VERSION = 4

RunStatus = Literal["running", "waiting", "completed", "failed", "cancelled", "erased"]
#: The statuses a run ends in by its own events; an erased run has ended too.
FINISHED_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
TERMINAL_STATUSES: frozenset[str] = FINISHED_STATUSES | {"erased"}
TaskStatus = Literal["pending", "running", "blocked", "completed", "failed", "cancelled"]
#: A task still to be done (its goal's scope and its owner still matter), and one that is done.
OPEN_TASK_STATUSES: frozenset[str] = frozenset({"pending", "running", "blocked"})
DONE_TASK_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


class MigratedFrom(Model):
    """Where a migrated state came from: the version it was written in, the path taken."""

    version: int
    path: list[int]


class Writer(Model):
    """An agent, as it signed a patch."""

    agent_id: str
    agent_version: str


class Provenance(Model):
    """Who wrote an item, and in which revisions (the document: stable id, author, revision),
    so that a change is attributed, never last-write-wins without a trace."""

    created_by: Writer
    created_at_revision: int
    updated_by: Writer
    updated_at_revision: int


class PriorValue(Model):
    """The value a correction replaced, and where that value came from."""

    value: str
    source: str | None
    set_at_revision: int
    patch_id: str


class Constraint(Model):
    """The current value of a constraint; ``supersedes`` records what it corrected."""

    key: str
    value: str
    source: str | None = None
    set_at_revision: int
    patch_id: str
    supersedes: PriorValue | None = None


class Goal(GoalSpec):
    """The run's goal as its state shows it: as stated, with the constraints now in force."""

    constraints: list[Constraint] = []


class Fact(Model):
    """A confirmed fact: evidence or authoritative source, time, optional scope."""

    id: str
    statement: str
    evidence: str | None = None
    source: str | None = None
    observed_at: AwareDatetime
    scope: str | None = None
    confirmed_at_revision: int
    replaces_hypothesis_id: str | None = None
    #: None only for items migrated from documents that did not record it.
    provenance: Provenance | None = None


class Hypothesis(Model):
    id: str
    statement: str
    confidence: float
    falsifier: str
    proposed_at_revision: int
    revised_at_revision: int | None = None
    provenance: Provenance | None = None


class Question(Model):
    id: str
    text: str
    opened_at_revision: int


class Task(Model):
    id: str
    title: str
    status: TaskStatus = "pending"
    depends_on: list[str] = []
    scope: list[str] = []
    blocked_by: str | None = None
    evidence: str | None = None
    reason: str | None = None
    updated_at_revision: int
    #: the agent that started it; only the owner completes, fails, blocks or hands it over.
    owner: str | None = None
    provenance: Provenance | None = None


class Artifact(Model):
    """An artifact the run knows: registered by a tool result or declared by an agent."""

    id: str
    kind: str
    digest: str | None = None
    call_id: str | None = None
    tool: str | None = None
    registered_at_revision: int
    provenance: Provenance | None = None


class Input(Model):
    """An input from outside the agent, with its origin (what makes it authoritative)."""

    id: str
    origin: Literal["user", "operator", "approval", "system_of_record"]
    text: str | None = None
    received_at: AwareDatetime
    recorded_at_revision: int
    provenance: Provenance | None = None


class Observation(ObservationSpec):
    """An observation of an external subject; one current observation per subject."""

    observed_at: AwareDatetime
    recorded_at_revision: int
    provenance: Provenance | None = None


class Effect(EffectSpec):
    updated_at_revision: int
    provenance: Provenance | None = None


class ToolCall(Model):
    call_id: str
    tool: str
    side_effect: bool = False
    costly: bool = False
    input_ref: str | None = None
    started_at: AwareDatetime
    started_at_revision: int


class GraphCheckpoint(Model):
    """A LangGraph checkpoint of the run (a LangGraph thread is a run), with the writes
    saved against it. ``key`` is its key in the collection: the namespace's length, the
    namespace and the id (``0:/1ef…`` at the root), so that one namespace's checkpoints are
    one range of keys in id order (LangGraph's ids sort by time). LangGraph saves a step's
    writes and its next checkpoint concurrently, so writes may come first: until the
    checkpoint does, ``checkpoint`` and ``metadata`` are None and reads do not list it."""

    key: str
    ns: str = ""
    id: str
    parent_id: str | None = None
    checkpoint: Blob | None = None
    metadata: Blob | None = None
    #: the channel versions where the values are kept once per version (``graph_values``);
    #: None where ``checkpoint`` holds every value
    versions: list[ChannelVersion] | None = None
    saved_at_revision: int
    writes: list[GraphWrite] = []


class GraphCheckpointRead(GraphCheckpoint):
    """A LangGraph checkpoint as ``GET /runs/{id}/graph/checkpoints`` gives it: with the
    values of its channel versions that are kept apart (``graph_values``)."""

    values: list[GraphValue] = []


class GraphValueItem(Model):
    """One channel's value at one version of a LangGraph thread (see ``GraphCheckpointSpec``):
    kept while a checkpoint of its namespace refers to that version. ``key``:
    :func:`graph_value_key`."""

    key: str
    ns: str = ""
    channel: str
    version: str
    value: Blob | None = None
    saved_at_revision: int


def graph_value_key(ns: str, channel: str, version: str) -> str:
    """The key of a channel's value at a version, in namespace ``ns``."""
    return f"{len(ns)}:{ns}/{len(channel)}:{channel}/{version}"


def graph_key(ns: str, checkpoint_id: str = "") -> str:
    """The key of checkpoint ``checkpoint_id`` of namespace ``ns`` (its prefix when the id is empty)."""
    return f"{len(ns)}:{ns}/{checkpoint_id}"


class Transition(Model):
    """The last effective transition: what was done and where its result is."""

    action: str
    result_ref: str | None = None
    #: absent only on documents migrated from the reference schema (v3), which did not record them.
    revision: int | None = None
    at: AwareDatetime | None = None


class Waiting(WaitingSpec):
    #: None only for a wait migrated from a document that did not record when it began.
    since: AwareDatetime | None
    since_revision: int


class Budgets(Model):
    tokens_remaining: int | None = None
    tokens_used: int = 0
    deadline: AwareDatetime | None = None


WorkspaceRef = WorkspaceRefSpec


class Erasure(Model):
    """Who erased a run, when and why: what remains of an erased run."""

    at: AwareDatetime
    by: str
    reason: str
    #: the revision the operator saw when erasing (informational)
    revision: int = 0


class RunSummary(Model):
    """A run's header as listings show it (``GET /runs``, ``runstate runs``): everything of
    a run but its collections and the projector's bookkeeping (:class:`RunHeader` adds that).
    Its size does not grow with the number of facts/tasks/observations."""

    schema_version: int = CURRENT_SCHEMA_VERSION
    run_id: str
    revision: int
    goal: GoalSpec
    phase: str | None = None
    status: RunStatus = "running"
    active_task_id: str | None = None
    last_transition: Transition | None = None
    waiting: Waiting | None = None
    budgets: Budgets = Budgets()
    workspace_ref: WorkspaceRef | None = None
    agent_version: str
    #: None only for documents migrated from the reference schema (v3), which did not record them.
    created_at: AwareDatetime | None = None
    #: the agent that started the run (None: started before runstate recorded it)
    created_by: str | None = None
    updated_at: AwareDatetime | None = None
    #: revision produced by the last control event (cancel, goal change): patches based on
    #: an earlier revision are rejected as superseded.
    last_control_revision: int = 0
    #: the reference schema (v3) referred to an external effect ledger; kept, never dropped, on migration.
    effect_ledger_ref: str | None = None
    policy: RunPolicy = RunPolicy()
    #: agents whose permission to write was revoked (their patches are ``unauthorized``)
    revoked_agents: list[str] = []
    #: set when the state was migrated from an older schema version (kept through restores)
    migrated_from: MigratedFrom | None = None
    #: set when the run was erased (its status is then ``erased`` and nothing else is left)
    erasure: Erasure | None = None


class RunHeader(RunSummary):
    """The record rewritten on each accepted patch: the run's summary and the projector's
    bookkeeping (:data:`HEADER_INTERNAL_FIELDS`)."""

    #: next insertion sequence number for collection items (keeps "order added").
    next_seq: int = 0
    #: the tasks now running (sorted): which one is active after the active one stops.
    running_task_ids: list[str] = []
    #: how many items each collection holds, the empty ones left out (in the order of
    #: COLLECTIONS). A lookup in an empty collection is answered without reading the store:
    #: most of a run's collections stay empty, and each such read was a point read that
    #: missed. None: not counted (a header written before runstate counted them): then
    #: every lookup reads the store.
    sizes: dict[str, int] | None = None


#: Fields of the stored header that are bookkeeping of the projector, not the contract.
HEADER_INTERNAL_FIELDS = tuple(f for f in RunHeader.model_fields if f not in RunSummary.model_fields)


#: Collection name in RunState -> item model. Order is the order of RunState's fields.
COLLECTIONS: dict[str, type[Model]] = {
    "constraints": Constraint,
    "confirmed_facts": Fact,
    "hypotheses": Hypothesis,
    "open_questions": Question,
    "tasks": Task,
    "effect_ledger": Effect,
    "environment_observations": Observation,
    "pending_tool_calls": ToolCall,
    "artifacts": Artifact,
    "inputs": Input,
    "graph_checkpoints": GraphCheckpoint,
    "graph_values": GraphValueItem,
}


#: The field that identifies an item within its collection (default ``id``).
ITEM_KEY: dict[str, str] = {
    "constraints": "key",
    "environment_observations": "subject",
    "pending_tool_calls": "call_id",
    "graph_checkpoints": "key",
    "graph_values": "key",
}


class RunState(RunSummary):
    """The assembled Run State of one run at one revision (the public document): the run's
    summary (its header's fields, declared once in :class:`RunSummary`) and its collections.
    The goal carries its constraints here, and a state always states its status."""

    goal: Goal
    status: RunStatus
    confirmed_facts: list[Fact] = []
    hypotheses: list[Hypothesis] = []
    open_questions: list[Question] = []
    tasks: list[Task] = []
    effect_ledger: list[Effect] = []
    environment_observations: list[Observation] = []
    pending_tool_calls: list[ToolCall] = []
    artifacts: list[Artifact] = []
    inputs: list[Input] = []
    #: LangGraph's checkpoints of the thread, when runstate is its checkpointer (empty otherwise)
    graph_checkpoints: list[GraphCheckpoint] = []
    #: the channel values those checkpoints keep once per version
    graph_values: list[GraphValueItem] = []


def status_span(status: str) -> bytes:
    """How a run's status shows in the JSON of its header, state or checkpoint
    (``"status":"<status>"``): found by a byte search without decoding the document. JSON
    escapes the quotes inside a string value, so no content can spell it; a header has no
    other field of that name, and ``erased`` is no item's status in a checkpoint's state."""
    return b'"status":"' + status.encode() + b'"'


def raw_state_digest(doc: dict[str, Any]) -> str:
    """sha256 of a state document's canonical JSON (sorted keys). Works on any schema
    version, so a checkpoint's digest is checked before the state is migrated."""
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()


def state_digest(state: RunState) -> str:
    """The digest of a Run State: equal states have equal digests."""
    return raw_state_digest(state.model_dump(mode="json"))
