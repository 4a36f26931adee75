"""What the benchmarks share: the workload's author, trust and patches, and a Kafka broker to
measure against."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from runstate.schemas.patch import Author, Patch

AUTHOR = Author(agent_id="bench", agent_version="1")
#: The workloads' facts cite artifact:// references they never register: the runs trust that
#: scheme (the evidence check still runs: one point read per fact).
TRUST = {"external_evidence_schemes": ["artifact"]}


#: Source that prints a process's own peak memory (kB) to stderr as ``PEAK <kB>``: the
#: kernel's high-water mark of its address space. Not ``ru_maxrss``: after a fork and exec
#: it starts at the parent's resident size, so a child of a big bench reported the bench.
PRINT_PEAK = (
    "print('PEAK', next(int(ln.split()[1]) for ln in open('/proc/self/status') if ln.startswith('VmHWM')), "
    "file=sys.stderr)"
)


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics(url: str) -> dict[str, list[float]]:
    """serve's ``/metrics`` at ``url``: each metric's values (one a label set), by name."""
    out: dict[str, list[float]] = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out.setdefault(name.split("{", 1)[0], []).append(float(value))
    return out


def wait_for(done: Callable[[], bool], timeout_s: float, failure: str) -> None:
    """Call ``done`` every half second until it is true (an HTTP error counts as not yet);
    exit with ``failure`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(failure)


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A directory for one run of a bench, removed with whatever the bench left in it."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as d:
        yield Path(d)


def bench_patch(run: str, rev: int, events: list[dict[str, Any]], at: datetime, patch_id: str) -> Patch:
    """One validated patch of the workloads, by ``AUTHOR``."""
    return Patch.model_validate(
        {
            "patch_id": patch_id,
            "run_id": run,
            "expected_revision": rev,
            "events": events,
            "author": AUTHOR,
            "created_at": at,
        }
    )


def fact_event(i: int) -> dict[str, Any]:
    """A confirmed fact citing an artifact: the workloads' commonest event."""
    return {
        "type": "FactConfirmed",
        "fact": {
            "id": f"f{i}",
            "statement": f"observation number {i} about the system",
            "evidence": f"artifact://test-output/{i}",
        },
    }


@contextmanager
def kafka_broker() -> Iterator[tuple[str, int | None]]:
    """``(bootstrap, the broker process's pid)``: ``RUNSTATE_BENCH_KAFKA`` if set (pid None),
    else a single-node broker of its own (runstate.compose.kafka_local), stopped and its
    log (hundreds of MB) removed at the end."""
    given = os.environ.get("RUNSTATE_BENCH_KAFKA")
    if given:
        yield given, None
        return
    from runstate.compose.kafka_local import LocalKafka

    broker_dir = tempfile.mkdtemp(prefix="runstate-bench-kafka-")
    broker = LocalKafka(broker_dir)
    try:
        bootstrap = broker.start()
        print(f"started a local broker at {bootstrap}", flush=True)
        yield bootstrap, broker.proc.pid if broker.proc is not None else None
    finally:
        broker.stop()
        shutil.rmtree(broker_dir, ignore_errors=True)
