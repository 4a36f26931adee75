"""The reducer's behaviour is pinned to its version: a fixed corpus of patches (every event
type, accepted and rejected, stale and rebased) is decided in memory and digested; the
digest is recorded with ``REDUCER_VERSION`` in ``tests/data/reducer_golden.json``.

A change to a rule or a reducer that changes a decision or a state fails here until
``REDUCER_VERSION`` is bumped (checkpoints made under the old rules must not be trusted)
and the file is written again: ``RUNSTATE_WRITE_GOLDEN=1 pytest tests/projector/test_reducer_golden.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import timedelta
from typing import Any

import msgspec
from helpers import TESTS, ev, fact, patch, start, task
from workloads import KINDS, _events

from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.core.runbook import RunBook
from runstate.schemas.codec import content_digest, encode
from runstate.schemas.events import EVENT_TYPE_NAMES
from runstate.schemas.patch import Patch

GOLDEN = TESTS / "data" / "reducer_golden.json"
BLOB = {"type": "json", "data": "e30="}


def _others() -> list[tuple[list[dict[str, Any]], int, bool]]:
    """What the workload's kinds do not cover, on a run of its own: (events, behind, rebase)."""
    graph = {"ns": "", "id": "c1", "checkpoint": BLOB, "metadata": BLOB}
    return [
        ([ev("PhaseChanged", phase="investigate")], 0, False),
        (
            [ev("HypothesisProposed", hypothesis={"id": "h1", "statement": "s", "confidence": 0.4, "falsifier": "f"})],
            0,
            False,
        ),
        ([ev("HypothesisRevised", hypothesis_id="h1", confidence=0.7)], 0, False),
        ([task("t1"), task("t2"), task("t3"), task("t4")], 0, False),
        ([ev("TaskStarted", task_id="t1")], 0, False),
        ([ev("TaskBlocked", task_id="t1", reason="waits for review")], 0, False),
        ([ev("TaskFailed", task_id="t2", reason="no")], 0, False),  # pending: not a transition
        ([ev("TaskStarted", task_id="t2")], 0, False),
        ([ev("TaskFailed", task_id="t2", reason="no")], 0, False),
        ([ev("TaskCancelled", task_id="t3", reason="out of scope")], 0, False),
        ([ev("TaskHandedOver", task_id="t4", to_agent_id="agent-2", reason="theirs")], 0, False),  # no owner yet
        ([ev("TaskStarted", task_id="t4")], 0, False),
        ([ev("TaskHandedOver", task_id="t4", to_agent_id="agent-2", reason="theirs")], 0, False),
        ([ev("ToolCallStarted", call_id="c1", tool="deploy", side_effect=True)], 0, False),
        ([ev("ToolFailed", call_id="c1", error="boom")], 0, False),
        ([ev("ToolCallStarted", call_id="c2", tool="read")], 0, False),
        ([ev("ToolSucceeded", call_id="c2", result_ref="artifact://r/2")], 0, False),
        ([ev("WaitingStarted", waiting={"wait_id": "w1", "kind": "user", "reason": "?"})], 0, False),
        ([ev("WaitingResolved", wait_id="w1")], 0, False),
        ([ev("QuestionOpened", question={"id": "q1", "text": "which?"})], 0, False),
        ([ev("QuestionResolved", question_id="q1", answer="this")], 0, False),
        ([ev("TaskStarted", task_id="t1")], 0, False),
        ([ev("TaskCompleted", task_id="t1", evidence="artifact://a/1")], 0, False),
        ([ev("ArtifactRecorded", artifact={"id": "artifact://a/1", "kind": "log"})], 0, False),
        ([ev("ArtifactRecorded", artifact={"id": "artifact://a/1", "kind": "log"})], 0, False),  # duplicate id
        ([ev("ArtifactRecorded", artifact={"id": "artifact://a/2", "kind": "log"})], 1, True),  # stale: commutes
        ([ev("InputRecorded", input={"id": "i1", "origin": "user", "text": "go"})], 0, False),  # not the user's channel
        (
            [
                ev(
                    "EffectRecorded",
                    effect={
                        "id": "e1",
                        "status": "started",
                        "kind": "deploy",
                        "target": "prod",
                        "idempotency_key": "k1",
                    },
                )
            ],
            0,
            False,
        ),
        (
            [
                ev(
                    "EffectRecorded",
                    effect={
                        "id": "e1",
                        "status": "committed",
                        "kind": "deploy",
                        "target": "prod",
                        "idempotency_key": "k1",
                    },
                )
            ],
            0,
            False,
        ),
        (
            [ev("WorkspaceUpdated", workspace_ref={"workspace_id": "w", "base_commit": "a1", "current_commit": "b2"})],
            0,
            False,
        ),
        ([ev("BudgetSet", tokens_remaining=100)], 0, False),
        ([ev("BudgetConsumed", tokens=150)], 1, True),  # stale, rebased: it commutes
        ([ev("LeaseReleased", worker_id="worker-1", lease_id="l1")], 0, False),
        ([ev("GraphCheckpointSaved", checkpoint=graph)], 2, True),
        (
            [
                ev(
                    "GraphWritesSaved",
                    checkpoint_id="c1",
                    writes=[{"task_id": "x", "idx": 0, "channel": "c", "value": BLOB, "task_path": "a"}],
                )
            ],
            0,
            True,
        ),
        ([ev("GraphCheckpointSaved", checkpoint={**graph, "id": "c2", "parent_id": "c1"})], 0, False),
        # Values kept once per version: c4 refers to m@1 that c3 saved.
        (
            [
                ev(
                    "GraphCheckpointSaved",
                    checkpoint={
                        **graph,
                        "id": "c3",
                        "parent_id": "c2",
                        "versions": [{"channel": "m", "version": "1"}, {"channel": "k", "version": "1"}],
                        "values": [{"channel": "m", "version": "1", "value": BLOB}, {"channel": "k", "version": "1"}],
                    },
                )
            ],
            0,
            False,
        ),
        (
            [
                ev(
                    "GraphCheckpointSaved",
                    checkpoint={
                        **graph,
                        "id": "c4",
                        "parent_id": "c3",
                        "versions": [{"channel": "m", "version": "1"}, {"channel": "k", "version": "2"}],
                        "values": [{"channel": "k", "version": "2", "value": BLOB}],
                    },
                )
            ],
            0,
            False,
        ),
        (
            [
                ev(
                    "GraphCheckpointsRemoved",
                    checkpoints=[{"ns": "", "id": "c1"}, {"ns": "", "id": "gone"}],
                    reason="prune keep_latest",
                )
            ],
            1,
            True,
        ),  # stale, rebased: it commutes; one not there
        # c3 goes, and k@1 with it (no checkpoint refers to it); m@1 stays for c4.
        ([ev("GraphCheckpointsRemoved", checkpoints=[{"ns": "", "id": "c3"}], reason="prune")], 0, False),
        ([ev("PermissionRevoked", agent_id="agent-2", reason="compromised")], 0, False),
        ([ev("GoalChanged", goal={"statement": "narrower", "scope": {"include": ["src"]}})], 1, False),  # stale control
    ]


