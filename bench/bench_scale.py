"""A million runs: the projector's rate on a tail after 1,000,000 runs against after 1,000,
the projector's and serve's peak memory at the defaults, and the store's size per run.

    .venv/bin/python bench/bench_scale.py              # 1,000,000 runs
    .venv/bin/python bench/bench_scale.py --quick      # 100,000 runs

Two embedded logs are filled at the log's native speed (records encoded once, appended in
big group commits): one run per ``RunStarted`` patch, 1,000 runs in one and ``--runs`` in
the other. Each is projected by a ``runstate project`` process (its peak memory is read
from the kernel), then the same tail (two-event patches, each on a run drawn at random, so
most touch a run that is not cached) is appended to both and projected by new processes,
side by side: events/s and their ratio (goal ≥ 0.7), peak memory (goal < 1 GB). Then
``runstate serve`` on the big projection answers a state, a context and the first page of
``GET /runs`` and its peak memory is read.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from benchkit import AUTHOR, PRINT_PEAK, TRUST, free_port, scratch
from runstate.eventlog.embedded import EmbeddedLog
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def run_id(i: int) -> str:
    return f"run-{i:07d}"


def fill(log: EmbeddedLog, runs: int) -> None:
    batch = []
    for i in range(runs):
        p = Patch.model_validate(
            {
                "patch_id": f"s{i}",
                "run_id": run_id(i),
                "expected_revision": 0,
                "events": [{"type": "RunStarted", "goal": {"statement": f"support ticket {i}"}, "policy": TRUST}],
                "author": AUTHOR,
                "created_at": T0,
            }
        )
        batch.append((log.topics.events, run_id(i), encode(p), (), None))
        if len(batch) >= 50_000:
            log._append_many(batch)
            batch = []
    if batch:
        log._append_many(batch)


def tail(log: EmbeddedLog, runs: int, n: int, seed: int = 3) -> int:
    """``n`` two-event patches on runs drawn at random (each run's revisions tracked); returns events."""
    rnd = random.Random(seed)
    revision: dict[int, int] = {}
    batch = []
    for k in range(n):
        i = rnd.randrange(runs)
        rev = revision.get(i, 1)
        revision[i] = rev + 1
        p = Patch.model_validate(
            {
                "patch_id": f"t{k}",
                "run_id": run_id(i),
                "expected_revision": rev,
                "events": [
                    {
                        "type": "FactConfirmed",
                        "fact": {"id": f"f{k}", "statement": f"observation {k}", "evidence": f"artifact://o/{k}"},
                    },
                    {"type": "BudgetConsumed", "tokens": 10},
                ],
                "author": AUTHOR,
                "created_at": T0 + timedelta(seconds=k),
            }
        )
        batch.append((log.topics.events, run_id(i), encode(p), (), None))
    log._append_many(batch)
    return 2 * n


def project(work: Path) -> tuple[float, int]:
    """Seconds and peak memory (kB) of a ``runstate project --until-caught-up`` process."""
    env = {**os.environ, "RUNSTATE_LOG": str(work / "log.db"), "RUNSTATE_STATE_DIR": str(work / "state")}
    t = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from runstate.cli import main\n"
            "try:\n    main(['project', '--until-caught-up', '--quiet'])\n"
            "except SystemExit as e:\n    code = e.code\n" + PRINT_PEAK,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    dt = time.perf_counter() - t
    peak = next(int(ln.split()[1]) for ln in out.stderr.splitlines() if ln.startswith("PEAK"))
    return dt, peak


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def serve_peak(work: Path, runs: int) -> tuple[int, float]:
    """Peak memory (kB) of ``runstate serve`` on the projection after a few reads, and the
    first page of ``GET /runs`` in ms."""
    port = free_port()
    env = {**os.environ, "RUNSTATE_LOG": str(work / "log.db"), "RUNSTATE_STATE_DIR": str(work / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runstate.cli", "serve", "--port", str(port), "--no-snapshotter"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=2).json().get("owned_partitions"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        http = httpx.Client(base_url=url, timeout=120)
        for i in (0, runs // 2, runs - 1):
            assert http.get(f"/runs/{run_id(i)}").status_code == 200
            assert http.get(f"/runs/{run_id(i)}/context").status_code == 200
        t = time.perf_counter()
        assert http.get("/runs", params={"limit": 50}).status_code == 200
        page_ms = (time.perf_counter() - t) * 1000
        status = Path(f"/proc/{proc.pid}/status").read_text()
        peak = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM")))
        return peak, page_ms
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--tail", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    big = 100_000 if args.quick else args.runs
    n_tail = 5_000 if args.quick else args.tail
    with scratch("runstate-bench-scale-") as root:
        rates, peaks = {}, {}
        for runs in (1000, big):
            work = root / f"r{runs}"
            work.mkdir()
            log = EmbeddedLog(work / "log.db")
            t = time.perf_counter()
            fill(log, runs)
            print(f"filled {runs:,} runs in {time.perf_counter() - t:.0f} s", flush=True)
            dt, peak = project(work)
            print(
                f"RESULT project {runs:,} new runs: {runs / dt:,.0f} patches/s, peak memory {peak / 1024:.0f} MB",
                flush=True,
            )
            if runs == big:
                size = du(work / "state")
                print(f"RESULT store on disk after {runs:,} runs: {size / 1e6:.0f} MB, {size / runs:.0f} bytes per run")
            events = tail(log, runs, n_tail)
            log.close()
            dt, peak = project(work)
            rates[runs], peaks[runs] = events / dt, peak
            print(
                f"RESULT tail of {n_tail:,} patches over {runs:,} runs: {rates[runs]:,.0f} events/s "
                f"(process included), peak memory {peak / 1024:.0f} MB",
                flush=True,
            )
        print(f"RESULT ratio after {big:,} / after 1,000 runs: {rates[big] / rates[1000]:.2f} (goal >= 0.7)")
        peak, page_ms = serve_peak(root / f"r{big}", big)
        print(
            f"RESULT serve on {big:,} runs: peak memory {peak / 1024:.0f} MB (goal < 1 GB); GET /runs first "
            f"page {page_ms:.0f} ms"
        )


if __name__ == "__main__":
    main()
