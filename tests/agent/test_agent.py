"""runstate.agent: the run as an object an agent loop holds, on the embedded log (the
projector in the process) and on a real ``runstate serve``; the example agent loop survives
a SIGKILL and resumes from the Run State."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from servekit import ServeProcess, serving

from helpers import ROOT, embedded_env

from runstate.agent import PatchRejected, RevisionConflict, events, open_run
from runstate.schemas.errors import ContractError

pytestmark = pytest.mark.slow


def _cli(work: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **embedded_env(work), **extra}
    return subprocess.run(
        [sys.executable, "-m", "runstate.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_example_agent_loop_resumes_after_a_sigkill_in_the_middle_of_a_tool_call(tmp_path: Path) -> None:
    loop = [sys.executable, str(ROOT / "examples" / "agent_loop.py"), str(tmp_path / "w"), "run_a"]
    crashed = subprocess.run([*loop, "--crash-at", "2"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr
    assert "step 1: t1 done" in crashed.stdout and "step 2" not in crashed.stdout
    resumed = subprocess.run(loop, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "step 1: t2 done" in resumed.stdout  # t1 is not redone
    assert "status: completed" in resumed.stdout and "[fact_t3]" in resumed.stdout
    history = _cli(tmp_path / "w", "history", "run_a")
    assert history.returncode == 0 and "ToolFailed" in history.stdout  # the call the crash left in flight
    verify = _cli(tmp_path / "w", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "w"


def test_typed_errors_for_conflicts_rejections_and_mistakes_made_before_sending(local: Path) -> None:
    with open_run(local, "r1", agent_id="a", agent_version="1") as a:
        a.start("fix login", policy={"external_evidence_schemes": ["artifact"]})
        a.task("t1", "look")
        with open_run(local, "r1", agent_id="b", agent_version="1", project=False) as b:
            assert b.revision == 2
            b.submit(events.PhaseChanged(phase="diagnose"))
        # a is behind: a commuting fact is rebased, a phase change is a typed conflict
        rebased = a.fact("f1", "seen", evidence="artifact://out/1")
        assert rebased.outcome == "accepted" and rebased.rebased and a.revision == 4
        stale = a.revision
        with open_run(local, "r1", agent_id="b", agent_version="1", project=False) as b:
            b.submit(events.PhaseChanged(phase="fix"))
        with pytest.raises(RevisionConflict) as conflict:
            a.submit(events.PhaseChanged(phase="verify"))
        assert (conflict.value.expected, conflict.value.current) == (stale, stale + 1)
        assert [d.event_types for d in conflict.value.since] == [["PhaseChanged"]]
        assert a.refresh() == stale + 1
        with pytest.raises(PatchRejected) as rejected:
            a.fact("f2", "a guess")  # no evidence, no source
        assert rejected.value.decision.rule == "fact.evidence_required"
        # a task the run does not have is refused before anything is sent
        a.state()
        before = a.revision
        with pytest.raises(ContractError, match="no task 'nope'"):
            a.start_task("nope")
        with pytest.raises(ContractError):
            a.submit({"type": "FactConfirmed", "fact": {"statement": 3}})
        assert a.refresh() == before


def test_every_verb_of_the_handle_lands_in_the_run_state(local: Path) -> None:
    """The handle's verbs beyond the tour's, each as the state shows it: an observation, a
    blocked task, a wait for approval and its resolution."""
    with open_run(local, "verbs", agent_id="a", agent_version="1") as run:
        run.start("check the deploy", policy={"external_evidence_schemes": ["artifact"]})
        run.observe("deploy/checkout", "v2.3.1 on 40% of pods", version="rev-118")
        run.task("t1", "roll out")
        run.start_task("t1")
        run.block_task("t1", reason="needs the change window")
        run.wait_for_approval("w1", "roll out to 100%?")
        waiting = run.state()
        assert waiting.status == "waiting" and waiting.waiting is not None and waiting.waiting.kind == "approval"
        assert [(o.subject, o.observed_version) for o in waiting.environment_observations] == [
            ("deploy/checkout", "rev-118")
        ]
        assert [(t.id, t.status, t.blocked_by) for t in waiting.tasks] == [("t1", "blocked", "needs the change window")]
        run.resolve_wait("w1")
        assert run.state().status == "running" and run.state().waiting is None


def test_tool_calls_and_effects_are_recorded_around_the_work(local: Path) -> None:
    with open_run(local, "r2", agent_id="a", agent_version="1") as run:
        run.start("ship")
        with run.tool_call("run_tests") as call:
            call.result("artifact://test-output/9", kind="test_output", digest="sha256:ab")
        state = run.state()
        (artifact,) = state.artifacts
        assert (artifact.id, artifact.kind, artifact.digest, artifact.call_id) == (
            "artifact://test-output/9",
            "test_output",
            "sha256:ab",
            call.call_id,
        )
        run.fact("f1", "tests fail", evidence="artifact://test-output/9")  # cites the tool's result
        with pytest.raises(RuntimeError, match="boom"), run.tool_call("deploy", side_effect=True):
            raise RuntimeError("boom")
        assert run.state().pending_tool_calls == []
        assert "deploy failed: RuntimeError: boom" in run.state().last_transition.action  # type: ignore[union-attr]
        with run.effect("order", "shop/orders", "idem-1") as effect_id:
            pass
        with pytest.raises(ValueError), run.effect("refund", "shop/refunds", "idem-2"):
            raise ValueError("declined")
        ledger = {e.kind: e.status for e in run.state().effect_ledger}
        assert ledger == {"order": "committed", "refund": "failed"} and effect_id
        # a call still open when the handle closes is recorded as failed, not left in flight
        left = run.tool_call("slow_tool")
        left.__enter__()
    with open_run(local, "r2", agent_id="a", agent_version="1") as again:
        assert again.state().pending_tool_calls == []


def test_a_tool_call_whose_result_is_rejected_is_closed_as_failed_and_the_run_can_complete(local: Path) -> None:
    """The second call names the same artifact id (refused: artifact.duplicate_id); the
    handle raises PatchRejected and records the call failed, so nothing stays in flight
    and the run completes. Sync and async alike."""
    import asyncio

    from runstate.agent import open_async_run

    with open_run(local, "r-dup", agent_id="a", agent_version="1") as run:
        run.start("twice")
        with run.tool_call("search") as call:
            call.result("artifact://search/1", kind="search_result")
        with pytest.raises(PatchRejected, match="duplicate_id"), run.tool_call("search") as call:
            call.result("artifact://search/1", kind="search_result")
        assert run.state().pending_tool_calls == []
        assert "rejected" in run.state().last_transition.action  # type: ignore[union-attr]
        assert run.complete(summary="done").outcome == "accepted"

    async def go() -> None:
        run = await open_async_run(local, "r-dup-async", agent_id="a", agent_version="1")
        async with run:
            await run.start("twice")
            async with run.tool_call("search") as call:
                call.result("artifact://s/1", kind="search_result")
            with pytest.raises(PatchRejected, match="duplicate_id"):
                async with run.tool_call("search") as call:
                    call.result("artifact://s/1", kind="search_result")
            assert (await run.state()).pending_tool_calls == []
            assert (await run.complete(summary="done")).outcome == "accepted"

    asyncio.run(go())


def test_a_crash_between_effect_started_and_committed_leaves_it_to_reconcile(local: Path) -> None:
    code = (
        f"import os, signal\nfrom runstate.agent import open_run\n"
        f"run = open_run({str(local)!r}, 'r3', agent_id='a', agent_version='1')\nrun.start('pay')\n"
        f"with run.effect('payment', 'bank/transfers', 'idem-9', effect_id='pay_1'):\n"
        f"    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    assert _cli(local, "project", "--until-caught-up", "--quiet").returncode == 0
    # a checkpoint at every revision: the newest one is the run as the crash left it
    assert (
        _cli(
            local,
            "snapshot",
            "--until-caught-up",
            "--quiet",
            RUNSTATE_CHECKPOINT_EVERY="1",
            RUNSTATE_CHECKPOINT_BYTES_RATIO="0",
        ).returncode
        == 0
    )
    plan = _cli(local, "resume", "r3").stdout
    assert "NEEDS_RECONCILIATION" in plan and "reconcile effect pay_1: payment on bank/transfers" in plan


@contextmanager
def _serving_as(tmp_path: Path, agent_id: str) -> Iterator[tuple[ServeProcess, str]]:
    """A serve of an embedded log in ``tmp_path`` that takes tokens, and a token for ``agent_id``."""
    from runstate.service.auth import add_token

    tokens = str(tmp_path / "tokens.json")
    token = add_token(tokens, agent_id)
    with serving({**embedded_env(tmp_path), "RUNSTATE_TOKENS_FILE": tokens}, tmp_path) as serve:
        yield serve, token


def test_the_same_handle_works_against_a_real_serve(tmp_path: Path) -> None:
    with _serving_as(tmp_path, "remote-agent") as (serve, token):
        with open_run(serve.url, "r4", agent_id="remote-agent", agent_version="3.0", token=token) as run:
            assert run.revision == 0
            run.start("remote work")
            with run.tool_call("search") as call:
                call.result("artifact://search/1")
            d = run.fact("f1", "found it", evidence="artifact://search/1")
            assert (d.agent_id, d.agent_version) == ("remote-agent", "3.0")
            assert "[f1] found it" in run.context()
            assert run.state().revision == run.revision == 4


def test_the_async_twin_does_the_same_on_the_local_log_and_on_a_serve(tmp_path: Path) -> None:
    import asyncio

    from runstate.agent import open_async_run

    async def work(where: str, token: str | None = None) -> None:
        async with await open_async_run(where, "ar1", agent_id="async-agent", agent_version="1", token=token) as run:
            await run.start("async work")
            await run.task("t1", "look")
            await run.start_task("t1")
            async with run.tool_call("search") as call:
                call.result("artifact://search/2", kind="search_result")
            await run.fact("f1", "found", evidence="artifact://search/2")
            await run.complete_task("t1", evidence="artifact://search/2")
            with pytest.raises(RuntimeError):
                async with run.effect("email", "user@example", "idem-1"):
                    raise RuntimeError("smtp down")
            state = await run.state()
            assert (state.revision, state.tasks[0].status) == (run.revision, "completed")
            assert [e.status for e in state.effect_ledger] == ["failed"]
            assert "[f1] found" in await run.context()
            with pytest.raises(PatchRejected):
                await run.fact("f2", "no evidence")

    asyncio.run(work(str(tmp_path / "local")))
    with _serving_as(tmp_path, "async-agent") as (serve, token):
        asyncio.run(work(serve.url, token))


def test_two_handles_on_one_directory_both_work_at_full_speed(tmp_path: Path) -> None:
    """In one process and from a second one: the first handle projects, the others append
    and read the decisions it makes, each answered in well under the handle's timeout, and
    no projector thread dies with a traceback."""
    import subprocess
    import sys
    import time

    where = tmp_path / "rs"
    with open_run(where, "two-a", agent_id="a", agent_version="1") as first:
        first.start("first")
        with open_run(where, "two-b", agent_id="b", agent_version="1", timeout_s=5) as second:
            started = time.monotonic()
            for i in range(5):
                (second.start("second") if i == 0 else second.task(f"t{i}", "a task"))
            assert second.state().revision == 5
            assert time.monotonic() - started < 4, "each decision came from the first handle's projector"
        code = (
            "import time\nfrom runstate.agent import open_run\n"
            f"with open_run({str(where)!r}, 'two-c', agent_id='c', agent_version='1', timeout_s=5) as run:\n"
            "    t = time.monotonic()\n    run.start('third')\n    assert run.state().revision == 1\n"
            "    print(round(time.monotonic() - t, 2))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert float(out.stdout.strip()) < 3 and "Traceback" not in out.stderr, out
        assert first.task("t1", "the first still decides").outcome == "accepted"
