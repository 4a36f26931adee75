"""`runstate serve` on Kafka, production's path: two instances as one consumer group on a
6-partition topic (separate state directories, as on two machines), clients sending to
both, so that about half of the requests land on the instance that does not own the run
and are forwarded to its owner.

    .venv/bin/python bench/bench_serve_kafka.py            # 1,000 patches/s for 60 s, twice
    .venv/bin/python bench/bench_serve_kafka.py --quick    # 200 patches/s for 10 s, twice
    .venv/bin/python bench/bench_serve_kafka.py --rate 250 --seconds 20 --forwarded 0 --gets 0 --steady-only
                                    # the capacity model's runs: what a patch costs, forwarded or not
    .venv/bin/python bench/bench_serve_kafka.py --capacity 300,450,600,750 --forwarded 0 --gets 0
                                    # capacity: the highest open-loop rate that meets the goal
    .venv/bin/python bench/bench_serve_kafka.py --overload --rate 1000 --seconds 60
                                    # overload: what is shed (429), what is admitted, and after

Two phases, each on fresh topics and fresh instances:

1. **steady**: open loop (a patch every 1/rate s, whatever the answers do), each
   ``POST /runs/{id}/patches?wait=10`` to the two instances in turn, a fact with a fresh id
   on a random run (``rebase``: facts commute, so no patch is refused for a concurrent
   one); beside it, ``GET /runs/{id}`` at 100/s, each through the instance that does *not*
   own the run. Figures: append -> decision and GET latency (ms, p50 / p99 / max),
   errors. Goals: append -> decision p99 < 50 ms, GET through the non-owner p99 < 10 ms, no
   error.
2. **SIGKILL**: the same load, and one instance SIGKILLed at the middle. A client whose
   instance is gone (a refused connection, a reset) or whose run's partition is moving
   (503) sends the same patch (same ``patch_id``) again, to the survivor, until it has a
   decision. Figures: the longest time from a patch's first send to its decision (goal
   < 8 s) and the longest stretch with no decision at all (goal < 6 s), with the consumer
   settings of ``RUNSTATE_KAFKA_CONFIG`` (e.g. ``{"consumer.partition.assignment.strategy":
   "cooperative-sticky"}``) over runstate's defaults.

After each phase, with the instances stopped, a new projector restores an empty state
directory from the checkpoints and the log's tail: every patch answered ``accepted`` is in
its run, each patch id is decided once (0 lost, 0 decided twice), and ``verify`` holds that
projection equal to a full replay of the log.

With ``--capacity R1,R2,...`` each rate is a steady phase of its own, after a warm-up of the
same load (``--warmup``, 3 s: a start's first seconds are a separate question from a rate's
capacity), and a table ends the run: the highest rate whose append -> decision p99 stays
under 50 ms with no error. Each steady phase also prints the broker's and the load
generator's CPU per decided patch (what the machine pays in all, and the rate its cores
could carry at that cost) and **the floor**: a RunProducer and a projector configured as
serve's, in one process of their own at the same rate (no HTTP, no snapshotter, no
forwarding), their CPU per patch.

The broker is ``RUNSTATE_BENCH_KAFKA`` or one of the benchmark's own (bench/benchkit.py).
Everything runs on this machine: the broker, both instances and the load generator share
its cores, and the load generator's CPU is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from bench_serve import LeanPool, p99, pct
from benchkit import AUTHOR, TRUST, free_port, kafka_broker

from runstate.app import make_producer, make_projector, open_settings_log
from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import CONSUMER_DEFAULTS, KafkaLog
from runstate.eventlog.partitioner import partition_for
from runstate.projector.core.working import RunDoc
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import verify
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.schemas.codec import encode
from runstate.schemas.patch import Decision, Patch
from runstate.settings import Settings

#: The instances prove it to each other before forwarding (eventlog/instancekey.py).
INSTANCE_SECRET = secrets.token_hex(32)

PARTITIONS = 6
#: The group's session timeout the instances run with (RUNSTATE_KAFKA_CONFIG over the default), as
#: printed: with KIP-848's protocol it is the broker's (``group.consumer.session.timeout.ms``).
_GROUP = json.loads(os.environ.get("RUNSTATE_KAFKA_CONFIG") or "{}")
SESSION_TIMEOUT = (
    "the broker's group.consumer.session.timeout.ms (KIP-848)"
    if _GROUP.get("consumer.group.protocol") == "consumer"
    else f"{_GROUP.get('consumer.session.timeout.ms', CONSUMER_DEFAULTS['session.timeout.ms']) / 1000:.0f}s"
)
#: A send slot finding this many patches in flight is skipped and counted: a server that
#: fell this far behind is saturated, and more sockets would only exhaust the generator's.
MAX_IN_FLIGHT = 2_000
#: how long the overload phase sends at the calm rate after its burst (s)
CALM_S = 10.0
#: how long ``--capacity`` loads a fresh broker before its first phase, not counted (s)
BROKER_WARMUP_S = 20.0


def cpu_s(pid: int | None) -> float:
    """CPU seconds a process has used (user + system, from /proc); 0 if it is gone or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Instance:
    """One ``runstate serve`` on Kafka, on a loopback port."""

    def __init__(self, name: str, bootstrap: str, topics: TopicNames, work: Path, snapshotter: str = "thread") -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = work / name
        env = {
            **os.environ,
            "RUNSTATE_LOG": f"kafka://{bootstrap}",
            "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
            "RUNSTATE_STATE_DIR": str(self.state),
            "RUNSTATE_INSTANCE_SECRET": INSTANCE_SECRET,
        }
        apart = snapshotter == "process"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", "serve", "--port", str(self.port)]
            + (["--no-snapshotter"] if snapshotter != "thread" else []),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / f"{name}.log", "wb"),
        )
        #: ``snapshotter="process"``: the instance's snapshotter as ``runstate snapshot`` beside
        #: ``serve --no-snapshotter`` (its CPU and memory counted as the instance's)
        self.snap = (
            subprocess.Popen(
                [sys.executable, "-m", "runstate.cli", "snapshot", "--quiet"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"{name}-snapshot.log", "wb"),
            )
            if apart
            else None
        )
        self.pool = LeanPool("127.0.0.1", self.port)
        #: the partitions it owned when last asked (the load refreshes it every second)
        self.owned_cache: set[int] = set()

    def owned(self) -> set[int]:
        return self.health()[0]

    def pids(self) -> list[int]:
        return [self.proc.pid] + ([self.snap.pid] if self.snap is not None else [])

    def cpu_s(self) -> float:
        """CPU seconds the instance's processes have used (0 once they are gone)."""
        return sum(cpu_s(pid) for pid in self.pids())

    def cpu_by_thread(self) -> dict[str, float]:
        """CPU seconds per thread name (the kernel's: serve names its threads ``rs-*``,
        librdkafka its own ``rdk:*``), summed over threads of one name."""
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for pid in self.pids():
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    comm = (task / "comm").read_text().strip()
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                name = "rdk:*" if comm.startswith("rdk:") else comm
                if pid != self.proc.pid:
                    name = f"snapshot process ({name})"
                out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return out

    def peak_mb(self) -> float:
        """The processes' peak resident memory so far (``VmHWM``, summed), MB; 0 once they have exited."""
        total = 0.0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM")) / 1024
        return total

    def health(self) -> tuple[set[int], set[int]]:
        """The partitions it serves, and those it is restoring."""
        try:
            body = httpx.get(self.url + "/healthz", timeout=2).json()
            return set(body["owned_partitions"]), {int(p) for p in body["restoring"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return set(), set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for proc in (self.proc, self.snap):
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)
                proc.wait(60)


def seed(bootstrap: str, topics: TopicNames, runs: int) -> None:
    """One RunStarted per run, appended to the events topic by a producer."""
    log = KafkaLog(bootstrap, topics=topics)
    prod = log.producer()
    for r in range(runs):
        p = Patch.model_validate(
            {
                "patch_id": f"seed-{r}",
                "run_id": f"run_{r}",
                "expected_revision": 0,
                "events": [{"type": "RunStarted", "goal": {"statement": f"goal {r}"}, "policy": TRUST}],
                "author": AUTHOR,
                "created_at": "2026-12-01T00:00:00Z",
            }
        )
        prod.append_async(topics.events, p.run_id, encode(p), lambda w, e: None)
    prod.close()
    log.close()


def fact_draft(fact_id: str, patch_id: str) -> dict[str, object]:
    """What every client of the bench sends: a fact with a fresh id, ``rebase`` (facts
    commute, so no patch is refused for a concurrent one)."""
    return {
        "patch_id": patch_id,
        "expected_revision": 0,
        "rebase": True,
        "events": [
            {
                "type": "FactConfirmed",
                "fact": {"id": fact_id, "statement": f"fact {fact_id}", "evidence": f"artifact://o/{fact_id}"},
            }
        ],
    }


def wait_split(a: Instance, b: Instance, runs: int, timeout_s: float = 180) -> None:
    """Until each instance owns some partitions, together all, and every seeded run is decided."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        oa, ob = a.owned(), b.owned()
        if oa and ob and oa | ob == set(range(PARTITIONS)):
            try:
                r = httpx.get(a.url + "/runs", params={"limit": 1}, timeout=30)
                if int(r.headers.get("x-total-count", 0)) >= runs:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    raise SystemExit(f"the two instances did not share the partitions and decide {runs} runs in {timeout_s}s")


class Load:
    """The open-loop clients of one phase and what they saw."""

    def __init__(
        self, instances: list[Instance], runs: int, rng: random.Random, forwarded: float | None = None, tag: str = ""
    ) -> None:
        self.instances = instances
        #: prefixes its fact and patch ids (a warm-up's load and the counted one share the runs)
        self.tag = tag
        self.runs = runs
        self.rng = rng
        #: the share of patches sent to the instance that does not own the run (None: each
        #: instance in turn, whoever owns the run, so about half)
        self.forwarded = forwarded
        self.append_lat: list[float] = []
        #: the first-try latencies of patches sent to the instance that does not own the run
        self.append_forwarded: list[float] = []
        self.get_lat: list[float] = []
        self.errors: list[str] = []
        self.retries = 0
        self.in_flight = 0
        self.skipped = 0
        self.accepted: dict[str, set[str]] = {}
        self.decided_at: list[float] = []
        self.longest = 0.0
        #: after the kill: when the survivor began restoring the dead one's partitions, and
        #: when it served them all (perf_counter)
        self.takeover: dict[str, float] = {}
        #: answers 429 (admission control: shed at once, not sent again here), their latency
        self.shed_lat: list[float] = []
        #: (when it was first sent, since the start; its latency) of each patch decided at the first try
        self.first_try: list[tuple[float, float]] = []
        #: latencies of ``GET /metrics`` asked every half second during the phase
        self.metrics_lat: list[float] = []
        #: the first instance's bound on requests in flight, read with each of those: (perf_counter, bound)
        self.bounds: list[tuple[float, float]] = []
        self.t0 = 0.0
        #: GETs answered 429
        self.get_shed = 0

    def other(self, inst: Instance) -> Instance:
        return self.instances[1 - self.instances.index(inst)]

    async def append(self, k: int, run: str, inst: Instance) -> None:
        self.in_flight += 1
        try:
            await self._append(k, run, inst)
        finally:
            self.in_flight -= 1

    def target(self, k: int, run: str) -> Instance:
        """The instance patch ``k`` of ``run`` is sent to (see :attr:`forwarded`)."""
        inst = self.instances[k % 2]
        if self.forwarded is not None:
            owner = partition_for(run, PARTITIONS) in inst.owned_cache
            if owner != (self.rng.random() >= self.forwarded):
                inst = self.other(inst)
        return inst if inst.alive() else self.other(inst)

    async def _append(self, k: int, run: str, inst: Instance) -> None:
        fid = f"{self.tag}f{k}"
        body = json.dumps(fact_draft(fid, f"p{self.tag}{k}-{uuid.uuid4().hex[:6]}")).encode()
        forwarded = partition_for(run, PARTITIONS) not in inst.owned_cache
        t0 = time.perf_counter()
        tries = 0
        while True:
            tries += 1
            try:
                status, data = await inst.pool.request("POST", f"/runs/{run}/patches?wait=10", body)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                status, data = 0, str(e).encode()
            decision = json.loads(data).get("decision") if status == 200 else None
            if decision is not None:
                break
            if status == 429:  # shed: nothing was done, and this client does not send it again
                self.shed_lat.append(time.perf_counter() - t0)
                return
            if status not in (0, 202, 503) or time.perf_counter() - t0 > 120:
                self.errors.append(f"POST {run} on {inst.name}: {status} {data[:200]!r}")
                return
            # its instance is gone, its partition is moving, or it was not decided in time:
            # the same patch (same id) again, to whichever instance is alive
            self.retries += 1
            if not inst.alive() or status == 0:
                inst = self.other(inst)
            await asyncio.sleep(0.05 * min(tries, 10))
        dt = time.perf_counter() - t0
        self.decided_at.append(time.perf_counter())
        self.longest = max(self.longest, dt)
        if tries == 1:
            self.append_lat.append(dt)
            self.first_try.append((t0 - self.t0, dt))
            if forwarded:
                self.append_forwarded.append(dt)
        if decision["outcome"] == "accepted":
            self.accepted.setdefault(run, set()).add(fid)
        else:
            self.errors.append(f"POST {run}: {decision['outcome']} {decision.get('reason')}")

    async def get_through_non_owner(self) -> None:
        run = f"run_{self.rng.randrange(self.runs)}"
        p = partition_for(run, PARTITIONS)
        alive = [i for i in self.instances if i.alive()]
        if len(alive) < 2:
            return  # only the survivor: nothing is forwarded
        non_owner = next((i for i in alive if p not in i.owned_cache), None)
        if non_owner is None:
            return
        t = time.perf_counter()
        try:
            status, data = await non_owner.pool.request("GET", f"/runs/{run}")
        except (OSError, asyncio.IncompleteReadError) as e:
            status, data = 0, str(e).encode()
        if status == 200:
            self.get_lat.append(time.perf_counter() - t)
            return
        if status == 429:  # shed by admission control, as a patch may be
            self.get_shed += 1
            return
        if status == 0:
            await asyncio.sleep(0.5)  # a connection cut by the kill: the process may not be reaped yet
        if non_owner.alive():
            self.errors.append(f"GET {run} on {non_owner.name}: {status} {data[:200]!r}")

    async def watch_metrics(self, until: float) -> None:
        """``GET /metrics`` of the first instance every half second until ``until`` (perf_counter)."""
        async with httpx.AsyncClient(timeout=30) as client:
            while time.perf_counter() < until:
                t = time.perf_counter()
                try:
                    resp = await client.get(self.instances[0].url + "/metrics")
                    resp.raise_for_status()
                    self.metrics_lat.append(time.perf_counter() - t)
                    found = re.search(r"^runstate_http_in_flight_limit (\S+)$", resp.text, re.M)
                    if found is not None:
                        self.bounds.append((t, float(found.group(1))))
                except httpx.HTTPError as e:
                    self.errors.append(f"GET /metrics: {e!r}")
                await asyncio.sleep(0.5)

    async def run(
        self,
        rate: float,
        seconds: float,
        get_rate: float,
        kill_at: float | None,
        calm_rate: float = 0.0,
        calm_s: float = 0.0,
    ) -> float | None:
        """``rate`` patches/s for ``seconds``, then ``calm_rate`` for ``calm_s``. Returns when
        the instance was killed (perf_counter), if it was."""
        tasks: list[asyncio.Task[None]] = []
        killed = None
        t0 = self.t0 = time.perf_counter()
        burst = int(seconds * rate)

        def sent_by(now: float) -> int:  # how many patches are due by ``now``
            return int(min(now, seconds) * rate) + int(max(0.0, now - seconds) * calm_rate) + 1

        def due_at(k: int) -> float:
            return k / rate if k < burst or not calm_rate else seconds + (k - burst) / calm_rate

        if calm_s:
            tasks.append(asyncio.create_task(self.watch_metrics(t0 + seconds + calm_s)))
        seconds_all = seconds + (calm_s if calm_rate else 0.0)
        k = g = 0
        for inst in self.instances:
            inst.owned_cache = inst.owned()
        refreshed = t0
        while (now := time.perf_counter() - t0) < seconds_all:
            if kill_at is not None and killed is None and now >= kill_at:
                for pid in self.instances[0].pids():  # the machine dies: its snapshotter too
                    os.kill(pid, signal.SIGKILL)
                killed = time.perf_counter()
                print(f"  SIGKILLed {self.instances[0].name} at {now:.1f}s", flush=True)
            if time.perf_counter() - refreshed > (0.2 if killed else 1.0):  # who owns what, for the non-owner GETs
                for inst in self.instances:
                    inst.owned_cache = await asyncio.to_thread(inst.owned) if inst.alive() else set()
                refreshed = time.perf_counter()
                if killed is not None and "served" not in self.takeover:
                    owned, restoring = await asyncio.to_thread(self.instances[1].health)
                    if (restoring or len(owned) > PARTITIONS // 2) and "restoring" not in self.takeover:
                        self.takeover["restoring"] = refreshed
                    if owned == set(range(PARTITIONS)):
                        self.takeover["served"] = refreshed
            while k < sent_by(now):
                run = f"run_{self.rng.randrange(self.runs)}"
                if self.in_flight >= MAX_IN_FLIGHT:
                    self.skipped += 1
                else:
                    tasks.append(asyncio.create_task(self.append(k, run, self.target(k, run))))
                k += 1
            while get_rate and g < int(now * get_rate) + 1:
                tasks.append(asyncio.create_task(self.get_through_non_owner()))
                g += 1
            due = min(due_at(k), g / get_rate) if get_rate else due_at(k)
            await asyncio.sleep(max(0.0, due - (time.perf_counter() - t0)))
        await asyncio.gather(*tasks)
        for inst in self.instances:  # its connections belong to this event loop
            inst.pool.close()
        return killed

    def longest_silence(self, since: float) -> float:
        """The longest stretch after ``since`` without any decision reaching a client."""
        times = sorted(t for t in self.decided_at if t >= since)
        return max((b - a for a, b in zip([since, *times], times)), default=0.0)


def check(load: Load, instances: list[Instance], topics: TopicNames, bootstrap: str, work: Path) -> dict[str, object]:
    """Once the instances are stopped: a new projector on an empty state directory (restored
    from the checkpoints, then the log's tail, as a lost disk would be) decides the whole
    log; in it, patches answered ``accepted`` but absent from their run (lost), patch ids
    decided more than once, facts applied whose patch the client never saw accepted (its
    answer lost to an error: not lost, but said); then ``verify`` holds that projection equal
    to a full replay of the log."""
    for inst in instances:
        inst.stop()
    state = work / f"check-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "RUNSTATE_LOG": f"kafka://{bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(state),
    }
    done = subprocess.run(
        [sys.executable, "-m", "runstate.cli", "project", "--until-caught-up", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"the check's projector failed: {done.stderr[-2000:]}")
    lost = twice = unacknowledged = 0
    with Projection(state) as proj:
        for r in range(load.runs):
            run = f"run_{r}"
            facts = load.accepted.get(run, set())
            ids = {f.id for f in proj.state(run).confirmed_facts}
            lost += len(facts - ids)
            unacknowledged += len(ids - facts)
            decided = [d.patch_id for d in proj.history(run)]
            twice += len(decided) - len(set(decided))
    log = KafkaLog(bootstrap, topics=topics)
    report = verify(log, str(state))
    log.close()
    return {
        "accepted": sum(len(v) for v in load.accepted.values()),
        "lost": lost,
        "twice": twice,
        "unacknowledged": unacknowledged,
        "verify": report.ok,
    }


class _Count:
    """Projector hook: how many decisions are stored."""

    def __init__(self) -> None:
        self.decided = 0

    def on_assign(self, partition: int, store: ProjectionStore) -> None: ...

    def on_accepted(
        self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch
    ) -> None: ...

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        self.decided += len(batch.decisions)


def _floor_child(bootstrap: str, runs: int, rate: float, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """The core path alone, in one process: a RunProducer builds (validates) and appends the
    bench's patches at ``rate``, open loop, and a projector configured as serve's decides
    them (decisions copied to the decisions topic); no HTTP, no snapshotter. Puts its CPU
    ms per decided patch, counted from the first paced patch until the last is stored."""
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as state:
        settings = Settings(
            log=f"kafka://{bootstrap}", topic_prefix=prefix, state_dir=state, instance_secret=INSTANCE_SECRET
        )
        log = open_settings_log(settings)
        log.create_topics(PARTITIONS)
        hook = _Count()
        projector = make_projector(settings, log, hooks=hook, tune_gc=True)
        stop = threading.Event()
        thread = threading.Thread(target=lambda: projector.run(stop=stop), daemon=True)
        thread.start()
        producer = make_producer(settings, log)
        starts = [f"run_{r}" for r in range(runs)]
        for run in starts:
            start = {"type": "RunStarted", "goal": {"statement": run}, "policy": TRUST}
            producer.append_async(producer.build(run, {"expected_revision": 0, "events": [start]}), lambda r, e: None)
        producer.flush(30.0)
        while hook.decided < runs:
            time.sleep(0.05)
        rng = random.Random(7)
        n = int(rate * seconds)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for k in range(n):
            delay = t0 + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            run = starts[rng.randrange(runs)]
            producer.append_async(producer.build(run, fact_draft(f"f{k}", f"p{k}")), lambda r, e: None)
            producer.flush(30.0)  # as serve's appender does with what it was handed
        while hook.decided < runs + n:
            time.sleep(0.005)
        out.put(1000 * (time.process_time() - cpu0) / n)
        stop.set()
        thread.join(30)
        producer.close()
        log.close()


def floor(bootstrap: str, runs: int, rate: float, seconds: float) -> float:
    """:func:`_floor_child`'s CPU ms per patch, from a process of its own (nothing else counted)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_floor_child, args=(bootstrap, runs, rate, seconds, out))
    child.start()
    try:
        return float(out.get(timeout=seconds + 180))
    finally:
        child.join(30)


def phase(
    name: str,
    bootstrap: str,
    work: Path,
    runs: int,
    rate: float,
    seconds: float,
    kill: bool,
    forwarded: float | None = None,
    get_rate: float = 100.0,
    calm_rate: float = 0.0,
    calm_s: float = 0.0,
    warmup_s: float = 0.0,
    broker_pid: int | None = None,
    snapshotter: str = "thread",
) -> dict[str, object]:
    """One phase on fresh topics and instances. ``warmup_s``: the same load first for that
    long, not counted (what a start costs is in the steady phase's first seconds)."""
    topics = TopicNames.with_prefix(f"bench-{uuid.uuid4().hex[:8]}")
    log = KafkaLog(bootstrap, topics=topics)
    log.create_topics(PARTITIONS)
    log.close()
    seed(bootstrap, topics, runs)
    a = Instance(f"{name}-a", bootstrap, topics, work, snapshotter)
    b = Instance(f"{name}-b", bootstrap, topics, work, snapshotter)
    try:
        wait_split(a, b, runs)
        print(
            f"{name}: {runs:,} runs seeded; a owns {sorted(a.owned())}, b owns {sorted(b.owned())}; "
            f"{rate:,.0f} patches/s for {seconds:.0f}s",
            flush=True,
        )
        warm = Load([a, b], runs, random.Random(8), forwarded, tag="w")
        if warmup_s:
            asyncio.run(warm.run(rate, warmup_s, get_rate, None))
        load = Load([a, b], runs, random.Random(7), forwarded)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        inst0, broker0 = a.cpu_s() + b.cpu_s(), cpu_s(broker_pid)
        threads0 = [a.cpu_by_thread(), b.cpu_by_thread()]
        killed = asyncio.run(
            load.run(rate, seconds, get_rate, seconds / 2 if kill else None, calm_rate=calm_rate, calm_s=calm_s)
        )
        peaks = [a.peak_mb(), b.peak_mb()]
        threads = {}  # a killed instance's threads are no longer counted
        for inst, before in zip((a, b), threads0, strict=True):
            for name, cpu in inst.cpu_by_thread().items():
                threads[name] = threads.get(name, 0.0) + cpu - before.get(name, 0.0)
        gen_s = time.process_time() - cpu0
        gen_cpu = gen_s / (time.perf_counter() - wall0)
        inst_cpu = a.cpu_s() + b.cpu_s() - inst0  # a killed instance's stops counting at its death
        broker_cpu = cpu_s(broker_pid) - broker0 if broker_pid is not None else None
        for run, facts in warm.accepted.items():  # the check holds every accepted fact
            load.accepted.setdefault(run, set()).update(facts)
        return {
            "load": load,
            "killed": killed,
            "gen_cpu": gen_cpu,
            "gen_s": gen_s,
            "inst_cpu": inst_cpu,
            "broker_cpu": broker_cpu,
            "warmup_s": warmup_s,
            "threads": threads,
            "rate": rate,
            "seconds": seconds,
            "calm_rate": calm_rate,
            "calm_s": calm_s,
            "peaks_mb": peaks,
            **check(load, [a, b], topics, bootstrap, work),
        }
    finally:
        a.stop(signal.SIGKILL)
        b.stop(signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=1_000)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--keep", action="store_true", help="keep the instances' state directories and logs")
    ap.add_argument(
        "--forwarded",
        type=float,
        help="the share of patches sent to the instance not owning the run [each instance in turn: about half]",
    )
    ap.add_argument("--gets", type=float, default=100.0, help="GETs per second through the non-owner [%(default)s]")
    ap.add_argument("--steady-only", action="store_true", help="no SIGKILL phase (the capacity model's runs)")
    ap.add_argument(
        "--overload",
        action="store_true",
        help="one phase instead: --rate for --seconds (offer about twice what the instances decide), then "
        "--calm-rate for 10 s; what is shed (429), what is admitted, and how fast it is normal again",
    )
    ap.add_argument("--calm-rate", type=float, default=100.0, help="patches/s after the overload [%(default)s]")
    ap.add_argument(
        "--capacity",
        help="comma-separated rates, one steady phase each (--seconds, default 20, after --warmup, default 3): "
        "the highest with append -> decision p99 < 50 ms and no error",
    )
    ap.add_argument("--warmup", type=float, help="seconds of the same load before each phase's figures [0]")
    ap.add_argument(
        "--snapshotter",
        choices=("thread", "process", "none"),
        default="thread",
        help="each instance's snapshotter: a thread of serve, `runstate snapshot` beside `serve "
        "--no-snapshotter` (its CPU counted as the instance's), or none (what it costs) [%(default)s]",
    )
    args = ap.parse_args()
    rate = args.rate or (200.0 if args.quick else 1_000.0)
    seconds = args.seconds or (10.0 if args.quick else 20.0 if args.capacity else 60.0)
    warmup = args.warmup if args.warmup is not None else 3.0 if args.capacity else 0.0
    work = Path(tempfile.mkdtemp(prefix="bench-serve-kafka-"))
    try:
        with kafka_broker() as (bootstrap, pid):
            more = {
                "forwarded": args.forwarded,
                "get_rate": args.gets,
                "warmup_s": warmup,
                "broker_pid": pid,
                "snapshotter": args.snapshotter,
            }
            if args.capacity:
                rates = [float(r) for r in args.capacity.split(",")]
                # A fresh broker's JVM is still compiling: without this, the first phase's
                # broker cost twice the later ones' per patch and set its tail.
                print(
                    f"broker warm-up: the floor's load at {max(rates):,.0f}/s for {BROKER_WARMUP_S:.0f} s", flush=True
                )
                floor(bootstrap, args.runs, max(rates), BROKER_WARMUP_S)
                results = [
                    phase(f"capacity-{r:.0f}", bootstrap, work, args.runs, r, seconds, kill=False, **more)  # type: ignore[arg-type]
                    for r in rates
                ]
            elif args.overload:
                more.update(calm_rate=args.calm_rate, calm_s=CALM_S)
                results = [phase("overload", bootstrap, work, args.runs, rate, seconds, kill=False, **more)]  # type: ignore[arg-type]
            else:
                results = [phase("steady", bootstrap, work, args.runs, rate, seconds, kill=False, **more)]  # type: ignore[arg-type]
            if not args.steady_only and not args.overload and not args.capacity:
                results.append(phase("sigkill", bootstrap, work, args.runs, rate, seconds, kill=True, **more))  # type: ignore[arg-type]
            floors: dict[float, float] = {}
            for res in results:  # the core path alone at each rate, the instances stopped
                r = res["rate"]
                if not res["killed"] and not res["calm_s"] and r not in floors:
                    floors[r] = floor(bootstrap, args.runs, r, min(seconds, 20.0))  # type: ignore[arg-type]
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for res in results:
        load: Load = res["load"]  # type: ignore[assignment]
        title = (
            "SIGKILL at the middle"
            if res["killed"]
            else "overload"
            if res["calm_s"]
            else "capacity"
            if args.capacity
            else "steady"
        )
        n = len(load.append_lat) + load.retries
        print(
            f"{title}: {res['rate']:,.0f} patches/s for {res['seconds']:.0f}s, "
            f"{'about half' if args.forwarded is None else f'{args.forwarded:.0%}'} of them sent to the "
            f"non-owner, {args.gets:.0f} GETs/s; load generator CPU {res['gen_cpu']:.0%} of a core"
            + (f"; after {res['warmup_s']:.0f}s of the same load, not counted" if res["warmup_s"] else "")
        )
        print(
            f"  append -> decision, first try (ms p50 / p99 / max) {pct(load.append_lat)}  n={len(load.append_lat)}"
            f"  (goal p99 < 50: {'met' if load.append_lat and p99(load.append_lat) < 0.05 else 'not met'})"
        )
        if load.get_lat:
            print(
                f"  GET state through the non-owner (ms)              {pct(load.get_lat)}  n={len(load.get_lat)}"
                f"  (goal p99 < 10: {'met' if p99(load.get_lat) < 0.01 else 'not met'})"
            )
        print(
            f"    of them sent to the non-owner (ms)              {pct(load.append_forwarded)}  "
            f"n={len(load.append_forwarded)}"
        )
        print(f"  send slots skipped with {MAX_IN_FLIGHT:,} patches in flight (saturated): {load.skipped}")
        print(f"  sends again: {load.retries}; errors: {len(load.errors)} {load.errors[:3]}; sends {n}")
        decided = max(len(load.append_lat), 1)
        print(
            f"  the two instances' CPU: {res['inst_cpu']:.1f} s, {1000 * res['inst_cpu'] / decided:.2f} ms per "  # type: ignore[operator]
            f"decided patch (each with its projector, snapshotter, decision feed and HTTP handlers)"
        )
        by_thread = sorted(res["threads"].items(), key=lambda kv: -kv[1])  # type: ignore[attr-defined]
        print(
            "    by thread, ms per decided patch: "
            + ", ".join(f"{name} {1000 * cpu / decided:.2f}" for name, cpu in by_thread if cpu > 0)
        )
        cost = (1000 * res["inst_cpu"] + 1000 * res["gen_s"]) / decided  # type: ignore[operator]
        if res["broker_cpu"] is not None:
            cost += 1000 * res["broker_cpu"] / decided  # type: ignore[operator]
            print(
                f"    the broker {1000 * res['broker_cpu'] / decided:.2f} ms and the load generator "  # type: ignore[operator]
                f"{1000 * res['gen_s'] / decided:.2f} ms per decided patch; all together {cost:.2f} ms per decided "  # type: ignore[operator]
                f"patch: this machine's {os.cpu_count()} cores could carry at most "
                f"{1000 * (os.cpu_count() or 1) / cost:,.0f} patches/s at this cost"
            )
        if res["rate"] in floors:
            f = floors[res["rate"]]  # type: ignore[index]
            times = 1000 * res["inst_cpu"] / decided / f  # type: ignore[operator]
            print(
                f"    the floor, RunProducer + a projector in one process at the same rate (no HTTP, no "
                f"snapshotter): {f:.2f} ms per patch; the two instances cost {times:.1f}x it"
            )
        if res["calm_s"]:
            overload_report(load, res)
        if res["killed"] is not None:
            silence = load.longest_silence(res["killed"])  # type: ignore[arg-type]
            t = {k: v - res["killed"] for k, v in load.takeover.items()}  # type: ignore[operator]
            took, served = (f"{t[k]:.1f}s" if k in t else "not within the run" for k in ("restoring", "served"))
            print(
                f"  the survivor took the partitions over {took} after the kill "
                f"(the group's session timeout: {SESSION_TIMEOUT}) and served them all at {served}"
            )
            print(
                f"  longest first send -> decision {load.longest:.1f}s "
                f"(goal < 8s: {'met' if load.longest < 8 else 'not met'}); "
                f"longest stretch with no decision after the kill {silence:.1f}s "
                f"(goal < 6s: {'met' if silence < 6 else 'not met'})"
            )
        print(
            f"  accepted {res['accepted']:,}: lost {res['lost']}, decided twice {res['twice']}; applied without "
            f"the client seeing it accepted: {res['unacknowledged']}; "
            "verify (restored projection against a full replay): "
            f"{'passes' if res['verify'] else 'FAILS'}"
        )
    if args.capacity:
        capacity_report(results)


def capacity_report(results: list[dict[str, object]]) -> None:
    """Each rate of ``--capacity`` against the goal, and the highest that meets it."""
    print("\ncapacity (append -> decision p99 < 50 ms, no error, after the warm-up):")
    met = []
    for res in results:
        load: Load = res["load"]  # type: ignore[assignment]
        ok = bool(load.append_lat) and p99(load.append_lat) < 0.05 and not load.errors and not load.skipped
        met += [res["rate"]] if ok else []
        print(
            f"  {res['rate']:>6,.0f}/s  p50 / p99 / max {pct(load.append_lat)} ms  errors {len(load.errors)}  "
            f"{'meets' if ok else 'does not'}"
        )
    print(f"  highest rate that meets it: {max(met):,.0f}/s" if met else "  no rate met it")  # type: ignore[type-var]


def overload_report(load: Load, res: dict[str, object]) -> None:
    """The overload phase's figures against the issue's goals."""
    burst_s: float = res["seconds"]  # type: ignore[assignment]
    during = [dt for at, dt in load.first_try if at < burst_s]
    after_0_5 = [dt for at, dt in load.first_try if burst_s <= at < burst_s + 5]
    after_5 = [dt for at, dt in load.first_try if at >= burst_s + 5]
    goodput = len(during) / burst_s
    longest = max([dt for _, dt in load.first_try] + load.shed_lat + [load.longest], default=0.0)
    print(
        f"  admitted during the burst, append -> decision (ms)  {pct(during)}  n={len(during)}"
        f"  (goal p99 < 250: {'met' if during and p99(during) < 0.25 else 'not met'})"
    )
    shed_goal = "none shed" if not load.shed_lat else "met" if p99(load.shed_lat) < 0.05 else "not met"
    print(
        f"  shed at once, 429 (ms)                             {pct(load.shed_lat)}  n={len(load.shed_lat)}"
        f"  (goal p99 < 50: {shed_goal})"
    )
    print(
        f"  goodput {goodput:,.0f} decided patches/s of {res['rate']:,.0f}/s offered; the longest any request "
        f"waited {longest:.2f}s (goal < 10 s); peak memory per instance "
        + " / ".join(f"{mb:.0f} MB" for mb in res["peaks_mb"])  # type: ignore[attr-defined]
    )
    print(
        f"  after the burst, at {res['calm_rate']:,.0f}/s (ms): sent in its first 5 s {pct(after_0_5)}  "
        f"n={len(after_0_5)}; later {pct(after_5)}  n={len(after_5)}"
    )
    print(f"  GETs shed (429): {load.get_shed}")
    if load.metrics_lat:
        print(
            f"  GET /metrics every 0.5 s (ms)                       {pct(load.metrics_lat)}  n={len(load.metrics_lat)}"
        )
    if load.bounds:
        seq = [int(b) for _t, b in load.bounds]
        print(
            f"  the first instance's bound on requests in flight (runstate_http_in_flight_limit), every 0.5 s: "
            f"min {min(seq)}, median {sorted(seq)[len(seq) // 2]}, max {max(seq)}; the last ten {seq[-10:]}"
        )


if __name__ == "__main__":
    main()
