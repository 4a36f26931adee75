"""The reducer: one pure function per event type, registered by type.

Each function checks the runtime rules its event must meet against the draft (raising
:class:`RuleViolation` with the rule's name) and then applies the event to the draft.
No clock, randomness, environment or I/O: time comes from the patch (``Ctx.at``), so the
same state and the same event give the same bytes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from runstate.projector.core.working import Draft, Item
from runstate.schemas import events as ev
from runstate.schemas import state, structs
from runstate.schemas.generated import structs as gen

# Items are built and read in their working form: the msgspec structs generated from the
# state's models (schemas/generated/structs.py), which the type checker sees as they are. A
# struct's constructor validates nothing: every value is the validated patch's or the core's
# own (tests/projector/test_properties.py holds each item equal to its validated round trip).
from runstate.schemas.generated.structs import (
    Artifact,
    Constraint,
    Effect,
    Fact,
    GraphCheckpoint,
    GraphValueItem,
    Hypothesis,
    Input,
    Observation,
    PriorValue,
    Provenance,
    Question,
    Task,
    ToolCall,
    Writer,
)
from runstate.schemas.generated.structs import Budgets as HeaderBudgets
from runstate.schemas.generated.structs import RunHeader as Header
from runstate.schemas.generated.structs import Transition as HeaderTransition
from runstate.schemas.generated.structs import Waiting as HeaderWaiting
from runstate.schemas.structs import updated

_REFERENCE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")


class RuleViolation(Exception):
    """An event breaks a runtime rule. ``rule`` is a stable name such as
    ``fact.evidence_required``; the patch is rejected as ``invalid`` with it."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        self.message = message
        super().__init__(f"{rule}: {message}")


@dataclass(slots=True)
class Ctx:
    """What an event is applied with: the revision the patch will produce and its time."""

    revision: int
    at: datetime
    patch_id: str
    agent_id: str
    agent_version: str
    #: the revision the patch was based on (what a revocation invalidates after)
    base_revision: int = 0
    #: the log's time for the patch in ms (when the log appended it), which rules that depend
    #: on time use (``at`` is the client's claim); None: decided without its record, ``at`` then
    log_ms: int | None = None

    @property
    def now(self) -> datetime:
        """The time the rules that depend on time measure against (made when one asks: most
        patches hold no such rule)."""
        return self.at if self.log_ms is None else datetime.fromtimestamp(self.log_ms / 1000, UTC)

    #: the provenance of every item this patch creates: one object per patch, not per item,
    #: made on first use (a patch that creates no item, a budget use say, makes none)
    _new: Provenance | None = field(default=None, init=False, repr=False)

    def created(self) -> Provenance:
        """The provenance of an item this patch creates."""
        new = self._new
        if new is None:
            w = _writer(self.agent_id, self.agent_version)
            new = self._new = Provenance(
                created_by=w, created_at_revision=self.revision, updated_by=w, updated_at_revision=self.revision
            )
        return new

    def touched(self, prior: Provenance | None) -> Provenance:
        """The provenance of an item this patch changes (created as before, updated now)."""
        if prior is None:  # an item migrated from a document that did not record it
            return self.created()
        return Provenance(
            created_by=prior.created_by,
            created_at_revision=prior.created_at_revision,
            updated_by=self.created().updated_by,
            updated_at_revision=self.revision,
        )


@functools.lru_cache(maxsize=1024)
def _writer(agent_id: str, agent_version: str) -> Writer:
    """Writers repeat (few agents, many patches): one frozen object per agent and version."""
    return Writer(agent_id=agent_id, agent_version=agent_version)


E = TypeVar("E")
Handler = Callable[[Draft, Any, Ctx], None]
REDUCERS: dict[str, Handler] = {}
#: Per event type, the item its reducer reads first, as ``(collection, id)`` of the event:
#: a hint to read it ahead with the batch (see :meth:`RunBook.prefetch`). A hint only
#: moves a read earlier; a wrong one costs a read, never a different decision (the
#: reducer reads what it needs either way). Tests hold each to a read the reducer makes.
READS: dict[str, Callable[[Any], tuple[str, str]]] = {}

#: Version of the reducer's semantics (with decide.py's rules): bump it when a change would
#: make the same log give another decision or state, so that checkpoints made under the old
#: rules are not trusted. tests/projector/test_reducer_golden.py fails when the decisions of a fixed
#: corpus change and this does not. 2: evidence to complete a task, budgets and deadlines,
#: loose ends, control conflicts; 3: log time, revokers, inputs by channel; 4: artifacts
#: and inputs commute (a stale patch of them with ``rebase`` is applied); 5: LangGraph's
#: checkpoints removed by name (``GraphCheckpointsRemoved``); 6: LangGraph's channel values
#: kept once per version (``graph_values``); 7: a patch built again with a new time (a
#: client's resend) is a duplicate of the first, not ``patch_id_reused``.
REDUCER_VERSION = 7


def reducer(
    event_type: type[E],
    reads: Callable[[E], tuple[str, str]] | None = None,
) -> Callable[[Callable[[Draft, E, Ctx], None]], Callable[[Draft, E, Ctx], None]]:
    def register(fn: Callable[[Draft, E, Ctx], None]) -> Callable[[Draft, E, Ctx], None]:
        REDUCERS[event_type.__name__] = fn
        if reads is not None:
            READS[event_type.__name__] = reads
        return fn

    return register


