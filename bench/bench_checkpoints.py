"""Checkpoints stay proportionate: checkpoint bytes written against the events' bytes, and
the snapshotter's pace against the projector's, on long runs.

    .venv/bin/python bench/bench_checkpoints.py            # 100 runs x 5,000 patches
    .venv/bin/python bench/bench_checkpoints.py --quick    # 20 runs x 1,000 patches

The log is filled at its native speed (records encoded once, appended in big group commits)
with long runs: each patch a new fact, an observation of one of five subjects, a tool call
started or finished, a budget use, or a task created, started or completed; the state grows
with the facts. Then, side by side in one run, on the same log: the projector, and the
snapshotter at the default policy without and with the byte budget (a run's next
checkpoint waits until the events since its last one weigh half of that checkpoint); last,
both following a log filled at the projector's full rate, their lag printed every second.
Goal: checkpoint bytes ≤ 2x the events' bytes, and the snapshotter keeps pace with the
projector (its lag bounded).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchkit import AUTHOR, TRUST, scratch
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.runtime.loop import DEFAULT_GROUP, Projector
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch
from runstate.snapshotter.loop import GROUP, Snapshotter
from runstate.snapshotter.policy import CheckpointPolicy

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _events(i: int) -> list[dict]:
    k = i % 10
    if k in (0, 5):
        return [
            {
                "type": "FactConfirmed",
                "fact": {
                    "id": f"f{i}",
                    "statement": f"measured latency of call {i}: {i % 997} ms on node eu-{i % 7}",
                    "evidence": f"artifact://r/{i}",
                },
            }
        ]
    if k in (1, 6):
        return [
            {
                "type": "ObservationRecorded",
                "observation": {
                    "subject": f"svc/{i % 5}",
                    "observed_state": f"p99 {i % 900} ms",
                    "observed_version": f"v{i}",
                },
            }
        ]
    if k == 2:
        return [{"type": "ToolCallStarted", "call_id": f"c{i}", "tool": "http_get"}]
    if k == 3:
        return [{"type": "ToolSucceeded", "call_id": f"c{i - 1}", "result_ref": f"artifact://r/{i}"}]
    if k == 4:
        return [{"type": "TaskCreated", "task": {"id": f"t{i}", "title": f"check node {i % 7}"}}]
    if k == 7:
        return [{"type": "TaskStarted", "task_id": f"t{i - 3}"}]
    if k == 8:
        return [{"type": "TaskCompleted", "task_id": f"t{i - 4}", "evidence": f"artifact://r/{i}"}]
    return [{"type": "BudgetConsumed", "tokens": 100 + i % 50}]


def fill(log: EmbeddedLog, runs: int, patches: int) -> int:
    """Every run's patches (round robin over the runs); returns the events' bytes."""
    total = 0
    batch: list[tuple[str, str, bytes, tuple, None]] = []
    for record in records(log, runs, patches):
        batch.append(record)
        if len(batch) >= 20_000:
            total += sum(len(v) for _, _, v, _, _ in batch)
            log._append_many(batch)
            batch = []
    if batch:
        total += sum(len(v) for _, _, v, _, _ in batch)
        log._append_many(batch)
    return total


def records(log: EmbeddedLog, runs: int, patches: int) -> Iterator[tuple[str, str, bytes, tuple, None]]:
    """The workload's records, encoded, in append order."""
    for r in range(runs):
        run = f"long-{r:03d}"
        p = Patch.model_validate(
            {
                "patch_id": f"{run}-0",
                "run_id": run,
                "expected_revision": 0,
                "events": [{"type": "RunStarted", "goal": {"statement": "a long investigation"}, "policy": TRUST}],
                "author": AUTHOR,
                "created_at": T0,
            }
        )
        yield (log.topics.events, run, encode(p), (), None)
    for i in range(1, patches):
        for r in range(runs):
            run = f"long-{r:03d}"
            p = Patch.model_validate(
                {
                    "patch_id": f"{run}-{i}",
                    "run_id": run,
                    "expected_revision": i,
                    "events": _events(i),
                    "author": AUTHOR,
                    "created_at": T0 + timedelta(seconds=i),
                }
            )
            yield (log.topics.events, run, encode(p), (), None)


