"""`runstate serve` on the embedded log: a real server process, real HTTP clients (httpx via
runstate.client), a real MCP client session, and a schemathesis fuzz run from /openapi.json."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import doc_blocks, examples, fact, start, embedded_env
from servekit import ServeProcess, await_on_start, free_port, serving

from runstate.client import AsyncClient, Client, ServiceError, ServiceUnreachable
from runstate.schemas.errors import ContractError, RunNotFound
from runstate.schemas.patch import Decision
from runstate.projector.read.queries import Projection
from runstate.schemas.state import RunState
from runstate.service.auth import add_token

pytestmark = pytest.mark.slow


class Served:
    def __init__(self, proc: ServeProcess, tokens: dict[str, str], workdir: Path) -> None:
        self.proc = proc
        self.url = proc.url
        self.tokens = tokens
        self.workdir = workdir

    def client(self, who: str = "planner") -> Client:
        return Client(self.url, self.tokens[who], retry_s=5)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("serve")
    tf = str(work / "tokens.json")
    tokens = {
        "planner": add_token(tf, "planner"),
        "coder": add_token(tf, "coder"),
        "reader": add_token(tf, "auditor", "read"),
        "team_a": add_token(tf, "team-a-bot", runs=["team-a-*"]),
        "user": add_token(tf, "user", channel="user"),
        "ops": add_token(tf, "ops", policy=True),
    }
    env = {
        **embedded_env(work),
        "RUNSTATE_TOKENS_FILE": tf,
        "RUNSTATE_CHECKPOINT_EVERY": "2",
        "RUNSTATE_CHECKPOINT_BYTES_RATIO": "0",
    }
    proc = ServeProcess(env, work)
    try:
        proc.wait_ready()
        yield Served(proc, tokens, work)
    finally:
        code = proc.stop()
    assert code == 0, proc.log()


def started(rs: Client, run_id: str, **policy: Any) -> Decision:
    d = rs.submit(run_id, {"expected_revision": 0, "events": [start(policy=policy or None)]})
    assert d.outcome == "accepted", d
    return d


def test_append_and_wait_then_read_your_writes(served: Served) -> None:
    with served.client() as rs:
        d1 = started(rs, "rw-1")
        d2 = rs.submit("rw-1", {"expected_revision": 1, "events": [fact("f1")]})
        assert (d2.outcome, d2.revision, d2.agent_id) == ("accepted", 2, "planner")
        state = rs.state("rw-1", min_revision=d2.revision)
        assert state.revision == 2 and [f.id for f in state.confirmed_facts] == ["f1"]
        assert "f1" in rs.context("rw-1")
        assert [d.patch_id for d in rs.history("rw-1")] == [d1.patch_id, d2.patch_id]
        assert rs.state("rw-1", revision=1).revision == 1 and not rs.state("rw-1", revision=1).confirmed_facts
        changes = rs.explain("rw-1", "confirmed_facts.f1.statement")
        assert [(c["revision"], c["agent_id"]) for c in changes] == [(2, "planner")]
        # a stale revision is a decision with its reason, not an error
        late = rs.submit("rw-1", {"expected_revision": 1, "events": [fact("f2")]})
        assert (late.outcome, late.reason, late.revision) == ("rejected", "revision_conflict", 2)
        assert "rw-1" in [h.run_id for h in rs.runs()]


def test_the_patch_route_answers_bad_parameters_as_the_other_routes_do(served: Served) -> None:
    """``POST …/patches`` (the hot route) answers a bad ``wait`` or run id as ``DELETE
    /runs/{id}``, whose parameters have the same types, does: 422 naming the field, the
    same message; and its requests are counted under its route."""
    auth = {"authorization": f"Bearer {served.tokens['planner']}"}
    draft = {"expected_revision": 0, "events": [start()]}
    cases = [
        ("bad-params", {"wait": "-1"}, "wait"),
        ("bad-params", {"wait": "soon"}, "wait"),
        ("bad-params", {"wait": "61"}, "wait"),
        ("x" * 201, {}, "run_id"),  # 200 characters at most
        ("%01", {}, "run_id"),  # no control characters
        ("%ff", {}, "run_id"),  # UTF-8
        ("%25" * 801, {}, "run_id"),  # longer than any encoded id
    ]
    for run, query, field in cases:
        got = httpx.post(f"{served.url}/runs/{run}/patches", params=query, json=draft, headers=auth, timeout=30)
        same = httpx.delete(f"{served.url}/runs/{run}", params={"reason": "r", **query}, headers=auth, timeout=30)
        assert (got.status_code, same.status_code) == (422, 422), (run, query, got.text, same.text)
        assert got.json() == same.json() and got.json()["error"]["field"] == field, (got.text, same.text)
    text = httpx.get(served.url + "/metrics", headers=auth, timeout=30).text
    assert 'runstate_http_requests_total{route="/runs/{run_id}/patches",status="422"}' in text


def test_etag_is_the_revision_and_min_revision_waits_for_the_projector(served: Served) -> None:
    with served.client() as rs:
        started(rs, "etag-1")
        h = {"authorization": f"Bearer {served.tokens['planner']}"}
        r = httpx.get(served.url + "/runs/etag-1", headers=h)
        assert r.status_code == 200 and r.headers["etag"] == '"1"'
        assert httpx.get(served.url + "/runs/etag-1", headers={**h, "if-none-match": '"1"'}).status_code == 304
        # appended, not yet decided: min_revision waits for the projector to apply it
        for i in range(5):
            rs.append("etag-1", {"expected_revision": 1 + i, "events": [fact(f"f{i}")]})
            assert rs.state("etag-1", min_revision=2 + i).revision == 2 + i
        # the body is the validated state's JSON, byte for byte (the route sends the stored
        # document as plain data), now and at an earlier revision
        r = httpx.get(served.url + "/runs/etag-1", headers=h)
        with Projection(served.workdir / "state") as proj:
            assert r.content == proj.state("etag-1").model_dump_json().encode()
        r = httpx.get(served.url + "/runs/etag-1", params={"revision": 3}, headers=h)
        assert r.status_code == 200, served.proc.log()[-3000:]
        assert r.headers["etag"] == '"3"' and RunState.model_validate_json(r.content).revision == 3
        assert r.content == RunState.model_validate_json(r.content).model_dump_json().encode()
        # a revision the log does not hold, with the projector caught up: 404 at once
        r = httpx.get(served.url + "/runs/etag-1", params={"min_revision": 99, "wait": 30}, headers=h)
        assert r.status_code == 404 and "99 does not exist" in r.json()["error"]["message"]
        assert httpx.get(served.url + "/runs/nope-1", params={"min_revision": 1}, headers=h).status_code == 404


def test_the_state_routes_etag_is_the_documents_top_level_revision_and_a_broken_document_is_a_store_error() -> None:
    """The GET route sends the stored document as it is and reads only its revision for
    the ETag: the top-level one (not a nested field of that name), and a document that is
    not JSON anywhere is a StoreError naming the run (a 500 with the reason), not a 200."""
    from runstate.schemas.errors import StoreError
    from runstate.service.http import _etag_of

    doc = b'{"schema_version":4,"run_id":"r","revision":7,"goal":{"revision":3},"tasks":[{"revision":9}]}'
    assert _etag_of(doc, "r") == '"7"'
    for broken in (doc[:-1], doc.replace(b'"tasks":[', b'"tasks":[,')):
        with pytest.raises(StoreError, match="stored state of run 'r' cannot be read"):
            _etag_of(broken, "r")


def test_only_the_user_channels_token_records_user_input_and_it_records_nothing_else(served: Served) -> None:
    """Input authority through serve: the agent's token cannot make its guess a user input
    (a decision naming the rule); the user channel's token records it (the run's writers
    need not name it) and may write nothing but inputs of its origin (403)."""
    user_said = {"type": "InputRecorded", "input": {"id": "user://m1", "origin": "user", "text": "use RS256"}}
    with served.client() as rs, served.client("user") as channel:
        started(rs, "chan-1", writers=["planner"])
        d = rs.submit("chan-1", {"expected_revision": 1, "events": [user_said]})
        assert (d.outcome, d.rule) == ("rejected", "input.not_authorized"), d
        for events in (
            [fact("f1")],
            [user_said, fact("f1")],
            [{**user_said, "input": {**user_said["input"], "origin": "operator"}}],
        ):
            with pytest.raises(ServiceError, match="records only user inputs") as e:
                channel.submit("chan-1", {"expected_revision": 1, "events": events})
            assert e.value.status == 403
        d = channel.submit("chan-1", {"expected_revision": 1, "events": [user_said]})
        assert (d.outcome, d.agent_id) == ("accepted", "user"), d
        d = rs.submit("chan-1", {"expected_revision": 2, "events": [fact("f2", evidence=None, source="user://m1")]})
        assert d.outcome == "accepted", d


def test_an_agent_cannot_switch_off_the_input_authority_that_constrains_it(served: Served) -> None:
    """A policy that weakens who records authoritative inputs (``input_authority:
    writers``, or the agent among a origin's recorders) is refused from an agent's token
    (403, nothing appended), so the agent cannot record its own ``user`` input and cite it;
    an operator's token (``token add --policy``) may start such a run."""
    user_said = {"type": "InputRecorded", "input": {"id": "user://m1", "origin": "user", "text": "ship it"}}
    with served.client() as rs, served.client("ops") as ops:
        for policy in (
            {"input_authority": "writers"},
            {"input_recorders": [{"origin": "user", "agents": ["planner"]}]},
        ):
            with pytest.raises(ServiceError, match="weakens who records authoritative inputs") as e:
                rs.submit("weak-1", {"expected_revision": 0, "events": [start(policy=policy)]})
            assert e.value.status == 403
        with pytest.raises(RunNotFound):
            rs.state("weak-1")
        started(rs, "weak-1", input_recorders=[{"origin": "user", "agents": ["user"]}])  # the default, stated
        d = rs.submit("weak-1", {"expected_revision": 1, "events": [user_said]})
        assert (d.outcome, d.rule) == ("rejected", "input.not_authorized"), d
        d = ops.submit("weak-2", {"expected_revision": 0, "events": [start(policy={"input_authority": "writers"})]})
        assert d.outcome == "accepted", d


def test_patch_without_wait_is_pending_and_decided_later(served: Served) -> None:
    with served.client() as rs:
        sub = rs.append("pend-1", {"expected_revision": 0, "events": [start()]})
        assert sub.decision is None
        assert rs.wait("pend-1", sub.patch_id, 10).outcome == "accepted"
        # the same patch id again: a duplicate, answered with the first decision
        again = rs.append("pend-1", {"patch_id": sub.patch_id, "expected_revision": 0, "events": [start()]}, wait_s=0.5)
        assert again.decision is not None and again.decision.offset == sub.offset


def test_bad_patches_are_422_with_the_field_and_oversize_is_413(served: Served) -> None:
    h = {"authorization": f"Bearer {served.tokens['planner']}"}
    cases = [
        (b'{"expected_revision": 0, "events": [{"type": "NoSuchEvent"}]}', "type"),
        (b'{"expected_revision": -1, "events": [{"type": "RunCompleted"}]}', "expected_revision"),
        (b'{"expected_revision": 0, "events": []}', "events"),
        (b'{"expected_revision": 0, "events": [{"type": "FactConfirmed", "fact": {"statement": 5}}]}', None),
        (b"not json", None),
        (b"[1, 2]", None),
        # a lone surrogate, which UTF-8 cannot encode: refused by the JSON parser, with where it is
        (b'{"expected_revision": 0, "events": [{"type": "RunStarted", "goal": {"statement": "\\ud800"}}]}', None),
    ]
    for body, field in cases:
        r = httpx.post(served.url + "/runs/bad-1/patches", content=body, headers=h)
        assert r.status_code == 422, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid" and err["message"]
        if field is not None:
            assert err["field"] is not None and err["field"].startswith(field), err
    huge = json.dumps(
        {"expected_revision": 0, "events": [{"type": "RunStarted", "goal": {"statement": "x" * 3_000_000}}]}
    )
    r = httpx.post(served.url + "/runs/bad-1/patches", content=huge, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "patch_too_large"
    with served.client() as rs, pytest.raises(RunNotFound):
        rs.state("bad-1")  # nothing of the above reached the log


def test_tokens_decide_who_writes(served: Served) -> None:
    with served.client() as rs:
        started(rs, "auth-1", writers=["planner"])
    no = httpx.post(served.url + "/runs/auth-1/patches", json={"expected_revision": 1, "events": [fact("f1")]})
    assert no.status_code == 401 and no.json()["error"]["code"] == "unauthorized"
    bad = httpx.get(served.url + "/runs/auth-1", headers={"authorization": "Bearer rs_not-a-token"})
    assert bad.status_code == 401
    with served.client("coder") as coder:
        # a body cannot claim another author
        with pytest.raises(ServiceError) as e:
            coder.append(
                "auth-1",
                {
                    "expected_revision": 1,
                    "events": [fact("f1")],
                    "author": {"agent_id": "planner", "agent_version": "9"},
                },
            )
        assert e.value.status == 403
        # as itself it may append, and the run's writer rule rejects it
        d = coder.submit(
            "auth-1",
            {"expected_revision": 1, "events": [fact("f1")], "author": {"agent_id": "coder", "agent_version": "2.1"}},
        )
        assert (d.outcome, d.reason, d.agent_id, d.agent_version) == ("rejected", "unauthorized", "coder", "2.1")
    with served.client("reader") as reader:
        assert reader.state("auth-1").revision == 1
        with pytest.raises(ServiceError) as e:
            reader.append("auth-1", {"expected_revision": 1, "events": [fact("f1")]})
        assert e.value.status == 403
    with served.client("team_a") as team:
        assert team.submit("team-a-1", {"expected_revision": 0, "events": [start()]}).outcome == "accepted"
        with pytest.raises(ServiceError) as e:
            team.state("auth-1")
        assert e.value.status == 403
        assert [h.run_id for h in team.runs()] == ["team-a-1"]
    with served.client() as rs:
        assert rs.state("auth-1").revision == 1  # nothing the refused tokens sent was applied


def test_events_stream_resumes_from_last_event_id(served: Served) -> None:
    with served.client() as rs:
        d1 = started(rs, "sse-1")
        got: list[Decision] = []
        done = threading.Event()

        def listen() -> None:
            with served.client() as c:
                # After d1: what comes while the stream opens is replayed, what comes later is live.
                for d in c.events("sse-1", last_event_id=d1.offset):
                    got.append(d)
                    if len(got) == 2:
                        done.set()
                        return

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        time.sleep(0.5)  # most likely open: the two decisions arrive live
        d2 = rs.submit("sse-1", {"expected_revision": 1, "events": [fact("f1")]})
        d3 = rs.submit("sse-1", {"expected_revision": 1, "events": [fact("f2")]})  # rejected: also an event
        assert done.wait(10), got
        assert [(d.patch_id, d.outcome) for d in got] == [(d2.patch_id, "accepted"), (d3.patch_id, "rejected")]
        # resuming after the first decision replays the missed ones from history
        with served.client() as c:
            it = c.events("sse-1", last_event_id=d1.offset)
            assert [next(it).patch_id, next(it).patch_id] == [d2.patch_id, d3.patch_id]


def test_async_client_has_the_same_verbs(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.url, served.tokens["planner"]) as rs:
            d = await rs.submit("async-1", {"expected_revision": 0, "events": [start()]})
            assert d.outcome == "accepted"
            assert (await rs.state("async-1", min_revision=1)).revision == 1
            assert "fix login" in await rs.context("async-1")
            assert len(await rs.history("async-1")) == 1
            with pytest.raises(ContractError):
                await rs.append("async-1", {"expected_revision": 1, "events": [{"type": "Nope"}]})
            with pytest.raises(RunNotFound):
                await rs.state("async-no-such-run")
            async with AsyncClient(served.url, served.tokens["team_a"]) as team_a:
                with pytest.raises(ServiceError) as denied:
                    await team_a.append("async-1", {"expected_revision": 1, "events": [fact("f0")]})
            assert denied.value.status == 403
            # the event stream: what comes next, then, resumed after the first, the rest replayed
            stream = rs.events("async-1", last_event_id=d.offset)
            coming = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.5)  # the stream is open
            d2 = await rs.submit("async-1", {"expected_revision": 1, "events": [fact("f1")]})
            assert (await asyncio.wait_for(coming, 10)).patch_id == d2.patch_id
            await stream.aclose()
            again = rs.events("async-1", last_event_id=d.offset)
            assert (await asyncio.wait_for(anext(again), 10)).patch_id == d2.patch_id
            await again.aclose()
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", retry_s=0.5) as gone:
            with pytest.raises(ServiceUnreachable, match="cannot reach runstate serve"):
                await gone.state("async-1")

    asyncio.run(main())


def test_the_client_sends_again_at_once_on_a_kept_alive_connection_the_server_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Servers close kept-alive connections that stay idle (uvicorn after 5 s). The client's
    next request on one fails before any answer: it is sent again at once on a new
    connection, not after the pause the client takes for an unreachable service."""
    import http.server
    import types

    from runstate import client as client_module

    seen: list[str] = []

    class ClosingAfterEachAnswer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as far as the client can tell

        def do_GET(self) -> None:
            seen.append(self.path)
            body = b'{"context": "ok"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True  # then closes it without saying so

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ClosingAfterEachAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def no_pause(seconds: float) -> None:
        raise AssertionError(f"the client paused {seconds} s instead of sending again at once")

    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=no_pause))
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}") as rs:
            assert rs.context("r1") == "ok"
            threading.Event().wait(0.2)  # the server has closed that connection
            assert rs.context("r2") == "ok"
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/runs/r1/context", "/runs/r2/context"], seen


def test_a_shed_request_is_sent_again_after_retry_after_ms_doubled_at_each_shed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 with ``Retry-After: 1`` and ``Retry-After-Ms: 20``, three times: the client
    waits between half and all of that, doubled at each shed (jittered), not a second each
    time, and the fourth answer is the request's."""
    import http.server
    import types

    import runstate.client as client_module

    answers = iter([429, 429, 429, 200])

    class Shedding(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = next(answers)
            body = b'{"context": "ok"}' if status == 200 else b'{"error": {"code": "overloaded", "message": "m"}}'
            self.send_response(status)
            if status == 429:
                self.send_header("retry-after", "1")
                self.send_header("retry-after-ms", "20")
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Shedding)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pauses: list[float] = []
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=pauses.append))
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}") as rs:
            assert rs.context("r1") == "ok"
    finally:
        server.shutdown()
        server.server_close()
    assert len(pauses) == 3, pauses
    for n, (low, high) in enumerate([(0.01, 0.02), (0.02, 0.04), (0.04, 0.08)]):
        assert low <= pauses[n] <= high, pauses


