# GENERATED from the contract's pydantic models by `python -m runstate.schemas.structs --write`:
# do not edit. tests/schemas/test_structs.py fails while this file differs from what the models generate.
"""msgspec structs of the contract's models: the projector's internal form (see
:mod:`runstate.schemas.structs`, which derives them and converts to and from the models)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

import msgspec


class Scope(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.Scope` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.Scope'
    include: list[str] = msgspec.field(default_factory=list)
    exclude: list[str] = msgspec.field(default_factory=list)


class GoalSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.GoalSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GoalSpec'
    statement: str
    scope: Scope = msgspec.field(default_factory=Scope)
    acceptance: list[str] = msgspec.field(default_factory=list)


class Transition(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Transition` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Transition'
    action: str
    result_ref: str | None = None
    revision: int | None = None
    at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None


class Waiting(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Waiting` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Waiting'
    wait_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    kind: Literal['user', 'approval', 'external_event', 'timer']
    reason: str
    until: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    since: Annotated[datetime, msgspec.Meta(tz=True)] | None
    since_revision: int


class Budgets(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Budgets` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Budgets'
    tokens_remaining: int | None = None
    tokens_used: int = 0
    deadline: Annotated[datetime, msgspec.Meta(tz=True)] | None = None


class WorkspaceRefSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.WorkspaceRefSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.WorkspaceRefSpec'
    workspace_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    base_commit: str | None = None
    current_commit: str | None = None
    uncommitted_changes: str | None = None


class InputRecorders(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.InputRecorders` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.InputRecorders'
    origin: Literal['user', 'operator', 'approval', 'system_of_record']
    agents: list[Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]] = msgspec.field(default_factory=list)


class RunPolicy(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.RunPolicy` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunPolicy'
    writers: list[Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]] = msgspec.field(default_factory=list)
    observation_max_age_s: Annotated[int, msgspec.Meta(ge=1, le=9223372036854775807)] | None = None
    require_observations_for_side_effects: bool = False
    external_evidence_schemes: list[str] = msgspec.field(default_factory=list)
    revokers: list[Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]] = msgspec.field(default_factory=list)
    input_recorders: list[InputRecorders] = msgspec.field(default_factory=list)
    input_authority: Literal['channels', 'writers'] = 'channels'
    artifacts_from_tools: bool = False


class MigratedFrom(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.MigratedFrom` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.MigratedFrom'
    version: int
    path: list[int]


class Erasure(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Erasure` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Erasure'
    at: Annotated[datetime, msgspec.Meta(tz=True)]
    by: str
    reason: str
    revision: int = 0


class RunHeader(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.RunHeader` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.RunHeader'
    schema_version: int = 4
    run_id: str
    revision: int
    goal: GoalSpec
    phase: str | None = None
    status: Literal['running', 'waiting', 'completed', 'failed', 'cancelled', 'erased'] = 'running'
    active_task_id: str | None = None
    last_transition: Transition | None = None
    waiting: Waiting | None = None
    budgets: Budgets = msgspec.field(default_factory=Budgets)
    workspace_ref: WorkspaceRefSpec | None = None
    agent_version: str
    created_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    created_by: str | None = None
    updated_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    last_control_revision: int = 0
    effect_ledger_ref: str | None = None
    policy: RunPolicy = msgspec.field(default_factory=RunPolicy)
    revoked_agents: list[str] = msgspec.field(default_factory=list)
    migrated_from: MigratedFrom | None = None
    erasure: Erasure | None = None
    next_seq: int = 0
    running_task_ids: list[str] = msgspec.field(default_factory=list)
    sizes: dict[str, int] | None = None


class PriorValue(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.PriorValue` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.PriorValue'
    value: str
    source: str | None
    set_at_revision: int
    patch_id: str


class Constraint(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Constraint` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Constraint'
    key: str
    value: str
    source: str | None = None
    set_at_revision: int
    patch_id: str
    supersedes: PriorValue | None = None


class Goal(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Goal` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Goal'
    statement: str
    scope: Scope = msgspec.field(default_factory=Scope)
    acceptance: list[str] = msgspec.field(default_factory=list)
    constraints: list[Constraint] = msgspec.field(default_factory=list)


class Writer(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Writer` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Writer'
    agent_id: str
    agent_version: str


class Provenance(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Provenance` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Provenance'
    created_by: Writer
    created_at_revision: int
    updated_by: Writer
    updated_at_revision: int


class Fact(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Fact` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Fact'
    id: str
    statement: str
    evidence: str | None = None
    source: str | None = None
    observed_at: Annotated[datetime, msgspec.Meta(tz=True)]
    scope: str | None = None
    confirmed_at_revision: int
    replaces_hypothesis_id: str | None = None
    provenance: Provenance | None = None


class Hypothesis(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Hypothesis` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Hypothesis'
    id: str
    statement: str
    confidence: float
    falsifier: str
    proposed_at_revision: int
    revised_at_revision: int | None = None
    provenance: Provenance | None = None


class Question(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Question` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Question'
    id: str
    text: str
    opened_at_revision: int


class Task(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Task` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Task'
    id: str
    title: str
    status: Literal['pending', 'running', 'blocked', 'completed', 'failed', 'cancelled'] = 'pending'
    depends_on: list[str] = msgspec.field(default_factory=list)
    scope: list[str] = msgspec.field(default_factory=list)
    blocked_by: str | None = None
    evidence: str | None = None
    reason: str | None = None
    updated_at_revision: int
    owner: str | None = None
    provenance: Provenance | None = None


class Effect(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Effect` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Effect'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    status: Literal['started', 'committed', 'failed']
    kind: str | None = None
    target: str | None = None
    idempotency_key: str | None = None
    call_id: str | None = None
    evidence: str | None = None
    updated_at_revision: int
    provenance: Provenance | None = None


class Observation(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Observation` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Observation'
    subject: str
    observed_state: str
    observed_version: str | None = None
    observed_at: Annotated[datetime, msgspec.Meta(tz=True)]
    evidence: str | None = None
    recorded_at_revision: int
    provenance: Provenance | None = None


class ToolCall(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.ToolCall` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.ToolCall'
    call_id: str
    tool: str
    side_effect: bool = False
    costly: bool = False
    input_ref: str | None = None
    started_at: Annotated[datetime, msgspec.Meta(tz=True)]
    started_at_revision: int


class Artifact(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Artifact` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Artifact'
    id: str
    kind: str
    digest: str | None = None
    call_id: str | None = None
    tool: str | None = None
    registered_at_revision: int
    provenance: Provenance | None = None


class Input(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.Input` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.Input'
    id: str
    origin: Literal['user', 'operator', 'approval', 'system_of_record']
    text: str | None = None
    received_at: Annotated[datetime, msgspec.Meta(tz=True)]
    recorded_at_revision: int
    provenance: Provenance | None = None


class Blob(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.Blob` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.Blob'
    type: str
    data: str


class ChannelVersion(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.ChannelVersion` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ChannelVersion'
    channel: str
    version: str


class GraphWrite(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.GraphWrite` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphWrite'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    idx: Annotated[int, msgspec.Meta(ge=-9223372036854775808, le=9223372036854775807)]
    channel: str
    value: Blob
    task_path: str = ''


class GraphCheckpoint(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.GraphCheckpoint` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.GraphCheckpoint'
    key: str
    ns: str = ''
    id: str
    parent_id: str | None = None
    checkpoint: Blob | None = None
    metadata: Blob | None = None
    versions: list[ChannelVersion] | None = None
    saved_at_revision: int
    writes: list[GraphWrite] = msgspec.field(default_factory=list)


class GraphValueItem(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.GraphValueItem` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.GraphValueItem'
    key: str
    ns: str = ''
    channel: str
    version: str
    value: Blob | None = None
    saved_at_revision: int


class RunState(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.state.RunState` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.state.RunState'
    schema_version: int = 4
    run_id: str
    revision: int
    goal: Goal
    phase: str | None = None
    status: Literal['running', 'waiting', 'completed', 'failed', 'cancelled', 'erased']
    active_task_id: str | None = None
    last_transition: Transition | None = None
    waiting: Waiting | None = None
    budgets: Budgets = msgspec.field(default_factory=Budgets)
    workspace_ref: WorkspaceRefSpec | None = None
    agent_version: str
    created_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    created_by: str | None = None
    updated_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    last_control_revision: int = 0
    effect_ledger_ref: str | None = None
    policy: RunPolicy = msgspec.field(default_factory=RunPolicy)
    revoked_agents: list[str] = msgspec.field(default_factory=list)
    migrated_from: MigratedFrom | None = None
    erasure: Erasure | None = None
    confirmed_facts: list[Fact] = msgspec.field(default_factory=list)
    hypotheses: list[Hypothesis] = msgspec.field(default_factory=list)
    open_questions: list[Question] = msgspec.field(default_factory=list)
    tasks: list[Task] = msgspec.field(default_factory=list)
    effect_ledger: list[Effect] = msgspec.field(default_factory=list)
    environment_observations: list[Observation] = msgspec.field(default_factory=list)
    pending_tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    artifacts: list[Artifact] = msgspec.field(default_factory=list)
    inputs: list[Input] = msgspec.field(default_factory=list)
    graph_checkpoints: list[GraphCheckpoint] = msgspec.field(default_factory=list)
    graph_values: list[GraphValueItem] = msgspec.field(default_factory=list)


class Decision(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.patch.Decision` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.patch.Decision'
    patch_id: str
    run_id: str
    outcome: Literal['accepted', 'rejected']
    revision: int
    expected_revision: int
    reason: Literal['revision_conflict', 'superseded', 'invalid', 'unknown_run', 'run_terminal', 'patch_id_reused', 'unauthorized', 'run_erased'] | None = None
    rule: str | None = None
    message: str | None = None
    event_index: int | None = None
    rebased: bool = False
    partition: int
    offset: int
    agent_id: str
    agent_version: str
    event_types: list[str]
    created_at: Annotated[datetime, msgspec.Meta(tz=True)]
    content_digest: str | None = None


class RunStarted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='RunStarted'):
    """The struct of :class:`runstate.schemas.events.RunStarted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunStarted'
    type: ClassVar[Literal['RunStarted']] = 'RunStarted'
    goal: GoalSpec
    phase: str | None = None
    policy: RunPolicy = msgspec.field(default_factory=RunPolicy)


class GoalChanged(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='GoalChanged'):
    """The struct of :class:`runstate.schemas.events.GoalChanged` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GoalChanged'
    type: ClassVar[Literal['GoalChanged']] = 'GoalChanged'
    goal: GoalSpec
    reason: str | None = None


class ConstraintSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.ConstraintSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ConstraintSpec'
    key: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    value: str
    source: str | None = None


class ConstraintSet(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ConstraintSet'):
    """The struct of :class:`runstate.schemas.events.ConstraintSet` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ConstraintSet'
    type: ClassVar[Literal['ConstraintSet']] = 'ConstraintSet'
    constraint: ConstraintSpec


class PhaseChanged(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='PhaseChanged'):
    """The struct of :class:`runstate.schemas.events.PhaseChanged` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.PhaseChanged'
    type: ClassVar[Literal['PhaseChanged']] = 'PhaseChanged'
    phase: str


class FactSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.FactSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.FactSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    statement: str
    evidence: str | None = None
    source: str | None = None
    observed_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    scope: str | None = None


class FactConfirmed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='FactConfirmed'):
    """The struct of :class:`runstate.schemas.events.FactConfirmed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.FactConfirmed'
    type: ClassVar[Literal['FactConfirmed']] = 'FactConfirmed'
    fact: FactSpec
    replaces_hypothesis_id: str | None = None