def snapshot(path: Path, work: Path, policy: CheckpointPolicy, name: str) -> tuple[float, int, int]:
    """Seconds, checkpoints and checkpoint bytes of a snapshotter draining the log."""
    log = EmbeddedLog(path, create=False)
    snap = Snapshotter(log, str(work / name), policy=policy, group_id=f"snap-{name}")
    t = time.perf_counter()
    snap.run(until_caught_up=True, poll_timeout_s=0.01)
    dt = time.perf_counter() - t
    log.close()
    return dt, snap.writer.written, snap.writer.written_bytes


def pace(work: Path, runs: int, patches: int, rate: float) -> None:
    """The projector and the snapshotter (default policy), each a process of its own
    (``runstate project``, ``runstate snapshot``), follow a log filled at ``rate`` patches/s;
    their lag (records behind the log's end, from each group's position mirror, written
    about once a second) printed every second, then how long each took to catch up after
    the last append."""
    path = work / "pace.db"
    log = EmbeddedLog(path, partitions=4)
    todo = list(records(log, runs, patches))
    env = {**os.environ, "RUNSTATE_LOG": str(path), "RUNSTATE_STATE_DIR": str(work / "pace-state")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", cmd, "--quiet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for cmd in ("project", "snapshot")
    ]
    topic = log.topics.events
    groups = {"projector": DEFAULT_GROUP, "snapshotter": GROUP}
    worst = dict.fromkeys(groups, 0)
    caught: dict[str, float] = {}

    def lags() -> dict[str, int]:
        end = sum(log.end_offsets(topic).values())
        return {name: end - sum(log.committed(g, topic).values()) for name, g in groups.items()}

    try:
        t0 = next_print = time.perf_counter()
        sent = 0
        print(f"pace: {len(todo):,} patches at {rate:,.0f}/s (the projector's full rate alone); lag in records:")
        while True:
            now = time.perf_counter() - t0
            due = min(len(todo), int(now * rate))
            if due > sent:
                log._append_many(todo[sent:due])
                sent = due
            if time.perf_counter() >= next_print:
                next_print += 1.0
                lag = lags()
                for name, n in lag.items():
                    worst[name] = max(worst[name], n)
                    if sent == len(todo) and n == 0 and name not in caught:
                        caught[name] = now - len(todo) / rate
                print(f"  {now:5.0f} s  appended {sent:,}  " + "  ".join(f"{k} {v:,}" for k, v in lag.items()))
                if len(caught) == len(groups) or now > len(todo) / rate + 600:
                    break
            time.sleep(0.05)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        log.close()
    print(
        "RESULT pace: largest lag "
        + ", ".join(f"{k} {v:,} records" for k, v in worst.items())
        + "; caught up after the last append: "
        + ", ".join(f"{k} {caught[k]:.0f} s" if k in caught else f"{k} not within 600 s" for k in groups)
        + " (goal: the snapshotter keeps pace, its lag bounded)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--patches", type=int, default=5000)
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the snapshotter without the byte budget (at the full size it writes ~100x the events)",
    )
    args = ap.parse_args()
    runs, patches = (20, 1000) if args.quick else (args.runs, args.patches)
    with scratch("runstate-bench-checkpoints-") as work:
        log = EmbeddedLog(work / "log.db", partitions=4)
        t = time.perf_counter()
        events_bytes = fill(log, runs, patches)
        print(f"filled {runs * patches:,} patches ({events_bytes / 1e6:.1f} MB) in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        Projector(log, str(work / "proj"), publish_dead_letters=False).run(until_caught_up=True, poll_timeout_s=0.01)
        projector_s = time.perf_counter() - t
        log.close()
        print(f"RESULT projector: {projector_s:.1f} s for {runs * patches:,} patches")
        variants = [
            ("every 50, no byte budget", CheckpointPolicy(every=50, bytes_ratio=None)),
            ("default: every 50 within the byte budget", CheckpointPolicy()),
        ]
        for label, policy in variants[1:] if args.no_baseline else variants:
            name = "budget" if policy.bytes_ratio else "plain"
            dt, n, size = snapshot(work / "log.db", work, policy, name)
            print(
                f"RESULT snapshotter, {label}: {n:,} checkpoints, {size / 1e6:.1f} MB = "
                f"{size / events_bytes:.2f}x the events' bytes (goal <= 2x); {dt:.1f} s = "
                f"{dt / projector_s:.2f}x the projector's time"
            )
        pace(work, runs, patches, runs * patches / projector_s)


if __name__ == "__main__":
    main()
