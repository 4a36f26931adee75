"""The first hour of a new user, as reproduced from outside: every mistake gets one line
naming what is wrong (exit 1), never a traceback; serve says where it listens; the HTTP
edges answer as the rest of the API does. Real processes throughout."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import ROOT, start, embedded_env
from servekit import ServeProcess, serving, free_port

from runstate.schemas.state import HEADER_INTERNAL_FIELDS, RunHeader, RunSummary

pytestmark = pytest.mark.slow


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str = "", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstate.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    text = (out.stdout + out.stderr).strip()
    assert out.returncode == 1, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize(
    "command",
    [
        ["project", "--until-caught-up"],
        ["snapshot", "--until-caught-up"],
        ["state", "r1"],
        ["runs"],
        ["verify"],
        ["serve", "--port", "0"],
    ],
)
def test_a_state_dir_that_is_a_file_is_one_line_naming_it(tmp_path: Path, command: list[str]) -> None:
    from runstate.eventlog.embedded import EmbeddedLog

    EmbeddedLog(tmp_path / "log.db").close()  # readers need a log: only writes make one
    (tmp_path / "afile").write_text("")
    line = one_line_error(cli("--log", str(tmp_path / "log.db"), "--state-dir", "afile", *command, cwd=tmp_path))
    assert "'afile' is a file, not a directory" in line and "run `runstate project` first" not in line


@pytest.mark.parametrize(
    "command", [["project", "--until-caught-up"], ["status"], ["topics", "create"], ["serve", "--port", "0"]]
)
def test_an_unreachable_kafka_is_one_line_without_the_client_s_log(tmp_path: Path, command: list[str]) -> None:
    out = cli("--log", f"kafka://127.0.0.1:{free_port()}", *command, cwd=tmp_path, timeout=30)
    line = one_line_error(out)
    assert "cannot reach Kafka at 127.0.0.1:" in line and "Connection refused" in line


@pytest.fixture(scope="module")
def open_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    """``serve --port 0`` on an embedded log, without tokens."""
    work = tmp_path_factory.mktemp("first-hour")
    env = embedded_env(work)
    proc = ServeProcess(env, work)
    try:
        assert not proc.url.endswith(":0"), proc.url
        proc.wait_ready()
        yield proc, work
    finally:
        assert proc.stop() == 0, proc.log()


def test_serve_on_port_0_announces_the_port_it_got_and_a_port_in_use_is_one_line(
    open_serve: tuple[ServeProcess, Path], tmp_path: Path
) -> None:
    proc, _ = open_serve
    assert httpx.get(proc.url + "/healthz").status_code == 200
    env = embedded_env(tmp_path)
    line = one_line_error(cli("serve", "--port", str(proc.port), cwd=tmp_path, env=env))
    assert f"port {proc.port} on 127.0.0.1 is in use" in line


def test_a_second_projector_is_told_who_holds_the_log_in_one_line(open_serve: tuple[ServeProcess, Path]) -> None:
    proc, work = open_serve
    line = one_line_error(
        cli(
            "project",
            "--until-caught-up",
            cwd=work,
            env={"RUNSTATE_LOG": str(work / "log.db"), "RUNSTATE_STATE_DIR": str(work / "state2")},
        )
    )
    assert f"runstate serve at {proc.url} (pid {proc.proc.pid})" in line and "stop that process" in line


def test_the_http_edges_answer_as_the_rest_of_the_api(open_serve: tuple[ServeProcess, Path]) -> None:
    proc, _ = open_serve
    url = proc.url
    r = httpx.post(url + "/runs/edge-1/patches?wait=5", json={"expected_revision": 0, "events": [start()]})
    assert r.json()["decision"]["outcome"] == "accepted", r.text
    # the decision stream of an unknown run is 404 like every other route; a known one streams
    with httpx.stream("GET", url + "/runs/nobody/events", timeout=5) as s:
        assert s.status_code == 404 and s.read() and s.json()["error"]["code"] == "not_found"
    with httpx.stream("GET", url + "/runs/edge-1/events", timeout=5) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
    bogus = httpx.get(url + "/runs", params={"status": "bogus"})
    assert bogus.status_code == 422 and bogus.json()["error"]["field"] == "status", bogus.text
    assert httpx.get(url + "/runs", params={"status": "running"}).json()[0]["run_id"] == "edge-1"
    # the listing is the documented summary: no projector bookkeeping
    (listed,) = httpx.get(url + "/runs").json()
    assert list(listed) == list(RunSummary.model_fields) and not set(HEADER_INTERNAL_FIELDS) & set(listed)
    assert [f for f in RunHeader.model_fields if f not in HEADER_INTERNAL_FIELDS] == list(RunSummary.model_fields)
    big = httpx.post(
        url + "/runs/edge-1/patches",
        content=b"x" * (2 * 1024 * 1024 + 10),
        headers={"content-type": "application/json"},
    )
    assert big.status_code == 413
    assert (
        "run 'edge-1'" in big.json()["error"]["message"]
        and "RUNSTATE_MAX_PATCH_BYTES" in big.json()["error"]["message"]
    )
    # FastAPI's /docs would load its scripts from a CDN: off; the API's description stays
    assert httpx.get(url + "/docs").status_code == 404
    assert httpx.get(url + "/openapi.json").json()["info"]["title"] == "runstate"


def test_the_cli_prints_words_not_python(tmp_path: Path) -> None:
    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_AGENT_VERSION": "1.0",
    }
    patch = '{"expected_revision": 0, "events": [%s, {"type": "TaskCreated", "task": {"id": "t1", "title": "look"}}]}'
    import json

    assert cli("publish", "r1", "-", cwd=tmp_path, env=env, stdin=patch % json.dumps(start())).returncode == 0
    assert cli("project", "--until-caught-up", cwd=tmp_path, env=env).returncode == 0
    state = cli("state", "r1", cwd=tmp_path, env=env).stdout
    assert "tasks: 1 pending" in state and "{" not in state
    assert "verified 1 run over 1 record: projection equals replay" in cli("verify", cwd=tmp_path, env=env).stdout
    assert "| agent version 1.0" in cli("context", "r1", cwd=tmp_path, env=env).stdout.splitlines()[0]


def test_the_repository_is_licensed_apache_2() -> None:
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"


@pytest.mark.parametrize(
    ("env", "expected", "code"),
    [
        ({"RUNSTATE_GROUP_ID": "../../x"}, "RUNSTATE_GROUP_ID", 2),
        ({"RUNSTATE_KAFKA_CONFIG": "not json"}, "RUNSTATE_KAFKA_CONFIG", 2),
        ({"RUNSTATE_KAFKA_CONFIG": '{"no.such.prop": 1}', "RUNSTATE_LOG": "kafka://127.0.0.1:9"}, "no.such.prop", 1),
    ],
)
def test_bad_settings_are_errors_naming_them(tmp_path: Path, env: dict[str, str], expected: str, code: int) -> None:
    """A group id that would put the lock file elsewhere (``../``), a Kafka configuration that
    is not JSON (a usage error, exit 2, as every bad setting), or names a property
    librdkafka does not have (exit 1, when the client is made)."""
    from runstate.eventlog.embedded import EmbeddedLog

    EmbeddedLog(tmp_path / "log.db").close()
    for command in (["project", "--until-caught-up"], ["status"]):
        out = cli(
            "--log",
            env.get("RUNSTATE_LOG", str(tmp_path / "log.db")),
            "--state-dir",
            "state",
            *command,
            cwd=tmp_path,
            env=env,
        )
        text = (out.stdout + out.stderr).strip()
        assert out.returncode == code and "Traceback" not in text, text
        assert expected in text.splitlines()[-1], text
    assert not (tmp_path.parent / "x.lock").exists() and not (tmp_path.parent.parent / "x.lock").exists()


@pytest.mark.parametrize(
    "command", [["project", "--until-caught-up"], ["state", "r1"], ["runs"], ["verify"], ["status"], ["history", "r1"]]
)
def test_a_garbage_layout_file_is_one_line_naming_it(tmp_path: Path, command: list[str]) -> None:
    from runstate.eventlog.embedded import EmbeddedLog

    EmbeddedLog(tmp_path / "log.db").close()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "layout.json").write_text("{garbage")
    line = one_line_error(cli("--log", str(tmp_path / "log.db"), "--state-dir", "state", *command, cwd=tmp_path))
    assert "layout.json" in line, line


def test_aborted_and_slow_request_bodies_leave_no_traceback_and_hold_nothing(tmp_path: Path) -> None:
    """A client that closes in the middle of a patch body, and one that sends its body a
    byte at a time and then stops: serve logs no traceback for the first, and answers the
    second 408 after RUNSTATE_BODY_TIMEOUT_S instead of holding the connection forever; a body
    or headers trickled steadily are cut off at RUNSTATE_REQUEST_TIMEOUT_S, and /metrics
    counts each."""
    import socket
    import time

    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_BODY_TIMEOUT_S": "1",
        "RUNSTATE_REQUEST_TIMEOUT_S": "2",
    }
    with serving(env, tmp_path) as proc:
        head = (
            b"POST /runs/r/patches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", proc.port)) as s:
            s.sendall(head + b'{"expected')
            time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
            s.sendall(head + b'{"expected')
            started = time.monotonic()
            answer = b""
            while chunk := s.recv(4096):  # the server closes after its answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b"RUNSTATE_BODY_TIMEOUT_S" in answer and time.monotonic() - started < 5
        # Trickled steadily, a byte every 0.3 s: the body never stalls, its whole has a deadline.
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
            s.sendall(head)
            started, answer = time.monotonic(), b""
            s.settimeout(0.3)
            while time.monotonic() - started < 8 and not answer:
                try:
                    s.sendall(b" ")
                    answer = s.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    break
            s.settimeout(5)
            with contextlib.suppress(OSError):  # the body may come in a later segment than the head
                while chunk := s.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"RUNSTATE_REQUEST_TIMEOUT_S" in answer, answer
            assert time.monotonic() - started < 5
        # An MCP call's body is held to the same deadline as a patch's.
        mcp_head = (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
            s.sendall(mcp_head + b'{"jsonrpc"')
            started, answer = time.monotonic(), b""
            with contextlib.suppress(OSError):
                while chunk := s.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"RUNSTATE_BODY_TIMEOUT_S" in answer, answer
            assert time.monotonic() - started < 5
        # Headers trickled (and a connection that sends nothing): closed at the deadline.
        for first in (b"POST /runs/r/patches HTTP/1.1\r\n", b""):
            with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
                s.sendall(first)
                started, closed = time.monotonic(), False
                s.settimeout(0.3)
                while time.monotonic() - started < 8:
                    try:
                        if first:
                            s.sendall(b"X-Slow: 1\r\n")
                        if s.recv(4096) == b"":
                            closed = True
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        closed = True
                        break
                assert closed and time.monotonic() - started < 5
        assert httpx.get(proc.url + "/healthz").status_code == 200
        metrics = httpx.get(proc.url + "/metrics").text
        assert 'runstate_http_slow_clients_total{phase="headers"} 2.0' in metrics, metrics
        assert 'runstate_http_slow_clients_total{phase="body"} 3.0' in metrics, metrics
        time.sleep(0.3)
        assert "Traceback" not in proc.log() and "ClientDisconnect" not in proc.log(), proc.log()


def test_a_wrong_serve_url_is_one_typed_error_naming_it() -> None:
    """Nothing listens there: the client and the agent handle raise ServiceUnreachable with
    the URL, not httpx's ConnectError."""
    from runstate.agent import open_run
    from runstate.client import Client, ServiceUnreachable

    with Client("http://127.0.0.1:9", retry_s=0.3) as rs, pytest.raises(ServiceUnreachable, match="127.0.0.1:9"):
        rs.state("r")
    with pytest.raises(ServiceUnreachable, match=r"http://127.0.0.1:9: .*is it running"):
        open_run("http://127.0.0.1:9", "r", agent_id="a", agent_version="1")


