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

Savers: LangGraph's ``InMemorySaver`` and ``SqliteSaver`` (a file, its defaults), and
runstate's ``RunstateSaver`` on the embedded log (projector in process) and through a
``runstate serve`` over loopback (embedded log; with ``--kafka``, on Kafka too).
Goal (issue 30): a step costs no more than 2x SqliteSaver's on the embedded log.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
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

from runstate.integrations.langgraph import RunstateSaver

STEPS = 50


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    n: int


def _graph(saver: BaseCheckpointSaver[Any]) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"step {state['n']}: looked at the failing test again")],
                "n": state["n"] + 1}  # fmt: skip

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
    out = graph.invoke({"messages": [("user", "fix the login test")], "n": 0},
                       {"configurable": {"thread_id": thread}, "recursion_limit": STEPS + 10})  # fmt: skip
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


@contextmanager
def embedded(work: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    with RunstateSaver.from_conn_string(work / "rs") as saver:
        yield saver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(env: dict[str, str]) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runstate.cli", "serve", "--port", str(port)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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
            "InMemorySaver": memory, "SqliteSaver": sqlite, "RunstateSaver (embedded)": embedded,
        }  # fmt: skip
        url = stack.enter_context(serve({"RUNSTATE_LOG": str(work / "serve-log.db"),
                                         "RUNSTATE_STATE_DIR": str(work / "serve-state")}))  # fmt: skip
        savers["RunstateSaver (serve, embedded)"] = remote(url)
        if args.kafka:
            prefix = f"bench-lg-{os.getpid()}"
            from runstate.eventlog.base import TopicNames
            from runstate.eventlog.kafka import KafkaLog

            KafkaLog(args.kafka, topics=TopicNames.with_prefix(prefix)).create_topics(3)
            kurl = stack.enter_context(serve({"RUNSTATE_LOG": f"kafka://{args.kafka}", "RUNSTATE_TOPIC_PREFIX": prefix,
                                              "RUNSTATE_STATE_DIR": str(work / "kafka-state")}))  # fmt: skip
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
    base = {k: statistics.median(got["SqliteSaver"][k]) for k in ("put+get", "graph")}
    print(f"\nper step of a {STEPS}-step graph, ms (median of {rounds} rounds); x = against SqliteSaver\n")
    print(f"| saver | put+get_tuple | x | graph step | x |\n|---|---|---|---|---|")
    for name, fig in got.items():
        pg, gs = statistics.median(fig["put+get"]), statistics.median(fig["graph"])
        print(f"| {name} | {pg * 1e3:.2f} | {pg / base['put+get']:.1f} | {gs * 1e3:.2f} | {gs / base['graph']:.1f} |")


@contextmanager
def contextlib_exit() -> Iterator[Any]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield stack


if __name__ == "__main__":
    main()
