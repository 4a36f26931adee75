"""runstate on a real Kafka broker (loopback), measured side by side in one run.

    .venv/bin/python bench/bench_kafka.py                 # starts its own broker (runstate.compose.kafka_local)
    RUNSTATE_BENCH_KAFKA=127.0.0.1:9092 .venv/bin/python bench/bench_kafka.py

1. produce: raw confluent-kafka produce of pre-encoded patches vs RunProducer (build +
   validate + Avro encode + send) of the same patches, events/s and their ratio;
2. end to end: one projector process consuming a pre-filled topic (1,000 runs) into
   RocksDB, events/s;
3. append -> visible latency at a steady 1,000 events/s (500 two-event patches/s) from a
   separate producer process: from the producer's send to the decision stored in RocksDB,
   p50/p99;
4. (``--only registry``, or with the rest when Java 21+ and Maven can start Apicurio
   Registry) the projector of part 2 on records in the Confluent Schema Registry's framing
   beside single-object encoding, rounds taken in turn, and their ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer

from benchkit import AUTHOR, TRUST, kafka_broker

from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import PRODUCER_DEFAULTS, KafkaLog
from runstate.producers.run_producer import RunProducer
from runstate.projector.core.working import RunDoc
from runstate.projector.runtime.loop import Projector
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.schemas.patch import Decision, Patch

ROOT = Path(__file__).resolve().parents[1]


def events(i: int) -> list[dict]:
    return [
        {
            "type": "FactConfirmed",
            "fact": {"id": f"f{i}", "statement": f"observation {i} of the system", "evidence": f"artifact://out/{i}"},
        },
        {"type": "BudgetConsumed", "tokens": 10},
    ]


def drafts(runs: int, per_run: int) -> list[tuple[str, dict]]:
    out = []
    for r in range(runs):
        out.append(
            (
                f"run_{r:05d}",
                {
                    "expected_revision": 0,
                    "events": [{"type": "RunStarted", "goal": {"statement": "b"}, "policy": TRUST}],
                },
            )
        )
    for i in range(per_run):
        for r in range(runs):
            out.append((f"run_{r:05d}", {"expected_revision": i + 1, "events": events(i)}))
    return out


def n_events(ds: list[tuple[str, dict]]) -> int:
    return sum(len(d["events"]) for _, d in ds)


def bench_produce(bootstrap: str, runs: int, per_run: int) -> tuple[float, float]:
    log = KafkaLog(bootstrap, topics=topics("produce"))
    log.create_topics(6)
    ds = drafts(runs, per_run)
    producer = RunProducer(log, AUTHOR)
    encoded = [(run, producer.encode(producer.build(run, d))) for run, d in ds]
    raw = Producer({"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS})
    # Warm both up (connections, topic metadata, idempotent producer id) before timing.
    for run, value in encoded[:200]:
        raw.produce(log.topics.events, value=value, key=run.encode())
    raw.flush(30)
    for run, d in ds[:200]:
        producer.append_async(producer.build(run, d), lambda r, e: None)
    producer.flush(30)
    t = time.perf_counter()
    for run, value in encoded:
        while True:
            try:
                raw.produce(log.topics.events, value=value, key=run.encode())
                break
            except BufferError:
                raw.poll(0.05)
        raw.poll(0)
    assert raw.flush(60) == 0
    raw_s = time.perf_counter() - t
    failures: list[Exception] = []
    t = time.perf_counter()
    for run, d in ds:
        producer.append_async(producer.build(run, d), lambda r, e: failures.append(e) if e else None)  # type: ignore[arg-type, func-returns-value]
    assert producer.flush(60) == 0 and not failures
    ours_s = time.perf_counter() - t
    producer.close()
    log.close()
    ev = n_events(ds)
    return ev / raw_s, ev / ours_s


def bench_e2e(bootstrap: str, runs: int, per_run: int, registry: str | None = None) -> float:
    """Events/s of one projector over a pre-filled topic; ``registry``: the records in that
    schema registry's framing (written and read through it)."""
    from runstate.eventlog.registry import RegistryFraming

    names = topics("e2e")
    log = KafkaLog(bootstrap, topics=names, registry=RegistryFraming(registry, names) if registry else None)
    log.create_topics(6)
    ds = drafts(runs, per_run)
    producer = RunProducer(log, AUTHOR)
    for run, d in ds:
        producer.append_async(producer.build(run, d), lambda r, e: None)
    assert producer.flush(120) == 0
    with tempfile.TemporaryDirectory() as state:
        pr = Projector(log, state, batch_size=5000, publish_dead_letters=False)
        pr.run(until_caught_up=True, poll_timeout_s=0.05)
        assert pr.stats.rejected == 0, pr.stats
    log.close()
    return pr.stats.rate()  # from the first batch: the consumer group join is not counted