class FactRetracted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='FactRetracted'):
    """The struct of :class:`runstate.schemas.events.FactRetracted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.FactRetracted'
    type: ClassVar[Literal['FactRetracted']] = 'FactRetracted'
    fact_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str


class HypothesisSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.HypothesisSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.HypothesisSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    statement: str
    confidence: float
    falsifier: str


class HypothesisProposed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='HypothesisProposed'):
    """The struct of :class:`runstate.schemas.events.HypothesisProposed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.HypothesisProposed'
    type: ClassVar[Literal['HypothesisProposed']] = 'HypothesisProposed'
    hypothesis: HypothesisSpec


class HypothesisRevised(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='HypothesisRevised'):
    """The struct of :class:`runstate.schemas.events.HypothesisRevised` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.HypothesisRevised'
    type: ClassVar[Literal['HypothesisRevised']] = 'HypothesisRevised'
    hypothesis_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    confidence: float | None = None
    statement: str | None = None
    falsifier: str | None = None


class HypothesisRejected(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='HypothesisRejected'):
    """The struct of :class:`runstate.schemas.events.HypothesisRejected` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.HypothesisRejected'
    type: ClassVar[Literal['HypothesisRejected']] = 'HypothesisRejected'
    hypothesis_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str
    evidence: str | None = None


class QuestionSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.QuestionSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.QuestionSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    text: str


class QuestionOpened(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='QuestionOpened'):
    """The struct of :class:`runstate.schemas.events.QuestionOpened` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.QuestionOpened'
    type: ClassVar[Literal['QuestionOpened']] = 'QuestionOpened'
    question: QuestionSpec


class QuestionResolved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='QuestionResolved'):
    """The struct of :class:`runstate.schemas.events.QuestionResolved` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.QuestionResolved'
    type: ClassVar[Literal['QuestionResolved']] = 'QuestionResolved'
    question_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    answer: str | None = None


class TaskSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.TaskSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    title: str
    depends_on: list[str] = msgspec.field(default_factory=list)
    scope: list[str] = msgspec.field(default_factory=list)


class TaskCreated(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskCreated'):
    """The struct of :class:`runstate.schemas.events.TaskCreated` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskCreated'
    type: ClassVar[Literal['TaskCreated']] = 'TaskCreated'
    task: TaskSpec


class TaskStarted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskStarted'):
    """The struct of :class:`runstate.schemas.events.TaskStarted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskStarted'
    type: ClassVar[Literal['TaskStarted']] = 'TaskStarted'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]


