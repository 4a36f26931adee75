"""A small ReAct-style agent loop on runstate.agent, with a scripted model (no network).

    python examples/agent_loop.py DIR RUN_ID [--crash-at STEP]

Each step reads where the run is (the compact context a real model would get as its
prompt), asks the "model" what to do next, and records what it did: the tool call around
the tool, the artifact it returned, the fact it supports, the task's completion. Killed at
any moment (``--crash-at`` SIGKILLs itself in the middle of a tool call), it is started
again and resumes from the Run State: finished tasks are not redone, and a call the crash
left in flight is recorded as failed before the task is tried again.
"""

from __future__ import annotations

import argparse
import os
import signal

from runstate.agent import Run, open_run

#: The scripted model's plan: per task, the tool it calls, what the tool returns, what it learns.
PLAN = {
    "t1": ("read_config", "artifact://config/auth.yaml", "the auth config selects RS256"),
    "t2": ("run_tests", "artifact://test-output/48", "test_login_refresh fails with a signature error"),
    "t3": ("apply_fix", "artifact://diff/7", "the fixture pins HS256; the fix aligns it with RS256"),
}


def model(context: str, run: Run) -> str | None:
    """The next task to work on, or None when the plan is done (a real model reads ``context``)."""
    done = {t.id for t in run.state().tasks if t.status == "completed"}
    return next((t for t in PLAN if t not in done), None)


def step(run: Run, task_id: str, crash: bool) -> None:
    state = run.state()
    task = next(t for t in state.tasks if t.id == task_id)
    for call in state.pending_tool_calls:  # left in flight by a crash: its outcome is unknown
        from runstate.agent import events

        run.submit(events.ToolFailed(call_id=call.call_id, error="interrupted: the worker died during the call"))
    if task.status == "pending":
        run.start_task(task_id)
    tool, ref, learned = PLAN[task_id]
    with run.tool_call(tool) as call:
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)
        call.result(ref, kind="tool_output")
    run.fact(f"fact_{task_id}", learned, evidence=ref)
    run.complete_task(task_id, evidence=ref)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("run_id")
    ap.add_argument("--crash-at", type=int, default=0, help="SIGKILL this process in the middle of step N")
    args = ap.parse_args()
    with open_run(args.dir, args.run_id, agent_id="react-demo", agent_version="1.0") as run:
        if run.revision == 0:
            run.start("fix the login failure after the dependency upgrade", include=["src/auth", "tests/login"])
            for i, task_id in enumerate(PLAN):
                run.task(task_id, f"{PLAN[task_id][0]}", depends_on=[f"t{i}"] if i else [])
        n = 0
        while (task_id := model(run.context(), run)) is not None:
            n += 1
            step(run, task_id, crash=n == args.crash_at)
            print(f"step {n}: {task_id} done at revision {run.revision}", flush=True)
        if run.state().status == "running":
            run.complete(summary="login fixed", evidence="artifact://diff/7")
        print(run.context())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
