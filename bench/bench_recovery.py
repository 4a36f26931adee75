"""Recovery: rebuild every projection by full replay vs from checkpoints + tail, side by
side, at two history lengths (embedded log, real RocksDB).

    .venv/bin/python bench/bench_recovery.py                    # 10,000 runs; 1,020,000 and 2,020,000 events
    .venv/bin/python bench/bench_recovery.py --runs 100000 --updates 0,20   # 2,000,000 and 10,000,000 events
    .venv/bin/python bench/bench_recovery.py --quick            # small smoke run

Each run starts with a goal, a budget, 10 facts and 3 tasks, then appends 4-event patches
that update bounded state (budget use, a re-observation of one of 3 subjects, a revised
hypothesis, a phase change): the state's size is the same at both history lengths, as in
a long-lived agent run. The snapshotter runs at the product's default policy (``--every``
changes K). Then:

- full replay: ``runstate project`` (its own process) on an empty state directory, before
  any checkpoint exists, from offset 0;
- checkpoints + tail: ``runstate project`` on an empty state directory ("lost disk"), which
  restores each partition from the checkpoints topic and replays the tail.

Each process's peak memory is read from the kernel. The log is filled at its native speed.
Beside the restore's rate in MB/s of state loaded, the same run measures RocksDB's own rate
of loading those bytes from Python (sorted SST files ingested; write batches): the floor.

Both must end with identical state digests for every run (checked).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


from rocksdict import AccessType, IngestExternalFileOptions, Options, Rdict, SstFileWriter, WriteBatch

from benchkit import PRINT_PEAK, TRUST, bench_patch, scratch
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.queries import Projection
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.loop import Snapshotter

T0 = datetime(2026, 8, 11, tzinfo=UTC)


def _patch(run: str, rev: int, events: list[dict], i: int) -> Patch:
    return bench_patch(run, rev, events, T0 + timedelta(seconds=i), f"{run}-{rev}")


def first_events(r: int) -> list[list[dict]]:
    start = [
        {"type": "RunStarted", "goal": {"statement": f"goal of run {r}"}, "policy": TRUST},
        {"type": "BudgetSet", "tokens_remaining": 1_000_000},
        {
            "type": "HypothesisProposed",
            "hypothesis": {"id": "h1", "statement": "s", "confidence": 0.5, "falsifier": "f"},
        },
        {"type": "TaskCreated", "task": {"id": "t1", "title": "first"}},
    ]
    facts = [
        {
            "type": "FactConfirmed",
            "fact": {"id": f"f{k}", "statement": f"fact {k} of run {r}", "evidence": f"artifact://out/{r}/{k}"},
        }
        for k in range(10)
    ]
    tasks = [
        {"type": "TaskCreated", "task": {"id": "t2", "title": "second", "depends_on": ["t1"]}},
        {"type": "TaskCreated", "task": {"id": "t3", "title": "third"}},
        {"type": "TaskStarted", "task_id": "t1"},
        {"type": "PhaseChanged", "phase": "work"},
    ]
    return [start, facts[:4], facts[4:8], facts[8:] + tasks[:2], tasks[2:]]


def update(i: int) -> list[dict]:
    return [
        {"type": "BudgetConsumed", "tokens": 17},
        {
            "type": "ObservationRecorded",
            "observation": {
                "subject": f"file://src/{i % 3}.py",
                "observed_state": f"v{i}",
                "observed_version": f"sha:{i:08x}",
            },
        },
        {"type": "HypothesisRevised", "hypothesis_id": "h1", "confidence": (i % 10) / 10},
        {"type": "PhaseChanged", "phase": f"step {i % 7}"},
    ]


def build_log(path: Path, runs: int, updates: int) -> int:
    """Fill the log at its native speed (each record encoded once, appended in big group
    commits, not one producer call per patch). Returns the number of events appended."""
    log = EmbeddedLog(path, partitions=4)
    n = 0
    i = 0
    batch: list[tuple[str, str, bytes, tuple[()], None]] = []

    def put(p: Patch) -> None:
        nonlocal n, i, batch
        batch.append((log.topics.events, p.run_id, encode(p), (), None))
        n += len(p.events)
        i += 1
        if len(batch) >= 50_000:
            log._append_many(batch)
            batch = []

    for r in range(runs):
        for rev, evs in enumerate(first_events(r)):
            put(_patch(f"run_{r:06d}", rev, evs, i))
    head = len(first_events(0))
    for u in range(updates):
        for r in range(runs):
            put(_patch(f"run_{r:06d}", head + u, update(u), i))
    if batch:
        log._append_many(batch)
    log.close()
    return n


def project_process(log_path: Path, state: Path) -> tuple[float, int, str]:
    """``runstate project --until-caught-up`` as its own process (a partition without a
    local store is restored from the checkpoints topic, as in production): seconds, peak
    memory (kB) and what it printed."""
    env = {**os.environ, "RUNSTATE_LOG": str(log_path), "RUNSTATE_STATE_DIR": str(state), "RUNSTATE_BATCH_SIZE": "5000"}
    code = (
        "import sys\nfrom runstate.cli import main\n"
        "try:\n    main(['project', '--until-caught-up', '--quiet'])\nexcept SystemExit:\n    pass\n" + PRINT_PEAK
    )
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=7200)
    dt = time.perf_counter() - t
    peak = next(int(ln.split()[1]) for ln in out.stderr.splitlines() if ln.startswith("PEAK"))
    return dt, peak, out.stdout + out.stderr


def rocksdb_floor(state: Path) -> tuple[int, float, float]:
    """RocksDB's own rate of loading the recovered state's bytes (every key and value of
    its partition stores), from Python, into fresh databases: ``(bytes, seconds as sorted
    SST files ingested, seconds as write batches)``. What a restore that writes the same
    bytes could approach at best."""
    total, sst_s, batch_s = 0, 0.0, 0.0
    for part in sorted(state.glob("p[0-9][0-9][0-9]")):
        src = Rdict(str(part), Options(raw_mode=True), access_type=AccessType.read_only())
        kv = list(src.items())
        src.close()
        total += sum(len(k) + len(v) for k, v in kv)
        with scratch("runstate-bench-floor-") as tmp:
            t = time.perf_counter()
            w = SstFileWriter(Options(raw_mode=True))
            w.open(str(tmp / "all.sst"))
            for k, v in kv:
                w[k] = v
            w.finish()
            db = Rdict(str(tmp / "sst"), Options(raw_mode=True))
            db.ingest_external_file([str(tmp / "all.sst")], IngestExternalFileOptions())
            db.close()
            sst_s += time.perf_counter() - t
            t = time.perf_counter()
            db = Rdict(str(tmp / "batches"), Options(raw_mode=True))
            for i in range(0, len(kv), 20_000):
                wb = WriteBatch(raw_mode=True)
                for k, v in kv[i : i + 20_000]:
                    wb.put(k, v)
                db.write(wb)
            db.close()
            batch_s += time.perf_counter() - t
    return total, sst_s, batch_s


def log_bytes(log: EmbeddedLog) -> int:
    """The events' bytes on the log."""
    t = log.topics.events
    return sum(len(r.value) for p in range(log.partitions(t)) for r in log.scan(t, p, 0, 10**12))


