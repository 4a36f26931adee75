"""Run ids through serve: any id the embedded log takes (1-200 characters, no control
characters) is one run through every `Client` method and every route, and no id reaches
another run. A path the server cannot route is refused, never resolved to another run."""

from __future__ import annotations

import asyncio
import socket

import pytest
from helpers import fact, start
from servekit import ServeProcess

from runstate import app
from runstate.client import AsyncClient, Client
from runstate.schemas.errors import ContractError, RunNotFound
from runstate.settings import Settings

HOSTILE = [
    "x/../victim",
    "./victim",
    "victim/.",
    "victim#other",
    "victim?x=1",
    "victim/context",
    "..",
    ".",
    "user 42",
    "café",
    "100%",
    "%2F",
    "#general",
    "slack/C123/1700000000.1",
    "a+b",
    "日本語 スレッド",
    "v" * 200,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServeProcess, Settings]:
    tmp = tmp_path_factory.mktemp("ids")
    s = Settings(log=str(tmp / "log.db"), state_dir=str(tmp / "state"), partitions=2)
    # A run written embedded, before serve starts, is servable too.
    app.publish(s, "written/embedded café", {"expected_revision": 0, "events": [start("embedded")]}, where="t")
    proc = ServeProcess({"RUNSTATE_LOG": s.log, "RUNSTATE_STATE_DIR": s.state_dir}, tmp)
    proc.wait_ready()
    yield proc, s
    proc.stop()


def test_every_client_method_keeps_each_id_its_own_run(served: tuple[ServeProcess, Settings]) -> None:
    proc, _s = served
    with Client(proc.url) as rs:
        victim = rs.submit("victim", {"expected_revision": 0, "events": [start("victim's goal")]})
        assert victim.revision == 1
        for i, run_id in enumerate(HOSTILE):
            pid = f"p/{i}/{run_id}"[:200]
            d = rs.submit(run_id, {"patch_id": pid, "expected_revision": 0, "events": [start(run_id)]})
            assert (d.run_id, d.outcome, d.revision) == (run_id, "accepted", 1), d
            d2 = rs.submit(run_id, {"expected_revision": 1, "events": [fact("f1")]})
            assert (d2.run_id, d2.revision) == (run_id, 2)
            state = rs.state(run_id)
            assert state.run_id == run_id and state.goal is not None and state.goal.statement == run_id
            assert rs.state(run_id, revision=1).revision == 1
            assert rs.decision(run_id, pid) is not None
            assert rs.wait(run_id, pid).run_id == run_id
            assert [h.revision for h in rs.history(run_id)] == [1, 2]
            assert run_id[:20] in rs.context(run_id) or "goal" in rs.context(run_id).lower()
            assert rs.explain(run_id, "goal")
            assert rs.graph_checkpoints(run_id) == []
            first = next(iter(rs.events(run_id, last_event_id=0)))
            assert first.run_id == run_id
        assert rs.state("victim").revision == 1 and len(rs.history("victim")) == 1
        assert rs.state("written/embedded café").revision == 1
        listed = {h.run_id for h in rs.runs()}
        assert set(HOSTILE) | {"victim", "written/embedded café"} == listed


def test_the_async_client_quotes_as_the_sync_one(served: tuple[ServeProcess, Settings]) -> None:
    proc, _s = served

    async def go() -> None:
        async with AsyncClient(proc.url) as rs:
            for run_id in ("async/../victim-of-async", "async #1", "async?x"):
                d = await rs.submit(run_id, {"expected_revision": 0, "events": [start(run_id)]})
                assert (d.run_id, d.revision) == (run_id, 1)
                assert (await rs.state(run_id)).run_id == run_id
                assert [h.run_id for h in await rs.history(run_id)] == [run_id]
                assert await rs.decision(run_id, d.patch_id) is not None
                assert await rs.graph_checkpoints(run_id) == []

    asyncio.run(go())
    with Client(proc.url) as rs, pytest.raises(RunNotFound):
        rs.state("victim-of-async")  # where "async/../victim-of-async" would have gone, unescaped


def raw_request(port: int, method: str, target: str) -> tuple[int, bytes]:
    """A request line sent as it is written (no client normalising its dots)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        body = b'{"expected_revision": 1, "events": []}' if method == "POST" else b""
        s.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def test_a_path_the_server_cannot_route_is_refused_not_resolved_to_another_run(
    served: tuple[ServeProcess, Settings],
) -> None:
    proc, _s = served
    with Client(proc.url) as rs:  # the run a bad path must not reach (another test may have made it)
        rs.submit("victim", {"expected_revision": 0, "events": [start("victim's goal")]})
    for target in (
        "/runs/x/../victim",
        "/runs/x/../victim/patches",
        "/runs/./victim",
        "/runs/victim/./history",
        "/runs/victim/.",
        "/runs/x/%2E%2E/victim",
    ):
        method = "POST" if target.endswith("patches") else "GET"
        status, answer = raw_request(proc.port, method, target)
        assert status in (404, 405), (target, answer)
    # An id that is not one: refused with the reason, never another run's answer.
    for bad in ("/runs/a%00b", "/runs/%FF%FE", "/runs/" + "v" * 201):
        status, answer = raw_request(proc.port, "GET", bad)
        assert status == 422, (bad, answer)
    with Client(proc.url) as rs:
        assert rs.state("victim").revision == 1
        with pytest.raises(ContractError, match="1-200 characters"):
            rs.state("v" * 201)


def test_a_patch_sent_without_wait_is_202_pending_with_its_id(served: tuple[ServeProcess, Settings]) -> None:
    import httpx

    proc, _s = served
    r = httpx.post(
        proc.url + "/runs/no-wait/patches", json={"patch_id": "nw1", "expected_revision": 0, "events": [start()]}
    )
    assert r.status_code == 202 and r.json()["status"] == "pending" and r.json()["patch_id"] == "nw1", r.text
    with Client(proc.url) as rs:
        assert rs.wait("no-wait", "nw1").outcome == "accepted"


def test_a_path_never_set_is_the_same_answer_over_http_the_client_and_the_cli(
    served: tuple[ServeProcess, Settings],
) -> None:
    import httpx
    from click.testing import CliRunner

    from runstate.cli import main
    from runstate.schemas.errors import FieldNeverSet

    proc, s = served
    with Client(proc.url) as rs:
        rs.submit("explained", {"expected_revision": 0, "events": [start()]})
        assert rs.explain("explained", "goal.statement")
        r = httpx.get(proc.url + "/runs/explained/explain", params={"path": "tasks.nope.status"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "never_set", r.text
        assert r.json()["error"]["field"] == "path" and "was never set" in r.json()["error"]["message"]
        with pytest.raises(FieldNeverSet, match="tasks.nope.status of run 'explained' was never set"):
            rs.explain("explained", "tasks.nope.status")
    out = CliRunner().invoke(
        main, ["--log", s.log, "--state-dir", s.state_dir, "explain", "written/embedded café", "tasks.nope.status"]
    )
    assert out.exit_code == 1 and "tasks.nope.status of run 'written/embedded café' was never set" in out.output