def apply_event(draft: Draft, event: Item, ctx: Ctx) -> None:
    """Check and apply one event to ``draft``. Raises :class:`RuleViolation`."""
    REDUCERS[event.type](draft, event, ctx)  # type: ignore[attr-defined]


#: ``_set(draft, **changes)``: the draft's header changes (the method itself: a wrapper
#: was a call and a repacking of the keywords per event).
_set = Draft.hset


def _require(cond: bool, rule: str, message: str) -> None:
    if not cond:
        raise RuleViolation(rule, message)


def _reference(value: str | None, rule: str, what: str) -> None:
    if value is not None:
        _require(bool(_REFERENCE.match(value)), rule, f"{what} {value!r} is not a reference (scheme://...)")


# --- run lifecycle, goal, constraints, phase --------------------------------------------


@reducer(gen.RunStarted)
def _run_started(d: Draft, e: gen.RunStarted, ctx: Ctx) -> None:
    _require(not d.started, "run.already_started", "the run was already started")
    _require(bool(e.goal.statement.strip()), "goal.statement_required", "a goal needs a statement")
    d.header = Header(
        run_id="",  # set by decide, which knows the run id
        revision=0,
        goal=e.goal,
        phase=e.phase,
        agent_version=ctx.agent_version,
        created_at=ctx.at,
        created_by=ctx.agent_id,
        updated_at=ctx.at,
        policy=e.policy,
        sizes={},
    )


def _in_scope(path: str, scope: gen.Scope) -> bool:
    if any(path.startswith(x) for x in scope.exclude):
        return False
    return not scope.include or any(path.startswith(i) for i in scope.include)


@reducer(gen.GoalChanged)
def _goal_changed(d: Draft, e: gen.GoalChanged, ctx: Ctx) -> None:
    _require(bool(e.goal.statement.strip()), "goal.statement_required", "a goal needs a statement")
    _set(d, goal=e.goal)
    cancelled: set[str] = set()
    for task in list(d.values("tasks")):
        assert isinstance(task, Task)
        if task.status in state.OPEN_TASK_STATUSES and task.scope:
            if not any(_in_scope(p, e.goal.scope) for p in task.scope) or any(
                any(p.startswith(x) for x in e.goal.scope.exclude) for p in task.scope
            ):
                _cancel_task(d, task, f"out of scope after goal change at revision {ctx.revision}", ctx)
                cancelled.add(task.id)
    # No silent orphans: what depends on a cancelled task cannot run either.
    while cancelled:
        newly: set[str] = set()
        for task in list(d.values("tasks")):
            assert isinstance(task, Task)
            lost = sorted(set(task.depends_on) & cancelled)
            if task.status in state.OPEN_TASK_STATUSES and lost:
                _cancel_task(
                    d,
                    task,
                    f"depends on {', '.join(lost)}, cancelled by the goal change at revision {ctx.revision}",
                    ctx,
                )
                newly.add(task.id)
        cancelled = newly


@reducer(gen.ConstraintSet, reads=lambda e: ("constraints", e.constraint.key))
def _constraint_set(d: Draft, e: gen.ConstraintSet, ctx: Ctx) -> None:
    c = e.constraint
    prior = d.get("constraints", c.key)
    supersedes = None
    if isinstance(prior, Constraint):
        supersedes = PriorValue(
            value=prior.value, source=prior.source, set_at_revision=prior.set_at_revision, patch_id=prior.patch_id
        )
    d.put(
        "constraints",
        c.key,
        Constraint(
            key=c.key,
            value=c.value,
            source=c.source,
            set_at_revision=ctx.revision,
            patch_id=ctx.patch_id,
            supersedes=supersedes,
        ),
    )


@reducer(gen.PhaseChanged)
def _phase_changed(d: Draft, e: gen.PhaseChanged, ctx: Ctx) -> None:
    _set(d, phase=e.phase)


@reducer(gen.RunCompleted)
def _run_completed(d: Draft, e: gen.RunCompleted, ctx: Ctx) -> None:
    _reference(e.evidence, "run.evidence_reference", "evidence")
    running = d.hget("running_task_ids")
    _require(
        not running,
        "run.tasks_running",
        f"the run cannot complete while tasks run: {', '.join(running)} (complete, fail or cancel them)",
    )
    calls = [c.call_id for c in d.values("pending_tool_calls")]  # type: ignore[attr-defined]
    _require(not calls, "run.calls_in_flight", f"the run cannot complete with tool calls in flight: {', '.join(calls)}")
    _set(
        d,
        status="completed",
        active_task_id=None,
        waiting=None,
        last_transition=HeaderTransition(
            action="run completed", result_ref=e.evidence, revision=ctx.revision, at=ctx.at
        ),
    )


@reducer(gen.RunFailed)
def _run_failed(d: Draft, e: gen.RunFailed, ctx: Ctx) -> None:
    _close_loose_ends(d, f"run failed: {e.reason}", ctx)
    _set(
        d,
        status="failed",
        active_task_id=None,
        waiting=None,
        last_transition=HeaderTransition(action=f"run failed: {e.reason}", revision=ctx.revision, at=ctx.at),
    )


