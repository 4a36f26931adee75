"""What sealing runs' content (erasure by crypto-shredding) costs, on and off side by side in one run.

    .venv/bin/python bench/bench_erasure.py            # starts its own Kafka broker (runstate.compose.kafka_local)
    .venv/bin/python bench/bench_erasure.py --quick
    RUNSTATE_BENCH_KAFKA=127.0.0.1:9092 .venv/bin/python bench/bench_erasure.py

1. producer: RunProducer's cost per patch (build, validate, encode, and with sealing the
   envelope read and AES-GCM) appending to Kafka, plain vs sealed, pairs alternated;
2. projector from Kafka: a pre-filled topic (the same patches, one topic plain, one sealed)
   consumed into RocksDB by a fresh projector, events/s, pairs alternated; the goal is
   sealed >= 0.85x plain;
3. erasure: how long ``runstate erase`` takes until the projector dropped the run (its
   stores compacted), on the embedded log.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path

from benchkit import AUTHOR, TRUST, kafka_broker, scratch

from runstate.eventlog.base import EventLog, TopicNames
from runstate.eventlog.kafka import KafkaLog
from runstate.eventlog.keystore import Keyring, KeyStore, MasterKey
from runstate.eventlog.sealed import SealedLog
from runstate.producers.run_producer import RunProducer
from runstate.projector.runtime.loop import Projector


def drafts(runs: int, per_run: int) -> list[tuple[str, dict]]:
    out = [
        (
            f"run_{r:05d}",
            {
                "expected_revision": 0,
                "events": [{"type": "RunStarted", "goal": {"statement": "bench"}, "policy": TRUST}],
            },
        )
        for r in range(runs)
    ]
    for i in range(per_run):
        for r in range(runs):
            out.append(
                (
                    f"run_{r:05d}",
                    {
                        "expected_revision": i + 1,
                        "events": [
                            {
                                "type": "FactConfirmed",
                                "fact": {
                                    "id": f"f{i}",
                                    "statement": f"observation {i} of the customer's system",
                                    "evidence": f"artifact://out/{i}",
                                },
                            },
                            {"type": "BudgetConsumed", "tokens": 10},
                        ],
                    },
                )
            )
    return out


def kafka_log(bootstrap: str, sealed: bool, master: MasterKey) -> EventLog:
    inner = KafkaLog(bootstrap, topics=TopicNames.with_prefix(f"b{uuid.uuid4().hex[:8]}"))
    inner.create_topics(6)
    return SealedLog(inner, Keyring(KeyStore(inner, master))) if sealed else inner


def produce(log: EventLog, ds: list[tuple[str, dict]], runs: int) -> tuple[float, float]:
    """Seconds per patch for RunProducer appending ``ds``: for each run's first patch (which,
    sealed, makes the run's key and waits until the key store holds it), and for the rest
    (delivery awaited at the end of each part)."""
    producer = RunProducer(log, AUTHOR)
    patches = [producer.build(run, d) for run, d in ds]
    out = []
    for part in (patches[:runs], patches[runs:]):
        t = time.perf_counter()
        for p in part:
            producer.append_async(p)
        producer.flush(60)
        out.append((time.perf_counter() - t) / len(part))
    producer.close()
    return out[0], out[1]


def project(log: EventLog, n_events: int, state: Path) -> float:
    """Events/s of a fresh projector draining the topic."""
    shutil.rmtree(state, ignore_errors=True)
    pr = Projector(log, str(state), group_id=f"g{uuid.uuid4().hex[:8]}", publish_dead_letters=False)
    t = time.perf_counter()
    stats = pr.run(until_caught_up=True, poll_timeout_s=0.05)
    dt = time.perf_counter() - t
    assert stats.events == n_events, (stats.events, n_events)
    return n_events / dt


def erase_time(work: Path, runs: int, per_run: int) -> float:
    from runstate import app
    from runstate.settings import Settings

    s = Settings(log=str(work / "e.db"), state_dir=str(work / "e"), master_key=MasterKey.generate())
    log = app.open_settings_log(s)
    producer = RunProducer(log, AUTHOR)
    for run, d in drafts(runs, per_run):
        producer.append_async(producer.build(run, d))
    producer.close()
    log.close()
    app.project(s, until_caught_up=True)
    t = time.perf_counter()
    app.erase(s, "run_00000", "bench", "bench")
    app.project(s, until_caught_up=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs, per_run = (100, 10) if args.quick else (1000, 20)
    rounds = 1 if args.quick else args.rounds
    with kafka_broker() as (bootstrap, _pid):
        master = MasterKey(os.urandom(32))
        ds = drafts(runs, per_run)
        n_events = sum(len(d["events"]) for _, d in ds)
        with scratch("runstate-bench-erasure-") as work:
            first: dict[bool, list[float]] = {False: [], True: []}
            cost: dict[bool, list[float]] = {False: [], True: []}
            rate: dict[bool, list[float]] = {False: [], True: []}
            for i in range(rounds):
                for sealed in (False, True) if i % 2 == 0 else (True, False):  # alternate which goes first
                    log = kafka_log(bootstrap, sealed, master)
                    a, b = produce(log, ds, runs)
                    first[sealed].append(a)
                    cost[sealed].append(b)
                    rate[sealed].append(project(log, n_events, work / f"s{int(sealed)}"))
                    log.close()
            plain_us, sealed_us = (statistics.median(cost[k]) * 1e6 for k in (False, True))
            plain_first, sealed_first = (statistics.median(first[k]) * 1e6 for k in (False, True))
            plain_r, sealed_r = (statistics.median(rate[k]) for k in (False, True))
            print(
                f"RESULT producer per patch, {len(ds) - runs} patches x {rounds} rounds: plain {plain_us:.1f} us, "
                f"sealed {sealed_us:.1f} us (+{sealed_us - plain_us:.1f} us, {sealed_us / plain_us:.2f}x)"
            )
            print(
                f"RESULT producer, a run's first patch (sealed: its key made and stored first), {runs} runs: "
                f"plain {plain_first:.1f} us, sealed {sealed_first:.1f} us"
            )
            print(
                f"RESULT projector from Kafka, {n_events} events over {runs} runs: plain {plain_r:,.0f} events/s, "
                f"sealed {sealed_r:,.0f} events/s, ratio {sealed_r / plain_r:.2f} (goal >= 0.85)"
            )
            took = erase_time(work, runs // 10, per_run)
            print(
                f"RESULT erase one run of {per_run + 1} patches among {runs // 10} (embedded log, until the "
                f"projector dropped and compacted it): {took * 1000:.0f} ms"
            )


if __name__ == "__main__":
    main()
