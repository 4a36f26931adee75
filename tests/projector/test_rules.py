"""Every rule the runtime enforces (docs/rules.md), and the decide contract."""

from __future__ import annotations

from typing import Any

from pathlib import Path

import pytest
from helpers import ev, fact, patch, start, task, project_all

from runstate.projector.core.runbook import RunBook
from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Decision, Patch


class Run:
    """Feeds patches for one run through the real RunBook and keeps the decisions."""

    def __init__(self, run_id: str = "r1") -> None:
        self.run_id = run_id
        self.book = RunBook()
        self.offset = 0
        self.decisions: list[Decision] = []

    def send(self, expected: int | None, *events: dict[str, Any], **kw: Any) -> Decision:
        p = patch(self.run_id, self.revision if expected is None else expected, *events, **kw)
        return self.send_patch(p)

    def send_patch(self, p: Patch) -> Decision:
        d = self.book.apply(p, 0, self.offset).decision
        self.offset += 1
        self.decisions.append(d)
        return d

    def ok(self, *events: dict[str, Any], **kw: Any) -> Decision:
        d = self.send(None, *events, **kw)
        assert d.outcome == "accepted", d
        return d

    def bad(self, rule: str, *events: dict[str, Any], **kw: Any) -> Decision:
        before = self.snapshot()
        d = self.send(None, *events, **kw)
        assert (d.outcome, d.reason, d.rule) == ("rejected", "invalid", rule), d
        assert self.snapshot() == before, "a rejected patch changed the state"
        return d

    @property
    def doc(self) -> RunDoc:
        d = self.book.docs[self.run_id]
        assert d is not None
        return d

    @property
    def revision(self) -> int:
        d = self.book.docs.get(self.run_id)
        return 0 if d is None else d.header.revision

    def snapshot(self) -> str | None:
        d = self.book.docs.get(self.run_id)
        return None if d is None else d.to_state().model_dump_json()

    def item(self, kind: str, id_: str) -> Any:
        return self.doc.items[kind][id_][1]


def _context(state: Any, now: Any = None) -> str:
    """``render_context`` of the validated ``state``, held equal to the context rendered
    from the state's msgspec struct (what the queries render, building no model)."""
    from runstate.projector.read.context import render_context
    from runstate.schemas import structs
    from runstate.schemas.state import RunState

    text = render_context(state, now=now)
    struct = structs.decoder(RunState)(state.model_dump_json().encode())
    assert type(struct) is structs.struct_of(RunState)  # msgspec's own path, not the model's
    assert render_context(struct, now=now) == text
    return text


@pytest.fixture
def run() -> Run:
    r = Run()
    r.ok(start(include=["src/auth", "tests"], exclude=["public_api"]))
    return r


# --- facts, hypotheses, observations: different types, with their own rules ----------------


def test_fact_needs_evidence_or_authoritative_source(run: Run) -> None:
    d = run.bad("fact.evidence_required", fact("f1", evidence=None))
    assert d.event_index == 0
    run.ok(ev("InputRecorded", input={"id": "user://msg_3", "origin": "user", "text": "it is RS256"}), agent="user")
    run.ok(fact("f2", evidence=None, source="user://msg_3"))
    run.ok(fact("f3"))


def test_fact_evidence_must_be_a_reference(run: Run) -> None:
    run.bad("fact.evidence_reference", fact("f1", evidence="I saw it in the logs"))


def test_fact_time_defaults_to_patch_time_and_keeps_scope(run: Run) -> None:
    run.ok(fact("f1", scope="src/auth"), minute=7)
    f = run.item("confirmed_facts", "f1")
    assert f.observed_at == patch("x", 0, fact("y"), minute=7).created_at
    assert f.scope == "src/auth" and f.confirmed_at_revision == run.revision


def test_hypothesis_needs_confidence_in_range_and_falsifier(run: Run) -> None:
    h = {"id": "h1", "statement": "maybe", "confidence": 1.5, "falsifier": "run test"}
    run.bad("hypothesis.confidence_range", ev("HypothesisProposed", hypothesis=h))
    run.bad(
        "hypothesis.falsifier_required", ev("HypothesisProposed", hypothesis={**h, "confidence": 0.5, "falsifier": " "})
    )
    run.ok(ev("HypothesisProposed", hypothesis={**h, "confidence": 0.5}))
    run.bad("hypothesis.confidence_range", ev("HypothesisRevised", hypothesis_id="h1", confidence=-0.1))


def test_hypothesis_becomes_fact_only_through_fact_confirmed(run: Run) -> None:
    run.ok(ev("HypothesisProposed", hypothesis={"id": "h1", "statement": "s", "confidence": 0.6, "falsifier": "f"}))
    run.bad("fact.unknown_hypothesis", {**fact("f1"), "replaces_hypothesis_id": "h9"})
    run.ok({**fact("f1"), "replaces_hypothesis_id": "h1"})
    st = run.doc.to_state()
    assert [h.id for h in st.hypotheses] == []
    assert st.confirmed_facts[0].replaces_hypothesis_id == "h1"


def test_observations_are_kept_apart_from_facts_one_per_subject(run: Run) -> None:
    obs = {"subject": "order://9", "observed_state": "created", "evidence": "artifact://r/1"}
    run.ok(ev("ObservationRecorded", observation=obs))
    run.ok(ev("ObservationRecorded", observation={**obs, "observed_state": "paid"}))
    st = run.doc.to_state()
    assert st.confirmed_facts == []
    assert [(o.subject, o.observed_state) for o in st.environment_observations] == [("order://9", "paid")]


def test_duplicate_ids_are_rejected(run: Run) -> None:
    run.ok(fact("f1"))
    run.bad("fact.duplicate_id", fact("f1"))
    run.ok(ev("QuestionOpened", question={"id": "q1", "text": "?"}))
    run.bad("question.duplicate_id", ev("QuestionOpened", question={"id": "q1", "text": "?"}))
    run.bad("question.unknown", ev("QuestionResolved", question_id="q9"))