def _ok(where: object, err: Exception | None) -> None:
    if err is not None:
        raise err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--every",
        type=int,
        default=CheckpointPolicy().every,
        help="checkpoint every K revisions [the product's default, %(default)s]",
    )
    ap.add_argument(
        "--max-age",
        type=int,
        default=CheckpointPolicy().max_age,
        help="records a run's uncovered records may wait for a checkpoint (the restore's tail) [%(default)s]",
    )
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--updates", default="21,46", help="4-event updates per run after the first 20 events, per history")
    args = ap.parse_args()
    runs, lengths = (500, (21, 46)) if args.quick else (args.runs, tuple(int(x) for x in args.updates.split(",")))
    rows = []
    with scratch("runstate-bench-recovery-") as root:
        for updates in lengths:
            d = root / f"h{updates}"
            t = time.perf_counter()
            events = build_log(d / "log.db", runs, updates)
            print(
                f"history: {runs:,} runs, {events:,} events ({events // runs} per run), log built in "
                f"{time.perf_counter() - t:.0f}s",
                flush=True,
            )
            # The full replay first, while the log holds no checkpoints to restore from.
            full_s, full_peak, _ = project_process(d / "log.db", d / "full")
            print(
                f"  full replay: {full_s:.1f}s ({events / full_s:,.0f} events/s), peak {full_peak / 1024:.0f} MB",
                flush=True,
            )

            log = EmbeddedLog(d / "log.db")
            t = time.perf_counter()
            snap = Snapshotter(
                log, str(d / "snap"), policy=CheckpointPolicy(every=args.every, max_age=args.max_age), batch_size=5000
            )
            snap.run(until_caught_up=True, poll_timeout_s=0.01)
            ck = log.topics.checkpoints
            live = sum(len(r.value) for p in range(log.partitions(ck)) for r in log.scan(ck, p, 0, 10**12))
            print(
                f"  snapshotter (not timed in the comparison): {snap.writer.written:,} checkpoints in "
                f"{time.perf_counter() - t:.0f}s, {snap.writer.written_bytes / 1e6:,.1f} MB written "
                f"({snap.writer.written_bytes / log_bytes(log):.2f}x the events' bytes), "
                f"{live / 1e6:,.1f} MB on the compacted topic",
                flush=True,
            )
            log.close()

            rec_s, rec_peak, _ = project_process(d / "log.db", d / "recovered")
            print(
                f"  checkpoints + tail: {rec_s:.1f}s ({live / 1e6 / rec_s:,.1f} MB/s of checkpoints loaded), "
                f"peak {rec_peak / 1024:.0f} MB",
                flush=True,
            )
            with Projection(d / "full") as a, Projection(d / "recovered") as b:
                assert a.digests() == b.digests(), "recovered projection differs from the full replay"
            state_b, sst_s, batch_s = rocksdb_floor(d / "recovered")
            print(
                f"  state loaded: {state_b / 1e6:,.1f} MB of store keys and values, {state_b / 1e6 / rec_s:,.0f} MB/s "
                f"by the restore (its whole process); RocksDB's own from Python, the floor: "
                f"{state_b / 1e6 / sst_s:,.0f} MB/s as SST files ingested ({sst_s:.1f}s), "
                f"{state_b / 1e6 / batch_s:,.0f} MB/s as write batches ({batch_s:.1f}s)",
                flush=True,
            )
            rows.append((events, full_s, rec_s, full_peak, rec_peak))
            shutil.rmtree(d)
        print()
        for events, full_s, rec_s, full_peak, rec_peak in rows:
            print(
                f"RESULT {events:,} events over {runs:,} runs: full replay {full_s:.1f}s, checkpoints + tail "
                f"{rec_s:.1f}s, ratio {full_s / rec_s:.1f}x; peak memory {full_peak / 1024:.0f} / "
                f"{rec_peak / 1024:.0f} MB (goal >= 50x, < 1 GB)"
            )


if __name__ == "__main__":
    main()
