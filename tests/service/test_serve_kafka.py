"""Two `runstate serve` instances on Kafka (6 partitions, separate state directories, as on
two machines): any instance answers for any run, decisions reach a waiter on either, and
when one is SIGKILLed the other takes its partitions over while a client keeps going."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from helpers import fact, start
from servekit import ServeProcess, await_on_start

from runstate.client import Client
from runstate.eventlog.base import TopicNames
from runstate.eventlog.partitioner import partition_for
from runstate.eventlog.kafka import KafkaLog
from runstate.projector.read.replay import verify
from runstate.schemas.errors import DecisionTimeout
from runstate.schemas.patch import Decision

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
#: Shared by the instances of one deployment (runstate keys generate).
INSTANCE_SECRET = "7" * 64


def kenv(bootstrap: str, topics: TopicNames, state: Path) -> dict[str, str]:
    return {
        "RUNSTATE_LOG": f"kafka://{bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(state),
        "RUNSTATE_CHECKPOINT_EVERY": "5",
        "RUNSTATE_INSTANCE_SECRET": INSTANCE_SECRET,
    }


def owned(url: str) -> list[int]:
    try:
        return list(httpx.get(url + "/healthz", timeout=2).json()["owned_partitions"])
    except httpx.HTTPError:
        return []


def submit(rs: Client, run_id: str, draft: dict[str, object]) -> Decision:
    try:
        return rs.submit(run_id, draft, timeout_s=10)
    except DecisionTimeout as e:  # decided while the partition moved: ask again
        return rs.wait(run_id, e.patch_id, 60)


def test_any_instance_answers_and_the_survivor_takes_over(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(6)
    a = ServeProcess(kenv(kafka_bootstrap, kafka_topics, tmp_path / "a"), tmp_path)
    b = ServeProcess(kenv(kafka_bootstrap, kafka_topics, tmp_path / "b"), tmp_path)
    try:
        a.wait_ready(owned=False)
        b.wait_ready(owned=False)
        deadline = time.monotonic() + 60
        while not (owned(a.url) and owned(b.url) and sorted(owned(a.url) + owned(b.url)) == list(range(6))):
            assert time.monotonic() < deadline, (owned(a.url), owned(b.url))
            time.sleep(0.3)
        runs = [f"run_{i}" for i in range(12)]
        seen: dict[str, int] = {}  # the newest revision this client saw decided, per run
        clients = {"a": Client(a.url, retry_s=60), "b": Client(b.url, retry_s=60)}

        def step(writer: str, reader: str, run_id: str) -> None:
            rev = seen.get(run_id, 0)
            draft = {"expected_revision": rev, "events": [start() if rev == 0 else fact(f"f{rev}")]}
            d = submit(clients[writer], run_id, draft)
            assert d.outcome == "accepted" and d.revision == rev + 1, d
            seen[run_id] = d.revision
            # read through the other instance: never older than what this client saw
            state = clients[reader].state(run_id, min_revision=seen[run_id])
            assert state.revision >= seen[run_id]

        # both instances answer for every run: each owns some partitions, forwards the rest
        for i in range(3):
            for n, run_id in enumerate(runs):
                step("a" if (n + i) % 2 else "b", "b" if (n + i) % 2 else "a", run_id)
        # a list asks every instance for the runs of the partitions it owns, through either
        for c in clients.values():
            assert [h.run_id for h in c.runs()] == sorted(runs)
            assert [(h.run_id, h.revision) for h in c.runs(status="running")] == sorted((r, seen[r]) for r in runs)
            assert c.runs(status="completed") == []
        # what the audit pages read, through either instance: a page of runs, a page of a
        # run's history (forwarded to its owner), the dead letters of every partition
        for url in (a.url, b.url):
            assert httpx.get(url + "/ui/runs/run_3", timeout=10).status_code == 200
            page = httpx.get(url + "/runs", params={"after": "run_1", "limit": 3}, timeout=30)
            assert [h["run_id"] for h in page.json()] == ["run_10", "run_11", "run_2"]
            assert page.headers["x-total-count"] == "12" and page.headers["x-next-after"] == "run_2"
            # by latest activity (the runs were last written run_0 … run_11), merged from both
            recent = httpx.get(url + "/runs", params={"order": "recent", "limit": 3}, timeout=30)
            assert [h["run_id"] for h in recent.json()] == ["run_11", "run_10", "run_9"]
            later = httpx.get(
                url + "/runs",
                params={"order": "recent", "limit": 3, "after": recent.headers["x-next-after"]},
                timeout=30,
            )
            assert [h["run_id"] for h in later.json()] == ["run_8", "run_7", "run_6"]
            hist = httpx.get(url + "/runs/run_3/history", params={"start": 1, "limit": 1}, timeout=30)
            assert [d["revision"] for d in hist.json()] == [2] and hist.headers["x-total-count"] == "3"
            assert httpx.get(url + "/deadletters", timeout=30).json() == []
        # Ids that are not URL-safe, written through one instance and read through the other
        # (forwarded with their percent-encoding intact): each its own run, run_3 untouched.
        odd = ["thread/../run_3", "café #1", "run_3/context", "100% ?x=1", "..", "slack/C1/17.1"]
        for n, run_id in enumerate(odd):
            w, r = ("a", "b") if n % 2 else ("b", "a")
            d = submit(clients[w], run_id, {"expected_revision": 0, "events": [start(run_id)]})
            assert (d.run_id, d.revision) == (run_id, 1), d
            assert clients[r].state(run_id, min_revision=1).goal.statement == run_id  # type: ignore[union-attr]
            assert [h.run_id for h in clients[r].history(run_id)] == [run_id]
        assert clients["a"].state("run_3").revision == seen["run_3"]
        assert sorted(h.run_id for h in clients["b"].runs()) == sorted(runs + odd)
        a_parts = owned(a.url)
        assert a_parts, "a owns partitions before it dies"
        foreign = [r for r in runs if partition_for(r, 6) not in a_parts]
        assert foreign and len(foreign) < len(runs)  # a answered some runs by forwarding them to b
        killed_at = time.monotonic()
        a.kill()
        # the survivor answers for every run while the group notices and it restores a's
        # partitions (checkpoints + tail): the client retries 503s; nothing goes backwards
        for i in range(3):
            for run_id in runs:
                step("b", "b", run_id)
                assert clients["b"].state(run_id).revision >= seen[run_id]
        print(f"takeover: 3 rounds on the survivor in {time.monotonic() - killed_at:.1f}s")
        assert sorted(owned(b.url)) == list(range(6))
        for run_id in runs:
            assert clients["b"].state(run_id).revision == seen[run_id] == 6
            assert [d.revision for d in clients["b"].history(run_id) if d.outcome == "accepted"][-1] == 6
        assert sorted(h.run_id for h in clients["b"].runs()) == sorted(runs + odd)
        for c in clients.values():
            c.close()
    finally:
        a.kill()
        code = b.stop()
    assert code == 0, b.log()
    report = verify(log, str(tmp_path / "b"))
    assert report.ok, report.mismatches[:3]
    log.close()
    assert os.path.exists(tmp_path / "b" / "layout.json")


def test_on_kafka_a_request_waiting_while_its_partition_is_restored_gets_the_restored_decision(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    """As ``test_serve.py``'s test of the same name, on Kafka, where a take-over restores
    the same way: an instance on a new machine restores every partition from the
    checkpoints, and a request waiting for a patch the checkpoints hold is answered once
    its partition is assigned, not after its wait (the decision feed does not carry a
    decision taken from a checkpoint)."""
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(6)
    env = kenv(kafka_bootstrap, kafka_topics, tmp_path / "a")
    first = ServeProcess(env, tmp_path)
    try:
        first.wait_ready()
        rs = Client(first.url, retry_s=60)
        for i in range(12):
            draft = {"patch_id": f"r{i}-start", "expected_revision": 0, "events": [start()]}
            assert submit(rs, f"r{i}", draft).revision == 1
        # The run's start is a checkpoint boundary: wait until the snapshotter took them all.
        deadline = time.monotonic() + 60
        while not all(httpx.get(f"{first.url}/runs/r{i}/checkpoints", timeout=10).json() for i in range(12)):
            assert time.monotonic() < deadline, "the snapshotter did not checkpoint every run start in 60 s"
            time.sleep(0.2)
        rs.close()
    finally:
        code = first.stop()
    assert code == 0, first.log()
    out = await_on_start({**env, "RUNSTATE_STATE_DIR": str(tmp_path / "b")}, "r7", "r7-start", 40)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "answered: accepted r7-start", out.stdout + out.stderr[-2000:]
    log.close()
