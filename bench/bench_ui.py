"""The audit pages in a real browser: first meaningful paint over loopback, in one run.

    .venv/bin/python bench/bench_ui.py           # 10,000 runs, a run of 1,000 patches, 7 loads each
    .venv/bin/python bench/bench_ui.py --quick   # 1,000 runs, a run of 200 patches, 3 loads each

Headless Chromium (Debian's ``chromium``, through Playwright) opens each page cold (a new
browser context: no cache) against a ``runstate serve`` on the embedded log, and the figure
is ``performance.now()`` when the page's content is on screen, in ms, from the navigation's
start: the runs list's first row (``/ui``), a run's timeline and state (``/ui/runs/{id}``).
The page shell alone (``/ui`` with no API call awaited) is the floor. The data is appended
straight to the log, then projected by the serve before measuring.
Goal (issue 31): under 1 s for the run of 1,000 patches and for the list of 10,000 runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from benchkit import AUTHOR, TRUST, free_port, metrics, wait_for
from runstate.eventlog.embedded import EmbeddedLog
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch

LONG_RUN = "long-run"


def seed(log_path: Path, runs: int, patches: int) -> int:
    """``runs`` runs of one patch, and one run of ``patches`` patches; the records appended."""
    log = EmbeddedLog(log_path, partitions=4)
    prod = log.producer()

    def put(run: str, n: int, events: list[dict[str, object]]) -> None:
        p = Patch.model_validate(
            {
                "patch_id": f"{run}-{n}",
                "run_id": run,
                "expected_revision": n,
                "events": events,
                "author": AUTHOR,
                "created_at": "2026-12-01T00:00:00Z",
            }
        )
        prod.append_async(log.topics.events, run, encode(p), lambda w, e: None)

    for r in range(runs):
        put(f"run_{r:06d}", 0, [{"type": "RunStarted", "goal": {"statement": f"goal {r}"}, "policy": TRUST}])
    put(LONG_RUN, 0, [{"type": "RunStarted", "goal": {"statement": "a long run"}, "policy": TRUST}])
    for n in range(1, patches):
        put(
            LONG_RUN,
            n,
            [
                {
                    "type": "FactConfirmed",
                    "fact": {"id": f"f{n}", "statement": f"fact {n}", "evidence": f"artifact://o/{n}"},
                }
            ],
        )
    prod.close()
    log.close()
    return runs + patches


def caught_up(url: str, records: int, timeout_s: float = 900) -> None:
    def done() -> bool:
        m = metrics(url)
        lags = m.get("runstate_lag_records", [])
        return m.get("runstate_projector_records", [0])[0] >= records and bool(lags) and sum(lags) == 0

    wait_for(done, timeout_s, "the serve did not catch up")


def paint(browser: object, url: str, selector: str) -> float:
    """ms from the navigation's start until ``selector`` is on screen, in a fresh context."""
    ctx = browser.new_context()  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.goto(url, wait_until="commit")
    page.wait_for_selector(selector, timeout=60_000)
    ms = float(page.evaluate("performance.now()"))
    ctx.close()
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs, patches, loads = (1_000, 200, 3) if args.quick else (10_000, 1_000, 7)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("needs Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        records = seed(work / "log.db", runs, patches)
        print(f"appended {records:,} records in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", "serve", "--port", str(port)],
            env={**os.environ, "RUNSTATE_LOG": str(work / "log.db"), "RUNSTATE_STATE_DIR": str(work / "state")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            caught_up(url, records)
            print(f"projected in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=exe, args=["--no-sandbox", "--disable-background-networking"]
                )
                cases = {
                    "page shell (floor)": (url + "/ui/nowhere", "h1"),
                    f"runs list, {runs:,} runs": (url + "/ui", "#runs tbody tr"),
                    f"run of {patches:,} patches": (url + f"/ui/runs/{LONG_RUN}", "#state h2"),
                }
                got: dict[str, list[float]] = {k: [] for k in cases}
                for _ in range(loads):  # the cases take turns
                    for name, (where, sel) in cases.items():
                        got[name].append(paint(browser, where, sel))
                browser.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    floor = statistics.median(got["page shell (floor)"])
    print(f"\nfirst meaningful paint over loopback, ms (median of {loads} cold loads; x = against the page shell)\n")
    print("| page | median | max | x |\n|---|---|---|---|")
    for name, xs in got.items():
        m = statistics.median(xs)
        print(f"| {name} | {m:.0f} | {max(xs):.0f} | {m / floor:.1f} |")


if __name__ == "__main__":
    main()