# --- tasks -------------------------------------------------------------------------------


def test_task_state_machine(run: Run) -> None:
    run.ok(task("t1"))
    run.bad("task.transition", ev("TaskCompleted", task_id="t1", evidence="artifact://done/1"))  # pending -> completed
    run.bad("task.transition", ev("TaskBlocked", task_id="t1", reason="x"))  # pending -> blocked
    run.ok(ev("TaskStarted", task_id="t1"))
    assert run.doc.header.active_task_id == "t1"
    run.ok(ev("TaskBlocked", task_id="t1", reason="needs creds"))
    assert run.item("tasks", "t1").blocked_by == "needs creds" and run.doc.header.active_task_id is None
    run.ok(ev("TaskStarted", task_id="t1"))  # blocked -> running
    run.ok(ev("TaskCompleted", task_id="t1", evidence="artifact://t/1"))
    run.bad("task.transition", ev("TaskStarted", task_id="t1"))  # completed is final
    run.bad("task.unknown", ev("TaskStarted", task_id="nope"))


def test_task_dependencies_must_exist_be_acyclic_and_complete_first(run: Run) -> None:
    run.bad("task.unknown_dependency", task("t2", deps=["t1"]))
    run.bad("task.dependency_cycle", task("t1", deps=["t1"]))
    run.ok(task("t1"))
    run.ok(task("t2", deps=["t1"]))
    run.bad("task.dependencies_incomplete", ev("TaskStarted", task_id="t2"))
    run.ok(ev("TaskStarted", task_id="t1"), ev("TaskCompleted", task_id="t1", evidence="artifact://done/1"))
    run.ok(ev("TaskStarted", task_id="t2"))


def test_goal_change_invalidates_out_of_scope_tasks(run: Run) -> None:
    run.ok(task("in", scope=["src/auth/jwt.py"]), task("docs", scope=["docs/auth"]), task("free"))
    run.ok(ev("TaskStarted", task_id="docs"))
    run.ok(ev("GoalChanged", goal={"statement": "code only", "scope": {"include": ["src/auth"], "exclude": ["docs"]}}))
    tasks = {t.id: t for t in run.doc.to_state().tasks}
    assert tasks["docs"].status == "cancelled" and "out of scope" in (tasks["docs"].reason or "")
    assert tasks["in"].status == "pending" and tasks["free"].status == "pending"
    assert run.doc.header.active_task_id is None
    assert run.doc.header.goal.statement == "code only"


# --- corrections, waits, budgets, tools, effects ----------------------------------------


def test_correction_supersedes_and_records_what_it_replaced(run: Run) -> None:
    r1 = run.ok(ev("ConstraintSet", constraint={"key": "timeout", "value": "30 min", "source": "user://m1"}))
    run.ok(ev("ConstraintSet", constraint={"key": "timeout", "value": "15 min", "source": "user://m2"}))
    constraints = run.doc.to_state().goal.constraints
    assert len(constraints) == 1
    c = constraints[0]
    assert c.value == "15 min" and c.supersedes is not None
    assert (c.supersedes.value, c.supersedes.source, c.supersedes.set_at_revision) == (
        "30 min",
        "user://m1",
        r1.revision,
    )


def test_waiting_and_budgets(run: Run) -> None:
    run.ok(ev("WaitingStarted", waiting={"wait_id": "w1", "kind": "approval", "reason": "deploy"}))
    assert run.doc.header.status == "waiting"
    run.bad("waiting.already_waiting", ev("WaitingStarted", waiting={"wait_id": "w2", "kind": "user", "reason": "x"}))
    run.bad("waiting.unknown", ev("WaitingResolved", wait_id="w9"))
    run.ok(ev("WaitingResolved", wait_id="w1"))
    assert run.doc.header.status == "running" and run.doc.header.waiting is None
    run.ok(ev("BudgetSet", tokens_remaining=100))
    run.bad("budget.consumed_positive", ev("BudgetConsumed", tokens=0))
    run.ok(ev("BudgetConsumed", tokens=130))
    assert (run.doc.header.budgets.tokens_remaining, run.doc.header.budgets.tokens_used) == (-30, 130)


def test_tool_calls_and_effect_ledger(run: Run) -> None:
    run.bad("tool.unknown_call", ev("ToolSucceeded", call_id="c1"))
    run.ok(
        ev("ToolCallStarted", call_id="c1", tool="deploy", side_effect=True),
        ev("EffectRecorded", effect={"id": "e1", "status": "started", "target": "prod"}),
    )
    run.bad("tool.duplicate_call", ev("ToolCallStarted", call_id="c1", tool="deploy"))
    run.ok(
        ev("ToolSucceeded", call_id="c1", result_ref="artifact://d/1"),
        ev("EffectRecorded", effect={"id": "e1", "status": "committed"}),
    )
    run.bad("effect.transition", ev("EffectRecorded", effect={"id": "e1", "status": "failed"}))
    st = run.doc.to_state()
    assert st.pending_tool_calls == [] and st.effect_ledger[0].status == "committed"
    assert st.effect_ledger[0].target == "prod"  # kept from the started record
    assert st.last_transition is not None and st.last_transition.action == "deploy"


# --- decide: revisions, control events, idempotency, terminal ---------------------------


def test_one_revision_per_accepted_patch(run: Run) -> None:
    before = run.revision
    d = run.ok(fact("f1"), fact("f2"), task("t1"))
    assert d.revision == before + 1 == run.revision


def test_all_or_nothing(run: Run) -> None:
    d = run.bad("task.unknown", fact("f1"), ev("TaskStarted", task_id="zz"))
    assert d.event_index == 1
    assert "f1" not in run.doc.items["confirmed_facts"]


