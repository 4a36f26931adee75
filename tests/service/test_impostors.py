"""Impostors: a client the broker admits is not an instance of runstate.

A forged decision appended to the decisions topic is never heard by a waiter, and a
plain Kafka consumer that joins the projector's group under a serve instance's client id
gets no client's token, no patch and no say in any answer: instances prove the shared
instance secret to each other (eventlog/instancekey.py)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import fact, start, embedded_env

from runstate import app
from runstate.client import Client
from runstate.eventlog.instancekey import InstanceKeys
from runstate.producers.decisions import DecisionFeed
from runstate.schemas.codec import encode_decision
from runstate.schemas.errors import DecisionTimeout
from runstate.schemas.patch import Decision
from runstate.settings import Settings

SECRET = "5" * 64


def forged(run_id: str, patch_id: str, partition: int) -> Decision:
    return Decision(
        patch_id=patch_id,
        run_id=run_id,
        outcome="rejected",
        revision=0,
        expected_revision=0,
        reason="invalid",
        rule="forged",
        message="an impostor's decision",
        partition=partition,
        offset=0,
        agent_id="impostor",
        agent_version="1",
        event_types=["RunStarted"],
        created_at=datetime.now(UTC),
    )


def test_a_decision_forged_on_the_decisions_topic_is_never_heard(tmp_path: Path) -> None:
    """A writer waiting on the decisions topic ignores a decision no projector signed, and
    hears the projector's own; a feed without the secret (today's default) hears both."""
    s = Settings(
        log=str(tmp_path / "log.db"),
        state_dir=str(tmp_path / "state"),
        partitions=2,
        publish_decisions=True,
        instance_secret=SECRET,
    )
    producer = app.make_producer(s)  # follows the decisions topic from here on
    patch = producer.build("r1", {"patch_id": "p1", "expected_revision": 0, "events": [start()]})
    log = app.open_settings_log(s)
    out = log.producer()
    part = log.partitions(log.topics.decisions)
    from runstate.eventlog.partitioner import partition_for

    out.append(log.topics.decisions, "r1", encode_decision(forged("r1", "p1", partition_for("r1", part))))
    out.flush(10)
    with pytest.raises(DecisionTimeout):
        producer.submit(patch, timeout_s=1.5)  # nobody decided it: the forgery is not heard
    app.project(s, until_caught_up=True)
    heard = DecisionFeed(log, {p: 0 for p in range(part)}, keys=InstanceKeys.parse(SECRET))
    assert [(d.patch_id, d.outcome) for d in heard.poll(2.0)] == [("p1", "accepted")]
    naive = DecisionFeed(log, {p: 0 for p in range(part)})
    assert [(d.patch_id, d.outcome) for d in naive.poll(2.0)] == [("p1", "rejected"), ("p1", "accepted")]
    assert heard.ignored == 1
    for c in (heard, naive, producer, out, log):
        c.close()


class _Impostor(BaseHTTPRequestHandler):
    """Answers every request as a serve instance would if it had decided the patch."""

    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        _Impostor.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        data: dict[str, Any] = json.loads(body) if body else {}
        run_id = self.path.split("/")[2] if self.path.startswith("/runs/") else "x"
        out = json.dumps(
            {
                "status": "decided",
                "patch_id": data.get("patch_id", "p"),
                "run_id": run_id,
                "decision": json.loads(forged(run_id, data.get("patch_id", "p"), 0).model_dump_json()),
                "proof": "0:00",
                "me": "http://127.0.0.1:1",
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *_a: Any) -> None:
        pass


@pytest.mark.kafka
@pytest.mark.slow
def test_an_impostor_in_the_projector_group_gets_no_token_no_patch_and_no_say(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """A plain Kafka consumer joins the projector's group as ``runstate-serve|<its URL>`` and
    is given partitions. The serve instance never forwards to it (it cannot answer the
    challenge bound to its address): the impostor sees no Authorization header and no patch,
    the client hears no forged decision, only 503s for the partitions the impostor holds;
    once it leaves, the same patches are decided by the instance."""
    import confluent_kafka
    import httpx
    from servekit import ServeProcess, free_port

    from runstate.eventlog.kafka import KafkaLog
    from runstate.eventlog.partitioner import partition_for

    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(4)
    tokens = tmp_path / "tokens.json"
    from runstate.service.auth import add_token

    token = add_token(str(tokens), "agent-1", "write")
    port = free_port()
    _Impostor.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", port), _Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    group = f"g-{kafka_topics.events}"
    impostor = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "client.id": f"runstate-serve|http://127.0.0.1:{port}",
            "enable.auto.commit": False,
        }
    )
    impostor.subscribe([kafka_topics.events])
    held: set[int] = set()
    stop = threading.Event()

    def keep_polling() -> None:
        while not stop.is_set():
            impostor.poll(0.1)
            held.clear()
            held.update(tp.partition for tp in impostor.assignment())

    poller = threading.Thread(target=keep_polling, daemon=True)
    poller.start()
    env = {
        "RUNSTATE_LOG": f"kafka://{kafka_bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": kafka_topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(tmp_path / "a"),
        "RUNSTATE_GROUP_ID": group,
        "RUNSTATE_TOKENS_FILE": str(tokens),
        "RUNSTATE_INSTANCE_SECRET": SECRET,
    }
    a = ServeProcess(env, tmp_path, "--host", "127.0.0.1")
    try:
        a.wait_ready(owned=True)
        deadline = time.monotonic() + 60
        while not held or len(held) == 4:
            assert time.monotonic() < deadline, held
            time.sleep(0.2)
        theirs = [f"run_{i}" for i in range(40) if partition_for(f"run_{i}", 4) in held][:3]
        assert theirs
        auth = {"authorization": f"Bearer {token}"}

        def start_run(run_id: str) -> httpx.Response:
            """The run's first patch, sent to instance a (its resend: the same patch id)."""
            return httpx.post(
                f"{a.url}/runs/{run_id}/patches",
                params={"wait": "5"},
                headers=auth,
                timeout=30,
                json={"patch_id": f"{run_id}-p1", "expected_revision": 0, "events": [start()]},
            )

        for run_id in theirs:
            r = start_run(run_id)
            assert r.status_code == 503, r.text  # never the impostor's "decided"
        assert not any("authorization" in h for _m, _p, h, _b in _Impostor.seen), _Impostor.seen
        assert not any(p.startswith("/runs/") for _m, p, _h, _b in _Impostor.seen), _Impostor.seen
        # Nor is a client told to send a run's requests to it: the map names proven owners only.
        told = httpx.get(f"{a.url}/partitions", headers={"authorization": f"Bearer {token}"}, timeout=30)
        assert told.status_code in (200, 503), told.text
        if told.status_code == 200:
            assert f"127.0.0.1:{port}" not in told.text and not set(told.json()["owners"]) & {str(p) for p in held}
        # /metrics answers while the group rebalances around the impostor (it used to wait on
        # the consumer's handle while a partition was restored in the rebalance callback).
        metrics = httpx.get(a.url + "/metrics", headers=auth, timeout=10).text
        assert (
            'runstate_untrusted{source="peers"}' in metrics and 'runstate_untrusted{source="peers"} 0.0' not in metrics
        )
        stop.set()
        poller.join(5)
        impostor.close()
        deadline = time.monotonic() + 60
        for run_id in theirs:
            while True:
                r = start_run(run_id)
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code == 200 and r.json()["decision"]["outcome"] == "accepted", r.text
        assert "Traceback" not in a.log(), a.log()
    finally:
        stop.set()
        a.stop()
        server.shutdown()
        log.close()