def test_a_service_that_never_answers_is_unreachable_once_the_retry_window_ends() -> None:
    """A socket that accepts and never answers: each request's read times out, is tried
    again for ``retry_s``, and ends as :class:`ServiceUnreachable` naming the timeout."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        with Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2, retry_s=0.5) as rs:
            t0 = time.monotonic()
            with pytest.raises(ServiceUnreachable, match="ReadTimeout"):
                rs.state("silent-1")
            assert time.monotonic() - t0 < 5
    finally:
        listener.close()


def test_health_metrics_checkpoints_and_resume(served: Served) -> None:
    with served.client() as rs:
        started(rs, "ops-1")
        rs.submit("ops-1", {"expected_revision": 1, "events": [fact("f1")]})
    h = {"authorization": f"Bearer {served.tokens['reader']}"}
    health = httpx.get(served.url + "/healthz").json()
    assert health["status"] == "serving" and health["owned_partitions"] == list(range(health["partitions"]))
    assert httpx.get(served.url + "/runs/no-such-run", headers=h).status_code == 404
    # A serve that needs tokens needs one for its metrics too, unless told otherwise
    # (RUNSTATE_METRICS_PUBLIC, tests/cli/test_first_hour.py): they name runs' activity.
    assert httpx.get(served.url + "/metrics").status_code == 401
    text = httpx.get(served.url + "/metrics", headers=h).text
    assert 'runstate_decisions_total{outcome="accepted",reason=""}' in text
    # requests by route template and status, the error answers included
    assert 'runstate_http_requests_total{route="/runs/{run_id}/patches",status="200"}' in text
    assert 'runstate_http_requests_total{route="/runs/{run_id}",status="404"}' in text
    assert "runstate_lag_records{partition=" in text
    assert "runstate_snapshotter_lag_records{partition=" in text
    deadline = time.monotonic() + 20
    while True:  # the snapshotter in the same process checkpoints every 2 revisions, a moment later
        r = httpx.get(served.url + "/runs/ops-1/checkpoints", headers=h)
        if (r.status_code == 200 and r.json()[-1]["revision"] == 2) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200 and r.json()[-1]["revision"] == 2
    plan = httpx.get(served.url + "/runs/ops-1/resume", headers=h).json()
    assert plan["checkpoint"]["revision"] == 2 and plan["tail"] == []
    assert httpx.get(served.url + "/runs/nobody/resume", headers=h).status_code == 404


def test_mcp_session_lists_tools_proposes_a_patch_and_reads_the_decision(served: Served) -> None:
    from mcp import ClientSession
    import httpx2  # the MCP SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> None:
        headers = {"authorization": f"Bearer {served.tokens['planner']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(served.url + "/mcp", http_client=http) as (read, write),
        ):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                assert {"run_context", "run_state", "propose_patch", "run_history"} <= set(tools)
                # the patch's input schema is the pydantic model's: the event union is there
                assert "FactConfirmed" in json.dumps(tools["propose_patch"].input_schema)
                res = await session.call_tool(
                    "propose_patch", {"run_id": "mcp-1", "patch": {"expected_revision": 0, "events": [start()]}}
                )
                assert not res.is_error, res
                out = res.structured_content or json.loads(res.content[0].text)
                assert out["status"] == "decided" and out["decision"]["outcome"] == "accepted"
                assert out["decision"]["agent_id"] == "planner"
                ctx = await session.call_tool("run_context", {"run_id": "mcp-1"})
                assert "revision 1" in ctx.content[0].text
                # a malformed call is refused by the schema: nothing is appended
                bad = await session.call_tool(
                    "propose_patch",
                    {
                        "run_id": "mcp-1",
                        "patch": {
                            "expected_revision": 1,
                            "events": [{"type": "FactConfirmed", "fact": {"statement": 3}}],
                        },
                    },
                )
                assert bad.is_error
                hist = await session.call_tool("run_history", {"run_id": "mcp-1"})
                assert not hist.is_error
                got = await session.call_tool("run_state", {"run_id": "mcp-1"})
                assert not got.is_error, got
                state = got.structured_content or json.loads(got.content[0].text)
                assert state == httpx.get(served.url + "/runs/mcp-1", headers=headers).json()
                assert state["revision"] == 1 and state["goal"]["statement"] == "fix login"

    asyncio.run(main())
    with served.client() as rs:
        assert rs.state("mcp-1").revision == 1


def test_openapi_fuzz_no_5xx_and_documented_errors(served: Served) -> None:
    """schemathesis from /openapi.json: no server error, every response (errors included)
    matches its documented schema and status. The SSE stream never ends: excluded."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            served.url + "/openapi.json",
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance",
            "--exclude-path-regex",
            "/events$",
            "--max-examples",
            str(examples(25, floor=5)),
            "--seed",
            "7",
            "--no-color",
            "--phases",
            "examples,coverage,fuzzing",
            "--request-timeout",
            "20",
            "--max-failures",
            "5",
            "-H",
            f"Authorization: Bearer {served.tokens['planner']}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=served.workdir,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_runs_page_by_latest_activity_pages_with_the_cursor_it_gives(served: Served) -> None:
    """``GET /runs?order=recent``: the run changed last comes first; ``X-Next-After`` is
    the next page's ``after``, and paging with it reaches every run once; a cursor it did
    not give is a 422 naming ``after``."""
    with served.client() as rs:
        for i in range(5):
            started(rs, f"act-{i}")
        rs.submit("act-1", {"expected_revision": 1, "events": [fact("f1")]})
        seen: list[str] = []
        params: dict[str, Any] = {"order": "recent", "q": "act-", "limit": 2}
        while True:
            page = httpx.get(
                served.url + "/runs", params=params, headers={"authorization": f"Bearer {served.tokens['planner']}"}
            )
            assert page.status_code == 200 and page.headers["x-total-count"] == "5", page.text
            seen += [h["run_id"] for h in page.json()]
            if "x-next-after" not in page.headers:
                break
            params["after"] = page.headers["x-next-after"]
        assert seen == ["act-1", "act-4", "act-3", "act-2", "act-0"]  # the last page (one run) offers no next
        whole = httpx.get(
            served.url + "/runs",
            params={"order": "recent", "q": "act-", "limit": 5},
            headers={"authorization": f"Bearer {served.tokens['planner']}"},
        )
        assert len(whole.json()) == 5 and "x-next-after" not in whole.headers  # full, and nothing after it
        by_id = httpx.get(
            served.url + "/runs",
            params={"q": "act-", "limit": 2},
            headers={"authorization": f"Bearer {served.tokens['planner']}"},
        )
        assert [h["run_id"] for h in by_id.json()] == ["act-0", "act-1"] and by_id.headers["x-next-after"] == "act-1"
        bad = httpx.get(
            served.url + "/runs",
            params={"order": "recent", "after": "act-1"},
            headers={"authorization": f"Bearer {served.tokens['planner']}"},
        )
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "after", bad.text


