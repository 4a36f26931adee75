"""runstate as LangGraph's checkpointer, side by side with LangGraph's own savers in one run.

    .venv/bin/python bench/bench_langgraph.py                 # 5 rounds
    .venv/bin/python bench/bench_langgraph.py --quick         # 2 rounds
    .venv/bin/python bench/bench_langgraph.py --kafka 127.0.0.1:9092   # also through a serve on Kafka

Per step of a 50-step graph, in milliseconds (median over rounds; the savers take turns
within each round, so a busy machine slows all of them alike):

- ``put+get``: ``put`` of the step's checkpoint then ``get_tuple`` of the thread's latest,
  as a graph does at each superstep (the checkpoint holds the 50-step state);
- ``graph``: a real ``graph.invoke`` of a 50-step loop (one node appending a message per
  step), its wall time divided by 50.

Savers: LangGraph's ``InMemorySaver``, ``SqliteSaver`` (a file, its defaults) and
``PostgresSaver`` (a PostgreSQL the bench starts from Debian's ``postgresql`` package on
loopback, its default settings: ``fsync`` and ``synchronous_commit`` on; left out, saying
so, where the package or ``pip install -e '.[bench]'`` is missing), and runstate's
``RunstateSaver`` on the embedded log (projector in process) and through a ``runstate
serve`` over loopback (embedded log; with ``--kafka``, on Kafka too).

Disk: a 60-turn conversation (a 4 kB user message and a 4 kB answer per turn, a real
graph, every checkpoint kept), the bytes each saver holds once it is done: SQLite's file,
PostgreSQL's checkpoint tables (``pg_total_relation_size``), runstate's directory (log +
projection + the snapshotter's history) and, through serve, the serve's log and state.

Concurrency: 50 threads at once, each a 10-step graph, driven by asyncio (``ainvoke``) on
the async savers: LangGraph's ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``, runstate's
``AsyncRunstateSaver`` embedded and through serve; the wall time of the whole batch.

Goals (LangGraph issue): a graph step on the embedded log <= 1.2x SqliteSaver's and <= 1.0x
PostgresSaver's, through serve <= 2x PostgresSaver's; disk <= 2x SqliteSaver's embedded
and <= 3x through serve; 50 async threads through serve within 2x AsyncSqliteSaver's time.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from benchkit import free_port

from runstate.integrations.langgraph import RunstateSaver

STEPS = 50
#: The disk workload: turns of a conversation, and the size of each message.
TURNS, MESSAGE_BYTES = 60, 4096


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    n: int


def _graph(saver: BaseCheckpointSaver[Any]) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {
            "messages": [AIMessage(content=f"step {state['n']}: looked at the failing test again")],
            "n": state["n"] + 1,
        }

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < STEPS else END, ["step", END])
    return g.compile(checkpointer=saver)


def put_get(saver: BaseCheckpointSaver[Any], thread: str) -> float:
    """Seconds per step: put of a checkpoint holding the state so far, then get_tuple."""
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    messages: list[Any] = []
    t0 = time.perf_counter()
    for i in range(STEPS):
        messages.append(AIMessage(content=f"step {i}: looked at the failing test again"))
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": list(messages), "n": i}
        cp["channel_versions"] = {"messages": i + 1, "n": i + 1}
        config = saver.put(config, cp, {"source": "loop", "step": i, "parents": {}}, {"messages": i + 1, "n": i + 1})
        assert saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}) is not None
    return (time.perf_counter() - t0) / STEPS


def graph_step(saver: BaseCheckpointSaver[Any], thread: str) -> float:
    """Seconds per step of a real 50-step graph."""
    graph = _graph(saver)
    t0 = time.perf_counter()
    out = graph.invoke(
        {"messages": [("user", "fix the login test")], "n": 0},
        {"configurable": {"thread_id": thread}, "recursion_limit": STEPS + 10},
    )
    assert out["n"] == STEPS
    return (time.perf_counter() - t0) / STEPS


@contextmanager
def memory(_: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    yield InMemorySaver()


@contextmanager
def sqlite(work: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    conn = sqlite3.connect(work / "lg.sqlite", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    return None


@contextmanager
def postgresql() -> Iterator[str]:
    """A PostgreSQL server of its own on loopback (initdb + pg_ctl, default settings), as
    the ``postgres`` user where this runs as root (the server refuses root); yields its URL.
    Stops the server it started."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise RuntimeError("no PostgreSQL (apt-get install -y postgresql)")
    # A directory of its own, not under the bench's (which the postgres user cannot enter).
    data = Path(tempfile.mkdtemp(prefix="runstate-bench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    run = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "bench"], **run)  # type: ignore[call-overload]
    subprocess.run(
        [
            *as_user,
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(data / "log"),
            "-w",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        **run,
    )  # type: ignore[call-overload]
    try:
        yield f"postgresql://bench@127.0.0.1:{port}/postgres?sslmode=disable"
    finally:
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(data, ignore_errors=True)


def postgres(url: str) -> Callable[[Path], AbstractContextManager[BaseCheckpointSaver[Any]]]:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()

    @contextmanager
    def make(_: Path) -> Iterator[BaseCheckpointSaver[Any]]:
        with PostgresSaver.from_conn_string(url) as saver:
            yield saver

    return make


def pg_bytes(url: str) -> int:
    """What PostgresSaver's tables hold, indexes and TOAST included."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select sum(pg_total_relation_size(c.oid)) from pg_class c "
            "where c.relname in ('checkpoints', 'checkpoint_blobs', 'checkpoint_writes')"
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def du(*paths: Path) -> int:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


_WORDS = (
    "the checkout service times out after thirty seconds when the proxy drops idle connections "
    "so we roll back build restart retry look again at logs metrics traces deploy region customer "
    "payment request response error latency because which then before after"
).split()


def _text(seed: int) -> str:
    """MESSAGE_BYTES of text that compresses as prose does (a saver that compresses its
    values, as PostgreSQL's TOAST does, gets no free ride on repeated characters)."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < MESSAGE_BYTES:
        w = rng.choice(_WORDS) + (str(rng.randrange(1000)) if rng.random() < 0.2 else "")
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:MESSAGE_BYTES]


def conversation(saver: BaseCheckpointSaver[Any], thread: str) -> None:
    """The disk workload: TURNS turns of a chat graph, MESSAGE_BYTES per message."""

    def answer(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(content=_text(2 * state["n"] + 1))], "n": state["n"] + 1}

    g = StateGraph(State)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    graph = g.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread}}
    for turn in range(TURNS):
        graph.invoke({"messages": [("user", _text(2 * turn))], "n": turn}, config)


