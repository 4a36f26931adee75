"""``runstate demo``: simulated agent workers (separate processes) and a projector.

Each worker drives one run through a realistic script and waits for every decision, as a
real agent would. Between them the scripts show: a revision conflict (two updates based on
the same revision; the second is rebased because it commutes), a fact rejected for lack of
evidence and a guess refused because its source is not an authoritative input, facts
accepted with artifacts a tool returned, a second agent refused on a task it does not own,
a risky write refused because the observation it relies on is stale, a correction (a
constraint set twice), a goal change that cancels an out-of-scope task, a wait for
approval, a side effect with its ledger, a hypothesis confirmed into a fact, an exhausted
budget refusing a costly call, and a patch refused after the run completed.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runstate.eventlog import open_log
from runstate.progress import Progress
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection, decision_reader
from runstate.producers.run_producer import RunProducer
from runstate.schemas.patch import Author

T0 = "2026-08-11T16:20:00+08:00"

Step = dict[str, Any]  # {"say": str, "events": [...], "stale": int?, "rebase": bool?}


def _login_script() -> list[Step]:
    return [
        {
            "say": "start: fix login after the dependency upgrade",
            "events": [
                {
                    "type": "RunStarted",
                    "phase": "diagnose",
                    "goal": {
                        "statement": "Fix the login failure after the dependency upgrade",
                        "scope": {"include": ["src/auth", "tests/login", "docs"], "exclude": ["public_api"]},
                        "acceptance": ["test_login_refresh passes", "public API unchanged"],
                    },
                },
                # Two hours from now: patch times come from the worker's clock, and a deadline
                # that has passed refuses new work (deadline.passed).
                {
                    "type": "BudgetSet",
                    "tokens_remaining": 100000,
                    "deadline": (datetime.now(UTC) + timedelta(hours=2)).isoformat(timespec="seconds"),
                },
                {
                    "type": "ConstraintSet",
                    "constraint": {"key": "session_timeout", "value": "30 min", "source": "user://msg_1"},
                },
            ],
        },
        {
            "say": "plan three tasks",
            "events": [
                {
                    "type": "TaskCreated",
                    "task": {"id": "task_1", "title": "Reproduce the failing login test", "scope": ["tests/login"]},
                },
                {
                    "type": "TaskCreated",
                    "task": {
                        "id": "task_2",
                        "title": "Confirm where the signing algorithm is configured",
                        "depends_on": ["task_1"],
                        "scope": ["src/auth"],
                    },
                },
                {
                    "type": "TaskCreated",
                    "task": {"id": "task_3", "title": "Update the auth docs", "scope": ["docs/auth"]},
                },
            ],
        },
        {
            "say": "run the login tests",
            "events": [
                {"type": "TaskStarted", "task_id": "task_1"},
                {"type": "ToolCallStarted", "call_id": "call_1", "tool": "run_test"},
            ],
        },
        {
            "say": "tests fail: token uses RS256 (a fact citing the output the test tool returned)",
            "events": [
                {"type": "ToolSucceeded", "call_id": "call_1", "result_ref": "artifact://test-output/47"},
                {
                    "type": "ObservationRecorded",
                    "observation": {
                        "subject": "file://src/auth/config.ts",
                        "observed_version": "sha256:9a2f",
                        "observed_state": "algorithm=RS256",
                    },
                },
                {
                    "type": "FactConfirmed",
                    "fact": {
                        "id": "fact_12",
                        "statement": "The session token is signed with RS256",
                        "evidence": "artifact://test-output/47",
                    },
                },
                {"type": "TaskCompleted", "task_id": "task_1", "evidence": "artifact://test-output/47"},
                {"type": "BudgetConsumed", "tokens": 5200},
            ],
        },
        {
            "say": "a guess written as a fact (no evidence): must be rejected",
            "events": [
                {"type": "FactConfirmed", "fact": {"id": "fact_x", "statement": "The fixture is probably fine"}}
            ],
        },
        {
            "say": "a guess that names its own reasoning as the source: not an authoritative input, rejected",
            "events": [
                {
                    "type": "FactConfirmed",
                    "fact": {"id": "fact_y", "statement": "The fixture is fine", "source": "my own reasoning (guess)"},
                }
            ],
        },
        {
            "say": "propose a hypothesis",
            "events": [
                {
                    "type": "HypothesisProposed",
                    "hypothesis": {
                        "id": "hyp_4",
                        "statement": "The config override order changed in the upgrade",
                        "confidence": 0.66,
                        "falsifier": "Run the config parser unit tests",
                    },
                }
            ],
        },
        {
            "say": "user corrects the timeout: 15 min, not 30",
            "events": [
                {
                    "type": "ConstraintSet",
                    "constraint": {"key": "session_timeout", "value": "15 min", "source": "user://msg_7"},
                }
            ],
        },
        {
            "say": "a tool result and a question arrive on the same revision",
            "events": [{"type": "TaskStarted", "task_id": "task_2"}],
            "then_stale": {
                "say": "question based on the old revision",
                "events": [
                    {
                        "type": "QuestionOpened",
                        "question": {"id": "q_1", "text": "Does the test fixture still pin HS256?"},
                    }
                ],
            },
        },
        {
            "say": "another agent tries to close task_2, which this worker owns: rejected",
            "agent": "agent-reviewer",
            "events": [{"type": "TaskCompleted", "task_id": "task_2", "evidence": "artifact://test-output/47"}],
        },
        {
            "say": "a risky write relying on an old read of the config: stale, rejected",
            "events": [
                {
                    "type": "ToolCallStarted",
                    "call_id": "call_w",
                    "tool": "write_file",
                    "side_effect": True,
                    "relies_on": [{"subject": "file://src/auth/config.ts", "observed_version": "sha256:0000"}],
                }
            ],
        },
        {
            "say": "user narrows the goal: no docs work",
            "events": [
                {
                    "type": "GoalChanged",
                    "reason": "user://msg_9",
                    "goal": {
                        "statement": "Fix the login failure after the dependency upgrade (code only)",
                        "scope": {"include": ["src/auth", "tests/login"], "exclude": ["public_api", "docs"]},
                        "acceptance": ["test_login_refresh passes", "public API unchanged"],
                    },
                }
            ],
        },
        {
            "say": "fixture confirmed; deploying a fix needs approval",
            "events": [
                {"type": "ToolCallStarted", "call_id": "call_2", "tool": "inspect_fixture"},
                {"type": "ToolSucceeded", "call_id": "call_2", "result_ref": "artifact://test-output/48"},
                {
                    "type": "FactConfirmed",
                    "fact": {
                        "id": "fact_13",
                        "statement": "The login fixture pins HS256",
                        "evidence": "artifact://test-output/48",
                    },
                },
                {"type": "QuestionResolved", "question_id": "q_1", "answer": "yes, see fact_13"},
                {"type": "TaskCompleted", "task_id": "task_2", "evidence": "artifact://test-output/48"},
                {
                    "type": "WorkspaceUpdated",
                    "workspace_ref": {"workspace_id": "ws_71", "base_commit": "81a23f0", "current_commit": "3bc92e1"},
                },
                {
                    "type": "WaitingStarted",
                    "waiting": {
                        "wait_id": "wait_1",
                        "kind": "approval",
                        "reason": "Deploying the fixture change needs a reviewer",
                    },
                },
            ],
        },
    ]


def _order_script() -> list[Step]:
    return [
        {
            "say": "start: place the customer's order",
            "events": [
                {
                    "type": "RunStarted",
                    "phase": "execute",
                    "goal": {"statement": "Place order for customer 42", "acceptance": ["order exists and is paid"]},
                },
                {"type": "TaskCreated", "task": {"id": "t_create", "title": "Create the order"}},
            ],
        },
        {
            "say": "create the order (side effect)",
            "events": [
                {"type": "TaskStarted", "task_id": "t_create"},
                {"type": "ToolCallStarted", "call_id": "c_1", "tool": "create_order", "side_effect": True},
                {
                    "type": "EffectRecorded",
                    "effect": {
                        "id": "eff_1",
                        "status": "started",
                        "kind": "create_order",
                        "target": "order://order_9",
                        "idempotency_key": "cust42-1",
                        "call_id": "c_1",
                    },
                },
            ],
        },
        {
            "say": "order created",
            "events": [
                {"type": "ToolSucceeded", "call_id": "c_1", "result_ref": "artifact://tool-result/create-order-9"},
                {
                    "type": "EffectRecorded",
                    "effect": {
                        "id": "eff_1",
                        "status": "committed",
                        "evidence": "artifact://tool-result/create-order-9",
                    },
                },
                {
                    "type": "ObservationRecorded",
                    "observation": {
                        "subject": "order://order_9",
                        "observed_state": "created",
                        "observed_at": "2026-08-11T16:24:00+08:00",
                        "evidence": "artifact://tool-result/create-order-9",
                    },
                },
                {"type": "TaskCompleted", "task_id": "t_create", "evidence": "artifact://tool-result/create-order-9"},
            ],
        },
        {
            "say": "done",
            "events": [
                {
                    "type": "RunCompleted",
                    "summary": "order_9 created",
                    "evidence": "artifact://tool-result/create-order-9",
                }
            ],
        },
        {
            "say": "a late retry after completion: must be refused",
            "events": [{"type": "ToolCallStarted", "call_id": "c_2", "tool": "create_order", "side_effect": True}],
        },
    ]


def _research_script() -> list[Step]:
    return [
        {
            "say": "start: why did p99 latency double?",
            "events": [
                {
                    "type": "RunStarted",
                    "phase": "investigate",
                    "goal": {"statement": "Explain why p99 latency doubled on Monday"},
                },
                {"type": "BudgetSet", "tokens_remaining": 20000},
            ],
        },
        {
            "say": "two hypotheses",
            "events": [
                {
                    "type": "HypothesisProposed",
                    "hypothesis": {
                        "id": "h_gc",
                        "statement": "GC pauses grew after the heap change",
                        "confidence": 0.4,
                        "falsifier": "GC logs show no long pauses",
                    },
                },
                {
                    "type": "HypothesisProposed",
                    "hypothesis": {
                        "id": "h_db",
                        "statement": "A slow query plan appeared",
                        "confidence": 0.5,
                        "falsifier": "EXPLAIN shows the old plan",
                    },
                },
                {"type": "QuestionOpened", "question": {"id": "q_deploy", "text": "Was there a deploy on Monday?"}},
            ],
        },
        {
            "say": "GC logs are clean: reject h_gc",
            "events": [
                {
                    "type": "HypothesisRejected",
                    "hypothesis_id": "h_gc",
                    "reason": "no pause over 20 ms",
                    "evidence": "artifact://gc-log/mon",
                },
                {"type": "BudgetConsumed", "tokens": 8000},
            ],
        },
        {
            "say": "EXPLAIN confirms h_db",
            "events": [
                {"type": "ToolCallStarted", "call_id": "c_explain", "tool": "explain_query"},
                {"type": "ToolSucceeded", "call_id": "c_explain", "result_ref": "artifact://explain/42"},
                {
                    "type": "FactConfirmed",
                    "replaces_hypothesis_id": "h_db",
                    "fact": {
                        "id": "f_plan",
                        "statement": "orders_by_user switched to a sequential scan",
                        "evidence": "artifact://explain/42",
                        "scope": "db/orders",
                    },
                },
                {"type": "BudgetConsumed", "tokens": 15000},
            ],
        },
        {
            "say": "the budget is spent: a costly call is refused",
            "events": [{"type": "ToolCallStarted", "call_id": "c_more", "tool": "large_model_review", "costly": True}],
        },
    ]


SCRIPTS: dict[str, Callable[[], list[Step]]] = {
    "run_login": _login_script,
    "run_order": _order_script,
    "run_research": _research_script,
}


def _say(run_id: str, text: str) -> None:
    print(f"[{run_id}] {text}", flush=True)


def _report(run_id: str, d: Any) -> None:
    if d.outcome == "accepted":
        _say(run_id, f"   -> accepted at revision {d.revision}{' (rebased)' if d.rebased else ''}")
    else:
        _say(run_id, f"   -> rejected: {d.reason}{f' [{d.rule}]' if d.rule else ''} {d.message}")


def worker(run_id: str, log_url: str, state_dir: str) -> int:
    """One agent worker: play the run's script, waiting for each decision."""
    log = open_log(log_url, create=False)
    producer = RunProducer(
        log, Author(agent_id=f"agent-{run_id}", agent_version="demo-1.0"), decisions=decision_reader(state_dir)
    )
    revision = 0
    for step in SCRIPTS[run_id]():
        _say(run_id, step["say"])
        if "agent" in step:  # another agent's worker, on the same run
            other_agent = RunProducer(
                log, Author(agent_id=step["agent"], agent_version="demo-1.0"), decisions=decision_reader(state_dir)
            )
            d = other_agent.submit(other_agent.events(run_id, revision, step["events"]), 30)
            _report(run_id, d)
            other_agent.close()
            continue
        patch = producer.events(run_id, revision, step["events"])
        stale = step.get("then_stale")
        if stale is not None:
            # A second update based on the same revision, sent before the first is decided.
            other = producer.events(run_id, revision, stale["events"])
            producer.append(patch)
            producer.append(other)
            d = producer.wait(run_id, patch.patch_id, 30)
            _report(run_id, d)
            revision = d.revision
            _say(run_id, stale["say"])
            d2 = producer.wait(run_id, other.patch_id, 30)
            _report(run_id, d2)
            if d2.reason == "revision_conflict":
                _say(run_id, "   retry with rebase (opening a question commutes)")
                retry = producer.events(run_id, d2.expected_revision, stale["events"], rebase=True)
                d2 = producer.submit(retry, 30)
                _report(run_id, d2)
            revision = d2.revision
            continue
        d = producer.submit(patch, 30)
        _report(run_id, d)
        revision = d.revision
    producer.close()
    return 0