def test_revision_conflict_then_rebase_of_commuting_events(run: Run) -> None:
    base = run.revision
    run.ok(fact("f1"))
    d = run.send(base, fact("f2"))
    assert (d.outcome, d.reason, d.revision) == ("rejected", "revision_conflict", run.revision)
    d = run.send(base, fact("f3"), ev("BudgetConsumed", tokens=5), rebase=True)
    assert d.outcome == "accepted" and d.rebased
    d = run.send(base, task("t9"), rebase=True)  # a task does not commute
    assert d.reason == "revision_conflict"
    d = run.send(base, fact("f1"), rebase=True)  # commutes, but the id is taken: re-validated
    assert (d.reason, d.rule) == ("invalid", "fact.duplicate_id")


def test_artifacts_and_inputs_commute_re_validated_on_the_current_state(run: Run) -> None:
    """An artifact or an input adds an item whatever revision the patch was based on: a
    stale one with rebase is applied (re-validated: a taken id is still refused), as the
    agent handle asks (its own list of commuting events had them; the projector's did not)."""
    base = run.revision
    run.ok(fact("f1"))
    d = run.send(base, ev("ArtifactRecorded", artifact={"id": "artifact://x/1", "kind": "log"}), rebase=True)
    assert d.outcome == "accepted" and d.rebased, d
    d = run.send(base, ev("ArtifactRecorded", artifact={"id": "artifact://x/1", "kind": "log"}), rebase=True)
    assert (d.reason, d.rule) == ("invalid", "artifact.duplicate_id")
    d = run.send(
        base, ev("InputRecorded", input={"id": "i1", "origin": "user", "text": "go"}), rebase=True, agent="user"
    )
    assert d.outcome == "accepted" and d.rebased, d


def test_every_event_type_has_its_traits_and_every_set_is_derived_from_them() -> None:
    from runstate.agent import _COMMUTING
    from runstate.projector.core.decide import COMMUTING
    from runstate.schemas import events

    assert set(events.TRAITS) == set(events.EVENT_TYPE_NAMES)
    assert COMMUTING == _COMMUTING == {n for n, t in events.TRAITS.items() if t.commutes}
    assert events.CONTROL_EVENT_TYPES == {n for n, t in events.TRAITS.items() if t.control}
    assert events.OPERATOR_EVENT_TYPES == {n for n, t in events.TRAITS.items() if t.operator}
    assert events.ANY_STATUS_EVENT_TYPES == {"GraphThreadDeleted", "GraphCheckpointsRemoved"}


def test_control_events_win_and_supersede_older_patches(run: Run) -> None:
    stale = run.revision
    run.ok(fact("f1"))
    d = run.send(stale, ev("GoalChanged", goal={"statement": "new goal"}))
    assert d.outcome == "accepted"
    control_rev = d.revision
    d = run.send(stale, fact("f2"), rebase=True)
    assert (d.reason, d.revision) == ("superseded", control_rev)
    d = run.send(0, ev("RunCancelled", reason="user stopped it"))
    assert d.outcome == "accepted" and run.doc.header.status == "cancelled"


def test_nothing_after_terminal_status(run: Run) -> None:
    run.ok(ev("RunCompleted", summary="done"))
    d = run.send(None, fact("f9"))
    assert (d.outcome, d.reason) == ("rejected", "run_terminal")
    d = run.send(None, ev("RunCancelled", reason="late"))
    assert d.reason == "run_terminal"
    r2 = Run("r2")
    r2.ok(start())
    d = r2.send(None, ev("RunCompleted"), fact("f1"))
    assert (d.reason, d.rule, d.event_index) == ("invalid", "run.terminal", 1)


def test_duplicate_patch_id_gets_the_earlier_decision_once(run: Run) -> None:
    p = patch(run.run_id, run.revision, fact("f1"), patch_id="same")
    first = run.send_patch(p)
    again = run.book.apply(p, 0, 999)
    assert again.duplicate and again.decision == first and again.changes is None
    assert run.revision == first.revision


def test_unknown_run_and_double_start() -> None:
    r = Run("never")
    d = r.send(0, fact("f1"))
    assert (d.outcome, d.reason) == ("rejected", "unknown_run")
    assert r.book.docs.get("never") is None
    r.ok(start())
    d = r.send(None, start())
    assert (d.reason, d.rule) == ("invalid", "run.already_started")


# --- guarantees past the shape (issue: the runtime guarantees what the document promises) ----


def test_a_second_goal_change_based_before_the_first_is_superseded(run: Run) -> None:
    stale = run.revision
    d = run.send(stale, ev("GoalChanged", goal={"statement": "narrower"}))
    assert d.outcome == "accepted"
    d = run.send(stale, ev("GoalChanged", goal={"statement": "another idea"}))
    assert (d.outcome, d.reason) == ("rejected", "superseded")
    assert run.doc.header.goal.statement == "narrower"  # not silently applied over the first
    d = run.send(stale, ev("RunCancelled", reason="stop"))  # cancelling is never refused as stale
    assert d.outcome == "accepted"


def test_a_side_effecting_call_is_refused_while_the_run_waits_for_approval(run: Run) -> None:
    run.ok(ev("WaitingStarted", waiting={"wait_id": "w1", "kind": "approval", "reason": "deploy needs a reviewer"}))
    run.bad("run.waiting", ev("ToolCallStarted", call_id="c1", tool="deploy", side_effect=True))
    run.ok(ev("ToolCallStarted", call_id="c2", tool="read_logs"))  # reading is fine while waiting
    run.ok(ev("WaitingResolved", wait_id="w1"))
    run.ok(ev("ToolCallStarted", call_id="c1", tool="deploy", side_effect=True))