def test_readme_client_example_runs_as_written(served: Served) -> None:
    """The docs' ``runstate.client`` block (docs/serve.md), against this server with a token
    (the page shows a tokenless laptop server); run_128 is brought to revision 2 first, as
    the block assumes after the tour."""
    [block] = [b for b in doc_blocks("python") if "runstate.client" in b]
    with served.client() as rs:
        started(rs, "run_128")
        assert rs.submit("run_128", {"expected_revision": 1, "events": [fact("f1")]}).revision == 2
    code = block.replace('"http://127.0.0.1:8750"', repr(served.url)).replace(
        "token=None", f"token={served.tokens['planner']!r}"
    )
    assert code != block
    scope: dict[str, Any] = {}
    exec(code, scope)
    assert scope["d"].outcome == "accepted" and scope["state"].revision == 3 and scope["state"].phase == "fix"
    again: dict[str, Any] = {}  # run twice, as a reader does: a stale patch is a decision saying so
    exec(code, again)
    assert again["d"].reason == "revision_conflict" and again["state"].revision == 3


def test_min_revision_is_not_refused_when_the_projector_applies_it_during_the_check() -> None:
    """Read-your-writes race (seen in CI once appends woke the projector at once): the
    revision was read (1), then the projector applied the patch and reached the log's end,
    then the lag check said "caught up" — and the request was refused as if revision 2
    did not exist. Caught up must be judged before the revision it is compared with."""
    from types import SimpleNamespace

    from runstate.service.core import Service
    from runstate.service.node import Hub

    class ProjectorAppliesDuringTheLagCheck:
        settings = None

        def __init__(self) -> None:
            self.hub = Hub()
            self.revision = 1

        def read(self, run_id: str, fn: Any) -> Any:
            return fn(SimpleNamespace(header=lambda _r: SimpleNamespace(revision=self.revision)))

        def caught_up(self, run_id: str) -> bool:
            self.revision = 2  # the batch with the patch is stored while the lag is read
            return True

    async def main() -> None:
        await Service(ProjectorAppliesDuringTheLagCheck(), None)._reach("r", 2, 1.0)  # type: ignore[arg-type]

    asyncio.run(main())


