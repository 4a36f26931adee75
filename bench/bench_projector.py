"""Projector throughput on a pre-filled embedded log, at two state sizes, and query latency.

    .venv/bin/python bench/bench_projector.py            # full: 1,000 runs x (20 | 2,000) facts, 24,000-event tail
    .venv/bin/python bench/bench_projector.py --large 500
    .venv/bin/python bench/bench_projector.py --quick    # small smoke run

For each state size the log is pre-filled (RunStarted + N facts per run) and projected;
then a tail of 2-event patches (FactConfirmed + BudgetConsumed) over all runs is appended
and timed twice, side by side:

- warm: the same projector process goes on (working states cached): steady state;
- cold: a fresh projector on a copy of the store (loads each run's state once).

Then query latency (p50/p99) on a store with 10,000 runs, through the :class:`Projection`
API (an open read-only store; the CLI adds process start-up): ``state``, ``header``, and
``context`` side by side with ``render_context`` of the validated state.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


from benchkit import TRUST, bench_patch, fact_event, scratch
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.context import render_context
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection
from runstate.schemas.codec import decode, encode
from runstate.schemas.patch import Patch

T0 = datetime(2026, 8, 11, tzinfo=UTC)


def mk(run: str, rev: int, events: list[dict], i: int) -> Patch:
    return bench_patch(run, rev, events, T0 + timedelta(seconds=i), f"{run}-{rev}-{i}")


def fill(log: EmbeddedLog, runs: int, facts: int, per_patch: int = 50) -> dict[str, int]:
    """RunStarted + ``facts`` facts per run. Returns each run's revision."""
    prod = log.producer()
    revs = {}
    for r in range(runs):
        run = f"run_{r:05d}"
        prod.append_async(
            log.topics.events,
            run,
            encode(mk(run, 0, [{"type": "RunStarted", "goal": {"statement": "bench"}, "policy": TRUST}], 0)),
            _ok,
        )
        rev = 1
        for start in range(0, facts, per_patch):
            evs = [fact_event(i) for i in range(start, min(facts, start + per_patch))]
            prod.append_async(log.topics.events, run, encode(mk(run, rev, evs, rev)), _ok)
            rev += 1
        revs[run] = rev
    prod.flush()
    return revs


def tail(log: EmbeddedLog, revs: dict[str, int], events: int, seed: int = 7) -> int:
    """2-event patches spread over every run. Returns the number of events appended."""
    rng = random.Random(seed)
    runs = sorted(revs)
    prod = log.producer()
    n = 0
    i = 0
    while n < events:
        run = runs[i % len(runs)] if i < len(runs) else rng.choice(runs)
        rev = revs[run]
        p = mk(run, rev, [fact_event(100_000 + i), {"type": "BudgetConsumed", "tokens": 10}], i)
        prod.append_async(log.topics.events, run, encode(p), _ok)
        revs[run] = rev + 1
        n += 2
        i += 1
    prod.flush()
    return n


def _ok(where: object, err: Exception | None) -> None:
    if err is not None:
        raise err


def drain(projector: Projector) -> float:
    """Project everything up to the log end through the projector's replay (same driver
    and batch size as the live loop, no consumer group); seconds."""
    log = projector.log
    t0 = time.perf_counter()
    projector.replay(log.end_offsets(log.topics.events), chunk=projector.batch_size)
    return time.perf_counter() - t0


def bench_size(root: Path, runs: int, facts: int, tail_events: int) -> tuple[float, float]:
    log = EmbeddedLog(root / f"log-{facts}.db", partitions=4)
    state = root / f"state-{facts}"
    t = time.perf_counter()
    revs = fill(log, runs, facts)
    proj = Projector(log, str(state), batch_size=2000, publish_dead_letters=False)
    proj.layout.ensure(log.topics.events, 4, log.identity())
    proj.assign([0, 1, 2, 3])
    fill_s = drain(proj)
    print(
        f"  prefill: {runs} runs x {facts} facts: appended+projected in {time.perf_counter() - t:.1f}s "
        f"(projection {runs * facts / fill_s:,.0f} events/s)"
    )
    # Copy the store for the cold run before the tail is applied.
    proj.release([0, 1, 2, 3])
    shutil.copytree(state, root / f"cold-{facts}")
    n = tail(log, revs, tail_events)
    # warm: working states loaded before timing, as in a projector that has been running.
    proj = Projector(log, str(state), batch_size=2000, publish_dead_letters=False)
    proj.assign([0, 1, 2, 3])
    for run in revs:
        proj.parts[proj.layout.partition_of(run)].book.doc(run)
    warm_s = drain(proj)
    accepted = proj.stats.accepted
    proj.release([0, 1, 2, 3])
    cold = Projector(log, str(root / f"cold-{facts}"), batch_size=2000, publish_dead_letters=False)
    cold.assign([0, 1, 2, 3])
    cold_s = drain(cold)
    cold.release([0, 1, 2, 3])
    assert cold.stats.rejected == 0 and accepted > 0, "the bench workload must be all-accepted"
    print(
        f"  tail: {n:,} events in {n // 2:,} patches: warm {n / warm_s:,.0f} events/s, cold {n / cold_s:,.0f} events/s"
    )
    log.close()
    return n / warm_s, n / cold_s