def corpus() -> list[Patch]:
    """The patches, with fixed ids and times; expected revisions follow a live RunBook."""
    book = RunBook()
    out: list[Patch] = []

    def add(
        run: str, events: list[dict[str, Any]], behind: int = 0, rebase: bool = False, agent: str = "agent-1"
    ) -> None:
        doc = book.docs.get(run)
        rev = 0 if doc is None else doc.header.revision
        p = patch(
            run, max(0, rev - behind), *events, rebase=rebase, patch_id=f"g{len(out)}", minute=len(out), agent=agent
        )
        book.apply(p, 0, len(out))
        out.append(p)

    for run in ("r0", "r1", "r2", "r3", "r4", "r5"):
        add(run, [start(include=["src", "docs"])])
    for i, kind in enumerate(KINDS):
        run = "r0" if i < 2 * len(KINDS) // 3 else "r1"
        add(run, _events(kind, i, book.docs.get(run)), behind=1 if i % 5 == 4 else 0, rebase=i % 4 == 0)
    for events, behind, rebase in _others():
        add("r2", events, behind, rebase)
    add("r2", [ev("InputRecorded", input={"id": "i2", "origin": "user", "text": "go"})], agent="user")
    add("r4", [ev("RunCancelled", reason="not needed")])
    add("r2", [ev("RunFailed", reason="gave up")])
    add("r2", [fact("late")])  # after the end: run_terminal
    add("r3", [ev("GraphThreadDeleted", reason="thread deleted")])
    add("r3", [ev("RunCancelled", reason="already cancelled")])  # run_terminal
    add("r3", [ev("RunErased", reason="asked", erased_by="ops")])
    add("r3", [fact("after erasure")])  # run_erased
    add("r1", [ev("RunCompleted", summary="done")])  # loose ends left: refused
    add("r5", [ev("RunCompleted", summary="done")])
    add("r5", [ev("RunCompleted", summary="twice")])
    out.append(out[5])  # a resend: its first decision
    # The same patch built again with a new time (a client's resend through serve): its
    # first decision, not patch_id_reused; then the id reused for other content.
    out.append(out[6].model_copy(update={"created_at": out[6].created_at + timedelta(hours=2)}))
    out.append(patch(out[6].run_id, 0, ev("PhaseChanged", phase="other"), patch_id=out[6].patch_id, minute=len(out)))
    return out