@contextmanager
def embedded(work: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    with RunstateSaver.from_conn_string(work / "rs") as saver:
        yield saver


@contextmanager
def serve(env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runstate.cli", "serve", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).json()["owned_partitions"]:
                    break
            except (httpx.HTTPError, KeyError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("runstate serve did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def remote(url: str) -> Callable[[Path], AbstractContextManager[BaseCheckpointSaver[Any]]]:
    @contextmanager
    def make(_: Path) -> Iterator[BaseCheckpointSaver[Any]]:
        with RunstateSaver.from_conn_string(url) as saver:
            yield saver

    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--kafka", metavar="BOOTSTRAP", help="also through a runstate serve on this Kafka broker")
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory() as tmp, contextlib_exit() as stack:
        work = Path(tmp)
        savers: dict[str, Callable[[Path], AbstractContextManager[BaseCheckpointSaver[Any]]]] = {
            "InMemorySaver": memory,
            "SqliteSaver": sqlite,
        }
        pg_url = None
        try:
            started = stack.enter_context(postgresql())
            savers["PostgresSaver"] = postgres(started)
            pg_url = started  # only with its saver: without langgraph-checkpoint-postgres, no PostgreSQL rows
        except (RuntimeError, ImportError, subprocess.CalledProcessError) as e:
            detail = e.stderr.decode(errors="replace").strip() if isinstance(e, subprocess.CalledProcessError) else e
            print(f"PostgresSaver left out: {detail}", file=sys.stderr)
        savers["RunstateSaver (embedded)"] = embedded
        serve_dirs = [work / "serve-log.db", work / "serve-state"]
        url = stack.enter_context(serve({"RUNSTATE_LOG": str(serve_dirs[0]), "RUNSTATE_STATE_DIR": str(serve_dirs[1])}))
        savers["RunstateSaver (serve, embedded)"] = remote(url)
        if args.kafka:
            prefix = f"bench-lg-{os.getpid()}"
            from runstate.eventlog.base import TopicNames
            from runstate.eventlog.kafka import KafkaLog

            KafkaLog(args.kafka, topics=TopicNames.with_prefix(prefix)).create_topics(3)
            kurl = stack.enter_context(
                serve(
                    {
                        "RUNSTATE_LOG": f"kafka://{args.kafka}",
                        "RUNSTATE_TOPIC_PREFIX": prefix,
                        "RUNSTATE_STATE_DIR": str(work / "kafka-state"),
                    }
                )
            )
            savers["RunstateSaver (serve, Kafka)"] = remote(kurl)
        got: dict[str, dict[str, list[float]]] = {n: {"put+get": [], "graph": []} for n in savers}
        for r in range(rounds):
            for name, make in savers.items():
                d = work / f"{r}-{len(got[name]['graph'])}-{abs(hash(name))}"
                d.mkdir()
                with make(d) as saver:
                    got[name]["put+get"].append(put_get(saver, f"pg-{r}-{d.name}"))
                    got[name]["graph"].append(graph_step(saver, f"g-{r}-{d.name}"))
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
        disk = measure_disk(work, pg_url, url, serve_dirs)
        conc = measure_concurrency(work, pg_url, url)
    base = {k: statistics.median(got["SqliteSaver"][k]) for k in ("put+get", "graph")}
    peer = "PostgresSaver" if "PostgresSaver" in got else None
    pbase = {k: statistics.median(got[peer][k]) for k in ("put+get", "graph")} if peer else None
    print(
        f"\nper step of a {STEPS}-step graph, ms (median of {rounds} rounds); x = against SqliteSaver"
        + (", xPG = against PostgresSaver" if peer else "")
        + "\n"
    )
    print(
        "| saver | put+get_tuple | x | graph step | x |"
        + (" xPG |\n|---|---|---|---|---|---|" if peer else "\n|---|---|---|---|---|")
    )
    for name, fig in got.items():
        pg, gs = statistics.median(fig["put+get"]), statistics.median(fig["graph"])
        row = f"| {name} | {pg * 1e3:.2f} | {pg / base['put+get']:.1f} | {gs * 1e3:.2f} | {gs / base['graph']:.1f} |"
        print(row + (f" {gs / pbase['graph']:.1f} |" if pbase else ""))
    print(
        f"\ndisk of a {TURNS}-turn conversation ({MESSAGE_BYTES} B per message, every checkpoint kept); "
        "x = against SqliteSaver\n"
    )
    print("| saver | bytes | x |\n|---|---|---|")
    for name, n in disk.items():
        print(f"| {name} | {n / 1e6:.1f} MB | {n / disk['SqliteSaver']:.1f} |")
    print(f"\n{THREADS} threads at once, {THREAD_STEPS} steps each (asyncio); x = against AsyncSqliteSaver\n")
    print("| saver | wall time | x |\n|---|---|---|")
    for name, sec in conc.items():
        print(f"| {name} | {sec:.2f} s | {sec / conc['AsyncSqliteSaver']:.1f} |")


THREADS, THREAD_STEPS = 50, 10


async def concurrent(saver: Any) -> float:
    """Seconds for THREADS threads at once, each a THREAD_STEPS-step graph."""
    import asyncio

    def step(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"step {state['n']}")], "n": state["n"] + 1}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < THREAD_STEPS else END, ["step", END])
    graph = g.compile(checkpointer=saver)
    tag = os.urandom(4).hex()
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(
            graph.ainvoke({"messages": [("user", "go")], "n": 0}, {"configurable": {"thread_id": f"c-{tag}-{i}"}})
            for i in range(THREADS)
        )
    )
    assert all(o["n"] == THREAD_STEPS for o in outs)
    return time.perf_counter() - t0


