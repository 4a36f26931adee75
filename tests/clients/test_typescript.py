"""The TypeScript client (clients/typescript) against a real ``runstate serve``: its own
tests with Node's test runner, and LangGraph.js's validation suite for checkpoint savers
(``@langchain/langgraph-checkpoint-validation``) against its ``RunstateSaver``. Node and npm
are needed (skipped without them, except under ``CI=true``, where that fails)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

import approval_graph
from helpers import ROOT, readme_blocks, embedded_env
from runstate.integrations.langgraph import JsonSerializer, RunstateSaver
from servekit import ServeProcess

TS = ROOT / "clients" / "typescript"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("typescript")]


@pytest.fixture(scope="module")
def built() -> Path:
    """The package installed (``npm ci``, once per lockfile) and built (``tsc``)."""
    missing = [t for t in ("node", "npm") if shutil.which(t) is None]
    if missing:
        msg = f"the TypeScript client's tests need {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    # The Kafka worker runs the validation suite on Kafka while another runs the rest: one
    # install and build at a time (two `npm ci` in one folder remove each other's files).
    with open(TS / ".install.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stamp = TS / "node_modules" / ".runstate-lock"
        lock = (TS / "package-lock.json").read_text()
        if not stamp.exists() or stamp.read_text() != lock:
            # No dependency needs an install script; one that builds native code from source
            # fails on a machine without its prebuilt binary.
            out = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=TS,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            stamp.write_text(lock)
        out = subprocess.run(["npx", "tsc", "-p", "tsconfig.json"], cwd=TS, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return TS


def _node(args: list[str], timeout: float, **env_: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNSTATE_PYTHON": sys.executable, "NO_COLOR": "1"}
    env.pop("RUNSTATE_TEST_KAFKA", None)
    return subprocess.run(args, cwd=TS, capture_output=True, text=True, timeout=timeout, env={**env, **env_})


def test_the_generated_types_are_those_of_the_python_side(built: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(TS / "scripts" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_client_and_the_run_handle_against_a_real_serve(built: Path) -> None:
    out = _node(["node", "--test", "--test-timeout=60000", "test/client.test.mjs"], timeout=300)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert "# fail 0" in out.stdout and "# pass 9" in out.stdout, out.stdout[-3000:]


# The suite's own time limits (vitest's 5 s a test, 10 s a hook) are timed assertions made
# for savers in the test's process: here each test waits on a serve started for it, which a
# loaded two-core machine has been seen to take past them. Speed is the benchmarks' to check.
_VALIDATE = [
    "npx",
    "vitest",
    "run",
    "test/validation.spec.mjs",
    "--globals",
    "--reporter=dot",
    "--testTimeout=60000",
    "--hookTimeout=120000",
]


def _said(out: subprocess.CompletedProcess[str]) -> str:
    """What a failed suite printed: the end of its report, and the start and end of its stderr
    (where a serve's first error comes before the suite's account of the test it failed)."""
    err = out.stderr if len(out.stderr) <= 8000 else out.stderr[:4000] + "\n[...]\n" + out.stderr[-4000:]
    return out.stdout[-4000:] + err


def test_langgraph_js_validation_suite_passes_through_a_serve(built: Path) -> None:
    out = _node(_VALIDATE, timeout=900)
    assert out.returncode == 0, _said(out)
    assert "718 passed (718)" in out.stdout, out.stdout[-3000:]


@pytest.mark.kafka
def test_langgraph_js_validation_suite_passes_through_a_serve_on_kafka(built: Path, kafka_bootstrap: str) -> None:
    prefix = f"tsv{uuid.uuid4().hex[:8]}"
    out = _node(
        _VALIDATE,
        timeout=900,
        RUNSTATE_TEST_KAFKA=kafka_bootstrap,
        RUNSTATE_TEST_TOPIC_PREFIX=prefix,
    )
    assert out.returncode == 0, _said(out)
    assert "718 passed (718)" in out.stdout, out.stdout[-3000:]
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert any(t.startswith(prefix) for t in topics), "the serves did not run on Kafka"


def _approval(mode: str, url: str, thread: str, *arg: str) -> dict[str, Any]:
    """One step of the JavaScript approval graph, as a process of its own: the state after it."""
    out = _node(["node", "test/approval.mjs", mode, url, thread, *arg], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_an_approval_crosses_processes_and_languages(built: Path, tmp_path: Path) -> None:
    """LangGraph.js asks for approval in one process and is resumed by another; Python audits
    the thread, continues it with the same graph, and each language resumes an interrupt
    the other raised."""
    env = embedded_env(tmp_path)
    serve = ServeProcess(env, tmp_path)
    try:
        serve.wait_ready()
        asked = _approval("start", serve.url, "release", "write the release note")
        assert asked["next"] == ["approve"]
        assert asked["interrupts"] == [{"question": "send this draft?", "draft": "draft: write the release note"}]
        done = _approval("resume", serve.url, "release", "yes")
        assert done["messages"][-1] == ["ai", "sent"] and done["approved"] is True and done["next"] == []

        cli = {**os.environ, **env}
        history = subprocess.run(
            [sys.executable, "-m", "runstate.cli", "history", "release", "--json"],
            env=cli,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert history.returncode == 0, history.stderr
        rows = json.loads(history.stdout)
        assert rows and all(r["outcome"] == "accepted" for r in rows)
        assert {r["agent_id"] for r in rows} == {"langgraph-js"}
        verify = subprocess.run(
            [sys.executable, "-m", "runstate.cli", "verify", "--quiet"],
            env=cli,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr

        config: RunnableConfig = {"configurable": {"thread_id": "release"}}
        with RunstateSaver.from_conn_string(serve.url, serde=JsonSerializer()) as saver:
            graph = approval_graph.builder().compile(checkpointer=saver)
            state = graph.get_state(config)
            assert [(m.type, m.content) for m in state.values["messages"]] == [
                ("human", "write the release note"),
                ("ai", "draft: write the release note"),
                ("ai", "sent"),
            ]
            graph.invoke({"messages": [HumanMessage("now the changelog")]}, config)  # Python asks
            assert graph.get_state(config).next == ("approve",)
        refused = _approval("resume", serve.url, "release", "no")  # JavaScript answers Python's question
        assert refused["messages"][-2:] == [["ai", "draft: now the changelog"], ["ai", "discarded"]]
        assert refused["approved"] is False
        asked = _approval("start", serve.url, "release", "and the blog post")  # JavaScript asks
        assert asked["next"] == ["approve"]
        with RunstateSaver.from_conn_string(serve.url, serde=JsonSerializer()) as saver:
            graph = approval_graph.builder().compile(checkpointer=saver)
            graph.invoke(Command(resume="yes"), config)  # Python answers JavaScript's question
            final = graph.get_state(config)
        assert [(m.type, m.content) for m in final.values["messages"]][-3:] == [
            ("human", "and the blog post"),
            ("ai", "draft: and the blog post"),
            ("ai", "sent"),
        ]
        assert len(final.values["messages"]) == 9 and final.values["approved"] is True and final.next == ()
        assert _approval("state", serve.url, "release")["messages"] == [
            [m.type, m.content] for m in final.values["messages"]
        ]
    finally:
        serve.stop()


def test_the_readmes_typescript_block_runs_as_written(built: Path, tmp_path: Path) -> None:
    [block] = readme_blocks("ts")
    env = embedded_env(tmp_path)
    serve = ServeProcess(env, tmp_path)
    # Inside the package, so that "@runstate/client" resolves to the checkout's build.
    script = TS / "test" / f".readme-{uuid.uuid4().hex[:8]}.mjs"
    try:
        serve.wait_ready()
        assert "http://127.0.0.1:8750" in block
        report = "\nconsole.log(JSON.stringify({ outcome: decision.outcome, revision: state.revision, prompt }));\n"
        script.write_text(block.replace("http://127.0.0.1:8750", serve.url) + report)
        out = _node(["node", str(script)], timeout=120)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["outcome"] == "accepted" and got["revision"] == 4
        assert "make the login refresh pass" in got["prompt"]
    finally:
        script.unlink(missing_ok=True)
        serve.stop()


def test_the_packages_install_from_tarballs_as_the_docs_say(built: Path, tmp_path: Path) -> None:
    """``npm pack`` of ``@runstate/client`` and ``@runstate/langgraph``, installed into a
    project of the user's with LangGraph's packages: both import, and their types check."""
    for where in (TS, TS / "langgraph"):
        out = subprocess.run(
            ["npm", "pack", "--pack-destination", str(tmp_path)], cwd=where, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
    app = tmp_path / "my-agent"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "my-agent", "private": True, "type": "module"}))
    lock = json.loads((TS / "package-lock.json").read_text())["packages"]
    peers = [
        f"{name}@{lock[f'node_modules/{name}']['version']}"
        for name in ("@langchain/core", "@langchain/langgraph-checkpoint")
    ]
    tarballs = sorted(str(t) for t in tmp_path.glob("runstate-*.tgz"))
    assert [Path(t).name for t in tarballs] == ["runstate-client-0.1.0.tgz", "runstate-langgraph-0.1.0.tgz"]
    out = subprocess.run(
        ["npm", "install", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts", *peers, *tarballs],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (app / "agent.ts").write_text(
        'import { Client, openRun } from "@runstate/client";\n'
        'import { RunstateSaver, generationRunId } from "@runstate/langgraph";\n'
        'const saver: RunstateSaver = RunstateSaver.fromConnString("http://127.0.0.1:8750", { token: "t" });\n'
        "const client: Client = saver.client;\n"
        'const run = openRun(client.url, generationRunId("chat", 2), { agentId: "a", agentVersion: "1" });\n'
        "console.log(JSON.stringify([client.url, typeof run.toolCall]));\n"
    )
    (app / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022",
                    "module": "NodeNext",
                    "strict": True,
                    "outDir": "out",
                    "types": [],
                    # LangChain's own declarations need a newer lib than ES2022's; ours are read.
                    "skipLibCheck": True,
                }
            }
        )
    )
    tsc = subprocess.run(
        [str(TS / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tsc.returncode == 0, tsc.stdout[-3000:] + tsc.stderr[-3000:]
    ran = subprocess.run(["node", "out/agent.js"], cwd=app, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == ["http://127.0.0.1:8750", "function"]
