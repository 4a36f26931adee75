"""Run events: the facts an agent appends about its run.

Convention (docs/events.md): an event that introduces an object carries it under its singular
name (``goal``, ``fact``, ``hypothesis``, ``task``, ``question``, ``observation``,
``constraint``, ``effect``, ``waiting``, ``workspace_ref``); an event about an existing
object names it ``<kind>_id``.

These models check *shape* (types, required fields, unknown fields). The rules that need
the run's state or name a runtime policy (evidence required, confidence in [0, 1], task
transitions, ...) live in the reducer (``runstate.projector.core.reducer``, one function per
event type) so that a violation is a rejected decision with the rule's name, visible to
the agent, rather than a local exception only.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Annotated, Literal, Union

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


class Model(BaseModel):
    """Base of every contract model: immutable, unknown fields are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


#: An identifier: 1-200 characters, no control characters (the store uses NUL as a separator).
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]

#: The range of an Avro ``long`` (and of the store's JSON): every integer of the contract is
#: bounded by it when validated, and the reducer's arithmetic never leaves it.
MIN_LONG = -(2**63)
MAX_LONG = 2**63 - 1
Long = Annotated[int, Field(ge=MIN_LONG, le=MAX_LONG)]
Revision = Annotated[int, Field(ge=0, le=MAX_LONG)]


# --- objects introduced by events -------------------------------------------------------


class Scope(Model):
    """What the goal covers: path/area prefixes included and excluded."""

    include: list[str] = []
    exclude: list[str] = []


class GoalSpec(Model):
    """A goal as stated by RunStarted / GoalChanged."""

    statement: str
    scope: Scope = Scope()
    acceptance: list[str] = []


class ConstraintSpec(Model):
    """A constraint on the run (``key`` identifies it; a later value for a key supersedes)."""

    key: Id
    value: str
    source: str | None = None


class FactSpec(Model):
    """A confirmed fact. Needs ``evidence`` (an artifact or input the run knows, or a
    reference in a scheme the run's policy trusts) or a ``source`` (a recorded input: its
    origin is the authority); ``observed_at`` defaults to the patch time."""

    id: Id
    statement: str
    evidence: str | None = None
    source: str | None = None
    observed_at: AwareDatetime | None = None
    scope: str | None = None


class HypothesisSpec(Model):
    """A current explanation, with a confidence in [0, 1] and a way to falsify it."""

    id: Id
    statement: str
    confidence: float
    falsifier: str


class QuestionSpec(Model):
    """An open question the run must answer or have answered."""

    id: Id
    text: str


class TaskSpec(Model):
    """A planned task. ``depends_on`` names existing tasks; ``scope`` lists the paths/areas
    it touches, used to invalidate it when the goal's scope changes."""

    id: Id
    title: str
    depends_on: list[str] = []
    scope: list[str] = []


class ObservationSpec(Model):
    """What the agent saw of an external system at a time and version: never a fact about
    the present."""

    subject: str
    observed_state: str
    observed_version: str | None = None
    observed_at: AwareDatetime | None = None
    evidence: str | None = None


class EffectSpec(Model):
    """An external side effect, started then committed or failed (the effect ledger)."""

    id: Id
    status: Literal["started", "committed", "failed"]
    kind: str | None = None
    target: str | None = None
    idempotency_key: str | None = None
    call_id: str | None = None
    evidence: str | None = None


class WorkspaceRefSpec(Model):
    """Where the run's work lives: a workspace and its versions, never its content."""

    workspace_id: Id
    base_commit: str | None = None
    current_commit: str | None = None
    uncommitted_changes: str | None = None


class InputRecorders(Model):
    """Who may record inputs of one origin (``InputRecorded``): the service identities of that
    channel (the user channel's, an approver's, an operator's), not the agent itself."""

    origin: Literal["user", "operator", "approval", "system_of_record"]
    #: none: nobody may record inputs of this origin on this run
    agents: list[Id] = []