@reducer(gen.PermissionRevoked)
def _permission_revoked(d: Draft, e: gen.PermissionRevoked, ctx: Ctx) -> None:
    revoked = d.hget("revoked_agents")
    _require(e.agent_id not in revoked, "permission.already_revoked", f"agent {e.agent_id!r} is already revoked")
    _require(e.agent_id != ctx.agent_id, "permission.self_revoked", "an agent cannot revoke itself")
    _set(d, revoked_agents=sorted({*revoked, e.agent_id}))

    def since_base(item: object) -> bool:
        p = getattr(item, "provenance", None)
        return p is not None and p.created_by.agent_id == e.agent_id and p.created_at_revision > ctx.base_revision

    why = f"permission of {e.agent_id!r} revoked at revision {ctx.revision}: {e.reason}"
    for task in list(d.values("tasks")):
        assert isinstance(task, Task)
        if task.status in state.OPEN_TASK_STATUSES and (since_base(task) or task.owner == e.agent_id):
            _cancel_task(d, task, why, ctx)
    for kind, key in (("confirmed_facts", "id"), ("hypotheses", "id"), ("artifacts", "id")):
        for item in list(d.values(kind)):
            if since_base(item):
                d.delete(kind, getattr(item, key))


@reducer(gen.RunCancelled)
def _run_cancelled(d: Draft, e: gen.RunCancelled, ctx: Ctx) -> None:
    _close_loose_ends(d, f"run cancelled: {e.reason}", ctx)
    _set(
        d,
        status="cancelled",
        active_task_id=None,
        waiting=None,
        last_transition=HeaderTransition(action=f"run cancelled: {e.reason}", revision=ctx.revision, at=ctx.at),
    )


@reducer(gen.RunErased)
def _run_erased(d: Draft, e: gen.RunErased, ctx: Ctx) -> None:
    # decide() applies an erasure that is alone in its patch; reaching a reducer, it is not.
    _require(False, "run.erasure_alone", "RunErased must be the only event of its patch")


# --- facts, hypotheses, questions ---------------------------------------------------------


@reducer(gen.FactConfirmed, reads=lambda e: ("confirmed_facts", e.fact.id))
def _fact_confirmed(d: Draft, e: gen.FactConfirmed, ctx: Ctx) -> None:
    f = e.fact
    _require(d.get("confirmed_facts", f.id) is None, "fact.duplicate_id", f"fact {f.id!r} already exists")
    _require(
        bool(f.evidence or f.source),
        "fact.evidence_required",
        f"fact {f.id!r} needs evidence (a reference) or an authoritative source",
    )
    _reference(f.evidence, "fact.evidence_reference", f"evidence of fact {f.id!r}")
    if f.evidence is not None:
        # Citable evidence is what the run knows (a tool's result, a declared artifact, a
        # recorded input) or a scheme its policy trusts; a well-formed string is not enough.
        scheme = f.evidence.split("://", 1)[0]
        known = (
            d.get("artifacts", f.evidence) is not None
            or d.get("inputs", f.evidence) is not None
            or scheme in d.hget("policy").external_evidence_schemes
        )
        _require(
            known,
            "fact.evidence_unknown",
            f"evidence {f.evidence!r} of fact {f.id!r} is no artifact or input of this run (record it first: "
            "a tool result, ArtifactRecorded, InputRecorded) and its scheme is not trusted by the run's policy",
        )
    if f.source is not None:
        _require(
            isinstance(d.get("inputs", f.source), Input),
            "fact.source_not_authoritative",
            f"source {f.source!r} of fact {f.id!r} is no recorded input: authority comes from an input's "
            "origin (user, operator, approval, system of record), recorded with InputRecorded",
        )
    if e.replaces_hypothesis_id is not None:
        _require(
            d.get("hypotheses", e.replaces_hypothesis_id) is not None,
            "fact.unknown_hypothesis",
            f"hypothesis {e.replaces_hypothesis_id!r} does not exist",
        )
        d.delete("hypotheses", e.replaces_hypothesis_id)
    d.put(
        "confirmed_facts",
        f.id,
        Fact(
            id=f.id,
            statement=f.statement,
            evidence=f.evidence,
            source=f.source,
            observed_at=f.observed_at or ctx.at,
            scope=f.scope,
            confirmed_at_revision=ctx.revision,
            replaces_hypothesis_id=e.replaces_hypothesis_id,
            provenance=ctx.created(),
        ),
    )


@reducer(gen.FactRetracted, reads=lambda e: ("confirmed_facts", e.fact_id))
def _fact_retracted(d: Draft, e: gen.FactRetracted, ctx: Ctx) -> None:
    _require(d.get("confirmed_facts", e.fact_id) is not None, "fact.unknown", f"fact {e.fact_id!r} does not exist")
    d.delete("confirmed_facts", e.fact_id)


def _check_confidence(value: float) -> None:
    _require(0.0 <= value <= 1.0, "hypothesis.confidence_range", f"confidence {value} is not in [0, 1]")


@reducer(gen.HypothesisProposed, reads=lambda e: ("hypotheses", e.hypothesis.id))
def _hypothesis_proposed(d: Draft, e: gen.HypothesisProposed, ctx: Ctx) -> None:
    h = e.hypothesis
    _require(d.get("hypotheses", h.id) is None, "hypothesis.duplicate_id", f"hypothesis {h.id!r} already exists")
    _check_confidence(h.confidence)
    _require(
        bool(h.falsifier.strip()),
        "hypothesis.falsifier_required",
        f"hypothesis {h.id!r} needs a falsifier (how it would be proven wrong)",
    )
    d.put(
        "hypotheses",
        h.id,
        Hypothesis(
            id=h.id,
            statement=h.statement,
            confidence=h.confidence,
            falsifier=h.falsifier,
            proposed_at_revision=ctx.revision,
            provenance=ctx.created(),
        ),
    )