def bench_decode(root: Path) -> float:
    p = mk("r", 1, [fact_event(1), {"type": "BudgetConsumed", "tokens": 10}], 1)
    data = encode(p)
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):
        decode(data)
    return 2 * n / (time.perf_counter() - t)


def bench_queries(root: Path, runs: int, samples: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each query on ``runs`` runs of 20 facts, random runs: ``state``,
    ``header``, and the compact context two ways, interleaved per sample: ``context``
    (rendered from the state's msgspec struct) and ``render_context`` of the validated
    ``state`` (what it did before)."""
    log = EmbeddedLog(root / "log-q.db", partitions=4)
    fill(log, runs, 20, per_patch=10)
    proj = Projector(log, str(root / "state-q"), batch_size=5000, publish_dead_letters=False)
    proj.run(until_caught_up=True, poll_timeout_s=0.01)
    rng = random.Random(1)
    ids = [f"run_{rng.randrange(runs):05d}" for _ in range(samples)]
    now = datetime.now(UTC)
    lat: dict[str, list[float]] = {"state": [], "header": [], "context": [], "context_validated": []}
    with Projection(root / "state-q") as q:
        q.state(ids[0])  # open the stores
        for run in ids:
            t = time.perf_counter_ns()
            q.state(run)
            lat["state"].append((time.perf_counter_ns() - t) / 1e6)
        for run in ids:
            t = time.perf_counter_ns()
            q.header(run)
            lat["header"].append((time.perf_counter_ns() - t) / 1e6)
        for run in ids:
            t = time.perf_counter_ns()
            q.context(run, now=now)
            lat["context"].append((time.perf_counter_ns() - t) / 1e6)
            t = time.perf_counter_ns()
            render_context(q.state(run), now=now)
            lat["context_validated"].append((time.perf_counter_ns() - t) / 1e6)
    log.close()

    def pct(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {k: (statistics.median(v), pct(v, 0.99)) for k, v in lat.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--large", type=int, default=2000, help="facts per run of the large state (issue 11: 2,000)")
    args = ap.parse_args()
    runs, small, large, tail_events, qruns = (1000, 20, args.large, 24_000, 10_000)
    if args.quick:
        runs, small, large, tail_events, qruns = (100, 20, 100, 2_000, 500)
    with scratch("runstate-bench-") as root:
        print(f"decode+validate alone: {bench_decode(root):,.0f} events/s")
        print(f"state size ~{small} facts/run:")
        w_small, c_small = bench_size(root, runs, small, tail_events)
        print(f"state size ~{large} facts/run:")
        w_large, c_large = bench_size(root, runs, large, tail_events)
        qs = bench_queries(root, qruns, 2000)
        print()
        print(
            f"RESULT projector warm: {w_small:,.0f} events/s @{small} facts, {w_large:,.0f} events/s @{large} facts, "
            f"ratio {w_large / w_small:.2f}"
        )
        print(
            f"RESULT projector cold: {c_small:,.0f} events/s @{small} facts, {c_large:,.0f} events/s @{large} facts, "
            f"ratio {c_large / c_small:.2f}"
        )
        (p50, p99), (h50, h99) = qs["state"], qs["header"]
        (c50, c99), (v50, v99) = qs["context"], qs["context_validated"]
        print(
            f"RESULT state query on {qruns:,} runs (20 facts each): p50 {p50:.3f} ms, p99 {p99:.3f} ms; "
            f"header only p50 {h50:.3f} ms, p99 {h99:.3f} ms"
        )
        print(
            f"RESULT context on the same runs: p50 {c50:.3f} ms, p99 {c99:.3f} ms; rendered from the validated "
            f"state p50 {v50:.3f} ms, p99 {v99:.3f} ms ({v50 / c50:.2f}x / {v99 / c99:.2f}x)"
        )


if __name__ == "__main__":
    main()