class RunPolicy(Model):
    """What a run asks of its writers, declared when it starts."""

    #: agents allowed to write this run (empty: any agent); others are rejected ``unauthorized``.
    writers: list[Id] = []
    #: an observation older than this (against the patch time) is stale for a risky write.
    observation_max_age_s: Annotated[int, Field(ge=1, le=MAX_LONG)] | None = None
    #: every side-effecting tool call must name the observations it relies on.
    require_observations_for_side_effects: bool = False
    #: evidence schemes the runtime cannot resolve but trusts (e.g. ``jira``): a fact may cite
    #: such a reference without the run knowing it as an artifact or input.
    external_evidence_schemes: list[str] = []
    #: agents that may revoke a writer's permission (``PermissionRevoked``: an administrator's
    #: act); empty: the agent that started the run. Others are rejected ``unauthorized``.
    revokers: list[Id] = []
    #: per origin, who may record inputs of it (``input.not_authorized`` for anyone else).
    input_recorders: list[InputRecorders] = []
    #: who records an input of an origin ``input_recorders`` does not name: ``channels``, only
    #: that origin's channel identity (the author whose agent id is the origin: ``user``,
    #: ``operator``, ``approval``, ``system_of_record``; serve gives it to that channel's
    #: token), never the agent; ``writers``, any writer (the rule of runs started by records
    #: of patch schema v5 and older, which the codec upcasts to it).
    input_authority: Literal["channels", "writers"] = "channels"
    #: artifacts only from tool results (``ToolSucceeded``/``ToolFailed``): an agent's own
    #: ``ArtifactRecorded`` is ``artifact.not_from_tool``.
    artifacts_from_tools: bool = False


class ArtifactSpec(Model):
    """Something a tool or an agent produced that a fact can cite (by its ``id``, a
    reference such as ``artifact://test-output/48``)."""

    id: Id
    kind: str
    digest: str | None = None
    call_id: str | None = None


#: Where an input comes from: what makes it authoritative (never the agent's own reasoning).
InputOrigin = Literal["user", "operator", "approval", "system_of_record"]


class InputSpec(Model):
    """A message or answer from outside the agent: a user's or operator's message, an
    approval, a system of record's answer. A fact's ``source`` names one."""

    id: Id
    origin: InputOrigin
    text: str | None = None


class ObservedVersion(Model):
    """An observation a risky action relies on: the subject and the version seen."""

    subject: str
    observed_version: str


class WaitingSpec(Model):
    """What the run waits for."""

    wait_id: Id
    kind: Literal["user", "approval", "external_event", "timer"]
    reason: str
    until: AwareDatetime | None = None


#: A LangGraph checkpoint namespace: "" for the root graph, ``parent:task|child:task`` for
#: subgraphs (LangGraph's own form; no control characters).
GraphNamespace = Annotated[str, Field(max_length=2000, pattern=r"^[^\x00-\x1f]*$")]


class Blob(Model):
    """A value serialized by LangGraph's serializer: its type tag and its bytes, the bytes as
    standard base64 text (the contract is JSON on every edge: HTTP, MCP, the store,
    checkpoints; one encoding for all of them)."""

    type: str
    data: str


class ChannelVersion(Model):
    """A channel of a LangGraph checkpoint and its version there (as text)."""

    channel: str
    version: str


class GraphValue(Model):
    """One channel's value at one version, as LangGraph's serializer wrote it (None: the
    channel has no value at that version, LangGraph's "empty")."""

    channel: str
    version: str
    value: Blob | None = None


class GraphCheckpointSpec(Model):
    """One LangGraph checkpoint of a thread (the run): LangGraph's own ids, the checkpoint
    and its metadata as LangGraph serialized them.

    ``versions`` None: ``checkpoint`` holds every channel's value. Otherwise, as LangGraph's
    own savers store them: ``versions`` is the checkpoint's channel versions (as text),
    ``checkpoint`` holds only the primitive values, and ``values`` the others of the
    channels whose version is new in this checkpoint; a channel that kept its version is
    read from the value saved with it before (once per version, not once per checkpoint)."""

    ns: GraphNamespace = ""
    id: Id
    parent_id: Id | None = None
    checkpoint: Blob
    metadata: Blob
    versions: list[ChannelVersion] | None = None
    values: list[GraphValue] = []


class GraphWrite(Model):
    """One pending write of a task: ``idx`` is LangGraph's (negative for its special
    channels, whose writes replace an earlier one)."""

    task_id: Id
    idx: Long
    channel: str
    value: Blob
    task_path: str = ""