@reducer(gen.HypothesisRevised, reads=lambda e: ("hypotheses", e.hypothesis_id))
def _hypothesis_revised(d: Draft, e: gen.HypothesisRevised, ctx: Ctx) -> None:
    h = d.get("hypotheses", e.hypothesis_id)
    _require(isinstance(h, Hypothesis), "hypothesis.unknown", f"hypothesis {e.hypothesis_id!r} does not exist")
    assert isinstance(h, Hypothesis)
    update: dict[str, Any] = {"revised_at_revision": ctx.revision, "provenance": ctx.touched(h.provenance)}
    if e.confidence is not None:
        _check_confidence(e.confidence)
        update["confidence"] = e.confidence
    if e.statement is not None:
        update["statement"] = e.statement
    if e.falsifier is not None:
        _require(bool(e.falsifier.strip()), "hypothesis.falsifier_required", "a falsifier cannot be emptied")
        update["falsifier"] = e.falsifier
    d.put("hypotheses", h.id, updated(h, update))


@reducer(gen.HypothesisRejected, reads=lambda e: ("hypotheses", e.hypothesis_id))
def _hypothesis_rejected(d: Draft, e: gen.HypothesisRejected, ctx: Ctx) -> None:
    _require(
        d.get("hypotheses", e.hypothesis_id) is not None,
        "hypothesis.unknown",
        f"hypothesis {e.hypothesis_id!r} does not exist",
    )
    d.delete("hypotheses", e.hypothesis_id)


@reducer(gen.QuestionOpened, reads=lambda e: ("open_questions", e.question.id))
def _question_opened(d: Draft, e: gen.QuestionOpened, ctx: Ctx) -> None:
    q = e.question
    _require(d.get("open_questions", q.id) is None, "question.duplicate_id", f"question {q.id!r} is already open")
    d.put("open_questions", q.id, Question(id=q.id, text=q.text, opened_at_revision=ctx.revision))


@reducer(gen.QuestionResolved, reads=lambda e: ("open_questions", e.question_id))
def _question_resolved(d: Draft, e: gen.QuestionResolved, ctx: Ctx) -> None:
    _require(
        d.get("open_questions", e.question_id) is not None,
        "question.unknown",
        f"question {e.question_id!r} is not open",
    )
    d.delete("open_questions", e.question_id)


# --- tasks: pending -> running -> blocked/completed/failed/cancelled; blocked -> running ---

