"""`runstate serve` over loopback, side by side with the same calls in-process and with a
plain framework endpoint as the floor, in one run (embedded log, real RocksDB, real
processes).

    .venv/bin/python bench/bench_serve.py           # 10,000 runs; 500 patches/s for 20 s; 5,000 GETs
    .venv/bin/python bench/bench_serve.py --quick   # 1,000 runs; 5 s; 1,000 GETs

Figures (milliseconds, p50 / p99 / max):

- append -> decision over HTTP: ``POST /runs/{id}/patches?wait=10`` sent open-loop at a
  steady rate (one every 1/rate s, whatever the answers do), each to a random run with
  its current revision, latency from send to the decision;
- the same in-process: ``RunProducer.submit`` (append + wait, reading the decision from the
  projection on the same disk, as a local worker does) against the same projector;
- ``GET /runs/{id}`` on random runs of the store, one client, keep-alive;
- the same in-process: ``Projection.state`` on the store (a read-only RocksDB view);
- the floor: ``GET`` of a constant JSON from a bare FastAPI app on uvicorn.

Goal (issue 10): append -> decision p99 < 50 ms, state p99 < 5 ms over loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

from benchkit import AUTHOR, TRUST, free_port, metrics, wait_for
from runstate.eventlog.embedded import EmbeddedLog
from runstate.producers.run_producer import RunProducer
from runstate.projector.read.queries import Projection, decision_reader
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch

PARTITIONS = 4


def pct(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    p = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return f"{p(0.5) * 1e3:7.2f} / {p(0.99) * 1e3:7.2f} / {xs[-1] * 1e3:7.2f}"


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def seed(log_path: Path, runs: int) -> None:
    """One RunStarted and two facts per run, appended straight to the log."""
    log = EmbeddedLog(log_path, partitions=PARTITIONS)
    prod = log.producer()
    for r in range(runs):
        run = f"run_{r}"
        events = [
            {"type": "RunStarted", "goal": {"statement": f"goal {r}"}, "policy": TRUST},
            *(
                {
                    "type": "FactConfirmed",
                    "fact": {"id": f"f{k}", "statement": f"fact {k}", "evidence": f"artifact://o/{r}/{k}"},
                }
                for k in range(2)
            ),
        ]
        p = Patch.model_validate(
            {
                "patch_id": f"seed-{r}",
                "run_id": run,
                "expected_revision": 0,
                "events": events,
                "author": AUTHOR,
                "created_at": "2026-12-01T00:00:00Z",
            }
        )
        prod.append_async(log.topics.events, run, encode(p), lambda w, e: None)
    prod.close()
    log.close()


def wait_caught_up(url: str, runs: int, timeout_s: float = 600) -> None:
    def done() -> bool:
        # the projector and the in-process snapshotter (checkpointing every seeded run)
        m = metrics(url)
        lags = m.get("runstate_lag_records", []) + m.get("runstate_snapshotter_lag_records", [])
        return (
            len(lags) == 2 * PARTITIONS and sum(lags) == 0 and len(httpx.get(url + "/runs", timeout=30).json()) >= runs
        )

    wait_for(done, timeout_s, "serve did not catch up")


def start_serve(work: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNSTATE_LOG": str(work / "log.db"), "RUNSTATE_STATE_DIR": str(work / "state")}
    return subprocess.Popen(
        [sys.executable, "-m", "runstate.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(work / "serve.log", "wb"),
    )


FLOOR_APP = textwrap.dedent("""
    import sys, uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response
    app = FastAPI()
    BODY = b'{"run_id": "run_1", "revision": 1}'
    @app.get("/runs/{run_id}")
    async def state(run_id: str) -> Response:
        return Response(BODY, media_type="application/json")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""")


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def get_latencies(url: str, runs: int, n: int, rng: random.Random) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=10) as c:
        for _ in range(50):  # warm the connection
            c.get(f"/runs/run_{rng.randrange(runs)}")
        for _ in range(n):
            t = time.perf_counter()
            r = c.get(f"/runs/run_{rng.randrange(runs)}")
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return out


class LeanPool:
    """A minimal HTTP/1.1 keep-alive client for the load generator.

    httpx's AsyncClient costs about 1-2 ms of CPU per request: at 500 requests/s on two
    cores the generator itself saturated a core and its queueing was measured as the
    server's latency. This one writes the request bytes and parses the status line,
    headers and a Content-Length body, nothing else (the server under test always sends
    Content-Length)."""

    #: Idle connections older than this are dropped, not reused: uvicorn closes a
    #: keep-alive connection after 5 s idle, and a request on it would fail.
    MAX_IDLE_S = 2.0

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []

    async def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        now = time.monotonic()
        while self.idle and now - self.idle[-1][2] > self.MAX_IDLE_S:
            self.idle.pop()[1].close()
        if self.idle:
            reader, writer, _t = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (method.encode(), path.encode(), self.host.encode(), len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(h.split(b":", 1)[1]) for h in lines[1:] if h.lower().startswith(b"content-length:"))
        data = await reader.readexactly(length)
        self.idle.append((reader, writer, time.monotonic()))
        return status, data

    def close(self) -> None:
        """Closes the idle connections (they belong to the event loop that opened them);
        the pool can be used again, from another loop."""
        for _r, w, _t in self.idle:
            w.close()
        self.idle.clear()


async def append_at_rate(
    url: str, runs: int, rate: float, seconds: float, rng: random.Random, shed: list[float] | None = None
) -> tuple[list[float], int, int, float]:
    """Open loop: a POST every 1/rate s to a run not in flight, with its next revision.
    Returns latencies, not accepted, skipped slots and the generator's own CPU share;
    ``shed`` gets the latency of each answer 429 (admission control: not sent again here)."""
    revisions = {f"run_{r}": 1 for r in range(runs)}
    busy: set[str] = set()
    lat: list[float] = []
    failed = skipped = 0
    u = httpx.URL(url)
    pool = LeanPool(u.host, u.port or 80)
    cpu0, wall0 = time.process_time(), time.perf_counter()

    async def one(run: str) -> None:
        nonlocal failed
        rev = revisions[run]
        body = json.dumps({"expected_revision": rev, "events": [{"type": "BudgetConsumed", "tokens": 1}]}).encode()
        t = time.perf_counter()
        status, data = await pool.post_json(f"/runs/{run}/patches?wait=10", body)
        dt = time.perf_counter() - t
        busy.discard(run)
        if status == 429 and shed is not None:
            shed.append(dt)
            return
        d = json.loads(data).get("decision") if status == 200 else None
        if d is None or d["outcome"] != "accepted":
            failed += 1
            return
        revisions[run] = d["revision"]
        lat.append(dt)

    tasks = []
    t0 = time.perf_counter()
    k = 0
    while (now := time.perf_counter() - t0) < seconds:
        due = int(now * rate) + 1
        while k < due:
            k += 1
            run = f"run_{rng.randrange(runs)}"
            if run in busy:  # a send slot whose run is still in flight: counted, not sent
                skipped += 1  # (spinning for a free run would stall the loop once all are busy)
                continue
            busy.add(run)
            tasks.append(asyncio.create_task(one(run)))
        await asyncio.sleep(max(0.0, (k / rate) - (time.perf_counter() - t0)))
    await asyncio.gather(*tasks)
    pool.close()
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return lat, failed, skipped, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float)
    args = ap.parse_args()
    runs = args.runs or (1_000 if args.quick else 10_000)
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    n_get = 1_000 if args.quick else 5_000
    rng = random.Random(7)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    print(f"seeding {runs} runs ...", flush=True)
    seed(work / "log.db", runs)
    port, floor_port = free_port(), free_port()
    serve = start_serve(work, port)
    floor = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(floor_port)])
    url, floor_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{floor_port}"
    try:
        wait_http(url + "/healthz")
        wait_caught_up(url, runs)
        wait_http(floor_url + "/runs/x")
        print(f"serve caught up on {runs} runs; measuring (ms: p50 / p99 / max)", flush=True)

        http_get = get_latencies(url, runs, n_get, rng)
        floor_get = get_latencies(floor_url, runs, n_get, rng)
        proj_get = []
        with Projection(work / "state") as proj:
            for _ in range(50):
                proj.state(f"run_{rng.randrange(runs)}")
            for _ in range(n_get):
                t = time.perf_counter()
                proj.state(f"run_{rng.randrange(runs)}")
                proj_get.append(time.perf_counter() - t)

        print("appending over HTTP ...", flush=True)
        shed: list[float] = []
        http_append, failed, skipped, gen_cpu = asyncio.run(append_at_rate(url, runs, args.rate, seconds, rng, shed))
        print("appending in-process ...", flush=True)
        # in-process: RunProducer against the same projector, sequential, on runs of its own
        log = EmbeddedLog(work / "log.db", create=False)
        producer = RunProducer(log, AUTHOR, decisions=decision_reader(work / "state"))
        local_append = []
        with Projection(work / "state") as proj:
            pool = [f"run_{r}" for r in rng.sample(range(runs), 200)]
            revs = {}
            for r in pool:
                revs[r] = proj.state(r).revision
        t_end = time.perf_counter() + min(seconds, 10)
        i = 0
        while time.perf_counter() < t_end:
            r = pool[i % len(pool)]
            i += 1
            p = producer.events(r, revs[r], [{"type": "BudgetConsumed", "tokens": 1}])
            t = time.perf_counter()
            d = producer.submit(p, 10)
            local_append.append(time.perf_counter() - t)
            assert d.outcome == "accepted", d
            revs[r] = d.revision
        producer.close()
        log.close()
    finally:
        for proc in (serve, floor):
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)

    sent = len(http_append) + failed + len(shed)
    print()
    print(f"{'call':58s} {'p50 / p99 / max (ms)':>28s}   n")
    print(
        f"{'POST patch ?wait -> decision, HTTP, open loop %d/s' % args.rate:58s} {pct(http_append)}   "
        f"{sent} ({failed} not accepted, {skipped} slots skipped: run in flight)"
    )
    if shed:
        print(f"{'  ... answered 429 at once (RUNSTATE_MAX_IN_FLIGHT)':58s} {pct(shed)}   {len(shed)}")
    print(f"{'RunProducer.submit in-process (sequential)':58s} {pct(local_append)}   {len(local_append)}")
    print(f"{'GET /runs/{id} state, HTTP, %d runs' % runs:58s} {pct(http_get)}   {len(http_get)}")
    print(f"{'Projection.state in-process':58s} {pct(proj_get)}   {len(proj_get)}")
    print(f"{'GET constant JSON, bare FastAPI on uvicorn (the floor)':58s} {pct(floor_get)}   {len(floor_get)}")
    print(
        f"load generator CPU {gen_cpu:.0%} of a core while appending"
        + (" (near saturation: its queueing counts as latency)" if gen_cpu > 0.8 else "")
    )
    print(
        f"goodput {len(http_append) / seconds:.0f} decided patches/s of {args.rate:.0f}/s offered; "
        f"max in flight {os.environ.get('RUNSTATE_MAX_IN_FLIGHT', '128 (default)')}"
    )
    print()
    print(
        f"ratios: state HTTP / floor p50 {statistics.median(http_get) / statistics.median(floor_get):.2f}x, "
        f"p99 {p99(http_get) / p99(floor_get):.2f}x; state HTTP / in-process p50 "
        f"{statistics.median(http_get) / statistics.median(proj_get):.2f}x; append HTTP / in-process p50 "
        f"{statistics.median(http_append) / statistics.median(local_append):.2f}x"
    )
    print(
        f"goals: append->decision p99 {p99(http_append) * 1e3:.1f} ms "
        f"(< 50: {'met' if p99(http_append) < 0.05 else 'NOT met'}); "
        f"state p99 {p99(http_get) * 1e3:.2f} ms (< 5: {'met' if p99(http_get) < 0.005 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
