"""A generator of interleaved patch streams for property tests: valid chains, stale,
invalid, rebase and duplicate patches over a few runs (a helper module, not a test)."""

from __future__ import annotations

from typing import Any

from helpers import ev, fact, patch, start, task
from hypothesis import strategies as st

from runstate.projector.core.runbook import RunBook
from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Patch

RUNS = ["r0", "r1", "r2"]


def _pick(doc: RunDoc | None, kind: str, n: int, fallback: str) -> str:
    """An id of a live object of the run (as an agent would target), or ``fallback``."""
    ids = [] if doc is None else [k for k, e in doc.entries(kind).items() if e is not None]
    return ids[n % len(ids)] if ids else fallback


def _events(kind: str, n: int, doc: RunDoc | None) -> list[dict[str, Any]]:
    """A small catalogue of event groups, valid and invalid, keyed by ``kind``."""
    hyp = _pick(doc, "hypotheses", n, "h_none")
    q = _pick(doc, "open_questions", n, "q_none")
    call = _pick(doc, "pending_tool_calls", n, "c_none")
    t = _pick(doc, "tasks", n, "t_none")
    f = _pick(doc, "confirmed_facts", n, "f_none")
    return {
        "fact": [fact(f"f{n}")],
        "fact_dup": [fact(f)],
        "fact_noevidence": [fact(f"x{n}", evidence=None)],
        "retract": [ev("FactRetracted", fact_id=f, reason="wrong")],
        "task": [task(f"t{n}", scope=["src/a"] if n % 2 else ["docs"])],
        "task_dep": [task(f"d{n}", deps=[t])],
        "start_task": [ev("TaskStarted", task_id=t)],
        "complete_task": [ev("TaskCompleted", task_id=t, evidence="artifact://done/1")],
        "hyp": [
            ev(
                "HypothesisProposed",
                hypothesis={"id": f"h{n}", "statement": "s", "confidence": (n % 12) / 10, "falsifier": "f"},
            )
        ],
        "confirm_hyp": [{**fact(f"c{n}"), "replaces_hypothesis_id": hyp}],
        "reject_hyp": [ev("HypothesisRejected", hypothesis_id=hyp, reason="no")],
        "question": [ev("QuestionOpened", question={"id": f"q{n}", "text": "?"})],
        "resolve": [ev("QuestionResolved", question_id=q)],
        "call": [ev("ToolCallStarted", call_id=f"c{n}", tool="t")],
        "call_done": [ev("ToolSucceeded", call_id=call)],
        "constraint": [ev("ConstraintSet", constraint={"key": f"k{n % 2}", "value": str(n)})],
        "obs": [ev("ObservationRecorded", observation={"subject": f"file://{n % 3}", "observed_state": str(n)})],
        "budget": [ev("BudgetConsumed", tokens=1 + n % 5)],
        "goal": [ev("GoalChanged", goal={"statement": f"g{n}", "scope": {"include": ["src"]}})],
        "wait": [ev("WaitingStarted", waiting={"wait_id": f"w{n}", "kind": "user", "reason": "?"})],
        "unwait": [
            ev("WaitingResolved", wait_id=doc.header.waiting.wait_id if doc and doc.header.waiting else "w_none")
        ],
        "mixed": [fact(f"m{n}"), ev("TaskStarted", task_id="nope")],
        "complete": [ev("RunCompleted")],
        # The kinds below came after the golden corpus was fixed on KINDS (MORE_KINDS).
        "phase": [ev("PhaseChanged", phase=f"p{n % 3}")],
        "revise_hyp": [ev("HypothesisRevised", hypothesis_id=hyp, confidence=(n % 10) / 10)],
        "block_task": [ev("TaskBlocked", task_id=t, reason="review")],
        "fail_task": [ev("TaskFailed", task_id=t, reason="no")],
        "cancel_task": [ev("TaskCancelled", task_id=t, reason="out of scope")],
        "hand_over": [ev("TaskHandedOver", task_id=t, to_agent_id="agent-2", reason="theirs")],
        "call_failed": [ev("ToolFailed", call_id=call, error="boom")],
        "artifact": [ev("ArtifactRecorded", artifact={"id": f"artifact://a/{n % 4}", "kind": "log"})],
        "input": [ev("InputRecorded", input={"id": f"i{n}", "origin": "user", "text": "go"})],
        "effect": [
            ev("EffectRecorded", effect={"id": f"e{n % 3}", "status": ("started", "committed")[n % 2], "target": "x"})
        ],
        "workspace": [ev("WorkspaceUpdated", workspace_ref={"workspace_id": "w", "current_commit": f"c{n}"})],
        "budget_set": [ev("BudgetSet", tokens_remaining=100 + n)],
        "lease": [ev("LeaseReleased", worker_id="worker-1", lease_id=f"l{n}")],
        "graph_save": [ev("GraphCheckpointSaved", checkpoint={"ns": "", "id": f"g{n}", **_GRAPH})],
        "graph_writes": [
            ev(
                "GraphWritesSaved",
                checkpoint_id=f"g{n - 1}",
                writes=[{"task_id": "x", "idx": 0, "channel": "c", "value": _BLOB, "task_path": "a"}],
            )
        ],
        "graph_remove": [ev("GraphCheckpointsRemoved", checkpoints=[{"ns": "", "id": f"g{n - 2}"}], reason="prune")],
        "graph_delete": [ev("GraphThreadDeleted", reason="thread deleted")],
        "revoke": [ev("PermissionRevoked", agent_id="agent-2", reason="compromised")],  # operator only
        "cancel": [ev("RunCancelled", reason="not needed")],
        "fail": [ev("RunFailed", reason="gave up")],
    }[kind]