def run_demo(
    workdir: str, n_runs: int = 3, echo: Callable[[str], None] = print, progress: Progress | None = None
) -> int:
    """Run the demo in ``workdir`` (recreated). Returns the exit code. ``progress`` shows
    the projector's counts while the workers run (on a terminal)."""
    root = Path(workdir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log_url, state_dir = str(root / "log.db"), str(root / "state")
    log = open_log(log_url, partitions=4)
    echo(f"demo: embedded log {log_url}, projections {state_dir}")
    stop = threading.Event()
    bar = progress or Progress("projector", quiet=True)
    projector = Projector(
        log,
        state_dir,
        batch_size=500,
        progress_every_s=2.0,
        on_progress=lambda s, lag: bar.update(
            s.records, s.records + lag, f"{s.accepted} accepted, {s.rejected} rejected"
        ),
    )
    thread = threading.Thread(target=projector.run, kwargs={"stop": stop, "poll_timeout_s": 0.05}, daemon=True)
    thread.start()
    runs = list(SCRIPTS)[:n_runs]
    echo(f"demo: starting {len(runs)} agent worker processes: {', '.join(runs)}")
    procs = {
        r: subprocess.Popen(
            [sys.executable, "-m", "runstate.demo", r, log_url, state_dir],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in runs
    }
    lock = threading.Lock()

    def relay(p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            with lock:
                echo(line.rstrip())

    relays = [threading.Thread(target=relay, args=(p,), daemon=True) for p in procs.values()]
    for t in relays:
        t.start()
    failed = 0
    for r, p in procs.items():
        try:
            failed += p.wait(timeout=300) != 0
        except subprocess.TimeoutExpired:
            p.kill()
            echo(f"demo: worker {r} did not finish in 300 s")
            failed += 1
    for t in relays:
        t.join(timeout=5)
    deadline = time.monotonic() + 30
    while projector.lag() != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=30)
    with Projection(state_dir) as proj:
        for r in runs:
            echo("")
            echo("=" * 78)
            try:
                echo(proj.context(r).rstrip())
            except Exception as e:  # show what is there even if one run failed
                echo(f"{r}: {e}")
    echo("")
    echo(f"demo: done; try `runstate --log {log_url} --state-dir {state_dir} history run_login`")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], sys.argv[2], sys.argv[3]))