TASK_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "cancelled"}),
    "running": frozenset({"blocked", "completed", "failed", "cancelled"}),
    "blocked": frozenset({"running", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


def _task(d: Draft, task_id: str) -> Task:
    t = d.get("tasks", task_id)
    _require(isinstance(t, Task), "task.unknown", f"task {task_id!r} does not exist")
    assert isinstance(t, Task)
    return t


def _move(d: Draft, t: Task, to: str, ctx: Ctx, **update: Any) -> None:
    _require(to in TASK_TRANSITIONS[t.status], "task.transition", f"task {t.id!r} cannot go from {t.status} to {to}")
    d.put(
        "tasks",
        t.id,
        updated(
            t, {"status": to, "updated_at_revision": ctx.revision, "provenance": ctx.touched(t.provenance), **update}
        ),
    )
    running = set(d.hget("running_task_ids"))
    if to == "running":
        _set(d, active_task_id=t.id, running_task_ids=sorted(running | {t.id}))
    elif t.id in running:
        running.discard(t.id)
        _set(d, running_task_ids=sorted(running))
        if d.hget("active_task_id") == t.id:
            _set(d, active_task_id=_most_recently_started(d, running))


def _most_recently_started(d: Draft, running: set[str]) -> str | None:
    """The active task when the active one stops running: the running task started last
    (highest revision, then id). Decided from the tasks themselves, so a run restored from a
    checkpoint chooses as the live projection did."""
    tasks = [t for t in (d.get("tasks", i) for i in running) if isinstance(t, Task)]
    return max(tasks, key=lambda t: (t.updated_at_revision, t.id)).id if tasks else None


def _close_loose_ends(d: Draft, why: str, ctx: Ctx) -> None:
    """A run that fails or is cancelled: unfinished tasks are cancelled with the reason and
    plain calls in flight abandoned; side-effecting calls stay listed (their outcome is
    unknown: the checkpoint's verdict asks to reconcile them)."""
    for task in list(d.values("tasks")):
        assert isinstance(task, Task)
        if task.status in state.OPEN_TASK_STATUSES:
            _cancel_task(d, task, why, ctx)
    for call in list(d.values("pending_tool_calls")):
        assert isinstance(call, ToolCall)
        if not call.side_effect:
            d.delete("pending_tool_calls", call.call_id)


def _cancel_task(d: Draft, t: Task, reason: str, ctx: Ctx) -> None:
    _move(d, t, "cancelled", ctx, reason=reason)


@reducer(gen.TaskCreated, reads=lambda e: ("tasks", e.task.id))
def _task_created(d: Draft, e: gen.TaskCreated, ctx: Ctx) -> None:
    t = e.task
    _require(d.get("tasks", t.id) is None, "task.duplicate_id", f"task {t.id!r} already exists")
    for dep in t.depends_on:
        _require(dep != t.id, "task.dependency_cycle", f"task {t.id!r} depends on itself")
        _require(
            d.get("tasks", dep) is not None,
            "task.unknown_dependency",
            f"task {t.id!r} depends on {dep!r}, which does not exist",
        )
    # Dependencies must already exist, so a new task cannot close a cycle; the walk below
    # keeps that true even for documents that were migrated or restored.
    seen: set[str] = set()
    stack = list(t.depends_on)
    while stack:
        cur = stack.pop()
        _require(cur != t.id, "task.dependency_cycle", f"task {t.id!r} would close a dependency cycle via {cur!r}")
        if cur in seen:
            continue
        seen.add(cur)
        dep_task = d.get("tasks", cur)
        if isinstance(dep_task, Task):
            stack.extend(dep_task.depends_on)
    d.put(
        "tasks",
        t.id,
        Task(
            id=t.id,
            title=t.title,
            depends_on=t.depends_on,
            scope=t.scope,
            updated_at_revision=ctx.revision,
            provenance=ctx.created(),
        ),
    )


def _budget_allows_new_work(d: Draft, what: str, ctx: Ctx) -> None:
    """Starting work (a task, a costly call) needs budget left and the deadline ahead,
    measured against the log's time for the patch (not the time the client claims), which a
    replay reads from the same record: it decides the same way."""
    b = d.hget("budgets")
    _require(
        b.tokens_remaining is None or b.tokens_remaining > 0,
        "budget.exhausted",
        f"cannot start {what}: the token budget is exhausted ({b.tokens_remaining} remaining); "
        "a BudgetSet can extend it",
    )
    now = ctx.now
    _require(
        b.deadline is None or now <= b.deadline,
        "deadline.passed",
        f"cannot start {what}: the deadline {b.deadline.isoformat() if b.deadline else ''} has passed "
        f"(the log's time {now.isoformat()}); a BudgetSet can move it",
    )


def _owned_by_writer(t: Task, ctx: Ctx, doing: str) -> None:
    """Owned work is the owner's: another agent's claim or result is refused naming the
    owner (arbitration in log order, never last-write-wins)."""
    _require(
        t.owner is None or t.owner == ctx.agent_id,
        "task.not_owner",
        f"task {t.id!r} is owned by {t.owner!r}; {ctx.agent_id!r} cannot {doing} it "
        "(the owner hands it over with TaskHandedOver)",
    )


@reducer(gen.TaskStarted, reads=lambda e: ("tasks", e.task_id))
def _task_started(d: Draft, e: gen.TaskStarted, ctx: Ctx) -> None:
    t = _task(d, e.task_id)
    _owned_by_writer(t, ctx, "start")
    _budget_allows_new_work(d, f"task {t.id!r}", ctx)
    if t.status == "pending":
        pending = [x for x in t.depends_on if getattr(d.get("tasks", x), "status", None) != "completed"]
        _require(
            not pending,
            "task.dependencies_incomplete",
            f"task {t.id!r} cannot start before {', '.join(pending)} complete(s)",
        )
    _move(d, t, "running", ctx, blocked_by=None, owner=ctx.agent_id)


@reducer(gen.TaskBlocked, reads=lambda e: ("tasks", e.task_id))
def _task_blocked(d: Draft, e: gen.TaskBlocked, ctx: Ctx) -> None:
    t = _task(d, e.task_id)
    _owned_by_writer(t, ctx, "block")
    _move(d, t, "blocked", ctx, blocked_by=e.reason)


@reducer(gen.TaskCompleted, reads=lambda e: ("tasks", e.task_id))
def _task_completed(d: Draft, e: gen.TaskCompleted, ctx: Ctx) -> None:
    _require(
        e.evidence is not None,
        "task.evidence_required",
        f"completing task {e.task_id!r} needs evidence (a reference to what shows it is done)",
    )
    _reference(e.evidence, "task.evidence_reference", "evidence")
    t = _task(d, e.task_id)
    _owned_by_writer(t, ctx, "complete")
    _move(d, t, "completed", ctx, evidence=e.evidence, blocked_by=None)
    _set(
        d,
        last_transition=HeaderTransition(
            action=f"complete {e.task_id}", result_ref=e.evidence, revision=ctx.revision, at=ctx.at
        ),
    )


@reducer(gen.TaskFailed, reads=lambda e: ("tasks", e.task_id))
def _task_failed(d: Draft, e: gen.TaskFailed, ctx: Ctx) -> None:
    t = _task(d, e.task_id)
    _owned_by_writer(t, ctx, "fail")
    _move(d, t, "failed", ctx, reason=e.reason)
    _set(d, last_transition=HeaderTransition(action=f"fail {e.task_id}: {e.reason}", revision=ctx.revision, at=ctx.at))


@reducer(gen.TaskHandedOver, reads=lambda e: ("tasks", e.task_id))
def _task_handed_over(d: Draft, e: gen.TaskHandedOver, ctx: Ctx) -> None:
    t = _task(d, e.task_id)
    _require(t.owner is not None, "task.not_owned", f"task {t.id!r} has no owner to hand it over (start it first)")
    _owned_by_writer(t, ctx, "hand over")
    d.put(
        "tasks",
        t.id,
        updated(
            t, {"owner": e.to_agent_id, "updated_at_revision": ctx.revision, "provenance": ctx.touched(t.provenance)}
        ),
    )


@reducer(gen.TaskCancelled, reads=lambda e: ("tasks", e.task_id))
def _task_cancelled(d: Draft, e: gen.TaskCancelled, ctx: Ctx) -> None:
    _cancel_task(d, _task(d, e.task_id), e.reason, ctx)


# --- tool calls, observations, effects, workspace ----------------------------------------


@reducer(gen.ToolCallStarted, reads=lambda e: ("pending_tool_calls", e.call_id))
def _tool_call_started(d: Draft, e: gen.ToolCallStarted, ctx: Ctx) -> None:
    _require(
        d.get("pending_tool_calls", e.call_id) is None,
        "tool.duplicate_call",
        f"tool call {e.call_id!r} is already in flight",
    )
    waiting = d.hget("waiting")
    _require(
        not (e.side_effect and waiting is not None and waiting.kind == "approval"),
        "run.waiting",
        f"side-effecting call {e.call_id!r} ({e.tool}) while the run waits for approval "
        f"({waiting.wait_id if waiting else ''!r}): resolve the wait first",
    )
    if e.costly:
        _budget_allows_new_work(d, f"costly call {e.call_id!r} ({e.tool})", ctx)
    policy = d.hget("policy")
    _require(
        not (e.side_effect and policy.require_observations_for_side_effects and not e.relies_on),
        "observation.required",
        f"side-effecting call {e.call_id!r} must name the observations it relies on (the run's policy)",
    )
    for seen in e.relies_on:
        # The document: before a high-risk write, re-read and compare the version.
        current = d.get("environment_observations", seen.subject)
        _require(
            isinstance(current, Observation),
            "observation.stale",
            f"call {e.call_id!r} relies on {seen.subject!r}, which the run has not observed",
        )
        assert isinstance(current, Observation)
        _require(
            current.observed_version == seen.observed_version,
            "observation.stale",
            f"call {e.call_id!r} relies on {seen.subject!r} at {seen.observed_version!r}, but the run last saw "
            f"{current.observed_version!r}: re-read it",
        )
        age = (ctx.now - current.observed_at).total_seconds()
        _require(
            policy.observation_max_age_s is None or age <= policy.observation_max_age_s,
            "observation.stale",
            f"call {e.call_id!r} relies on {seen.subject!r} observed {age:.0f}s before the patch, more than the "
            f"run's {policy.observation_max_age_s}s: re-read it",
        )
    d.put(
        "pending_tool_calls",
        e.call_id,
        ToolCall(
            call_id=e.call_id,
            tool=e.tool,
            side_effect=e.side_effect,
            costly=e.costly,
            input_ref=e.input_ref,
            started_at=ctx.at,
            started_at_revision=ctx.revision,
        ),
    )


def _finish_call(d: Draft, call_id: str) -> ToolCall:
    call = d.get("pending_tool_calls", call_id)
    _require(isinstance(call, ToolCall), "tool.unknown_call", f"tool call {call_id!r} is not in flight")
    assert isinstance(call, ToolCall)
    d.delete("pending_tool_calls", call_id)
    return call


def _register_result(d: Draft, ref: str | None, call: ToolCall, ctx: Ctx) -> None:
    """A tool's result is an artifact the run knows (what facts may cite)."""
    if ref is not None and d.get("artifacts", ref) is None:
        d.put(
            "artifacts",
            ref,
            Artifact(
                id=ref,
                kind="tool_result",
                call_id=call.call_id,
                tool=call.tool,
                registered_at_revision=ctx.revision,
                provenance=ctx.created(),
            ),
        )


@reducer(gen.ArtifactRecorded, reads=lambda e: ("artifacts", e.artifact.id))
def _artifact_recorded(d: Draft, e: gen.ArtifactRecorded, ctx: Ctx) -> None:
    a = e.artifact
    _require(
        not d.hget("policy").artifacts_from_tools,
        "artifact.not_from_tool",
        f"artifact {a.id!r}: this run takes artifacts only from tool results (its policy's artifacts_from_tools)",
    )
    _reference(a.id, "artifact.reference", "artifact id")
    _require(d.get("artifacts", a.id) is None, "artifact.duplicate_id", f"artifact {a.id!r} is already known")
    d.put(
        "artifacts",
        a.id,
        Artifact(
            id=a.id,
            kind=a.kind,
            digest=a.digest,
            call_id=a.call_id,
            registered_at_revision=ctx.revision,
            provenance=ctx.created(),
        ),
    )


def input_recorders(policy: gen.RunPolicy, origin: str) -> list[str] | None:
    """Who may record an input of ``origin`` on a run of ``policy`` (None: any writer): the
    agents its ``input_recorders`` names, else the origin's channel identity (the agent id
    equal to the origin), unless the run keeps the older rule (``input_authority: writers``)."""
    named = next((r.agents for r in policy.input_recorders if r.origin == origin), None)
    if named is not None:
        return list(named)
    return [origin] if policy.input_authority == "channels" else None


@reducer(gen.InputRecorded, reads=lambda e: ("inputs", e.input.id))
def _input_recorded(d: Draft, e: gen.InputRecorded, ctx: Ctx) -> None:
    i = e.input
    _require(d.get("inputs", i.id) is None, "input.duplicate_id", f"input {i.id!r} is already recorded")
    named = input_recorders(d.hget("policy"), i.origin)
    _require(
        named is None or ctx.agent_id in named,
        "input.not_authorized",
        f"agent {ctx.agent_id!r} may not record a {i.origin} input on this run (who may: "
        f"{', '.join(named or []) or 'nobody'}): an input's authority is its origin, which the agent cannot "
        f"claim for itself; the {i.origin} channel records it",
    )
    d.put(
        "inputs",
        i.id,
        Input(
            id=i.id,
            origin=i.origin,
            text=i.text,
            received_at=ctx.at,
            recorded_at_revision=ctx.revision,
            provenance=ctx.created(),
        ),
    )


@reducer(gen.ToolSucceeded, reads=lambda e: ("pending_tool_calls", e.call_id))
def _tool_succeeded(d: Draft, e: gen.ToolSucceeded, ctx: Ctx) -> None:
    call = _finish_call(d, e.call_id)
    _register_result(d, e.result_ref, call, ctx)
    _set(
        d, last_transition=HeaderTransition(action=call.tool, result_ref=e.result_ref, revision=ctx.revision, at=ctx.at)
    )


@reducer(gen.ToolFailed, reads=lambda e: ("pending_tool_calls", e.call_id))
def _tool_failed(d: Draft, e: gen.ToolFailed, ctx: Ctx) -> None:
    call = _finish_call(d, e.call_id)
    _register_result(d, e.result_ref, call, ctx)
    _set(
        d,
        last_transition=HeaderTransition(
            action=f"{call.tool} failed: {e.error}", result_ref=e.result_ref, revision=ctx.revision, at=ctx.at
        ),
    )


@reducer(gen.ObservationRecorded, reads=lambda e: ("environment_observations", e.observation.subject))
def _observation_recorded(d: Draft, e: gen.ObservationRecorded, ctx: Ctx) -> None:
    o = e.observation
    _require(bool(o.subject.strip()), "observation.subject_required", "an observation needs a subject")
    # One current observation per subject: a newer one replaces it (the log keeps both); a
    # late one, seen before the current one, is recorded in the log only.
    current = d.get("environment_observations", o.subject)
    if isinstance(current, Observation) and (o.observed_at or ctx.at) < current.observed_at:
        return
    d.put(
        "environment_observations",
        o.subject,
        Observation(
            **{**structs.fields_of(o), "observed_at": o.observed_at or ctx.at},
            recorded_at_revision=ctx.revision,
            provenance=ctx.created() if not isinstance(current, Observation) else ctx.touched(current.provenance),
        ),
    )


EFFECT_TRANSITIONS: dict[str, frozenset[str]] = {
    "started": frozenset({"committed", "failed"}),
    "committed": frozenset(),
    "failed": frozenset(),
}


@reducer(gen.EffectRecorded, reads=lambda e: ("effect_ledger", e.effect.id))
def _effect_recorded(d: Draft, e: gen.EffectRecorded, ctx: Ctx) -> None:
    new = e.effect
    old = d.get("effect_ledger", new.id)
    if isinstance(old, Effect):
        _require(
            new.status in EFFECT_TRANSITIONS[old.status],
            "effect.transition",
            f"effect {new.id!r} cannot go from {old.status} to {new.status}",
        )
        merged = {k: v for k, v in structs.fields_of(new).items() if v is not None}
        d.put(
            "effect_ledger",
            new.id,
            updated(old, {**merged, "updated_at_revision": ctx.revision, "provenance": ctx.touched(old.provenance)}),
        )
    else:
        d.put(
            "effect_ledger",
            new.id,
            Effect(**structs.fields_of(new), updated_at_revision=ctx.revision, provenance=ctx.created()),
        )


@reducer(gen.WorkspaceUpdated)
def _workspace_updated(d: Draft, e: gen.WorkspaceUpdated, ctx: Ctx) -> None:
    _set(d, workspace_ref=e.workspace_ref)


# --- waiting and budgets ---------------------------------------------------------------


@reducer(gen.WaitingStarted)
def _waiting_started(d: Draft, e: gen.WaitingStarted, ctx: Ctx) -> None:
    current = d.hget("waiting")
    _require(
        current is None, "waiting.already_waiting", f"the run already waits for {current.wait_id if current else ''!r}"
    )
    _set(
        d,
        status="waiting",
        waiting=HeaderWaiting(**structs.fields_of(e.waiting), since=ctx.at, since_revision=ctx.revision),
    )


@reducer(gen.WaitingResolved)
def _waiting_resolved(d: Draft, e: gen.WaitingResolved, ctx: Ctx) -> None:
    w = d.hget("waiting")
    _require(w is not None and w.wait_id == e.wait_id, "waiting.unknown", f"the run does not wait for {e.wait_id!r}")
    _set(d, status="running", waiting=None)


@reducer(gen.LeaseReleased)
def _lease_released(d: Draft, e: gen.LeaseReleased, ctx: Ctx) -> None:
    _set(
        d, last_transition=HeaderTransition(action=f"lease released by {e.worker_id}", revision=ctx.revision, at=ctx.at)
    )


@reducer(gen.BudgetSet)
def _budget_set(d: Draft, e: gen.BudgetSet, ctx: Ctx) -> None:
    _require(
        e.tokens_remaining is None or e.tokens_remaining >= 0,
        "budget.non_negative",
        "tokens_remaining cannot be negative",
    )
    b = d.hget("budgets")
    _set(
        d,
        budgets=HeaderBudgets(
            tokens_remaining=e.tokens_remaining if e.tokens_remaining is not None else b.tokens_remaining,
            tokens_used=b.tokens_used,
            deadline=e.deadline if e.deadline is not None else b.deadline,
        ),
    )


@reducer(gen.BudgetConsumed)
def _budget_consumed(d: Draft, e: gen.BudgetConsumed, ctx: Ctx) -> None:
    _require(e.tokens > 0, "budget.consumed_positive", f"consumed tokens must be > 0, got {e.tokens}")
    b = d.hget("budgets")
    used = b.tokens_used + e.tokens
    remaining = None if b.tokens_remaining is None else b.tokens_remaining - e.tokens
    _require(
        used <= ev.MAX_LONG and (remaining is None or remaining >= ev.MIN_LONG),
        "budget.overflow",
        f"consuming {e.tokens} tokens would take the budget past what can be stored "
        f"(used {b.tokens_used}, remaining {b.tokens_remaining})",
    )
    # Consumption already happened: it is recorded even past the budget (remaining < 0).
    _set(d, budgets=updated(b, {"tokens_used": used, "tokens_remaining": remaining}))


# --- LangGraph's checkpoints (runstate.integrations.langgraph) ------------------------------


@reducer(
    gen.GraphCheckpointSaved, reads=lambda e: ("graph_checkpoints", state.graph_key(e.checkpoint.ns, e.checkpoint.id))
)
def _graph_checkpoint_saved(d: Draft, e: gen.GraphCheckpointSaved, ctx: Ctx) -> None:
    c = e.checkpoint
    key = state.graph_key(c.ns, c.id)
    prior = d.get("graph_checkpoints", key)
    assert prior is None or isinstance(prior, GraphCheckpoint)
    # LangGraph saves a checkpoint id once; saved again (a retried step), the new one
    # replaces it and the writes saved against it stay.
    d.put(
        "graph_checkpoints",
        key,
        GraphCheckpoint(
            key=key,
            ns=c.ns,
            id=c.id,
            parent_id=c.parent_id,
            checkpoint=c.checkpoint,
            metadata=c.metadata,
            versions=c.versions,
            saved_at_revision=ctx.revision,
            writes=prior.writes if prior is not None else [],
        ),
    )
    for v in c.values:  # once per version: a version saved again (a retried step) replaces it
        vkey = state.graph_value_key(c.ns, v.channel, v.version)
        d.put(
            "graph_values",
            vkey,
            GraphValueItem(
                key=vkey, ns=c.ns, channel=v.channel, version=v.version, value=v.value, saved_at_revision=ctx.revision
            ),
        )


def _drop_unreferenced_values(d: Draft) -> None:
    """Remove the channel values no remaining checkpoint refers to (after checkpoints went)."""
    sizes = d.hget("sizes")
    if sizes is not None and not sizes.get("graph_values"):
        return  # the run keeps none apart: its checkpoints need not be read
    referenced = set()
    for cp in d.values("graph_checkpoints"):
        assert isinstance(cp, GraphCheckpoint)
        for cv in cp.versions or ():
            referenced.add(state.graph_value_key(cp.ns, cv.channel, cv.version))
    for v in list(d.values("graph_values")):
        assert isinstance(v, GraphValueItem)
        if v.key not in referenced:
            d.delete("graph_values", v.key)


@reducer(gen.GraphWritesSaved, reads=lambda e: ("graph_checkpoints", state.graph_key(e.ns, e.checkpoint_id)))
def _graph_writes_saved(d: Draft, e: gen.GraphWritesSaved, ctx: Ctx) -> None:
    key = state.graph_key(e.ns, e.checkpoint_id)
    cp = d.get("graph_checkpoints", key)
    if cp is None:  # the writes came before their checkpoint (LangGraph saves both at once)
        cp = GraphCheckpoint(key=key, ns=e.ns, id=e.checkpoint_id, saved_at_revision=ctx.revision)
    assert isinstance(cp, GraphCheckpoint)
    writes = list(cp.writes)
    at = {(w.task_id, w.idx): i for i, w in enumerate(writes)}
    for w in e.writes:
        i = at.get((w.task_id, w.idx))
        if i is None:
            at[(w.task_id, w.idx)] = len(writes)
            writes.append(w)
        elif w.idx < 0:  # a special channel (error, interrupt, ...): the latest write holds
            writes[i] = w
    d.put("graph_checkpoints", key, updated(cp, {"writes": writes, "saved_at_revision": ctx.revision}))


@reducer(gen.GraphCheckpointsRemoved)
def _graph_checkpoints_removed(d: Draft, e: gen.GraphCheckpointsRemoved, ctx: Ctx) -> None:
    for ref in e.checkpoints:
        key = state.graph_key(ref.ns, ref.id)
        if d.get("graph_checkpoints", key) is not None:  # one removed already is no error
            d.delete("graph_checkpoints", key)
    _drop_unreferenced_values(d)


@reducer(gen.GraphThreadDeleted)
def _graph_thread_deleted(d: Draft, e: gen.GraphThreadDeleted, ctx: Ctx) -> None:
    for cp in list(d.values("graph_checkpoints")):
        assert isinstance(cp, GraphCheckpoint)
        d.delete("graph_checkpoints", cp.key)
    for v in list(d.values("graph_values")):
        assert isinstance(v, GraphValueItem)
        d.delete("graph_values", v.key)
    if d.hget("status") not in state.TERMINAL_STATUSES:
        _close_loose_ends(d, f"thread deleted: {e.reason}", ctx)
        _set(
            d,
            status="cancelled",
            active_task_id=None,
            waiting=None,
            last_transition=HeaderTransition(action=f"thread deleted: {e.reason}", revision=ctx.revision, at=ctx.at),
        )


missing = set(ev.EVENT_TYPE_NAMES) - set(REDUCERS)
assert not missing, f"event types without a reducer: {missing}"