def test_task_completion_needs_evidence(run: Run) -> None:
    run.ok(task("t1"), ev("TaskStarted", task_id="t1"))
    run.bad("task.evidence_required", ev("TaskCompleted", task_id="t1"))
    run.ok(ev("TaskCompleted", task_id="t1", evidence="artifact://test-output/48"))


def test_a_late_older_observation_does_not_replace_a_newer_one(run: Run) -> None:
    new = {
        "subject": "file://cfg",
        "observed_state": "RS256",
        "observed_version": "v2",
        "observed_at": "2026-08-11T10:00:00Z",
    }
    old = {
        "subject": "file://cfg",
        "observed_state": "HS256",
        "observed_version": "v1",
        "observed_at": "2026-08-11T09:00:00Z",
    }
    run.ok(ev("ObservationRecorded", observation=new))
    run.ok(ev("ObservationRecorded", observation=old))  # accepted (the log keeps it) ...
    [kept] = run.doc.to_state().environment_observations
    assert (kept.observed_version, kept.observed_state) == ("v2", "RS256")  # ... the state keeps the newest


def test_an_exhausted_budget_or_a_passed_deadline_refuses_new_work(run: Run) -> None:
    run.ok(task("t1"), task("t2"), ev("BudgetSet", tokens_remaining=100))
    run.ok(ev("BudgetConsumed", tokens=100))
    assert run.doc.header.budgets.tokens_remaining == 0
    run.bad("budget.exhausted", ev("TaskStarted", task_id="t1"))
    run.bad("budget.exhausted", ev("ToolCallStarted", call_id="c1", tool="llm", costly=True))
    run.ok(ev("ToolCallStarted", call_id="c2", tool="ls"))  # a cheap call is not refused
    run.ok(ev("BudgetSet", tokens_remaining=50))  # extended
    run.ok(ev("TaskStarted", task_id="t1"))
    run.ok(ev("BudgetSet", deadline="2026-08-11T07:00:00Z"))  # before the patch time (08:00)
    run.bad("deadline.passed", ev("TaskStarted", task_id="t2"))
    run.ok(ev("BudgetSet", deadline="2026-08-12T07:00:00Z"))
    run.ok(ev("TaskStarted", task_id="t2"))


def test_context_flags_exhausted_budgets_and_overdue_waits() -> None:
    from datetime import UTC, datetime

    r = Run("ctx")
    r.ok(start())
    r.ok(ev("BudgetSet", tokens_remaining=10))
    r.ok(ev("BudgetConsumed", tokens=10))
    r.ok(
        ev(
            "WaitingStarted",
            waiting={"wait_id": "w", "kind": "timer", "reason": "cool down", "until": "2026-08-11T09:00:00Z"},
        )
    )
    text = _context(r.doc.to_state(), now=datetime(2026, 8, 11, 10, 0, tzinfo=UTC))
    assert "tokens remaining 0 (EXHAUSTED)" in text and "(OVERDUE)" in text


def test_completing_a_run_needs_its_loose_ends_closed(run: Run) -> None:
    run.ok(task("t1"), ev("TaskStarted", task_id="t1"), ev("ToolCallStarted", call_id="c1", tool="build"))
    run.bad("run.tasks_running", ev("RunCompleted", summary="done?"))
    run.ok(ev("TaskCompleted", task_id="t1", evidence="artifact://ci/1"))
    run.bad("run.calls_in_flight", ev("RunCompleted", summary="done?"))
    run.ok(ev("ToolSucceeded", call_id="c1", result_ref="artifact://ci/2"))
    run.ok(ev("RunCompleted", summary="done"))


def test_cancelling_a_run_closes_its_loose_ends(run: Run) -> None:
    run.ok(
        task("t1"),
        task("t2"),
        ev("TaskStarted", task_id="t1"),
        ev("ToolCallStarted", call_id="read", tool="ls"),
        ev("ToolCallStarted", call_id="pay", tool="charge_card", side_effect=True),
    )
    run.ok(ev("RunCancelled", reason="user stopped it"))
    st = run.doc.to_state()
    assert {t.id: t.status for t in st.tasks} == {"t1": "cancelled", "t2": "cancelled"}
    assert all("run cancelled" in (t.reason or "") for t in st.tasks)
    # A plain call is abandoned; a side-effecting one stays listed: its outcome is unknown.
    assert [c.call_id for c in st.pending_tool_calls] == ["pay"] and st.active_task_id is None


def test_active_task_stays_right_with_several_running(run: Run) -> None:
    run.ok(task("t1"), task("t2"), ev("TaskStarted", task_id="t1"), ev("TaskStarted", task_id="t2"))
    assert run.doc.header.active_task_id == "t2"
    run.ok(ev("TaskCompleted", task_id="t2", evidence="artifact://x/2"))
    assert run.doc.header.active_task_id == "t1"  # still running, so still active
    run.ok(ev("TaskBlocked", task_id="t1", reason="waiting for a review"))
    assert run.doc.header.active_task_id is None


def test_a_goal_change_cancels_the_dependents_of_what_it_cancels() -> None:
    r = Run("g")
    r.ok(start(include=["src", "docs"]))
    r.ok(task("docs", scope=["docs/auth"]), task("review", deps=["docs"]), task("free"))
    r.ok(ev("GoalChanged", goal={"statement": "code only", "scope": {"include": ["src"], "exclude": ["docs"]}}))
    st = r.doc.to_state()
    by_id = {t.id: t for t in st.tasks}
    assert by_id["docs"].status == "cancelled"
    assert by_id["review"].status == "cancelled" and "docs" in (by_id["review"].reason or "")
    assert by_id["free"].status == "pending"  # no scope: kept, and flagged for review
    assert "[free] task free (no scope under a scoped goal: review)" in _context(st)