class GraphCheckpointRef(Model):
    """One LangGraph checkpoint of a thread, by its namespace and id."""

    ns: GraphNamespace = ""
    id: Id


#: The most checkpoints one ``GraphCheckpointsRemoved`` names (a bigger removal is several patches).
MAX_GRAPH_REMOVALS = 500


# --- events -----------------------------------------------------------------------------


class RunStarted(Model):
    type: Literal["RunStarted"] = "RunStarted"
    goal: GoalSpec
    phase: str | None = None
    policy: RunPolicy = RunPolicy()


class GoalChanged(Model):
    """Control event: applies whatever revision it was based on; tasks whose scope falls
    out of the new goal are cancelled."""

    type: Literal["GoalChanged"] = "GoalChanged"
    goal: GoalSpec
    reason: str | None = None


class ConstraintSet(Model):
    """Sets a constraint; a later value for the same key supersedes (a correction)."""

    type: Literal["ConstraintSet"] = "ConstraintSet"
    constraint: ConstraintSpec


class PhaseChanged(Model):
    type: Literal["PhaseChanged"] = "PhaseChanged"
    phase: str


class FactConfirmed(Model):
    type: Literal["FactConfirmed"] = "FactConfirmed"
    fact: FactSpec
    replaces_hypothesis_id: str | None = None


class FactRetracted(Model):
    type: Literal["FactRetracted"] = "FactRetracted"
    fact_id: Id
    reason: str


class HypothesisProposed(Model):
    type: Literal["HypothesisProposed"] = "HypothesisProposed"
    hypothesis: HypothesisSpec


class HypothesisRevised(Model):
    type: Literal["HypothesisRevised"] = "HypothesisRevised"
    hypothesis_id: Id
    confidence: float | None = None
    statement: str | None = None
    falsifier: str | None = None


class HypothesisRejected(Model):
    type: Literal["HypothesisRejected"] = "HypothesisRejected"
    hypothesis_id: Id
    reason: str
    evidence: str | None = None


class QuestionOpened(Model):
    type: Literal["QuestionOpened"] = "QuestionOpened"
    question: QuestionSpec


class QuestionResolved(Model):
    type: Literal["QuestionResolved"] = "QuestionResolved"
    question_id: Id
    answer: str | None = None


class TaskCreated(Model):
    type: Literal["TaskCreated"] = "TaskCreated"
    task: TaskSpec


class TaskStarted(Model):
    type: Literal["TaskStarted"] = "TaskStarted"
    task_id: Id


class TaskBlocked(Model):
    type: Literal["TaskBlocked"] = "TaskBlocked"
    task_id: Id
    reason: str


class TaskCompleted(Model):
    type: Literal["TaskCompleted"] = "TaskCompleted"
    task_id: Id
    evidence: str | None = None


class TaskFailed(Model):
    type: Literal["TaskFailed"] = "TaskFailed"
    task_id: Id
    reason: str


class TaskCancelled(Model):
    type: Literal["TaskCancelled"] = "TaskCancelled"
    task_id: Id
    reason: str


class TaskHandedOver(Model):
    """The owner of a task gives it to another agent (the only way ownership moves)."""

    type: Literal["TaskHandedOver"] = "TaskHandedOver"
    task_id: Id
    to_agent_id: Id
    reason: str | None = None


class ToolCallStarted(Model):
    """A tool call in flight. ``side_effect``/``costly`` mark calls before which a
    checkpoint is taken and whose outcome must be reconciled after a crash."""

    type: Literal["ToolCallStarted"] = "ToolCallStarted"
    call_id: Id
    tool: str
    side_effect: bool = False
    costly: bool = False
    input_ref: str | None = None
    #: the observations this call relies on: rejected (``observation.stale``) unless each is
    #: the run's current observation of its subject, at that version, fresh enough.
    relies_on: list[ObservedVersion] = []


class ToolSucceeded(Model):
    type: Literal["ToolSucceeded"] = "ToolSucceeded"
    call_id: Id
    result_ref: str | None = None


class ToolFailed(Model):
    type: Literal["ToolFailed"] = "ToolFailed"
    call_id: Id
    error: str
    result_ref: str | None = None


class ArtifactRecorded(Model):
    type: Literal["ArtifactRecorded"] = "ArtifactRecorded"
    artifact: ArtifactSpec