def test_a_forwarded_request_is_answered_only_when_an_instance_signed_it_for_this_address(tmp_path: Path) -> None:
    """What the owner checks (served on the embedded log, the check is the same): a request
    marked forwarded without a signature, signed with another secret, for another address,
    with another body, or sent twice is refused 401 and appends nothing; one signed by an
    instance is answered as the identity it carries (no token), and its answer is signed
    for the forwarder, which refuses an answer it cannot verify."""
    import asyncio

    import httpx
    from servekit import ServeProcess

    from runstate.service.auth import Identity
    from runstate.service.routing import FORWARDED, IDENTITY, SIGNED, ForwardError, Router, body_digest, identity_header

    tokens = tmp_path / "tokens.json"
    from runstate.service.auth import add_token

    add_token(str(tokens), "someone", "write")
    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_TOKENS_FILE": str(tokens),
        "RUNSTATE_INSTANCE_SECRET": SECRET,
    }
    proc = ServeProcess(env, tmp_path)
    agent = Identity(agent_id="planner", role="write")
    draft = {"patch_id": "p1", "expected_revision": 0, "events": [start()]}
    body = json.dumps(draft).encode()

    async def send(router: Router, url: str, data: bytes = body, who: Identity = agent) -> Any:
        try:
            return await router.forward(
                url, "POST", "/runs/r1/patches", [("wait", "5")], {"content-type": "application/json"}, data, who=who
            )
        finally:
            await router.close()

    try:
        proc.wait_ready(owned=False)
        me = Router(None, "g", "http://127.0.0.1:1", InstanceKeys.parse(SECRET))  # type: ignore[arg-type]
        other = Router(None, "g", "http://127.0.0.1:1", InstanceKeys.parse("6" * 64))  # type: ignore[arg-type]
        bare = httpx.post(proc.url + "/runs/r1/patches", content=body, headers={FORWARDED: "http://x"})
        assert bare.status_code == 401, bare.text
        with pytest.raises(ForwardError, match="did not prove"):
            asyncio.run(send(other, proc.url))
        # The challenge is bound to the address asked; so is each request: one signed for
        # another address (the challenge skipped) is refused by the owner, and its unsigned
        # refusal by the forwarder.
        wrong = proc.url.replace("127.0.0.1", "localhost")
        with pytest.raises(ForwardError, match="did not prove"):
            asyncio.run(send(me, wrong))
        me._proved[wrong] = time.monotonic() + 30
        with pytest.raises(ForwardError, match="answered 401 without the owner's signature"):
            asyncio.run(send(me, wrong))

        # Captured on the way and replayed, or with its body changed: refused.
        captured: dict[str, str] = {}

        async def capture() -> Any:
            import aiohttp

            real = aiohttp.ClientSession._request

            async def spy(self: Any, method: str, url: Any, **kw: Any) -> Any:
                if "patches" in str(url):
                    captured.update(kw.get("headers") or {})
                return await real(self, method, url, **kw)

            aiohttp.ClientSession._request = spy  # type: ignore[method-assign]
            try:
                return await send(me, proc.url)
            finally:
                aiohttp.ClientSession._request = real  # type: ignore[method-assign]

        first = asyncio.run(capture())
        assert first.status_code == 200, first.content
        decided = json.loads(first.content)["decision"]
        assert decided["outcome"] == "accepted" and decided["agent_id"] == "planner"  # the identity it carried
        again = httpx.post(proc.url + "/runs/r1/patches", params={"wait": "5"}, content=body, headers=captured)
        assert again.status_code == 401 and "replayed" in again.text, again.text
        # Signed afresh for one body, sent with another.
        keys, ident, ts, nonce = InstanceKeys.parse(SECRET), identity_header(agent), str(int(time.time())), "n" * 32
        digest = body_digest(body)
        sig = keys.sign("request", proc.url, "POST", "/runs/r1/patches", "wait=5", ident, ts, nonce, digest)
        fresh = {
            FORWARDED: "http://127.0.0.1:1",
            IDENTITY: ident,
            SIGNED: f"{ts};{nonce};{sig}",
            "x-runstate-body-sha256": digest,
            "content-type": "application/json",
        }
        other_body = json.dumps({**draft, "patch_id": "p2"}).encode()
        changed = httpx.post(proc.url + "/runs/r1/patches", params={"wait": "5"}, content=other_body, headers=fresh)
        assert changed.status_code == 401 and "body" in changed.text, changed.text
        forged_who = httpx.post(
            proc.url + "/runs/r1/patches",
            params={"wait": "5"},
            content=body,
            headers={**captured, IDENTITY: identity_header(Identity("root", "write", trusted=True))},
        )
        assert forged_who.status_code == 401, forged_who.text
        # A read-only identity forwarded is held to it at the owner.
        reader = asyncio.run(
            send(
                me, proc.url, json.dumps({**draft, "patch_id": "p3"}).encode(), Identity(agent_id="viewer", role="read")
            )
        )
        assert reader.status_code == 403, reader.content
        history = httpx.get(proc.url + "/runs/r1/history", headers={"authorization": "Bearer x"})
        assert history.status_code == 401  # tokens still hold for everyone else
        metrics = httpx.get(proc.url + "/metrics", headers={"authorization": "Bearer x"})
        assert metrics.status_code == 401
        assert "Traceback" not in proc.log(), proc.log()
    finally:
        proc.stop()