def test_an_external_effect_ledger_must_be_read_before_resuming() -> None:
    from helpers import V1_DOC

    from runstate.schemas.migrations import load_state
    from runstate.snapshotter.checkpoint import verdict_of

    state = load_state(V1_DOC)
    verdict, _ = verdict_of(state)
    assert verdict == "needs_reconciliation"
    assert "effects://run_128@rev4" in _context(state)


def test_a_waiting_run_of_an_old_version_migrates() -> None:
    from helpers import V1_DOC

    from runstate.schemas.migrations import load_state

    doc = {**V1_DOC, "status": "waiting", "waiting": {"kind": "approval", "reason": "deploy needs a reviewer"}}
    state = load_state(doc)
    assert state.status == "waiting" and state.waiting is not None
    assert (state.waiting.kind, state.waiting.reason) == ("approval", "deploy needs a reviewer")
    assert state.waiting.wait_id  # a deterministic id to resolve it by
    assert load_state(doc) == state


# --- provenance, owners, writers, guarded writes ---------------------------------------------


def test_every_item_records_who_wrote_it_and_when(run: Run) -> None:
    run.ok(fact("f1"), task("t1"), agent="agent-a", version="a-1.0")
    rev = run.revision
    run.ok(ev("TaskStarted", task_id="t1"), agent="agent-b", version="b-2.0")
    st = run.doc.to_state()
    f, t = st.confirmed_facts[0], st.tasks[0]
    assert f.provenance is not None and t.provenance is not None
    assert (f.provenance.created_by.agent_id, f.provenance.created_by.agent_version) == ("agent-a", "a-1.0")
    assert (f.provenance.created_at_revision, f.provenance.updated_at_revision) == (rev, rev)
    assert (t.provenance.created_by.agent_id, t.provenance.updated_by.agent_id) == ("agent-a", "agent-b")
    assert (t.provenance.created_at_revision, t.provenance.updated_at_revision) == (rev, rev + 1)


def test_the_agent_that_starts_a_task_owns_it(run: Run) -> None:
    run.ok(task("t1"), task("t2"))
    run.ok(ev("TaskStarted", task_id="t1"), agent="agent-a")
    assert run.doc.to_state().tasks[0].owner == "agent-a"
    d = run.send(None, ev("TaskStarted", task_id="t1"), agent="agent-b")  # a second claim: arbitration
    assert (d.reason, d.rule) == ("invalid", "task.not_owner") and "agent-a" in (d.message or "")
    for other in (
        ev("TaskCompleted", task_id="t1", evidence="artifact://x/1"),
        ev("TaskFailed", task_id="t1", reason="x"),
        ev("TaskBlocked", task_id="t1", reason="x"),
    ):
        d = run.send(None, other, agent="agent-b")
        assert d.rule == "task.not_owner", d
    d = run.send(None, ev("TaskHandedOver", task_id="t1", to_agent_id="agent-b"), agent="agent-b")
    assert d.rule == "task.not_owner"  # only the owner hands a task over
    run.ok(ev("TaskHandedOver", task_id="t1", to_agent_id="agent-b", reason="end of shift"), agent="agent-a")
    run.ok(ev("TaskCompleted", task_id="t1", evidence="artifact://x/1"), agent="agent-b")
    assert run.doc.to_state().tasks[0].owner == "agent-b"


def test_a_run_can_declare_who_may_write_it() -> None:
    r = Run("w")
    r.ok(start(policy={"writers": ["agent-1", "agent-2"]}))
    r.ok(fact("f1"), agent="agent-2")
    d = r.send(None, fact("f2"), agent="intruder")
    assert (d.outcome, d.reason) == ("rejected", "unauthorized") and "intruder" in (d.message or "")
    assert "f2" not in r.doc.items["confirmed_facts"]


def test_a_risky_write_needs_the_observation_it_relies_on_to_be_current() -> None:
    r = Run("obs")
    r.ok(start(policy={"observation_max_age_s": 600, "require_observations_for_side_effects": True}))
    r.ok(
        ev(
            "ObservationRecorded",
            observation={
                "subject": "file://cfg",
                "observed_state": "RS256",
                "observed_version": "sha:2",
                "observed_at": "2026-08-11T07:55:00Z",
            },
        )
    )
    write = {"type": "ToolCallStarted", "call_id": "w1", "tool": "write_file", "side_effect": True}
    r.bad("observation.required", write)  # the policy asks every side-effecting call to name them
    r.bad("observation.stale", {**write, "relies_on": [{"subject": "file://cfg", "observed_version": "sha:1"}]})
    r.bad("observation.stale", {**write, "relies_on": [{"subject": "file://other", "observed_version": "sha:2"}]})
    r.ok({**write, "relies_on": [{"subject": "file://cfg", "observed_version": "sha:2"}]})  # 5 min old: fresh
    d = r.send(
        None,
        {**write, "call_id": "w2", "relies_on": [{"subject": "file://cfg", "observed_version": "sha:2"}]},
        minute=30,
    )
    assert (d.reason, d.rule) == ("invalid", "observation.stale")  # 35 min old by the patch's clock


# --- evidence and authority are checked, not just well-formed ---------------------------


def _strict_run() -> Run:
    """A run whose policy trusts no external evidence scheme (the default)."""
    r = Run("strict")
    r.ok({**start(), "policy": {}})
    return r


def test_a_fact_needs_evidence_the_run_knows() -> None:
    r = _strict_run()
    r.bad("fact.evidence_unknown", fact("f1", evidence="plan://next"))  # no tool returned it
    r.bad("fact.evidence_unknown", fact("f1", evidence="artifact://test-output/48"))
    r.ok(
        ev("ToolCallStarted", call_id="c1", tool="run_test"),
        ev("ToolSucceeded", call_id="c1", result_ref="artifact://test-output/48"),
    )
    [a] = r.doc.to_state().artifacts
    assert (a.id, a.kind, a.call_id, a.tool) == ("artifact://test-output/48", "tool_result", "c1", "run_test")
    assert a.provenance is not None and a.provenance.created_at_revision == r.revision
    r.ok(fact("f1", evidence="artifact://test-output/48"))
    r.ok(ev("ArtifactRecorded", artifact={"id": "artifact://diff/7", "kind": "patch", "digest": "sha256:ab"}))
    r.ok(fact("f2", evidence="artifact://diff/7"))