class TaskBlocked(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskBlocked'):
    """The struct of :class:`runstate.schemas.events.TaskBlocked` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskBlocked'
    type: ClassVar[Literal['TaskBlocked']] = 'TaskBlocked'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str


class TaskCompleted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskCompleted'):
    """The struct of :class:`runstate.schemas.events.TaskCompleted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskCompleted'
    type: ClassVar[Literal['TaskCompleted']] = 'TaskCompleted'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    evidence: str | None = None


class TaskFailed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskFailed'):
    """The struct of :class:`runstate.schemas.events.TaskFailed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskFailed'
    type: ClassVar[Literal['TaskFailed']] = 'TaskFailed'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str


class TaskCancelled(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskCancelled'):
    """The struct of :class:`runstate.schemas.events.TaskCancelled` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskCancelled'
    type: ClassVar[Literal['TaskCancelled']] = 'TaskCancelled'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str


class TaskHandedOver(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='TaskHandedOver'):
    """The struct of :class:`runstate.schemas.events.TaskHandedOver` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.TaskHandedOver'
    type: ClassVar[Literal['TaskHandedOver']] = 'TaskHandedOver'
    task_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    to_agent_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str | None = None


class ObservedVersion(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.ObservedVersion` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ObservedVersion'
    subject: str
    observed_version: str


class ToolCallStarted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ToolCallStarted'):
    """The struct of :class:`runstate.schemas.events.ToolCallStarted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ToolCallStarted'
    type: ClassVar[Literal['ToolCallStarted']] = 'ToolCallStarted'
    call_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    tool: str
    side_effect: bool = False
    costly: bool = False
    input_ref: str | None = None
    relies_on: list[ObservedVersion] = msgspec.field(default_factory=list)


class ToolSucceeded(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ToolSucceeded'):
    """The struct of :class:`runstate.schemas.events.ToolSucceeded` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ToolSucceeded'
    type: ClassVar[Literal['ToolSucceeded']] = 'ToolSucceeded'
    call_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    result_ref: str | None = None


class ToolFailed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ToolFailed'):
    """The struct of :class:`runstate.schemas.events.ToolFailed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ToolFailed'
    type: ClassVar[Literal['ToolFailed']] = 'ToolFailed'
    call_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    error: str
    result_ref: str | None = None


class ArtifactSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.ArtifactSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ArtifactSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    kind: str
    digest: str | None = None
    call_id: str | None = None


class ArtifactRecorded(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ArtifactRecorded'):
    """The struct of :class:`runstate.schemas.events.ArtifactRecorded` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ArtifactRecorded'
    type: ClassVar[Literal['ArtifactRecorded']] = 'ArtifactRecorded'
    artifact: ArtifactSpec


class InputSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.InputSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.InputSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    origin: Literal['user', 'operator', 'approval', 'system_of_record']
    text: str | None = None


class InputRecorded(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='InputRecorded'):
    """The struct of :class:`runstate.schemas.events.InputRecorded` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.InputRecorded'
    type: ClassVar[Literal['InputRecorded']] = 'InputRecorded'
    input: InputSpec


class ObservationSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.ObservationSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ObservationSpec'
    subject: str
    observed_state: str
    observed_version: str | None = None
    observed_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None
    evidence: str | None = None


class ObservationRecorded(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='ObservationRecorded'):
    """The struct of :class:`runstate.schemas.events.ObservationRecorded` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.ObservationRecorded'
    type: ClassVar[Literal['ObservationRecorded']] = 'ObservationRecorded'
    observation: ObservationSpec


class EffectSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.EffectSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.EffectSpec'
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    status: Literal['started', 'committed', 'failed']
    kind: str | None = None
    target: str | None = None
    idempotency_key: str | None = None
    call_id: str | None = None
    evidence: str | None = None


class EffectRecorded(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='EffectRecorded'):
    """The struct of :class:`runstate.schemas.events.EffectRecorded` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.EffectRecorded'
    type: ClassVar[Literal['EffectRecorded']] = 'EffectRecorded'
    effect: EffectSpec


class WorkspaceUpdated(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='WorkspaceUpdated'):
    """The struct of :class:`runstate.schemas.events.WorkspaceUpdated` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.WorkspaceUpdated'
    type: ClassVar[Literal['WorkspaceUpdated']] = 'WorkspaceUpdated'
    workspace_ref: WorkspaceRefSpec


class WaitingSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.WaitingSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.WaitingSpec'
    wait_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    kind: Literal['user', 'approval', 'external_event', 'timer']
    reason: str
    until: Annotated[datetime, msgspec.Meta(tz=True)] | None = None


class WaitingStarted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='WaitingStarted'):
    """The struct of :class:`runstate.schemas.events.WaitingStarted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.WaitingStarted'
    type: ClassVar[Literal['WaitingStarted']] = 'WaitingStarted'
    waiting: WaitingSpec


class WaitingResolved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='WaitingResolved'):
    """The struct of :class:`runstate.schemas.events.WaitingResolved` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.WaitingResolved'
    type: ClassVar[Literal['WaitingResolved']] = 'WaitingResolved'
    wait_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    resolution: str | None = None


class LeaseReleased(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='LeaseReleased'):
    """The struct of :class:`runstate.schemas.events.LeaseReleased` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.LeaseReleased'
    type: ClassVar[Literal['LeaseReleased']] = 'LeaseReleased'
    worker_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    lease_id: str | None = None


class BudgetSet(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='BudgetSet'):
    """The struct of :class:`runstate.schemas.events.BudgetSet` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.BudgetSet'
    type: ClassVar[Literal['BudgetSet']] = 'BudgetSet'
    tokens_remaining: Annotated[int, msgspec.Meta(ge=-9223372036854775808, le=9223372036854775807)] | None = None
    deadline: Annotated[datetime, msgspec.Meta(tz=True)] | None = None


class BudgetConsumed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='BudgetConsumed'):
    """The struct of :class:`runstate.schemas.events.BudgetConsumed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.BudgetConsumed'
    type: ClassVar[Literal['BudgetConsumed']] = 'BudgetConsumed'
    tokens: Annotated[int, msgspec.Meta(ge=-9223372036854775808, le=9223372036854775807)]


class PermissionRevoked(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='PermissionRevoked'):
    """The struct of :class:`runstate.schemas.events.PermissionRevoked` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.PermissionRevoked'
    type: ClassVar[Literal['PermissionRevoked']] = 'PermissionRevoked'
    agent_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    reason: str


class RunCompleted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='RunCompleted'):
    """The struct of :class:`runstate.schemas.events.RunCompleted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunCompleted'
    type: ClassVar[Literal['RunCompleted']] = 'RunCompleted'
    summary: str | None = None
    evidence: str | None = None


class RunFailed(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='RunFailed'):
    """The struct of :class:`runstate.schemas.events.RunFailed` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunFailed'
    type: ClassVar[Literal['RunFailed']] = 'RunFailed'
    reason: str


class RunCancelled(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='RunCancelled'):
    """The struct of :class:`runstate.schemas.events.RunCancelled` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunCancelled'
    type: ClassVar[Literal['RunCancelled']] = 'RunCancelled'
    reason: str


class GraphValue(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.GraphValue` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphValue'
    channel: str
    version: str
    value: Blob | None = None


class GraphCheckpointSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.GraphCheckpointSpec` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphCheckpointSpec'
    ns: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]*\\Z', max_length=2000)] = ''
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    parent_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)] | None = None
    checkpoint: Blob
    metadata: Blob
    versions: list[ChannelVersion] | None = None
    values: list[GraphValue] = msgspec.field(default_factory=list)


class GraphCheckpointSaved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='GraphCheckpointSaved'):
    """The struct of :class:`runstate.schemas.events.GraphCheckpointSaved` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphCheckpointSaved'
    type: ClassVar[Literal['GraphCheckpointSaved']] = 'GraphCheckpointSaved'
    checkpoint: GraphCheckpointSpec


class GraphWritesSaved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='GraphWritesSaved'):
    """The struct of :class:`runstate.schemas.events.GraphWritesSaved` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphWritesSaved'
    type: ClassVar[Literal['GraphWritesSaved']] = 'GraphWritesSaved'
    ns: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]*\\Z', max_length=2000)] = ''
    checkpoint_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    writes: list[GraphWrite]