def test_metrics_are_public_only_by_choice_where_tokens_are_needed(tmp_path: Path) -> None:
    from runstate.service.auth import add_token

    tokens = str(tmp_path / "tokens.json")
    add_token(tokens, "agent")
    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_TOKENS_FILE": tokens,
        "RUNSTATE_METRICS_PUBLIC": "true",
    }
    with serving(env, tmp_path) as proc:
        assert httpx.get(proc.url + "/metrics").status_code == 200
        assert httpx.get(proc.url + "/runs").status_code == 401  # only the metrics were made public


def test_the_bound_on_requests_in_flight_follows_the_patches_latency(tmp_path: Path) -> None:
    """With a target no patch can meet (``RUNSTATE_ADMIT_TARGET_MS=0.01``), an instance's
    bound shrinks from RUNSTATE_MAX_IN_FLIGHT as its patches are answered, and /metrics
    says where it is; with the target at 0 it stays."""
    import re

    def limit_after_a_second_of_patches(target_ms: str, where: Path) -> float:
        where.mkdir()
        env = {**embedded_env(where), "RUNSTATE_MAX_IN_FLIGHT": "64", "RUNSTATE_ADMIT_TARGET_MS": target_ms}
        with serving(env, where) as proc, Client(proc.url) as rs:
            rs.submit("r", {"expected_revision": 0, "events": [start()]})
            deadline, i = time.monotonic() + 1.0, 0
            while time.monotonic() < deadline:
                i += 1
                assert rs.submit("r", {"expected_revision": i, "events": [fact(f"f{i}")]}).revision == i + 1
            found = re.search(r"^runstate_http_in_flight_limit (\S+)$", httpx.get(proc.url + "/metrics").text, re.M)
            assert found is not None
            return float(found.group(1))

    assert limit_after_a_second_of_patches("0.01", tmp_path / "target") < 64
    assert limit_after_a_second_of_patches("0", tmp_path / "fixed") == 64