def test_authority_is_an_inputs_origin_not_a_free_text_field() -> None:
    r = _strict_run()
    r.bad("fact.source_not_authoritative", fact("f1", evidence=None, source="my own reasoning (guess)"))
    r.bad("fact.source_not_authoritative", fact("f1", evidence=None, source="user://msg_3"))  # never recorded
    r.ok(
        ev("InputRecorded", input={"id": "user://msg_3", "origin": "user", "text": "the timeout is 15 min"}),
        agent="user",
    )
    r.ok(fact("f1", evidence=None, source="user://msg_3"))
    r.ok(fact("f2", evidence="user://msg_3"))  # a recorded input is citable evidence too
    [i] = r.doc.to_state().inputs
    assert (i.id, i.origin) == ("user://msg_3", "user")


def test_external_evidence_schemes_are_allowed_only_where_the_policy_lists_them() -> None:
    r = Run("ext")
    r.ok({**start(), "policy": {"external_evidence_schemes": ["jira"]}})
    r.ok(fact("f1", evidence="jira://PROJ-12"))
    r.bad("fact.evidence_unknown", fact("f2", evidence="confluence://page/9"))


def test_revoking_an_agent_rejects_its_patches_and_invalidates_what_it_did_since() -> None:
    r = Run("rev")
    r.ok(start(policy={"revokers": ["operator"]}))
    r.ok(fact("early"), agent="rogue")  # before the revocation's base: kept
    base = r.revision
    r.ok(fact("late"), task("t_rogue"), agent="rogue")
    r.ok(ev("TaskStarted", task_id="t_rogue"), agent="rogue")
    r.ok(fact("mine"), agent="agent-1")
    d = r.send(base, ev("PermissionRevoked", agent_id="rogue", reason="leaked credentials"), agent="operator")
    assert d.outcome == "accepted"  # a control event: applies whatever it was based on
    st = r.doc.to_state()
    assert [f.id for f in st.confirmed_facts] == ["early", "mine"]
    [t] = st.tasks
    assert t.status == "cancelled" and "revoked" in (t.reason or "")
    d = r.send(None, fact("again"), agent="rogue")
    assert (d.outcome, d.reason) == ("rejected", "unauthorized") and "revoked" in (d.message or "")
    assert r.send(None, fact("fine"), agent="agent-1").outcome == "accepted"


def test_an_agent_cannot_make_its_own_guess_an_authoritative_input_where_the_policy_names_who_may() -> None:
    """The policy names who may record inputs of each origin (the service identities of the
    user channel, the approver, the operator): the agent's own InputRecorded of that origin
    is rejected, so it cannot confirm a fact with its guess as the source. Where the policy
    also asks for it, artifacts come from tool results, not an agent's own declaration."""
    r = Run("authority")
    r.ok(
        start(
            policy={
                "input_recorders": [
                    {"origin": "user", "agents": ["user-channel"]},
                    {"origin": "approval", "agents": ["approver"]},
                ],
                "artifacts_from_tools": True,
            }
        ),
        agent="lead",
    )
    guess = ev("InputRecorded", input={"id": "user://guess", "origin": "user", "text": "it is surely RS256"})
    r.bad("input.not_authorized", guess, agent="lead")
    r.bad("input.not_authorized", ev("InputRecorded", input={"id": "approval://1", "origin": "approval"}), agent="lead")
    r.ok(guess, agent="user-channel")
    go = ev("InputRecorded", input={"id": "operator://1", "origin": "operator", "text": "go"})
    r.bad("input.not_authorized", go, agent="lead")  # not named: the operator channel only
    r.ok(go, agent="operator")
    r.bad(
        "artifact.not_from_tool", ev("ArtifactRecorded", artifact={"id": "plan://next", "kind": "plan"}), agent="lead"
    )
    r.ok(ev("ToolCallStarted", call_id="c1", tool="read"), agent="lead")
    r.ok(ev("ToolSucceeded", call_id="c1", result_ref="artifact://out/1"), agent="lead")
    r.ok(fact("f1", evidence="artifact://out/1"), agent="lead")


def test_by_default_only_an_origins_channel_records_its_inputs_and_older_runs_keep_their_rule() -> None:
    """An input's authority is its origin: by default only that origin's channel identity
    (the agent id ``user``, ``approval``, ...; serve gives it to the channel's token) records
    it, also on a run whose writers do not name the channel; the agent cannot, so it cannot
    make its guess a fact's authoritative source. ``input_authority: writers`` is the older
    rule, which runs started by records of patch schema v5 and older keep."""
    r = Run("channels")
    r.ok(start(policy={"writers": ["lead"]}), agent="lead")
    guess = ev("InputRecorded", input={"id": "user://guess", "origin": "user", "text": "it is surely RS256"})
    d = r.bad("input.not_authorized", guess, agent="lead")
    assert "the user channel records it" in d.message and "who may: user" in d.message
    r.bad("fact.source_not_authoritative", fact("f1", evidence=None, source="user://guess"), agent="lead")
    approval = ev("InputRecorded", input={"id": "approval://1", "origin": "approval"})
    d = r.send(None, approval, agent="user")  # the user channel is not the approver
    assert (d.outcome, d.reason) == ("rejected", "unauthorized"), d
    d = r.send(None, guess, fact("f0"), agent="user")  # a channel writes inputs, not the run's work
    assert (d.outcome, d.reason) == ("rejected", "unauthorized"), d
    r.ok(guess, agent="user")
    r.ok(fact("f1", evidence=None, source="user://guess"), agent="lead")
    assert [i.id for i in r.doc.to_state().inputs] == ["user://guess"]

    old = Run("older")
    old.ok(start(policy={"input_authority": "writers"}), agent="lead")
    old.ok(guess, agent="lead")


