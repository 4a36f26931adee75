"""The CLI through click's runner (same process) and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from helpers import CLIENT_EXAMPLE, fact, start, embedded_env

from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.runtime.loop import DEFAULT_GROUP
from runstate.cli import main


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return embedded_env(tmp_path)


def cli(env: dict[str, str], *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)


def write(tmp_path: Path, name: str, body: object) -> str:
    p = tmp_path / name
    p.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(p)


def ends(env: dict[str, str]) -> dict[int, int]:
    log = EmbeddedLog(env["RUNSTATE_LOG"])
    try:
        return log.end_offsets(log.topics.events)
    finally:
        log.close()


def test_publish_project_and_query(tmp_path: Path, env: dict[str, str]) -> None:
    s = write(tmp_path, "start.json", {"expected_revision": 0, "events": [start("fix login")]})
    r = cli(env, "publish", "run_128", s)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["run_id"] == "run_128"
    for i in range(16):  # revisions 2..17
        cli(env, "publish", "run_128", "-", input=json.dumps({"expected_revision": i + 1, "events": [fact(f"f_{i}")]}))
    cli(
        env,
        "publish",
        "run_128",
        "-",
        input=json.dumps(
            {
                "expected_revision": 17,
                "events": [
                    {"type": "TaskCreated", "task": {"id": "task_3", "title": "x"}},
                    {"type": "TaskStarted", "task_id": "task_3"},
                ],
            }
        ),
    )
    # The client's example, verbatim, on top of revision 18 -> 19.
    cli(env, "publish", "run_128", write(tmp_path, "client.json", CLIENT_EXAMPLE), "--agent-version", "agent-2.1")
    r = cli(env, "project", "--until-caught-up", "--quiet")
    assert r.exit_code == 0 and json.loads(r.output.splitlines()[-1])["accepted"] == 19

    st = json.loads(cli(env, "state", "run_128", "--json").output)
    assert st["revision"] == 19 and st["agent_version"] == "agent-2.1"
    assert [t["status"] for t in st["tasks"]] == ["completed"]
    assert st["confirmed_facts"][-1]["id"] == "fact_13" and st["confirmed_facts"][-1]["observed_at"]
    assert [f["id"] for f in st["confirmed_facts"]][:3] == ["f_0", "f_1", "f_2"]  # order added

    past = json.loads(cli(env, "state", "run_128", "--json", "--revision", "5").output)
    assert past["revision"] == 5 and len(past["confirmed_facts"]) == 4

    ctx = cli(env, "context", "run_128").output
    assert "CONFIRMED FACTS" in ctx and "[fact_13]" in ctx and "artifact://test-output/48" in ctx
    assert ctx.index("CONFIRMED FACTS") < ctx.index("PLAN / TASKS")

    assert "run_128\trunning" in cli(env, "runs").output
    assert cli(env, "runs", "--status", "completed").output == ""
    hist = cli(env, "history", "run_128").output.splitlines()
    assert len(hist) == 19 and "agent-2.1" in hist[-1] and "accepted" in hist[-1]
    r = cli(env, "verify")
    assert r.exit_code == 0 and "projection equals replay" in r.output


def test_publish_wait_prints_the_decision(tmp_path: Path, env: dict[str, str]) -> None:
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    stop = threading.Event()
    from runstate.app import project
    from runstate.settings import Settings

    settings = Settings(log=env["RUNSTATE_LOG"], state_dir=env["RUNSTATE_STATE_DIR"])
    from runstate.eventlog import open_log
    from runstate.projector.runtime.loop import Projector

    log = open_log(settings.log)
    t = threading.Thread(target=Projector(log, settings.state_dir).run, kwargs={"stop": stop, "poll_timeout_s": 0.02})
    t.start()
    try:
        r = cli(env, "publish", "r", "-", "--wait", input=json.dumps({"expected_revision": 1, "events": [fact("f1")]}))
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["outcome"] == "accepted" and json.loads(r.output)["revision"] == 2
        r = cli(env, "publish", "r", "-", "--wait", input=json.dumps({"expected_revision": 1, "events": [fact("f2")]}))
        assert r.exit_code == 3
        d = json.loads(r.output)
        assert (d["outcome"], d["reason"], d["revision"]) == ("rejected", "revision_conflict", 2)
        r = cli(
            env, "publish", "nobody", "-", "--wait", input=json.dumps({"expected_revision": 0, "events": [fact("f")]})
        )
        assert r.exit_code == 3 and json.loads(r.output)["reason"] == "unknown_run"
    finally:
        stop.set()
        t.join()
        log.close()
    assert project  # the library function the CLI calls is importable for direct use


@pytest.mark.parametrize(
    "body, message",
    [
        ("{not json", "not JSON"),
        ('["a list"]', "must be a JSON object"),
        ('{"events": []}', "expected_revision"),
        ('{"expected_revision": 0, "events": [{"type": "TaskStarted"}]}', "task_id"),
        ('{"expected_revision": 0, "events": [{"type": "NoteAdded", "text": "x"}]}', "known types: RunStarted"),
    ],
)
def test_bad_patch_files_exit_2_naming_file_and_field(
    tmp_path: Path, env: dict[str, str], body: str, message: str
) -> None:
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    before = ends(env)
    f = write(tmp_path, "bad.json", body)
    r = CliRunner().invoke(main, ["publish", "r", f], env=env)
    assert r.exit_code == 2
    assert message in r.output and "bad.json" in r.output
    assert ends(env) == before  # nothing appended


def test_oversized_patch_is_refused_by_the_producer(tmp_path: Path, env: dict[str, str]) -> None:
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    before = ends(env)
    big = {"expected_revision": 1, "events": [fact("f", statement="x" * 5000)]}
    r = CliRunner().invoke(
        main, ["publish", "r", "-"], env={**env, "RUNSTATE_MAX_PATCH_BYTES": "4096"}, input=json.dumps(big)
    )
    assert r.exit_code == 2 and "over the limit of 4096 bytes" in r.output
    assert ends(env) == before


def test_missing_file_and_unknown_run_queries(tmp_path: Path, env: dict[str, str]) -> None:
    r = CliRunner().invoke(main, ["publish", "r", str(tmp_path / "nope.json")], env=env)
    assert r.exit_code == 2 and "nope.json" in r.output
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    cli(env, "project", "--until-caught-up", "--quiet")
    r = CliRunner().invoke(main, ["state", "zzz"], env=env)
    assert r.exit_code == 1 and "run 'zzz' not found" in r.output
    r = CliRunner().invoke(main, ["state", "r", "--revision", "7"], env=env)
    assert r.exit_code == 1 and "revisions 0..1" in r.output
    r = CliRunner().invoke(main, ["--log", "bogus://x", "publish", "r", "-"], env=env, input="{}")
    assert r.exit_code != 0 and "unknown log URL scheme" in r.output


def test_real_subprocess_demo(tmp_path: Path) -> None:
    """`runstate demo` as a user runs it: separate worker processes, the projector, contexts."""
    out = subprocess.run(
        [sys.executable, "-m", "runstate.cli", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "rejected: revision_conflict" in text and "(rebased)" in text
    assert "[fact.evidence_required]" in text and "rejected: run_terminal" in text
    assert "[fact.source_not_authoritative]" in text and "[task.not_owner]" in text
    assert "[observation.stale]" in text and "[budget.exhausted]" in text
    assert "ARTIFACTS: 2 known" in text  # run_login: the two test outputs its tools returned
    assert "constraint session_timeout = 15 min (corrects '30 min'" in text
    assert "WAITING for approval" in text and "1 cancelled" in text
    env = {
        **os.environ,
        "RUNSTATE_LOG": str(tmp_path / "demo/log.db"),
        "RUNSTATE_STATE_DIR": str(tmp_path / "demo/state"),
    }
    v = subprocess.run(
        [sys.executable, "-m", "runstate.cli", "verify"], capture_output=True, text=True, env=env, timeout=120
    )
    assert v.returncode == 0 and "projection equals replay" in v.stdout


def test_resume_plan_names_what_to_reconcile(tmp_path: Path, env: dict[str, str]) -> None:
    cli(env, "publish", "pay", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    cli(
        env,
        "publish",
        "pay",
        "-",
        input=json.dumps(
            {
                "expected_revision": 1,
                "events": [
                    {
                        "type": "ObservationRecorded",
                        "observation": {"subject": "order://9", "observed_state": "unpaid", "observed_version": "v3"},
                    },
                    {"type": "ToolCallStarted", "call_id": "c1", "tool": "charge_card", "side_effect": True},
                    {
                        "type": "EffectRecorded",
                        "effect": {
                            "id": "e1",
                            "status": "started",
                            "kind": "charge",
                            "target": "card://42",
                            "idempotency_key": "order-9",
                        },
                    },
                ],
            }
        ),
    )
    cli(env, "publish", "pay", "-", input=json.dumps({"expected_revision": 2, "events": [fact("f1")]}))
    assert cli(env, "project", "--until-caught-up", "--quiet").exit_code == 0
    r = cli(env, "snapshot", "--until-caught-up", "--quiet")
    assert r.exit_code == 0 and json.loads(r.output.splitlines()[-1])["checkpoints"] == 2
    assert "2\tp" in cli(env, "checkpoints", "pay").output  # revision 2: before_side_effect
    out = cli(env, "resume", "pay").output
    assert "verdict: NEEDS_RECONCILIATION" in out
    assert "replay 1 patches since (to revision 3)" in out
    assert "reconcile effect e1: charge on card://42 started, outcome unknown (idempotency key order-9)" in out
    assert "reconcile tool call c1 (charge_card)" in out and "re-read order://9" in out
    r = CliRunner().invoke(main, ["resume", "nobody"], env=env)
    assert r.exit_code == 1 and "not found" in r.output


def test_progress_is_shown_on_a_terminal_only(tmp_path: Path, env: dict[str, str]) -> None:
    """Long work (here verify, and the projector's restore) reports records done / total and
    the rate on a terminal; piped, or with --quiet, it prints its result and nothing else."""
    import pty

    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    for i in range(5):
        cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": i + 1, "events": [fact(f"f{i}")]}))
    assert cli(env, "project", "--until-caught-up").exit_code == 0

    def verify_stderr(*flags: str) -> str:
        master, slave = pty.openpty()
        try:
            out = subprocess.run(
                [sys.executable, "-m", "runstate.cli", "verify", *flags],
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=slave,
                text=True,
                timeout=60,
            )
            os.close(slave)
            chunks = []
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: the terminal's other side is closed
                    break
                if not data:
                    break
                chunks.append(data)
            assert out.returncode == 0 and "projection equals replay" in out.stdout
            return b"".join(chunks).decode()
        finally:
            os.close(master)

    shown = verify_stderr()
    assert "verify: replayed: 6/6 records (100%)" in shown and "/s" in shown
    assert verify_stderr("--quiet") == ""
    piped = cli(env, "verify")  # CliRunner's streams are not terminals
    assert "replayed" not in piped.output and "projection equals replay" in piped.output


def test_an_agent_version_is_never_empty_and_can_be_required(tmp_path: Path, env: dict[str, str]) -> None:
    body = json.dumps({"expected_revision": 0, "events": [start()]})
    r = cli(env, "publish", "r", "-", "--agent-version", "", input=body)
    assert r.exit_code == 2 and "agent_version" in r.output
    required = {**env, "RUNSTATE_REQUIRE_AGENT_VERSION": "true"}
    r = cli(required, "publish", "r", "-", input=body)
    assert r.exit_code == 2 and "agent version" in r.output and ends(env) == {0: 0, 1: 0, 2: 0, 3: 0}
    assert cli(required, "publish", "r", "-", "--agent-version", "coder-2.1", input=body).exit_code == 0


def test_resume_reads_the_log_after_the_checkpoint_even_while_the_projector_lags(
    tmp_path: Path, env: dict[str, str]
) -> None:
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    assert cli(env, "snapshot", "--until-caught-up", "--quiet").exit_code == 0  # checkpoint at revision 1
    for i in range(3):  # the projector has not run at all: it lags by everything
        cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": i + 1, "events": [fact(f"f{i}")]}))
    cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 1, "events": [fact("stale")]}))  # rejected
    out = cli(env, "resume", "r").output
    assert "replay 3 patches since (to revision 4)" in out, out
    assert "projection: not built yet" in out


def test_an_interrupted_project_until_caught_up_is_not_a_success(tmp_path: Path, env: dict[str, str]) -> None:
    """SIGINT before the log is drained: what was read is stored, the counts are printed,
    and the exit is 130 (128 + SIGINT), so `project --until-caught-up && next` stops."""
    import signal
    import time

    from runstate import app
    from runstate.settings import Settings

    s = Settings(log=env["RUNSTATE_LOG"], state_dir=env["RUNSTATE_STATE_DIR"])
    producer = app.make_producer(s)
    for i in range(10_000):
        producer.append_async(producer.build(f"r{i}", {"expected_revision": 0, "events": [start()]}))
    assert producer.flush(60) == 0
    producer.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runstate.cli", "project", "--until-caught-up", "--quiet", "--batch-size", "1"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Interrupted once it has stored a first batch (its position mirrored in the log; a
    # fixed sleep was too short on a busy machine), long before it drains 10,000 one by one.
    log = EmbeddedLog(env["RUNSTATE_LOG"], create=False)
    deadline = time.monotonic() + 60
    while not sum(log.committed(DEFAULT_GROUP, log.topics.events).values()):
        assert time.monotonic() < deadline and proc.poll() is None, "the projector stored nothing"
        time.sleep(0.02)
    log.close()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "stopped by SIGINT before the log was drained" in err and "Traceback" not in err, err
    records = json.loads(out)["records"]
    assert 0 < records < 10_000
    again = cli(env, "project", "--until-caught-up", "--quiet")
    assert again.exit_code == 0 and json.loads(again.output)["records"] == 10_000 - records


def test_version_names_runstate_and_the_newest_formats_it_writes() -> None:
    """``runstate --version``: what a bug report needs, without opening a log."""
    import runstate
    from runstate.projector.core.reducer import REDUCER_VERSION
    from runstate.schemas.state import CURRENT_SCHEMA_VERSION

    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"runstate {runstate.__version__}")
    assert f"state schema {CURRENT_SCHEMA_VERSION}" in out.output and f"reducer {REDUCER_VERSION}" in out.output