def _steady_producer(bootstrap: str, prefix: str, runs: int, rate_patches: float, seconds: float) -> None:
    linger = os.environ.get("RUNSTATE_BENCH_LINGER_MS")
    log = KafkaLog(
        bootstrap, topics=TopicNames.with_prefix(prefix), config={"producer.linger.ms": linger} if linger else None
    )
    producer = RunProducer(log, AUTHOR)
    rev = {f"run_{r:05d}": 1 for r in range(runs)}
    for run in rev:
        producer.append_async(
            producer.build(
                run,
                {
                    "expected_revision": 0,
                    "events": [{"type": "RunStarted", "goal": {"statement": "b"}, "policy": TRUST}],
                },
            ),
            lambda r, e: None,
        )
    producer.flush(30)
    time.sleep(3)  # let the projector catch up on the starts
    start = time.time()
    i = 0
    runs_l = list(rev)
    while time.time() - start < seconds:
        due = start + i / rate_patches
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        run = runs_l[i % len(runs_l)]
        # patch_id carries the send time (ns since the epoch): read back by the projector's hook.
        p = producer.build(
            run, {"expected_revision": rev[run], "events": events(i), "patch_id": f"{time.time_ns()}-{i}"}
        )
        producer.append_async(p, lambda r, e: None)
        producer.flush(0) if i % 5 == 0 else None
        rev[run] += 1
        i += 1
    producer.flush(30)
    producer.close()


class _Latency:
    """Projector hook: when a batch is stored, each decision's patch became visible."""

    def __init__(self) -> None:
        self.lat_ms: list[float] = []

    def on_assign(self, partition: int, store: ProjectionStore) -> None: ...

    def on_accepted(
        self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch
    ) -> None: ...

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        now = time.time_ns()
        for d in batch.decisions:
            if "-" in d.patch_id:
                self.lat_ms.append((now - int(d.patch_id.split("-")[0])) / 1e6)


def bench_latency(bootstrap: str, runs: int, seconds: float) -> tuple[list[float], int]:
    prefix = topics("lat").events.rsplit(".", 1)[0]
    log = KafkaLog(bootstrap, topics=TopicNames.with_prefix(prefix))
    log.create_topics(6)
    hook = _Latency()
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as state:
        pr = Projector(log, state, publish_dead_letters=False, hooks=hook)
        failed: list[BaseException] = []

        def project() -> None:
            try:
                pr.run(stop=stop, poll_timeout_s=0.05)
            except BaseException as e:  # reported below: a dead projector is not a latency
                failed.append(e)

        t = threading.Thread(target=project)
        t.start()
        proc = mp.get_context("spawn").Process(target=_steady_producer, args=(bootstrap, prefix, runs, 500.0, seconds))
        proc.start()
        proc.join()
        time.sleep(2)
        stop.set()
        t.join()
    log.close()
    if failed:
        raise RuntimeError(f"the projector stopped during the latency run: {failed[0]}") from failed[0]
    if not hook.lat_ms:
        raise RuntimeError("no decision was stored during the latency run")
    return hook.lat_ms, len(hook.lat_ms)


_n = 0


def bench_registry(bootstrap: str, runs: int, per_run: int, rounds: int) -> None:
    """Part 4: the projector's rate on the registry's framing and on single-object encoding."""
    from runstate.compose.kafka_local import BrokerError
    from runstate.compose.registry_local import LocalRegistry

    with tempfile.TemporaryDirectory() as where:
        registry = LocalRegistry(where)
        try:
            url = registry.start()
        except BrokerError as e:
            print(f"RESULT registry framing: not measured ({e})")
            return
        try:
            soe, framed = [], []
            for _ in range(rounds):
                soe.append(bench_e2e(bootstrap, runs, per_run))
                framed.append(bench_e2e(bootstrap, runs, per_run, url))
        finally:
            registry.stop()
    a, b = statistics.median(soe), statistics.median(framed)
    print(
        f"RESULT projector, single-object encoding {a:,.0f} events/s, Schema Registry framing {b:,.0f} events/s "
        f"(medians of {rounds} rounds in turn), ratio {b / a:.3f}"
    )


def topics(name: str) -> TopicNames:
    global _n
    _n += 1
    t = f"bench{os.getpid()}{name}{_n}"
    return TopicNames.with_prefix(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["produce", "e2e", "latency", "registry"], help="run one part")
    args = ap.parse_args()
    with kafka_broker() as (bootstrap, _pid):
        runs, per_run, lat_s = (200, 20, 5.0) if args.quick else (1000, 30, 20.0)
        if args.only in (None, "produce"):
            raw, ours = bench_produce(bootstrap, runs, per_run)
            print(
                f"RESULT produce: raw confluent-kafka {raw:,.0f} events/s, RunProducer {ours:,.0f} events/s, "
                f"ratio {ours / raw:.2f}"
            )
        if args.only in (None, "e2e"):
            e2e = bench_e2e(bootstrap, runs, per_run)
            print(f"RESULT end-to-end projector from Kafka, {runs} runs: {e2e:,.0f} events/s")
        if args.only in (None, "registry"):
            bench_registry(bootstrap, runs, per_run, rounds=2 if args.quick else 5)
        if args.only not in (None, "latency"):
            return
        lat, n = bench_latency(bootstrap, runs, lat_s)
        s = sorted(lat)

        def pct(q: float) -> float:
            return s[int(q * (len(s) - 1))]

        over = [i for i, x in enumerate(lat) if x > 50]
        print(
            f"RESULT append->visible at 1,000 events/s ({n} patches, {datetime.now(UTC):%H:%M}): "
            f"p50 {statistics.median(s):.1f} ms, p90 {pct(0.9):.1f} ms, p99 {pct(0.99):.1f} ms, max {s[-1]:.0f} ms; "
            f"{len(over)} over 50 ms, first at patch {over[0] if over else '-'}"
        )


if __name__ == "__main__":
    main()