def test_a_run_started_by_a_v5_record_keeps_the_rule_it_was_started_under() -> None:
    """The codec upcasts a v5 record's run policy to ``input_authority: writers`` (what
    its inputs meant when written); a v6 record's default is ``channels``."""
    from runstate.schemas import codec

    v5 = next(w for w in codec.published().values() if w.version == 5)
    record = codec.encode(patch("r", 0, start(), agent="lead"), v5)  # v5 has no input_authority to write
    assert codec.decode(record).events[0].policy.input_authority == "writers"  # type: ignore[union-attr]
    assert codec.read_patch(record).events[0].policy.input_authority == "writers"  # type: ignore[union-attr]
    new = codec.encode(patch("r", 0, start(), agent="lead"))
    assert codec.decode(new).events[0].policy.input_authority == "channels"  # type: ignore[union-attr]


def test_only_the_runs_revokers_may_revoke_its_creator_by_default() -> None:
    """Revocation is an administrator's act: a writer cannot revoke another (and wipe its
    work from revision 0); the policy's ``revokers`` may, else the agent that started the run."""
    r = Run("who-revokes")
    r.ok(start(), agent="lead")
    r.ok(fact("f1"), agent="helper")
    r.ok(fact("f2"), agent="rogue")
    d = r.send(0, ev("PermissionRevoked", agent_id="helper", reason="I want its facts gone"), agent="rogue")
    assert (d.outcome, d.reason) == ("rejected", "unauthorized") and "revoke" in (d.message or ""), d
    assert {f.id for f in r.doc.to_state().confirmed_facts} == {"f1", "f2"}
    assert r.doc.to_state().created_by == "lead"
    assert r.send(1, ev("PermissionRevoked", agent_id="rogue", reason="it tried"), agent="lead").outcome == "accepted"
    assert {f.id for f in r.doc.to_state().confirmed_facts} == {"f1"}
    named = Run("named-revokers")
    named.ok(start(policy={"revokers": ["security"]}), agent="lead")
    d = named.send(1, ev("PermissionRevoked", agent_id="x", reason="r"), agent="lead")
    assert d.reason == "unauthorized"
    assert named.send(1, ev("PermissionRevoked", agent_id="x", reason="r"), agent="security").outcome == "accepted"


def test_every_section_of_the_context_reads_the_same_from_the_states_struct() -> None:
    """A run with something in every section of the context (constraints and a correction,
    facts, a hypothesis, a question, tasks in each status, a wait, observations fresh and
    stale, artifacts, inputs, a side-effecting call in flight, effects, budgets, a
    transition): the text from the struct is the text from the validated state."""
    from datetime import UTC, datetime

    r = Run("every")
    r.ok(start(include=["src"], exclude=["public_api"]))
    r.ok(
        ev("ConstraintSet", constraint={"key": "timeout", "value": "30 min", "source": "user://m1"}),
        ev("ConstraintSet", constraint={"key": "timeout", "value": "15 min", "source": "user://m2"}),
    )
    r.ok(ev("InputRecorded", input={"id": "user://msg_3", "origin": "user", "text": "it is RS256"}), agent="user")
    r.ok(ev("ArtifactRecorded", artifact={"id": "artifact://diff/7", "kind": "patch", "digest": "sha256:ab"}))
    r.ok(
        fact("f1", scope="src/auth"),
        fact("f2", evidence=None, source="user://msg_3"),
        ev(
            "HypothesisProposed",
            hypothesis={"id": "h1", "statement": "maybe", "confidence": 0.66, "falsifier": "a test"},
        ),
        ev("QuestionOpened", question={"id": "q1", "text": "HS256 still pinned?"}),
    )
    r.ok(task("t1", scope=["src/auth"]), task("t2", deps=["t1"], scope=["src"]), task("t3"), task("t4", scope=["src"]))
    r.ok(ev("TaskStarted", task_id="t1"), ev("TaskStarted", task_id="t4"))
    r.ok(ev("TaskBlocked", task_id="t4", reason="needs a review"))
    r.ok(
        ev(
            "ObservationRecorded",
            observation={
                "subject": "svc",
                "observed_state": "up",
                "observed_at": "2026-08-11T09:00:00Z",
                "evidence": "artifact://r/1",
            },
        ),
        ev(
            "ObservationRecorded",
            observation={"subject": "db", "observed_state": "migrated", "evidence": "artifact://r/2"},
        ),
    )
    r.ok(
        ev("ToolCallStarted", call_id="c1", tool="deploy", side_effect=True),
        ev("EffectRecorded", effect={"id": "e1", "status": "started", "target": "prod"}),
    )
    r.ok(ev("BudgetSet", tokens_remaining=100), ev("BudgetConsumed", tokens=130))
    r.ok(
        ev(
            "WaitingStarted",
            waiting={"wait_id": "w1", "kind": "approval", "reason": "deploy", "until": "2026-08-11T09:30:00Z"},
        )
    )
    text = _context(r.doc.to_state(), now=datetime(2026, 8, 11, 10, 0, tzinfo=UTC))
    for part in (
        "constraint timeout = 15 min (corrects '30 min'",
        "[f2] statement f2 (source: input user://msg_3",
        "confidence 0.66",
        "OPEN QUESTIONS",
        "running  [t1]",
        "blocked  [t4]",
        "(after t1)",
        "STALE",
        "(OVERDUE)",
        "ARTIFACTS: 1 known; INPUTS: 1 recorded",
        "c1: deploy (side effect)",
        "1 with unknown outcome",
        "(OVER BUDGET)",
    ):
        assert part in text, part


