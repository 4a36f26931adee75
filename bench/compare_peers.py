"""runstate side by side with its peers, as separate processes, interleaved.

    .venv/bin/python bench/compare_peers.py            # 3 repeats of every figure
    .venv/bin/python bench/compare_peers.py --quick    # smaller data, 3 repeats (smoke run)
    .venv/bin/python bench/compare_peers.py --only append,rebuild --repeats 5
    .venv/bin/python bench/compare_peers.py --before ../older-worktree --quick   # runstate before / after

The peers run in a virtualenv of their own, ``.bench-peers/`` (created on first use:
``eventsourcing`` pins nothing of ours, but Quix Streams pins its own confluent-kafka and
pydantic, so they must not share runstate's). Every figure is measured by a fresh worker
process per sample, in the order A B, B A, A B, ... so that drift on this shared machine
falls on both sides; the report gives each side's median and range and the median of the
per-pair ratios.

Figures (each worker prints one JSON line):

- ``append`` — embedded append in batches of 500 patches (2 events each: a fact and a
  budget use) over 1,000 runs, durable on commit: runstate ``RunProducer.append_async``
  (validate + Avro encode; no receipt callback: a failed delivery is raised by ``flush``)
  on the embedded SQLite log, ``flush`` every 500; eventsourcing
  9.5: one ``Run`` aggregate per run, two events triggered per patch, ``app.save`` of the
  touched aggregates every 500 patches, on its SQLite store (WAL, the same synchronous
  level: FULL). Events per second.
- ``rebuild`` — one run of 1,000 events (500 patches of 2), checkpoint / snapshot every 50
  revisions / 100 versions (the same points): the state at the head (a checkpoint is
  there) and 48 events after the newest checkpoint before it. runstate ``state_at`` with
  the checkpoint history (the API behind ``runstate state --revision``), stores open, and
  ``state_data_at`` (the same state as plain JSON data, what serve sends for ``?revision=``);
  eventsourcing ``repository.get(id, version=...)`` from its snapshot. And the head by a
  full replay: runstate without the checkpoints, eventsourcing without snapshotting (goal:
  <= 1.0x). Milliseconds.
- ``query`` — ``Projection.state`` (the validated ``RunState``) and ``Projection.state_data``
  (the same document as plain JSON data) on a store of 10,000 runs (random runs, p50 /
  p99) against the floor: a RocksDB ``get`` of the same state's JSON document +
  ``orjson.loads`` (plain data too).
- the validated forms' lower bounds, measured in the same workers: pydantic alone
  (``RunState.model_validate_json``) validating the state the rebuild returns; the floor's
  ``get`` with its document validated instead of parsed. No validated rebuild or ``state``
  can take less, so where a bound's own ratio is above the goal, that goal cannot be met
  while the result is the pydantic ``RunState``.

Goals (issue 11): append >= 1.0x eventsourcing; rebuild from a checkpoint <= 2x
eventsourcing's from a snapshot, a full replay <= 1.0x its; state query <= 2x the floor at
p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit import fact_event

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".bench-peers"
#: The peers, and what importing runstate's codec needs besides what Quix brings (runstate
#: is installed there without its dependencies: Quix pins its own confluent-kafka and pydantic).
PEER_PACKAGES = ["eventsourcing==9.5.6", "quixstreams==3.28.1", "orjson", "fastavro", "msgspec"]

RUNS = 1_000
PATCHES_PER_COMMIT = 500


# -- shared workload ----------------------------------------------------------------------------


def budget_event() -> dict[str, Any]:
    return {"type": "BudgetConsumed", "tokens": 1}


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


# -- runstate workers ---------------------------------------------------------------------------


def rs_append(work: Path, patches: int) -> None:
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.producers.run_producer import RunProducer
    from runstate.schemas.patch import Author

    log = EmbeddedLog(work / "log.db", partitions=4)
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    for r in range(RUNS):  # the runs exist before the timed part, as the peer's aggregates do
        prod.append_async(
            prod.events(
                f"run_{r}",
                0,
                [
                    {
                        "type": "RunStarted",
                        "goal": {"statement": "bench"},
                        "policy": {"external_evidence_schemes": ["artifact"]},
                    }
                ],
            )
        )
    prod.flush()
    t = time.perf_counter()
    for i in range(patches):
        r = i % RUNS
        prod.append_async(prod.events(f"run_{r}", 1 + i // RUNS, [fact_event(i), budget_event()]))
        if (i + 1) % PATCHES_PER_COMMIT == 0:
            prod.flush()
    prod.flush()
    dt = time.perf_counter() - t
    prod.close()
    log.close()
    emit({"events_per_s": 2 * patches / dt})


def _rs_one_run_store(work: Path, patches: int) -> tuple[Any, Any, Any, int]:
    """One run of ``2 * patches`` events, projected, checkpointed every 50 revisions."""
    from runstate.app import open_settings_log
    from runstate.projector.runtime.loop import Projector
    from runstate.projector.read.queries import Projection
    from runstate.settings import Settings
    from runstate.snapshotter.history import CheckpointHistory
    from runstate.snapshotter.policy import CheckpointPolicy
    from runstate.snapshotter.loop import Snapshotter, snapshotter_dir
    from runstate.producers.run_producer import RunProducer
    from runstate.schemas.patch import Author

    settings = Settings(log=str(work / "log.db"), state_dir=str(work / "state"))
    log = open_settings_log(settings)
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    start = [
        {"type": "RunStarted", "goal": {"statement": "bench"}, "policy": {"external_evidence_schemes": ["artifact"]}}
    ]
    # RunStarted + 499 two-event patches + one more fact: 1,000 events, revision 500
    prod.append_async(prod.events("run_one", 0, start + [fact_event(0)]))
    for i in range(1, patches):
        prod.append_async(prod.events("run_one", i, [fact_event(i), budget_event()]))
    prod.close()
    Projector(log, settings.state_dir).run(until_caught_up=True, poll_timeout_s=0.01)
    snap = Snapshotter(log, settings.state_dir, policy=CheckpointPolicy(every=50, max_age=10**9))
    snap.run(until_caught_up=True)
    proj = Projection(settings.state_dir)
    hist = CheckpointHistory(snapshotter_dir(settings.state_dir))
    return log, proj, hist, patches


def rs_rebuild(work: Path, patches: int, samples: int) -> None:
    from runstate.projector.read.replay import state_at, state_data_at
    from runstate.schemas.state import RunState

    log, proj, hist, head = _rs_one_run_store(work, patches)
    nearest = hist.nearest_state_data
    behind = head - 50 + 24  # the checkpoint at head - 50, then 24 two-event patches: 48 events
    out = {}
    for form, rebuild in (("", state_at), ("data_", state_data_at)):
        # full_ms: the head again, without the checkpoints (a full replay of the run's log).
        for name, rev, near in (("head_ms", head, nearest), ("tail48_ms", behind, nearest), ("full_ms", head, None)):
            got = rebuild(log, proj, "run_one", rev, nearest=near)
            assert (got["revision"] if isinstance(got, dict) else got.revision) == rev
            lat = []
            for _ in range(samples if near is not None else max(5, samples // 5)):
                t = time.perf_counter()
                rebuild(log, proj, "run_one", rev, nearest=near)
                lat.append(time.perf_counter() - t)
            out[form + name] = statistics.median(lat) * 1e3
    # The validated form's lower bound: pydantic alone validating the state the rebuild
    # returns, from its JSON (no log, no store, no reducer).
    for name, rev in (("head_ms", head), ("tail48_ms", behind)):
        doc = state_at(log, proj, "run_one", rev, nearest=nearest).model_dump_json()
        lat = []
        for _ in range(samples):
            t = time.perf_counter()
            RunState.model_validate_json(doc)
            lat.append(time.perf_counter() - t)
        out["pydantic_" + name] = statistics.median(lat) * 1e3
    hist.close()
    proj.close()
    log.close()
    emit(out)


def rs_query(work: Path, runs: int, samples: int) -> None:
    import orjson
    from rocksdict import Options, Rdict

    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.producers.run_producer import RunProducer
    from runstate.projector.runtime.loop import Projector
    from runstate.projector.read.queries import Projection
    from runstate.schemas.patch import Author
    from runstate.schemas.state import RunState

    log = EmbeddedLog(work / "log.db", partitions=4)
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    for r in range(runs):
        prod.append_async(
            prod.events(
                f"run_{r}",
                0,
                [
                    {
                        "type": "RunStarted",
                        "goal": {"statement": f"goal {r}"},
                        "policy": {"external_evidence_schemes": ["artifact"]},
                    },
                    fact_event(2 * r),
                    fact_event(2 * r + 1),
                ],
            )
        )
    prod.close()
    Projector(log, str(work / "state")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    floor_db = Rdict(str(work / "floor"), Options(raw_mode=True))
    rng = random.Random(7)
    with Projection(work / "state") as proj:
        for r in range(runs):  # the floor: the same state as one JSON document per run
            floor_db[f"run_{r}".encode()] = proj.state(f"run_{r}").model_dump_json().encode()
        picks = [f"run_{rng.randrange(runs)}" for _ in range(samples)]
        for run in picks[:200]:
            proj.state(run)
        state_lat, data_lat, floor_lat, pydantic_lat = [], [], [], []
        for run in picks:
            t = time.perf_counter()
            proj.state(run)
            state_lat.append(time.perf_counter() - t)
            t = time.perf_counter()
            proj.state_data(run)
            data_lat.append(time.perf_counter() - t)
            k = run.encode()
            t = time.perf_counter()
            orjson.loads(floor_db[k])
            floor_lat.append(time.perf_counter() - t)
            # The floor of a validated state: the same get, validated instead of parsed (a
            # store holding the whole document under one key could do no better).
            t = time.perf_counter()
            RunState.model_validate_json(floor_db[k])
            pydantic_lat.append(time.perf_counter() - t)
    floor_db.close()
    emit(
        {
            "state_p50_ms": _q(state_lat, 0.5),
            "state_p99_ms": _q(state_lat, 0.99),
            "data_p50_ms": _q(data_lat, 0.5),
            "data_p99_ms": _q(data_lat, 0.99),
            "floor_p50_ms": _q(floor_lat, 0.5),
            "floor_p99_ms": _q(floor_lat, 0.99),
            "pydantic_p50_ms": _q(pydantic_lat, 0.5),
            "pydantic_p99_ms": _q(pydantic_lat, 0.99),
        }
    )


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


# -- eventsourcing workers (peer venv) -----------------------------------------------------------


def _es_app(work: Path, snapshot_every: int | None = None) -> Any:
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class Run(Aggregate):
        """The same state the workload builds: facts by id and a token count."""

        @event("Started")
        def __init__(self, goal: str) -> None:
            self.goal = goal
            self.facts: dict[str, dict[str, str]] = {}
            self.tokens = 0

        @event("FactConfirmed")
        def confirm(self, fact_id: str, statement: str, evidence: str) -> None:
            self.facts[fact_id] = {"statement": statement, "evidence": evidence}

        @event("BudgetConsumed")
        def consume(self, tokens: int) -> None:
            self.tokens += tokens

    class Runs(Application[Any]):
        pass

    if snapshot_every:
        Runs.snapshotting_intervals = {Run: snapshot_every}
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(work / "es.db")}
    app = Runs(env=env)
    return app, Run


def es_append(work: Path, patches: int) -> None:
    app, Run = _es_app(work)
    aggs = [Run(goal="bench") for _ in range(RUNS)]
    app.save(*aggs)
    t = time.perf_counter()
    touched: dict[int, Any] = {}
    for i in range(patches):
        r = i % RUNS
        f = fact_event(i)["fact"]
        aggs[r].confirm(f["id"], f["statement"], f["evidence"])
        aggs[r].consume(1)
        touched[r] = aggs[r]
        if (i + 1) % PATCHES_PER_COMMIT == 0:
            app.save(*touched.values())
            touched = {}
    if touched:
        app.save(*touched.values())
    dt = time.perf_counter() - t
    app.close()
    emit({"events_per_s": 2 * patches / dt})


def es_rebuild(work: Path, patches: int, samples: int) -> None:
    # Versions: 1 = Started (+ the first fact: 2), then 2 per patch. A snapshot every 100
    # versions is a checkpoint every 50 patches, the same points as runstate's.
    app, Run = _es_app(work, snapshot_every=100)
    agg = Run(goal="bench")
    f = fact_event(0)["fact"]
    agg.confirm(f["id"], f["statement"], f["evidence"])
    app.save(agg)
    for i in range(1, patches):
        f = fact_event(i)["fact"]
        agg.confirm(f["id"], f["statement"], f["evidence"])
        agg.consume(1)
        app.save(agg)
    head = agg.version
    assert head == 2 * patches, head
    assert head % 100 == 0  # the head has a snapshot, as runstate's head has a checkpoint
    behind = head - 100 + 48
    out = {}
    for name, version in (("head_ms", head), ("tail48_ms", behind)):
        assert app.repository.get(agg.id, version=version).version == version
        lat = []
        for _ in range(samples):
            t = time.perf_counter()
            app.repository.get(agg.id, version=version)
            lat.append(time.perf_counter() - t)
        out[name] = statistics.median(lat) * 1e3
    app.close()
    # A full replay: the same store read by an application without snapshotting.
    app, _ = _es_app(work)
    assert app.repository.get(agg.id).version == head
    lat = []
    for _ in range(max(5, samples // 5)):
        t = time.perf_counter()
        app.repository.get(agg.id)
        lat.append(time.perf_counter() - t)
    out["full_ms"] = statistics.median(lat) * 1e3
    app.close()
    emit(out)


# -- Kafka: projector and producer ---------------------------------------------------------------

KAFKA_RUNS = 1_000
KAFKA_PARTITIONS = 6


def _kafka_topics(prefix: str) -> Any:
    from runstate.eventlog.base import TopicNames

    return TopicNames.with_prefix(prefix)


def fill_topic(bootstrap: str, prefix: str, patches_per_run: int) -> int:
    """RunStarted (+ a fact) then ``patches_per_run - 1`` two-event patches per run, in
    round-robin order; returns the events written. Done once, read by every worker."""
    from runstate.eventlog.kafka import KafkaLog
    from runstate.producers.run_producer import RunProducer
    from runstate.schemas.patch import Author

    log = KafkaLog(bootstrap, topics=_kafka_topics(prefix))
    log.create_topics(KAFKA_PARTITIONS)
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    start = {
        "type": "RunStarted",
        "goal": {"statement": "bench"},
        "policy": {"external_evidence_schemes": ["artifact"]},
    }
    events = 0
    for k in range(patches_per_run):
        for r in range(KAFKA_RUNS):
            evs = [start, fact_event(0)] if k == 0 else [fact_event(k), budget_event()]
            prod.append_async(prod.events(f"run_{r}", k, evs))
            events += len(evs)
    assert prod.flush(120) == 0
    prod.close()
    log.close()
    return events


def _shortfall(log: Any, state_dir: Path, stats: Any, expected_events: int) -> str:
    """Why a projection fell short (once seen on a loaded machine: 20,997 of 21,000 records,
    60 rejected): the topic's record count beside what was projected, and the rejections by
    reason and rule."""
    from collections import Counter

    from runstate.projector.read.queries import Projection

    in_topic = sum(log.end_offsets(log.topics.events).values())
    reasons: Counter[str] = Counter()
    with Projection(str(state_dir)) as proj:
        for header in proj.runs():
            for d in proj.history(header.run_id):
                if d.outcome == "rejected":
                    reasons[f"{d.reason}/{d.rule}"] += 1
    return (
        f"projection short: {stats} against {expected_events} events expected; the events topic holds "
        f"{in_topic} records; rejected by reason/rule: {dict(reasons)}"
    )


def rs_kafka_project(work: Path, bootstrap: str, prefix: str, events: int) -> None:
    from runstate.eventlog.kafka import KafkaLog
    from runstate.projector.runtime.loop import Projector

    log = KafkaLog(bootstrap, topics=_kafka_topics(prefix))
    # As `runstate project` follows the log (the GC policy on); a group of its own per sample.
    pr = Projector(log, str(work / "state"), group_id=f"bench-{os.getpid()}", publish_dead_letters=False, tune_gc=True)
    pr.run(until_caught_up=True, poll_timeout_s=0.05)
    if not (pr.stats.events >= events and pr.stats.rejected == 0):
        raise SystemExit(_shortfall(log, work / "state", pr.stats, events))
    log.close()
    emit({"events_per_s": pr.stats.rate()})  # from the first batch: the group join is not counted


def qs_kafka_project(work: Path, bootstrap: str, prefix: str, events: int, validate: int) -> None:
    """Quix Streams doing the projector's work: decode the Avro record, (validate it with the
    same pydantic model,) drop a patch id seen before, check the revision against the run's
    state, apply the events (facts by id with the evidence-scheme check of the run's
    policy, a token count), keep the run's document and a decision per patch in Quix's
    RocksDB state; commit every 2,000 records (runstate's batch). Lighter than runstate's
    reducer (no provenance, item ids, history index or checkpoint triggers)."""
    from quixstreams import Application

    from runstate.schemas.codec import decode_raw
    from runstate.schemas.patch import Patch

    topics = _kafka_topics(prefix)
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"qs-{os.getpid()}",
        auto_offset_reset="earliest",
        state_dir=str(work / "qs"),
        commit_every=2000,
        loglevel="WARNING",
    )
    topic = app.topic(topics.events, value_deserializer="bytes", key_deserializer="str")
    seen = {"events": 0, "rejected": 0, "t0": 0.0, "t1": 0.0}

    def process(value: bytes, state: Any) -> None:
        if not seen["t0"]:
            seen["t0"] = time.perf_counter()
        raw = decode_raw(value)
        if validate:
            Patch.model_validate(raw)
        seen["events"] += len(raw["events"])
        pid = "p:" + raw["patch_id"]
        if state.get(pid) is None:  # else a resend: decided before
            decide(raw, pid, state)
        if seen["events"] >= events:
            seen["t1"] = time.perf_counter()
            app.stop()

    def decide(raw: dict[str, Any], pid: str, state: Any) -> None:
        doc = state.get("doc")
        revision = doc["revision"] if doc else 0
        outcome = "accepted"
        if raw["expected_revision"] != revision:
            outcome = "revision_conflict"
        else:
            schemes = next(
                (e["policy"]["external_evidence_schemes"] for e in raw["events"] if e["type"] == "RunStarted"),
                doc["schemes"] if doc else [],
            )
            # the rules first (nothing applied from a rejected patch), then the effects
            for e in raw["events"]:
                if e["type"] == "FactConfirmed":
                    evidence = e["fact"]["evidence"]
                    if not evidence or evidence.split("://", 1)[0] not in schemes:
                        outcome = "evidence"
            if outcome == "accepted":
                for e in raw["events"]:
                    kind = e["type"]
                    if kind == "RunStarted":
                        doc = {
                            "revision": 0,
                            "goal": e["goal"]["statement"],
                            "facts": {},
                            "tokens": 0,
                            "schemes": schemes,
                        }
                    elif kind == "FactConfirmed":
                        doc["facts"][e["fact"]["id"]] = {
                            "statement": e["fact"]["statement"],
                            "evidence": e["fact"]["evidence"],
                        }
                    elif kind == "BudgetConsumed":
                        doc["tokens"] += e["tokens"]
                doc["revision"] = revision + 1
                state.set("doc", doc)
        if outcome != "accepted":
            seen["rejected"] += 1
        state.set(
            pid,
            {
                "outcome": outcome,
                "revision": doc["revision"] if doc else 0,
                "expected": raw["expected_revision"],
                "agent": raw["author"]["agent_id"],
                "at": raw["created_at"],
            },
        )

    app.dataframe(topic).update(process, stateful=True)
    app.run()
    assert seen["rejected"] == 0 and seen["events"] >= events, seen
    emit({"events_per_s": seen["events"] / (seen["t1"] - seen["t0"])})


def rs_produce(work: Path, bootstrap: str, prefix: str, patches: int) -> None:
    """runstate's producer path: ``RunProducer.events`` (build + validate), Avro encode,
    ``append_async`` without a receipt callback (a failed delivery is raised by ``flush``),
    as the Quix producer below sends without one."""
    from runstate.eventlog.kafka import KafkaLog
    from runstate.producers.run_producer import RunProducer
    from runstate.schemas.patch import Author

    log = KafkaLog(bootstrap, topics=_kafka_topics(prefix))
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    for i in range(500):  # warm: connection, metadata, idempotent producer id
        prod.append_async(prod.events(f"w{i}", 0, [fact_event(i), budget_event()]))
    prod.flush(60)
    t = time.perf_counter()
    for i in range(patches):
        prod.append_async(prod.events(f"run_{i % KAFKA_RUNS}", i, [fact_event(i), budget_event()]))
    assert prod.flush(120) == 0
    dt = time.perf_counter() - t
    prod.close()
    log.close()
    emit({"us_per_patch": dt / patches * 1e6})


def qs_produce(work: Path, bootstrap: str, prefix: str, patches: int, validate: int) -> None:
    """Quix's serialise-and-produce path: the same draft validated with the same pydantic
    model (with ``validate``), JSON-serialised, produced with Quix's producer; without
    ``validate``, a pre-encoded record produced as is (the raw floor)."""
    import secrets
    from datetime import UTC, datetime

    from quixstreams import Application

    from runstate.schemas.patch import Author, Patch

    from runstate.eventlog.kafka import PRODUCER_DEFAULTS

    topics = _kafka_topics(prefix)
    # The same producer settings as runstate's (idempotent, acks=all, lz4, linger 5 ms):
    # the same durability and the same compression work.
    app = Application(broker_address=bootstrap, loglevel="WARNING", producer_extra_config=dict(PRODUCER_DEFAULTS))
    author = Author(agent_id="bench", agent_version="1")
    with app.get_producer() as producer:

        def send(i: int) -> None:
            key = f"run_{i % KAFKA_RUNS}"
            if validate:
                p = Patch(
                    patch_id=secrets.token_hex(16),
                    run_id=key,
                    expected_revision=i,
                    author=author,
                    created_at=datetime.now(UTC),
                    events=[fact_event(i), budget_event()],
                )
                value = p.model_dump_json().encode()
            else:
                value = b'{"raw": true}' * 20
            producer.produce(topic=topics.events, key=key.encode(), value=value)

        for i in range(500):
            send(i)
        producer.flush()
        t = time.perf_counter()
        for i in range(patches):
            send(i)
        producer.flush()
        dt = time.perf_counter() - t
    emit({"us_per_patch": dt / patches * 1e6})


def rs_scale(work: Path, runs: int, tail_patches: int) -> None:
    """The projector's rate on the same tail (``tail_patches`` two-event patches to random
    runs) after ``runs`` runs were projected: flat in the number of runs is the goal."""
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.producers.run_producer import RunProducer
    from runstate.projector.runtime.loop import Projector
    from runstate.schemas.patch import Author

    log = EmbeddedLog(work / "log.db", partitions=4)
    prod = RunProducer(log, Author(agent_id="bench", agent_version="1"))
    start = {
        "type": "RunStarted",
        "goal": {"statement": "bench"},
        "policy": {"external_evidence_schemes": ["artifact"]},
    }
    for r in range(runs):
        prod.append_async(prod.events(f"run_{r}", 0, [start, fact_event(0)]))
    prod.flush()
    Projector(log, str(work / "state"), publish_dead_letters=False).run(until_caught_up=True, poll_timeout_s=0.01)
    rng = random.Random(11)
    revs: dict[int, int] = {}
    for i in range(tail_patches):
        r = rng.randrange(runs)
        rev = revs.get(r, 1)
        prod.append_async(prod.events(f"run_{r}", rev, [fact_event(rev), budget_event()]))
        revs[r] = rev + 1
    prod.close()
    pr = Projector(log, str(work / "state"), publish_dead_letters=False, tune_gc=True)
    t = time.perf_counter()
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    dt = time.perf_counter() - t
    if pr.stats.rejected:
        raise SystemExit(_shortfall(log, work / "state", pr.stats, 2 * tail_patches))
    log.close()
    emit({"events_per_s": 2 * tail_patches / dt})


WORKERS: dict[str, Callable[..., None]] = {
    "rs-scale": rs_scale,
    "rs-kafka-project": rs_kafka_project,
    "qs-kafka-project": qs_kafka_project,
    "rs-produce": rs_produce,
    "qs-produce": qs_produce,
    "rs-append": rs_append,
    "es-append": es_append,
    "rs-rebuild": rs_rebuild,
    "es-rebuild": es_rebuild,
    "rs-query": rs_query,
}


# -- orchestration -------------------------------------------------------------------------------


def peer_python() -> Path:
    """The peers' interpreter, installing them on first use."""
    py = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".installed"
    if marker.exists() and marker.read_text() == " ".join(PEER_PACKAGES):
        return py
    print(f"installing {', '.join(PEER_PACKAGES)} into {PEERS_VENV} (first use) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    # runstate itself without its pins: the Quix workers decode with its codec and validate
    # with its models (the same work as the projector), under Quix's own dependencies.
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    marker.write_text(" ".join(PEER_PACKAGES))
    return py


def run_worker(python: Path, name: str, *args: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"peers-{name}-"))
    try:
        out = subprocess.run(
            [str(python), __file__, "--worker", name, str(work), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=ROOT,
            env=env,
        )
        if out.returncode != 0:
            raise SystemExit(f"worker {name} failed:\n{out.stderr[-3000:]}")
        line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
        return dict(json.loads(line[len("RESULT ") :]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pairs(
    repeats: int, a: Callable[[], dict[str, Any]], b: Callable[[], dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``repeats`` pairs, alternating which side runs first."""
    out = []
    for i in range(repeats):
        if i % 2 == 0:
            ra, rb = a(), b()
        else:
            rb, ra = b(), a()
        out.append((ra, rb))
        print(f"  pair {i + 1}/{repeats}: {ra} | {rb}", flush=True)
    return out


def spread(xs: list[float]) -> str:
    def f(x: float) -> str:
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    return f"{f(statistics.median(xs))} [{f(min(xs))}–{f(max(xs))}]"


Row = tuple[str, str, str, float, str]


def _bound(ratio: float, goal: float) -> str:
    """The goal column of a lower bound's row: whether the goal is within reach of it."""
    if ratio > goal:
        return f"bound above {goal}: the validated goal cannot be met"
    return f"bound within {goal}"


def report(rows: list[Row]) -> None:
    print()
    print("| figure | runstate | peer | ratio (median of pairs) | goal |")
    print("|---|---|---|---|---|")
    for figure, ours, theirs, ratio, goal in rows:
        print(f"| {figure} | {ours} | {theirs} | {ratio:.2f} | {goal} |")


def before_after(tree: str, only: set[str], quick: bool, repeats: int) -> None:
    """runstate's own figures, this tree against ``tree`` (an older checkout: a worktree of
    the commit before a change), in pairs in one run: every number a worker reports, after /
    before (for times, above 1 is slower; for rates, below 1 is slower)."""
    ours = Path(sys.executable)
    before = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    specs = {
        "append": ("rs-append", (5_000,) if quick else (20_000,)),
        "rebuild": ("rs-rebuild", (200, 20) if quick else (500, 50)),
        "query": ("rs-query", (2_000, 2_000) if quick else (10_000, 5_000)),
    }
    print("| figure | after | before | after / before (median of pairs) |")
    print("|---|---|---|---|")
    for fig in [f for f in specs if f in only]:
        name, args = specs[fig]
        ps = pairs(repeats, lambda: run_worker(ours, name, *args), lambda: run_worker(ours, name, *args, env=before))
        for key, value in ps[0][0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and all(y.get(key) for _, y in ps):
                a, b = [x[key] for x, _ in ps], [y[key] for _, y in ps]
                print(
                    f"| {fig}: {key} | {spread(a)} | {spread(b)} | "
                    f"{statistics.median(x / y for x, y in zip(a, b)):.2f} |",
                    flush=True,
                )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        name, work, *rest = sys.argv[2:]
        WORKERS[name](Path(work), *(int(x) if x.isdigit() else x for x in rest))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="append,rebuild,query,scale,kafka,produce", help="comma-separated figures")
    ap.add_argument(
        "--before",
        metavar="TREE",
        help="instead of the peers: runstate's own figures (append, rebuild, "
        "query) against the checkout TREE, before / after in one run",
    )
    args = ap.parse_args()
    repeats = max(3, args.repeats)
    only = set(args.only.split(","))
    if args.before:
        before_after(args.before, only, args.quick, repeats)
        return
    ours = Path(sys.executable)
    rows: list[Row] = []
    if only & {"append", "rebuild"}:
        peer = peer_python()
    if "append" in only:
        n = 5_000 if args.quick else 20_000
        print(f"append: {n:,} patches of 2 events, {PATCHES_PER_COMMIT} per commit", flush=True)
        ps = pairs(repeats, lambda: run_worker(ours, "rs-append", n), lambda: run_worker(peer, "es-append", n))
        a = [x["events_per_s"] for x, _ in ps]
        b = [y["events_per_s"] for _, y in ps]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        rows.append(
            (
                "embedded append, 500 patches per commit (events/s)",
                spread(a),
                "eventsourcing " + spread(b),
                ratio,
                f">= 1.0: {'met' if ratio >= 1.0 else 'NOT met'}",
            )
        )
    if "rebuild" in only:
        n, samples = (200, 20) if args.quick else (500, 50)
        print(f"rebuild: one run of {2 * n:,} events", flush=True)
        ps = pairs(
            repeats,
            lambda: run_worker(ours, "rs-rebuild", n, samples),
            lambda: run_worker(peer, "es-rebuild", n, samples),
        )
        # The validated RunState (state_at), then the same state as plain JSON data
        # (state_data_at: the checkpoint's digest checked, its items validated only where
        # the replayed events touch them), against eventsourcing's aggregate from its
        # snapshot, which validates nothing.
        for form, label in (("", "validated RunState"), ("data_", "plain JSON data")):
            for key, what, goal in (
                ("head_ms", "from a checkpoint, at the head", 2.0),
                ("tail48_ms", "from a checkpoint, 48 events after it", 2.0),
                ("full_ms", "by a full replay, no checkpoint / snapshot", 1.0),
            ):
                a = [x[form + key] for x, _ in ps]
                b = [y[key] for _, y in ps]
                ratio = statistics.median(x / y for x, y in zip(a, b))
                rows.append(
                    (
                        f"rebuild one run ({label}) {what} (ms)",
                        spread(a),
                        "eventsourcing " + spread(b),
                        ratio,
                        f"<= {goal}: {'met' if ratio <= goal else 'NOT met'}",
                    )
                )
        # What pydantic alone takes to validate the rebuilt RunState: no validated rebuild
        # can take less, so a ratio here above the goal means the validated goal cannot be met
        # while the result is the pydantic model.
        for key, what in (("head_ms", "at the head"), ("tail48_ms", "48 events after a checkpoint")):
            a = [x["pydantic_" + key] for x, _ in ps]
            b = [y[key] for _, y in ps]
            ratio = statistics.median(x / y for x, y in zip(a, b))
            rows.append(
                (
                    f"lower bound of the validated rebuild {what}: "
                    "`RunState.model_validate_json` of its result alone (ms)",
                    spread(a),
                    "eventsourcing " + spread(b),
                    ratio,
                    _bound(ratio, 2.0),
                )
            )
    if "query" in only:
        runs, samples = (2_000, 2_000) if args.quick else (10_000, 5_000)
        print(f"query: state of random runs among {runs:,}", flush=True)
        rs = [run_worker(ours, "rs-query", runs, samples) for _ in range(repeats)]
        for key, what in (
            ("state", "`Projection.state` (validated RunState)"),
            ("data", "`Projection.state_data` (plain JSON data)"),
        ):
            for q in ("p50", "p99"):
                a = [x[f"{key}_{q}_ms"] for x in rs]
                b = [x[f"floor_{q}_ms"] for x in rs]
                ratio = statistics.median(x / y for x, y in zip(a, b))
                rows.append(
                    (
                        f"{what}, {runs:,} runs, {q} (ms)",
                        spread(a),
                        "get + orjson.loads " + spread(b),
                        ratio,
                        f"<= 2.0: {'met' if ratio <= 2.0 else 'NOT met'}",
                    )
                )
        for q in ("p50", "p99"):  # no validated `state` can take less than the same get validated
            a = [x[f"pydantic_{q}_ms"] for x in rs]
            b = [x[f"floor_{q}_ms"] for x in rs]
            ratio = statistics.median(x / y for x, y in zip(a, b))
            rows.append(
                (
                    "lower bound of `state`: the floor's get + `RunState.model_validate_json` "
                    f"instead of `orjson.loads`, {q} (ms)",
                    spread(a),
                    "get + orjson.loads " + spread(b),
                    ratio,
                    _bound(ratio, 2.0),
                )
            )
    if "scale" in only:
        small, big, tail = (1_000, 20_000, 5_000) if args.quick else (1_000, 100_000, 10_000)
        print(f"scale: a tail of {tail:,} two-event patches after {small:,} / {big:,} runs", flush=True)
        ps = pairs(
            repeats, lambda: run_worker(ours, "rs-scale", big, tail), lambda: run_worker(ours, "rs-scale", small, tail)
        )
        a = [x["events_per_s"] for x, _ in ps]
        b = [y["events_per_s"] for _, y in ps]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        rows.append(
            (
                f"projector, same tail, {big:,} runs vs {small:,} runs (events/s)",
                spread(a),
                f"runstate at {small:,} runs {spread(b)}",
                ratio,
                f">= 0.8: {'met' if ratio >= 0.8 else 'NOT met'}",
            )
        )
    if only & {"kafka", "produce"}:
        rows += kafka_figures(args.quick, repeats, only, ours, peer_python())
    report(rows)


def kafka_figures(quick: bool, repeats: int, only: set[str], ours: Path, peer: Path) -> list[Row]:
    """One broker, one topic filled once; the projectors each read it in a group of their own."""
    from runstate.compose.kafka_local import LocalKafka

    broker_dir = tempfile.mkdtemp(prefix="peers-kafka-")
    broker = LocalKafka(broker_dir)
    bootstrap = broker.start()
    rows: list[Row] = []
    try:
        if "kafka" in only:
            per_run = 21 if quick else 101  # x 1,000 runs: 41,000 / 201,000 events
            prefix = f"cmp{os.getpid()}"
            events = fill_topic(bootstrap, prefix, per_run)
            print(f"kafka: {events:,} events, {KAFKA_RUNS:,} runs, {KAFKA_PARTITIONS} partitions", flush=True)
            for validate, label in ((0, "Quix without validation"), (1, "Quix + the same pydantic validation")):
                ps = pairs(
                    repeats,
                    lambda: run_worker(ours, "rs-kafka-project", bootstrap, prefix, events),
                    lambda: run_worker(peer, "qs-kafka-project", bootstrap, prefix, events, validate),
                )
                a = [x["events_per_s"] for x, _ in ps]
                b = [y["events_per_s"] for _, y in ps]
                ratio = statistics.median(x / y for x, y in zip(a, b))
                goal = f">= 1.5: {'met' if ratio >= 1.5 else 'NOT met'}" if not validate else "-"
                rows.append(("projector from Kafka (events/s)", spread(a), f"{label} {spread(b)}", ratio, goal))
        if "produce" in only:
            n = 5_000 if quick else 20_000
            prefix = f"prod{os.getpid()}"
            from runstate.eventlog.kafka import KafkaLog

            KafkaLog(bootstrap, topics=_kafka_topics(prefix)).create_topics(KAFKA_PARTITIONS)
            print(f"produce: {n:,} two-event patches", flush=True)
            ps = pairs(
                repeats,
                lambda: run_worker(ours, "rs-produce", bootstrap, prefix, n),
                lambda: run_worker(peer, "qs-produce", bootstrap, prefix, n, 1),
            )
            raw = [run_worker(peer, "qs-produce", bootstrap, prefix, n, 0)["us_per_patch"] for _ in range(repeats)]
            a = [x["us_per_patch"] for x, _ in ps]
            b = [y["us_per_patch"] for _, y in ps]
            ratio = statistics.median(y / x for x, y in zip(a, b))  # speed ratio: theirs / ours in time
            rows.append(
                (
                    "producer: validate + encode + send (µs per 2-event patch)",
                    spread(a),
                    f"Quix + pydantic + JSON {spread(b)}; raw produce {spread(raw)}",
                    ratio,
                    f">= 1.0: {'met' if ratio >= 1.0 else 'NOT met'}",
                )
            )
    finally:
        broker.stop()
        shutil.rmtree(broker_dir, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main()