_BLOB = {"type": "json", "data": "e30="}
_GRAPH = {"checkpoint": _BLOB, "metadata": _BLOB}


KINDS = [
    "fact",
    "fact",
    "fact_dup",
    "fact_noevidence",
    "retract",
    "task",
    "task_dep",
    "start_task",
    "complete_task",
    "hyp",
    "hyp",
    "confirm_hyp",
    "reject_hyp",
    "question",
    "resolve",
    "call",
    "call_done",
    "constraint",
    "obs",
    "budget",
    "goal",
    "wait",
    "unwait",
    "mixed",
] * 3 + ["complete"]

#: Every event type's kinds beyond KINDS (which the golden corpus is built on and so stays as
#: it is); the property tests draw from both.
MORE_KINDS = [
    "phase",
    "revise_hyp",
    "block_task",
    "fail_task",
    "cancel_task",
    "hand_over",
    "call_failed",
    "artifact",
    "input",
    "effect",
    "workspace",
    "budget_set",
    "lease",
    "graph_save",
    "graph_save",
    "graph_writes",
    "graph_remove",
    "graph_delete",
    "revoke",
    "cancel",
    "fail",
]

op = st.tuples(
    st.sampled_from(["r0", "r0", "r1", "r1", "r2"]),  # r2 is never started: unknown_run
    st.sampled_from(KINDS + MORE_KINDS),
    st.sampled_from([0, 0, 0, 0, 0, 1, 2]),  # how many revisions behind the patch is based
    st.booleans(),  # rebase
    st.integers(0, 20),  # resend an earlier patch (duplicate) when < 3
)


def build(ops: list[tuple[str, str, int, bool, int]]) -> list[Patch]:
    """Turn ops into patches; expected revisions track a live RunBook, as an agent would."""
    book = RunBook()
    out: list[Patch] = []
    for r in RUNS[:2]:
        out.append(patch(r, 0, start(include=["src", "docs"])))
        book.apply(out[-1], 0, len(out))
    for i, (run, kind, behind, rebase, dup) in enumerate(ops):
        if dup < 3 and out:
            out.append(out[(i * 7) % len(out)])
            continue
        doc = book.docs.get(run)
        rev = 0 if doc is None else doc.header.revision
        p = patch(run, max(0, rev - behind), *_events(kind, i, doc), rebase=rebase, minute=i)
        book.apply(p, 0, len(out))
        out.append(p)
    return out