class InputRecorded(Model):
    type: Literal["InputRecorded"] = "InputRecorded"
    input: InputSpec


class ObservationRecorded(Model):
    type: Literal["ObservationRecorded"] = "ObservationRecorded"
    observation: ObservationSpec


class EffectRecorded(Model):
    type: Literal["EffectRecorded"] = "EffectRecorded"
    effect: EffectSpec


class WorkspaceUpdated(Model):
    type: Literal["WorkspaceUpdated"] = "WorkspaceUpdated"
    workspace_ref: WorkspaceRefSpec


class WaitingStarted(Model):
    type: Literal["WaitingStarted"] = "WaitingStarted"
    waiting: WaitingSpec


class WaitingResolved(Model):
    type: Literal["WaitingResolved"] = "WaitingResolved"
    wait_id: Id
    resolution: str | None = None


class LeaseReleased(Model):
    """A worker gives up the run (end of its lease): a safe point to checkpoint."""

    type: Literal["LeaseReleased"] = "LeaseReleased"
    worker_id: Id
    lease_id: str | None = None


class BudgetSet(Model):
    type: Literal["BudgetSet"] = "BudgetSet"
    tokens_remaining: Long | None = None
    deadline: AwareDatetime | None = None


class BudgetConsumed(Model):
    type: Literal["BudgetConsumed"] = "BudgetConsumed"
    tokens: Long


class RunCompleted(Model):
    type: Literal["RunCompleted"] = "RunCompleted"
    summary: str | None = None
    evidence: str | None = None


class RunFailed(Model):
    type: Literal["RunFailed"] = "RunFailed"
    reason: str


class PermissionRevoked(Model):
    """Control event: the agent may no longer write the run, and what it produced after
    the revision this event was based on is invalidated (its tasks cancelled, its facts,
    hypotheses and artifacts removed; the log keeps them)."""

    type: Literal["PermissionRevoked"] = "PermissionRevoked"
    agent_id: Id
    reason: str


class RunCancelled(Model):
    """Control event: applies whatever revision it was based on."""

    type: Literal["RunCancelled"] = "RunCancelled"
    reason: str


class GraphCheckpointSaved(Model):
    """LangGraph's checkpointer saved a checkpoint of the thread (``runstate.integrations.langgraph``)."""

    type: Literal["GraphCheckpointSaved"] = "GraphCheckpointSaved"
    checkpoint: GraphCheckpointSpec


class GraphWritesSaved(Model):
    """LangGraph's checkpointer saved pending writes against a checkpoint of the thread; a
    write whose ``(task_id, idx)`` is already there is kept as it was, except on a special
    channel (``idx < 0``), whose write replaces it."""

    type: Literal["GraphWritesSaved"] = "GraphWritesSaved"
    ns: GraphNamespace = ""
    checkpoint_id: Id
    writes: list[GraphWrite]


class GraphCheckpointsRemoved(Model):
    """LangGraph's checkpointer removed some checkpoints of the thread (``prune``,
    ``delete_for_runs``): each named checkpoint and the writes saved against it leave the
    Run State; one that is not there is no error (removed already). The run goes on, and
    the log keeps what was removed (erasure removes it from the log)."""

    type: Literal["GraphCheckpointsRemoved"] = "GraphCheckpointsRemoved"
    checkpoints: Annotated[list[GraphCheckpointRef], Field(min_length=1, max_length=MAX_GRAPH_REMOVALS)]
    reason: str


class GraphThreadDeleted(Model):
    """LangGraph deleted the thread: every checkpoint and write of it leaves the Run State,
    and the run is cancelled, so that a late write cannot bring the thread back. Accepted on
    a run in any status (the log keeps what was deleted; erasure removes it from the log)."""

    type: Literal["GraphThreadDeleted"] = "GraphThreadDeleted"
    reason: str = "thread deleted"


class RunErased(Model):
    """Control event, an operator's act (``runstate erase``, ``DELETE /runs/{id}``; never an
    agent's: drafts and tools refuse it): the run's content leaves the Run State, its
    checkpoints and its history, and with the run's keys destroyed, the log's copies become
    unreadable. What stays is who erased it, when and why. Alone in its patch; accepted in
    any status; a second erasure of the run is rejected (``run_erased``): the first stands."""

    type: Literal["RunErased"] = "RunErased"
    reason: str = Field(min_length=1)
    erased_by: str = Field(min_length=1)