class GraphCheckpointRef(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.events.GraphCheckpointRef` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphCheckpointRef'
    ns: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]*\\Z', max_length=2000)] = ''
    id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]


class GraphCheckpointsRemoved(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='GraphCheckpointsRemoved'):
    """The struct of :class:`runstate.schemas.events.GraphCheckpointsRemoved` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphCheckpointsRemoved'
    type: ClassVar[Literal['GraphCheckpointsRemoved']] = 'GraphCheckpointsRemoved'
    checkpoints: Annotated[list[GraphCheckpointRef], msgspec.Meta(min_length=1, max_length=500)]
    reason: str


class GraphThreadDeleted(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='GraphThreadDeleted'):
    """The struct of :class:`runstate.schemas.events.GraphThreadDeleted` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.GraphThreadDeleted'
    type: ClassVar[Literal['GraphThreadDeleted']] = 'GraphThreadDeleted'
    reason: str = 'thread deleted'


class RunErased(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False, tag_field='type', tag='RunErased'):
    """The struct of :class:`runstate.schemas.events.RunErased` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.events.RunErased'
    type: ClassVar[Literal['RunErased']] = 'RunErased'
    reason: Annotated[str, msgspec.Meta(min_length=1)]
    erased_by: Annotated[str, msgspec.Meta(min_length=1)]


class Author(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.patch.Author` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.patch.Author'
    agent_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    agent_version: Annotated[str, msgspec.Meta(min_length=1)]


class Patch(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """The struct of :class:`runstate.schemas.patch.Patch` (``__contract__``)."""

    __contract__: ClassVar[str] = 'runstate.schemas.patch.Patch'
    patch_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    run_id: Annotated[str, msgspec.Meta(pattern='^[^\\x00-\\x1f]+\\Z', min_length=1, max_length=200)]
    expected_revision: Annotated[int, msgspec.Meta(ge=0, le=9223372036854775807)]
    events: Annotated[list[RunStarted | GoalChanged | ConstraintSet | PhaseChanged | FactConfirmed | FactRetracted | HypothesisProposed | HypothesisRevised | HypothesisRejected | QuestionOpened | QuestionResolved | TaskCreated | TaskStarted | TaskBlocked | TaskCompleted | TaskFailed | TaskCancelled | TaskHandedOver | ToolCallStarted | ToolSucceeded | ToolFailed | ArtifactRecorded | InputRecorded | ObservationRecorded | EffectRecorded | WorkspaceUpdated | WaitingStarted | WaitingResolved | LeaseReleased | BudgetSet | BudgetConsumed | PermissionRevoked | RunCompleted | RunFailed | RunCancelled | GraphCheckpointSaved | GraphWritesSaved | GraphCheckpointsRemoved | GraphThreadDeleted | RunErased], msgspec.Meta(min_length=1)]
    author: Author
    created_at: Annotated[datetime, msgspec.Meta(tz=True)]
    rebase: bool = False