@pytest.mark.kafka
@pytest.mark.slow
def test_two_instances_forward_the_callers_identity_never_its_token(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """With tokens on two instances sharing the secret: a write sent to the instance that
    does not own the run is decided as the token's agent, a read-only token's write is 403
    at the owner, and so is an erase without the erase scope."""
    import httpx
    from servekit import ServeProcess

    from runstate.eventlog.kafka import KafkaLog
    from runstate.eventlog.partitioner import partition_for
    from runstate.service.auth import add_token

    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(4)
    tokens = tmp_path / "tokens.json"
    writer = add_token(str(tokens), "agent-1", "write")
    reader = add_token(str(tokens), "viewer", "read")
    group = f"g2-{kafka_topics.events}"
    base = {
        "RUNSTATE_LOG": f"kafka://{kafka_bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": kafka_topics.events.rsplit(".", 1)[0],
        "RUNSTATE_GROUP_ID": group,
        "RUNSTATE_TOKENS_FILE": str(tokens),
        "RUNSTATE_INSTANCE_SECRET": SECRET,
    }
    a = ServeProcess({**base, "RUNSTATE_STATE_DIR": str(tmp_path / "a")}, tmp_path)
    b = ServeProcess({**base, "RUNSTATE_STATE_DIR": str(tmp_path / "b")}, tmp_path)
    try:
        a.wait_ready(owned=False)
        b.wait_ready(owned=False)
        deadline = time.monotonic() + 60
        while True:
            owned = {u: httpx.get(u + "/healthz").json()["owned_partitions"] for u in (a.url, b.url)}
            if all(owned.values()) and sorted(owned[a.url] + owned[b.url]) == [0, 1, 2, 3]:
                break
            assert time.monotonic() < deadline, owned
            time.sleep(0.3)
        run_id = next(f"r{i}" for i in range(100) if partition_for(f"r{i}", 4) in owned[b.url])
        auth = {"authorization": f"Bearer {writer}"}
        draft = {"expected_revision": 0, "events": [start()]}
        deadline = time.monotonic() + 30
        while (
            r := httpx.post(f"{a.url}/runs/{run_id}/patches", params={"wait": 5}, headers=auth, json=draft, timeout=30)
        ).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert r.status_code == 200 and r.json()["decision"]["agent_id"] == "agent-1", r.text
        ro = httpx.post(
            f"{a.url}/runs/{run_id}/patches",
            params={"wait": 5},
            json={**draft, "expected_revision": 1},
            headers={"authorization": f"Bearer {reader}"},
            timeout=30,
        )
        assert ro.status_code == 403 and "read-only" in ro.text, ro.text
        er = httpx.delete(f"{a.url}/runs/{run_id}", params={"reason": "x"}, headers=auth, timeout=30)
        assert er.status_code == 403, er.text
        assert httpx.get(f"{a.url}/runs/{run_id}", headers=auth, timeout=30).json()["revision"] == 1
        # A routing client sends the run's requests to its owner: a never sees them.
        owners = httpx.get(f"{a.url}/partitions", headers=auth, timeout=30).json()
        assert owners["partitions"] == 4 and owners["owners"][str(partition_for(run_id, 4))] == b.url, owners

        def patches_seen(url: str) -> float:
            text = httpx.get(url + "/metrics", headers=auth, timeout=30).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('runstate_http_requests_total{route="/runs/{run_id}/patches"')
            )

        before = patches_seen(a.url)
        with Client(a.url, writer, route=True) as routed:
            d = routed.submit(run_id, {**draft, "expected_revision": 1, "events": [fact("f-routed")]})
            assert d.outcome == "accepted" and d.agent_id == "agent-1", d
            assert routed.state(run_id).revision == 2
        assert patches_seen(a.url) == before
        assert "Traceback" not in a.log() + b.log()
    finally:
        a.stop()
        b.stop()
        log.close()