def test_a_second_serve_on_one_embedded_log_is_one_line_before_any_announcement(tmp_path: Path) -> None:
    from servekit import ServeProcess

    env = embedded_env(tmp_path)
    first = ServeProcess(env, tmp_path)
    try:
        first.wait_ready()
        second = subprocess.run(
            [sys.executable, "-m", "runstate.cli", "serve", "--port", "0"],
            env={**os.environ, **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second
        assert "Traceback" not in second.stderr and "runstate serve: http" not in second.stderr, second.stderr
        assert "already projected by another process" in second.stderr, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    finally:
        first.stop()


def test_readyz_answers_only_once_every_run_is_answered(tmp_path: Path) -> None:
    """Right after /readyz first says 200, an unknown run is 404 on every route (not 503)."""
    import time

    import httpx
    from servekit import ServeProcess

    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_PARTITIONS": "16",
    }
    proc = ServeProcess(env, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(proc.url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.01)
        for i in range(16):
            assert httpx.get(f"{proc.url}/runs/unknown-{i}", timeout=5).status_code == 404
        assert httpx.get(proc.url + "/runs/unknown/events", timeout=5).status_code == 404
        assert httpx.get(proc.url + "/healthz", timeout=5).status_code == 200
    finally:
        proc.stop()


def test_a_broker_that_refuses_for_a_moment_is_reached_when_it_comes_back() -> None:
    """The start-up probe tries a refusing address again within its window (a broker
    restarting), and gives up with one line after it."""
    import socket
    import threading
    import time

    from runstate.eventlog.kafka import PROBE_WINDOW_S, KafkaLog
    from runstate.schemas.errors import LogConfigError

    port = free_port()
    listener = socket.socket()

    def come_back() -> None:
        time.sleep(1.0)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    threading.Thread(target=come_back, daemon=True).start()
    log = KafkaLog(f"127.0.0.1:{port}")
    log._reachable()  # refused for a second, then reached: no error
    listener.close()
    started = time.monotonic()
    with pytest.raises(LogConfigError, match="Connection refused"):
        KafkaLog(f"127.0.0.1:{free_port()}")._reachable()
    assert PROBE_WINDOW_S - 0.5 < time.monotonic() - started < PROBE_WINDOW_S + 2