def measure_concurrency(work: Path, pg_url: str | None, url: str) -> dict[str, float]:
    """Each async saver's wall time for the concurrent batch (its best of two)."""
    import asyncio

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from runstate.integrations.langgraph import AsyncRunstateSaver

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        async with AsyncSqliteSaver.from_conn_string(str(work / "conc.sqlite")) as saver:
            out["AsyncSqliteSaver"] = min([await concurrent(saver) for _ in range(2)])
        if pg_url is not None:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(pg_url) as saver:
                out["AsyncPostgresSaver"] = min([await concurrent(saver) for _ in range(2)])
        async with AsyncRunstateSaver.from_conn_string(work / "conc-rs") as saver:
            out["AsyncRunstateSaver (embedded)"] = min([await concurrent(saver) for _ in range(2)])
        async with AsyncRunstateSaver.from_conn_string(url) as saver:
            out["AsyncRunstateSaver (serve, embedded)"] = min([await concurrent(saver) for _ in range(2)])
        return out

    return asyncio.run(run())


def measure_disk(work: Path, pg_url: str | None, url: str, serve_dirs: list[Path]) -> dict[str, int]:
    """Each saver's bytes after the same conversation, each on a store of its own (the
    serve's: what it held before, subtracted)."""
    out: dict[str, int] = {}
    d = work / "disk"
    d.mkdir()
    with sqlite(d) as saver:
        conversation(saver, "chat")
    out["SqliteSaver"] = du(d / "lg.sqlite")
    if pg_url is not None:
        before = pg_bytes(pg_url)
        with postgres(pg_url)(d) as saver:
            conversation(saver, "chat")
        out["PostgresSaver (tables)"] = pg_bytes(pg_url) - before
    with embedded(d) as saver:
        conversation(saver, "chat")
    out["RunstateSaver (embedded)"] = du(d / "rs")
    before = du(*serve_dirs)
    with remote(url)(d) as saver:
        conversation(saver, "chat")
    time.sleep(2)  # the serve's snapshotter writes its checkpoints after the decisions
    out["RunstateSaver (serve, embedded)"] = du(*serve_dirs) - before
    return out


@contextmanager
def contextlib_exit() -> Iterator[Any]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield stack


if __name__ == "__main__":
    main()