def test_an_overloaded_instance_sheds_at_once_fairly_and_health_and_metrics_still_answer(tmp_path: Path) -> None:
    """RUNSTATE_MAX_IN_FLIGHT=4: requests that hold their slot (a patch whose body is slow
    to come) fill it; the next is answered 429 with Retry-After at once; from then on a
    caller holds at most its share (3), so that a slot its own requests free goes to the
    other; health, readiness and metrics answer; and the client sends a shed request again
    until it is served. A caller alone takes every slot."""
    import threading
    import time

    from runstate.client import Client
    from runstate.service.auth import add_token

    tokens = tmp_path / "tokens.json"
    a, b, c = (add_token(str(tokens), name, "write") for name in ("a", "b", "c"))
    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_TOKENS_FILE": str(tokens),
        "RUNSTATE_MAX_IN_FLIGHT": "4",
        "RUNSTATE_METRICS_PUBLIC": "true",
    }
    proc = ServeProcess(env, tmp_path)
    try:
        proc.wait_ready()
        with Client(proc.url, a) as rs:
            rs.submit("busy", {"expected_revision": 0, "events": [start()]})

        def hold(token: str, seconds: float) -> None:  # a patch whose body takes that long: its slot is held
            import socket

            with socket.create_connection(("127.0.0.1", proc.port)) as sock:
                sock.sendall(
                    f"POST /runs/busy/patches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
                )
                time.sleep(seconds)

        holders = [threading.Thread(target=hold, args=(a, 5)) for _ in range(3)]
        for t in holders:
            t.start()
        time.sleep(0.5)
        # a alone: its fourth request is served (nobody else wants a slot)
        alone = httpx.get(proc.url + "/runs/busy", headers={"authorization": f"Bearer {a}"})
        assert alone.status_code == 200, alone.text
        other = threading.Thread(target=hold, args=(b, 1.5))  # the last slot
        other.start()
        time.sleep(0.5)
        started = time.monotonic()
        full = httpx.get(proc.url + "/runs/busy", headers={"authorization": f"Bearer {c}"})
        assert full.status_code == 429 and full.headers["retry-after"] == "1", full.text
        assert full.json()["error"]["code"] == "overloaded" and time.monotonic() - started < 0.5
        assert "RUNSTATE_MAX_IN_FLIGHT" in full.text and full.headers["retry-after-ms"] == "100", full.text
        other.join()  # b's slot is free again; c was refused a moment ago: a's share binds
        mine = httpx.get(proc.url + "/runs/busy", headers={"authorization": f"Bearer {a}"})
        assert mine.status_code == 429 and "already has 3 requests" in mine.text, mine.text
        for path in ("/healthz", "/readyz", "/metrics"):
            assert httpx.get(proc.url + path, timeout=2).status_code == 200, path
        metrics = httpx.get(proc.url + "/metrics").text
        assert 'runstate_http_shed_total{reason="caller"} 1.0' in metrics
        assert 'runstate_http_shed_total{reason="limit"} 1.0' in metrics
        assert "runstate_http_in_flight 3.0" in metrics
        with Client(proc.url, c, retry_s=15) as rs:  # the free slot is c's
            assert rs.state("busy").revision == 1
        for t in holders:
            t.join()
        assert "Traceback" not in proc.log()
    finally:
        proc.stop()