def decided() -> tuple[str, dict[str, int], set[str]]:
    """The corpus decided afresh: its digest (every decision, and the run's state after each
    accepted patch), decisions by outcome/reason, and the event types of the accepted patches."""
    book = RunBook()
    h = hashlib.sha256()
    outcomes: dict[str, int] = {}
    accepted: set[str] = set()
    for offset, p in enumerate(corpus()):
        record = encode(p)  # decided as the projector decides a log record: with its digest
        d = book.apply(p, 0, offset, content_digest(record), None, record).decision
        assert d is not None
        h.update(msgspec.json.encode(d))
        key = d.outcome if d.outcome == "accepted" else f"rejected:{d.reason}"
        outcomes[key] = outcomes.get(key, 0) + 1
        if d.outcome == "accepted":
            accepted.update(e.type for e in p.events)
            # The state after each patch, not only the last: a later patch may hide a change.
            h.update(json.dumps(book.docs[p.run_id].to_state_data(), sort_keys=True, default=str).encode())
    for run, doc in sorted(book.docs.items()):
        h.update(run.encode())
        h.update(json.dumps(doc.to_state_data(), sort_keys=True, default=str).encode())
    return h.hexdigest(), outcomes, accepted


def test_the_corpus_holds_every_event_type_and_both_outcomes() -> None:
    types = {e.type for p in corpus() for e in p.events}
    assert types == set(EVENT_TYPE_NAMES), set(EVENT_TYPE_NAMES) - types
    _digest, outcomes, accepted = decided()
    assert outcomes["accepted"] > 40 and sum(n for k, n in outcomes.items() if k != "accepted") > 20, outcomes
    assert accepted == set(EVENT_TYPE_NAMES), set(EVENT_TYPE_NAMES) - accepted


def test_the_reducer_s_decisions_change_only_with_its_version() -> None:
    digest, outcomes, _accepted = decided()
    assert decided()[0] == digest  # deterministic
    if os.environ.get("RUNSTATE_WRITE_GOLDEN"):
        GOLDEN.write_text(
            json.dumps(
                {"reducer_version": REDUCER_VERSION, "digest": digest, "outcomes": outcomes}, indent=1, sort_keys=True
            )
            + "\n"
        )
    golden = json.loads(GOLDEN.read_text())
    if golden["reducer_version"] == REDUCER_VERSION:
        assert golden["digest"] == digest, (
            f"the corpus is decided differently (outcomes now {outcomes}, recorded {golden['outcomes']}) "
            f"while REDUCER_VERSION is still {REDUCER_VERSION}: bump it in projector/core/reducer.py, then "
            "write the file again (RUNSTATE_WRITE_GOLDEN=1)"
        )
    else:
        raise AssertionError(
            f"REDUCER_VERSION is {REDUCER_VERSION}, {GOLDEN.name} records "
            f"{golden['reducer_version']}: write it again (RUNSTATE_WRITE_GOLDEN=1)"
        )