EVENT_TYPES: tuple[type[Model], ...] = (
    RunStarted,
    GoalChanged,
    ConstraintSet,
    PhaseChanged,
    FactConfirmed,
    FactRetracted,
    HypothesisProposed,
    HypothesisRevised,
    HypothesisRejected,
    QuestionOpened,
    QuestionResolved,
    TaskCreated,
    TaskStarted,
    TaskBlocked,
    TaskCompleted,
    TaskFailed,
    TaskCancelled,
    TaskHandedOver,
    ToolCallStarted,
    ToolSucceeded,
    ToolFailed,
    ArtifactRecorded,
    InputRecorded,
    ObservationRecorded,
    EffectRecorded,
    WorkspaceUpdated,
    WaitingStarted,
    WaitingResolved,
    LeaseReleased,
    BudgetSet,
    BudgetConsumed,
    PermissionRevoked,
    RunCompleted,
    RunFailed,
    RunCancelled,
    GraphCheckpointSaved,
    GraphWritesSaved,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    RunErased,
)

#: Every event type name, in catalogue order.
EVENT_TYPE_NAMES: tuple[str, ...] = tuple(t.__name__ for t in EVENT_TYPES)


@dataclass(frozen=True, slots=True)
class Traits:
    """What the runtime knows of an event type beyond its fields. Every set of event types
    below is derived from :data:`TRAITS`, and nowhere else is one written down."""

    #: A stale patch of such events is re-applied on the current revision when it asks
    #: (``rebase``), re-validated there: the event's effect does not depend on the revision
    #: it was based on (it adds an item or a quantity). ``FactConfirmed`` replacing a
    #: hypothesis does not commute (projector/core/decide.py ``commutes``).
    commutes: bool = False
    #: Wins over the revision check: applied whatever revision it was based on, and a later
    #: patch based before it is ``superseded``.
    control: bool = False
    #: Only an operator proposes it (``runstate erase``): a draft holding one is refused.
    operator: bool = False
    #: Accepted on a run in a terminal status too (a patch of only such events): what
    #: LangGraph deletes must go whatever became of the run.
    any_status: bool = False


_C, _CONTROL = Traits(commutes=True), Traits(control=True)
#: Every event type's traits (a test holds the keys to the catalogue).
TRAITS: dict[str, Traits] = {
    **{name: Traits() for name in EVENT_TYPE_NAMES},
    **{
        name: _C
        for name in (
            "FactConfirmed",
            "HypothesisProposed",
            "QuestionOpened",
            "ObservationRecorded",
            "ArtifactRecorded",
            "InputRecorded",
            "BudgetConsumed",
            "GraphCheckpointSaved",
            "GraphWritesSaved",
        )
    },
    **{name: _CONTROL for name in ("GoalChanged", "PermissionRevoked", "RunCancelled")},
    "GraphCheckpointsRemoved": Traits(commutes=True, any_status=True),
    "GraphThreadDeleted": Traits(control=True, any_status=True),
    "RunErased": Traits(control=True, operator=True),
}

#: Events that commute with any concurrent patch (see :class:`Traits`).
COMMUTING_EVENT_TYPES: frozenset[str] = frozenset(n for n, t in TRAITS.items() if t.commutes)
#: Events that win over the revision check.
CONTROL_EVENT_TYPES: frozenset[str] = frozenset(n for n, t in TRAITS.items() if t.control)
#: Events only an operator proposes: a draft (HTTP, MCP, a patch file, ``RunProducer.build``)
#: holding one is refused.
OPERATOR_EVENT_TYPES: frozenset[str] = frozenset(n for n, t in TRAITS.items() if t.operator)

#: Events accepted on a run in a terminal status (a patch of only these).
ANY_STATUS_EVENT_TYPES: frozenset[str] = frozenset(n for n, t in TRAITS.items() if t.any_status)

#: Any event: a discriminated union on ``type`` over the catalogue above (one list only).
Event = Annotated[Union[EVENT_TYPES], Field(discriminator="type")]  # type: ignore[valid-type]