def test_the_decision_feed_decodes_only_the_runs_a_request_here_waits_for(tmp_path: Path) -> None:
    """Every instance follows the decisions topic; it decodes (and checks) only the records
    of runs a request of its own waits on, and a waiter registers before its patch is
    appended, so none it waits for passes unseen."""
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.producers.decisions import DecisionFeed
    from runstate.schemas.codec import encode_decision
    from runstate.service.node import Hub

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    out = log.producer()
    decided = Decision.model_validate(
        {
            "patch_id": "p1",
            "run_id": "mine",
            "outcome": "accepted",
            "revision": 1,
            "expected_revision": 0,
            "partition": 0,
            "offset": 0,
            "agent_id": "a",
            "agent_version": "1",
            "event_types": ["RunStarted"],
            "created_at": "2026-01-01T00:00:00Z",
        }
    )
    out.append(log.topics.decisions, "other", b"not a decision at all")  # never decoded: nobody waits on it
    out.append(log.topics.decisions, "mine", encode_decision(decided))
    out.flush(10)

    async def main() -> None:
        hub = Hub()
        assert not hub.follows("mine")
        waiting = hub.expect("mine", "p1")
        assert hub.follows("mine") and not hub.follows("other")
        feed = DecisionFeed(log, {0: 0})
        got = feed.poll(1.0, wanted=hub.follows)
        assert [d.patch_id for d in got] == ["p1"]
        hub.publish(got, False)
        assert (await waiting).revision == 1 and not hub.follows("mine")
        again = hub.expect("mine", "p2")
        hub.forget("mine", "p2", again)
        assert not hub.follows("mine")
        q = hub.subscribe("other")
        assert hub.follows("other")
        hub.unsubscribe("other", q)
        feed.close()

    asyncio.run(main())
    out.close()
    log.close()