def test_time_rules_use_the_log_s_time_not_the_time_a_patch_claims(tmp_path: Path) -> None:
    """A patch stamped in the past does not slip under a deadline that has passed: the
    deadline is measured against the log's time for the record (its append time), which a
    replay reads from the same record."""
    from datetime import UTC, datetime, timedelta

    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.producers.run_producer import RunProducer
    from runstate.projector.read.queries import Projection
    from runstate.projector.read.replay import replay
    from runstate.schemas.patch import Author

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    clock = [datetime.now(UTC) - timedelta(days=2)]
    prod = RunProducer(log, Author(agent_id="a", agent_version="1"), clock=lambda: clock[0])
    deadline = datetime.now(UTC) - timedelta(days=1)  # passed a day ago
    prod.append(prod.events("r", 0, [start(), task("t1")]))
    prod.append(prod.events("r", 1, [ev("BudgetSet", deadline=deadline.isoformat())]))
    # Stamped two days ago, before the deadline, but appended now, after it.
    prod.append(prod.events("r", 2, [ev("TaskStarted", task_id="t1")]))
    prod.close()
    project_all(log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        last = proj.history("r")[-1]
        assert (last.outcome, last.rule) == ("rejected", "deadline.passed"), last
    # A replay from the log decides the same way.
    book = replay(r for r in log.scan(log.topics.events, 0, 0, 10**9))
    assert [d.rule for d in book.decided.values()][-1] == "deadline.passed"
    log.close()


def test_graph_values_are_kept_once_per_version_while_a_checkpoint_refers_to_them() -> None:
    """A checkpoint saved with its channel versions keeps each new version's value apart
    (``graph_values``), once; removing checkpoints drops the values no remaining checkpoint
    of the namespace refers to, and deleting the thread drops them all."""
    blob = {"type": "json", "data": "e30="}

    def saved(
        cid: str, parent: str | None, versions: dict[str, str], values: dict[str, str], ns: str = ""
    ) -> dict[str, Any]:
        return ev(
            "GraphCheckpointSaved",
            checkpoint={
                "ns": ns,
                "id": cid,
                "parent_id": parent,
                "checkpoint": blob,
                "metadata": blob,
                "versions": [{"channel": c, "version": v} for c, v in versions.items()],
                "values": [{"channel": c, "version": v, "value": blob} for c, v in values.items()],
            },
        )

    def kept(run: Run) -> list[str]:
        return sorted(k for k, v in run.doc.entries("graph_values").items() if v is not None)

    run = Run()
    run.ok(start())
    run.ok(saved("c1", None, {"m": "1", "k": "1"}, {"m": "1", "k": "1"}))
    run.ok(saved("c2", "c1", {"m": "1", "k": "2"}, {"k": "2"}))
    run.ok(saved("s1", None, {"m": "1"}, {"m": "1"}, ns="sub:x"))  # another namespace's m@1
    assert kept(run) == ["0:/1:k/1", "0:/1:k/2", "0:/1:m/1", "5:sub:x/1:m/1"]
    run.ok(ev("GraphCheckpointsRemoved", checkpoints=[{"id": "c1"}], reason="prune"))
    assert kept(run) == ["0:/1:k/2", "0:/1:m/1", "5:sub:x/1:m/1"]  # c2 still refers to m@1
    run.ok(ev("GraphCheckpointsRemoved", checkpoints=[{"id": "c2"}], reason="prune"))
    assert kept(run) == ["5:sub:x/1:m/1"]
    run.ok(ev("GraphThreadDeleted"))
    assert kept(run) == []


def test_graph_checkpoints_removed_by_name_take_their_writes_and_leave_the_others() -> None:
    """LangGraph's prune and delete_for_runs: the named checkpoints and their writes leave
    the state, one already gone is no error, the run goes on; a stale removal is rebased."""
    blob = {"type": "json", "data": "e30="}
    run = Run()
    run.ok(start())
    for cid, parent in (("c1", None), ("c2", "c1"), ("c3", "c2")):
        run.ok(
            ev(
                "GraphCheckpointSaved",
                checkpoint={"id": cid, "parent_id": parent, "checkpoint": blob, "metadata": blob},
            )
        )
    run.ok(
        ev("GraphWritesSaved", checkpoint_id="c1", writes=[{"task_id": "t", "idx": 0, "channel": "c", "value": blob}])
    )
    removal = ev("GraphCheckpointsRemoved", checkpoints=[{"id": "c1"}, {"id": "c2"}, {"id": "never"}], reason="prune")
    d = run.send(run.revision - 2, removal, rebase=True)
    assert d.outcome == "accepted", d
    graph = {k: v[1] for k, v in run.doc.entries("graph_checkpoints").items() if v is not None}
    assert [cp.id for cp in graph.values()] == ["c3"]
    assert run.doc.header.status == "running"
    run.ok(removal)  # again: nothing left to remove, no error
    run.ok(ev("GraphCheckpointSaved", checkpoint={"id": "c4", "parent_id": "c3", "checkpoint": blob, "metadata": blob}))
    # On a finished run too (what LangGraph deletes must go), but nothing else is accepted there.
    run.ok(ev("RunCancelled", reason="done with it"))
    run.ok(ev("GraphCheckpointsRemoved", checkpoints=[{"id": "c4"}], reason="prune"))
    assert [k for k, v in run.doc.entries("graph_checkpoints").items() if v is not None] == ["0:/c3"]
    d = run.send(None, ev("GraphCheckpointsRemoved", checkpoints=[{"id": "c3"}], reason="prune"), fact("f9"))
    assert d.reason == "run_terminal", d