def test_the_instances_threads_carry_their_names_in_the_kernel(served: Served) -> None:
    """``top -H``, ``ps -L`` and the bench's CPU per thread tell the projector, the
    snapshotter and the appender apart."""
    tasks = Path(f"/proc/{served.proc.proc.pid}/task")
    names = {(t / "comm").read_text().strip() for t in tasks.iterdir()}
    assert {"rs-projector", "rs-snapshotter", "rs-appender"} <= names, names


def test_the_map_of_owners_names_no_other_instance_on_the_embedded_log_and_a_routing_client_works(
    served: Served,
) -> None:
    """One instance owns every partition: ``GET /partitions`` names none, and a client with
    ``route=True`` sends everything to its URL."""
    with served.client() as rs:
        body = httpx.get(rs.url + "/partitions", headers=rs.headers).json()
        assert body == {"partitions": 4, "owners": {}}, body
    with Client(served.url, served.tokens["planner"], route=True) as routed:
        started(routed, "routed-1")
        assert routed.state("routed-1").revision == 1


def test_an_instance_generates_its_patch_writer_before_it_serves(tmp_path: Path) -> None:
    """Generating the current schema's writer holds the GIL for tens of milliseconds: paid
    by the first request on the event loop, it queued every request behind it (the first
    second after a start had a p99 ten times the steady one). A Node makes it when it is
    built, before uvicorn accepts a connection; the first patch encoded compiles nothing."""
    code = f"""
from runstate.schemas import avrofast, codec
from runstate.service.node import Node
from runstate.settings import Settings
print("before:", codec._current_encoder is None)
node = Node(Settings(log={str(tmp_path / "log.db")!r}, state_dir={str(tmp_path / "state")!r}), "http://127.0.0.1:1")
print("made:", codec._current_encoder is not None)
compiled = []
for name in ("compile_schema", "compile_object_writer"):
    real = getattr(avrofast, name)
    setattr(avrofast, name, lambda *a, real=real, **k: compiled.append(a) or real(*a, **k))
started = {{"type": "RunStarted", "goal": {{"statement": "g"}}}}
patch = node.producer.build("r", {{"expected_revision": 0, "events": [started]}})
node.producer.encode(patch)
print("compiled at the first encode:", len(compiled))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before: True", "made: True", "compiled at the first encode: 0"]


def _started(run_id: str) -> dict[str, Any]:
    return {
        "patch_id": f"{run_id}-start",
        "expected_revision": 0,
        "author": {"agent_id": "a", "agent_version": "1"},
        "created_at": "2026-12-07T00:00:00Z",
        "events": [{"type": "RunStarted", "goal": {"statement": run_id}}],
    }


def test_a_request_waiting_while_its_partition_is_restored_gets_the_restored_decision(tmp_path: Path) -> None:
    """A serve starting on a state directory it must restore takes decisions from the
    checkpoints, and replays what they hold as duplicates: neither tells a waiting request
    (a patch appended as the serve started, which the snapshotter checkpointed first). Once
    the partition is restored, a request waiting for a patch it holds gets its decision,
    rather than waiting out its wait (as a put did in LangGraph.js's suite, run under load)."""
    env = embedded_env(tmp_path)
    with serving(env, tmp_path) as first, httpx.Client(timeout=30) as c:
        for i in range(20):
            assert c.post(f"{first.url}/runs/r{i}/patches", params={"wait": 10}, json=_started(f"r{i}")).is_success

        # The run's start is a checkpoint boundary: wait until the snapshotter took them all.
        def checkpointed(run_id: str) -> bool:
            r = c.get(f"{first.url}/runs/{run_id}/checkpoints")
            return r.status_code == 200 and len(r.json()) > 0

        deadline = time.monotonic() + 30
        while not all(checkpointed(f"r{i}") for i in range(20)):
            assert time.monotonic() < deadline, "the snapshotter did not checkpoint every run start in 30 s"
            time.sleep(0.1)
    shutil.rmtree(tmp_path / "state")  # a new machine: the next instance restores every partition
    out = await_on_start(env, "r7", "r7-start", 20)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "answered: accepted r7-start", out.stdout + out.stderr[-2000:]


def test_a_request_given_up_on_while_its_patch_is_appended_leaves_the_instance_serving(tmp_path: Path) -> None:
    """A request cancelled while its patch waits for the appender (an MCP client's
    cancellation, a shutdown's deadline) cancels the future the appender answers. Answering
    a cancelled future raises, and it raised in the appender's thread: the instance's
    appender died and the instance stopped serving. A patch given up on before it is
    appended is not appended; the appender goes on with the others."""
    code = f"""
import asyncio
from runstate.service.node import Node
from runstate.settings import Settings

node = Node(Settings(log={str(tmp_path / "log.db")!r}, state_dir={str(tmp_path / "state")!r}), "http://127.0.0.1:1")

def encoded(run_id):
    started = {{"type": "RunStarted", "goal": {{"statement": run_id}}}}
    patch = node.producer.build(run_id, {{"expected_revision": 0, "events": [started]}})
    return patch, node.producer.encode(patch)

async def main():
    node.start(asyncio.get_running_loop())
    given_up = []
    for i in range(50):
        f = node.append(*encoded(f"r{{i}}"))
        given_up.append(f.cancel())
    try:
        receipt = await asyncio.wait_for(asyncio.wrap_future(node.append(*encoded("after"))), 20)
        print("after:", receipt.offset >= 0)
    except TimeoutError:
        print("after: no receipt in 20 s")
    print("cancelled:", sum(given_up) > 0)
    print("failed:", node.health.failed)
    node.stop()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["after: True", "cancelled: True", "failed: None"], (
        out.stdout + out.stderr[-3000:]
    )


def test_requests_waiting_on_an_instance_whose_projector_died_are_told_at_once_to_send_again(tmp_path: Path) -> None:
    """An instance whose projector thread dies stops serving. The requests waiting there for
    a decision (their patches appended: durable, decided by whoever projects the partition
    next) waited out the shutdown's grace and were cancelled, a 500 that says nothing. They
    are answered 503 at once, with why and Retry-After, as when a partition's owner moves:
    the clients send the patch again with its id, and a resend is decided once."""
    flag = tmp_path / "fail-now"
    prelude = f"""
import os
from runstate.projector.runtime.loop import Projector
real = Projector.process
def process(self, records):
    if os.path.exists({str(flag)!r}):
        raise RuntimeError("injected: the projector fails")
    return real(self, records)
Projector.process = process
"""
    serve = ServeProcess(embedded_env(tmp_path), tmp_path, prelude=prelude)
    try:
        serve.wait_ready()
        with httpx.Client(timeout=60) as c:
            assert c.post(f"{serve.url}/runs/r1/patches", params={"wait": 10}, json=_started("r1")).is_success
            flag.touch()
            resp = c.post(f"{serve.url}/runs/r2/patches", params={"wait": 30}, json=_started("r2"))
        assert resp.status_code == 503, (resp.status_code, resp.text, serve.log())
        assert resp.headers["retry-after"] == "1"
        error = resp.json()["error"]
        assert error["code"] == "unavailable"
        assert "injected: the projector fails" in error["message"] and "same patch_id" in error["message"], error
        assert serve.proc.wait(60) == 1, serve.log()
    finally:
        serve.stop()


def test_an_embedded_instance_not_yet_open_says_it_is_starting_not_that_another_owns_the_run(tmp_path: Path) -> None:
    """The embedded log has one projector: before it has opened a partition (the instance
    is starting), no other instance owns it, and the answer (a 503 the clients retry)
    says so."""
    code = f"""
from runstate.service.node import Node, NotOwner
from runstate.settings import Settings
node = Node(Settings(log={str(tmp_path / "log.db")!r}, state_dir={str(tmp_path / "state")!r}), "http://127.0.0.1:1")
try:
    node.read("r", lambda st: None)
except NotOwner as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "another instance" not in line and "starting" in line, line
