"""runstate as LangGraph's checkpointer, differentially: the same real graphs run on
LangGraph's ``InMemorySaver`` and on ``RunstateSaver`` embedded, through a real ``serve`` and
through a serve on the real Kafka broker, and everything a LangGraph user can see compared
after ids and times are set aside: each thread's full history (values, next nodes, tasks
with their interrupts, metadata), the pending writes of the newest checkpoint, the final
state.

The graphs are the kinds LangGraph users write: a tool-calling loop with a scripted model
(``ToolNode``), parallel branches into a ``DeltaChannel`` (an order-sensitive reducer),
``Send`` map-reduce, a subgraph, ``interrupt()`` resumed with ``Command(resume=...)``, and
time travel (a fork from an earlier checkpoint with ``update_state``)."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, Send, interrupt
from servekit import ServeProcess

from runstate.integrations.langgraph import RunstateSaver
from helpers import embedded_env

pytestmark = pytest.mark.slow

Saver = BaseCheckpointSaver[Any]


# --- the graphs ------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


@tool
def lookup_order(order_id: str) -> str:
    """The status of an order."""
    return f"order {order_id}: shipped, 2 parcels"


def tool_loop(saver: Saver) -> Any:
    """A model (scripted: it asks for a tool twice, then answers) and a ToolNode in a loop."""

    def model(state: Chat) -> dict[str, Any]:
        asked = sum(isinstance(m, ToolMessage) for m in state["messages"])
        if asked < 2:
            call = {"name": "lookup_order", "args": {"order_id": f"A-{asked + 1}"}, "id": f"call-{asked + 1}"}
            return {"messages": [AIMessage(content="", tool_calls=[call], id=f"ai-{asked}")]}
        return {"messages": [AIMessage(content="both orders shipped", id="ai-final")]}

    g = StateGraph(Chat)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([lookup_order]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def _concat(state: list[str], writes: Any) -> list[str]:
    return state + [x for w in writes for x in w]


class Fan(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]
    total: Annotated[int, operator.add]


def parallel_delta(saver: Saver) -> Any:
    """Three branches writing a DeltaChannel at once, the slowest finishing first."""

    def branch(name: str, pause: float) -> Callable[[Fan], dict[str, Any]]:
        def run(_s: Fan) -> dict[str, Any]:
            time.sleep(pause)
            return {"items": [name], "total": len(name)}

        return run

    g = StateGraph(Fan)
    for name, pause in (("alpha", 0.15), ("beta", 0.0), ("gamma", 0.05)):
        g.add_node(name, branch(name, pause))
        g.add_edge(START, name)
        g.add_edge(name, "join")
    g.add_node("join", lambda s: {"items": [f"joined {len(s['items'])}"]})
    g.add_edge("join", END)
    return g.compile(checkpointer=saver)


class MapState(TypedDict):
    topics: list[str]
    drafts: Annotated[list[str], operator.add]


def map_reduce(saver: Saver) -> Any:
    """``Send`` one task per topic, their results reduced into one list."""
    g = StateGraph(MapState)
    g.add_node("draft", lambda s: {"drafts": [f"draft on {s['topic']}"]})  # type: ignore[typeddict-item]
    g.add_node("collect", lambda s: {"drafts": [f"{len(s['drafts'])} drafts"]})
    g.add_conditional_edges(START, lambda s: [Send("draft", {"topic": t}) for t in s["topics"]], ["draft"])
    g.add_edge("draft", "collect")
    g.add_edge("collect", END)
    return g.compile(checkpointer=saver)


class Outer(TypedDict):
    notes: Annotated[list[str], operator.add]


def with_subgraph(saver: Saver) -> Any:
    """A compiled subgraph as a node (its checkpoints in their own namespace)."""
    inner = StateGraph(Outer)
    inner.add_node("read", lambda s: {"notes": ["inner read"]})
    inner.add_node("summarize", lambda s: {"notes": [f"inner saw {len(s['notes'])}"]})
    inner.add_edge(START, "read")
    inner.add_edge("read", "summarize")
    outer = StateGraph(Outer)
    outer.add_node("before", lambda s: {"notes": ["outer before"]})
    outer.add_node("sub", inner.compile())
    outer.add_node("after", lambda s: {"notes": [f"outer after {len(s['notes'])}"]})
    outer.add_edge(START, "before")
    outer.add_edge("before", "sub")
    outer.add_edge("sub", "after")
    outer.add_edge("after", END)
    return outer.compile(checkpointer=saver)


class Approval(TypedDict):
    request: str
    decisions: Annotated[list[str], operator.add]


def approvals(saver: Saver) -> Any:
    """Two parallel steps each stopping for a person's answer with ``interrupt()``."""

    def ask(who: str) -> Callable[[Approval], dict[str, Any]]:
        def run(s: Approval) -> dict[str, Any]:
            answer = interrupt({"question": f"{who}: approve {s['request']}?"})
            return {"decisions": [f"{who} said {answer}"]}

        return run

    g = StateGraph(Approval)
    g.add_node("finance", ask("finance"))
    g.add_node("legal", ask("legal"))
    g.add_edge(START, "finance")
    g.add_edge(START, "legal")
    g.add_edge("finance", END)
    g.add_edge("legal", END)
    return g.compile(checkpointer=saver)


# --- what a user sees, ids and times set aside -------------------------------------------------


def _plain(v: Any) -> Any:
    if isinstance(v, BaseMessage):
        calls = [(c["name"], c["args"], c["id"]) for c in getattr(v, "tool_calls", [])]
        return (v.type, v.content, calls, getattr(v, "tool_call_id", None))
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "value") and type(v).__name__ == "Interrupt":
        return ("interrupt", _plain(v.value))
    return v


def _snapshot(s: Any) -> Any:
    meta = {k: v for k, v in (s.metadata or {}).items() if k in ("source", "step")}
    tasks = [(t.name, _plain(list(t.interrupts)), _plain(t.result) if t.result is not None else None) for t in s.tasks]
    return {
        "values": _plain(s.values),
        "next": sorted(s.next),
        "meta": meta,
        "tasks": sorted(tasks, key=repr),
        "parent": s.parent_config is not None,
    }


def _seen(graph: Any, cfg: dict[str, Any]) -> Any:
    """A thread as its user sees it: its history, newest first, and its state now."""
    return {"history": [_snapshot(s) for s in graph.get_state_history(cfg)], "now": _snapshot(graph.get_state(cfg))}


def _pending(saver: Saver, cfg: dict[str, Any]) -> Any:
    tup = saver.get_tuple(cfg)
    return None if tup is None else sorted((w[1], repr(_plain(w[2]))) for w in tup.pending_writes or [])


def script(saver: Saver, thread: str) -> dict[str, Any]:
    """Every graph on its own thread, as a user drives them; what the user saw."""
    seen: dict[str, Any] = {}
    cfg: dict[str, Any] = {"configurable": {"thread_id": f"{thread}/tools"}}
    g = tool_loop(saver)
    g.invoke({"messages": [HumanMessage(content="where are A-1 and A-2?", id="human-1")]}, cfg)
    seen["tools"] = _seen(g, cfg)

    cfg = {"configurable": {"thread_id": f"{thread}/delta"}}
    g = parallel_delta(saver)
    for turn in range(3):
        g.invoke({"items": [f"in {turn}"], "total": 0}, cfg)
    seen["delta"] = _seen(g, cfg)

    cfg = {"configurable": {"thread_id": f"{thread}/map"}}
    g = map_reduce(saver)
    g.invoke({"topics": ["retries", "timeouts", "quotas"], "drafts": []}, cfg)
    seen["map"] = _seen(g, cfg)

    cfg = {"configurable": {"thread_id": f"{thread}/sub"}}
    g = with_subgraph(saver)
    g.invoke({"notes": ["start"]}, cfg)
    seen["sub"] = _seen(g, cfg)
    seen["sub ns"] = sorted(
        {
            t.config["configurable"]["checkpoint_ns"].split(":")[0]
            for t in saver.list({"configurable": {"thread_id": f"{thread}/sub"}})
        }
    )

    cfg = {"configurable": {"thread_id": f"{thread}/approval"}}
    g = approvals(saver)
    g.invoke({"request": "refund 40 EUR", "decisions": []}, cfg)
    seen["approval asked"] = _seen(g, cfg)
    seen["approval pending"] = _pending(saver, cfg)
    [finance, legal] = sorted(g.get_state(cfg).interrupts, key=lambda i: repr(i.value))
    g.invoke(Command(resume={finance.id: "yes", legal.id: "after review"}), cfg)
    seen["approval done"] = _seen(g, cfg)

    # Time travel: back to the tool loop's first model step, a corrected question, and on.
    cfg = {"configurable": {"thread_id": f"{thread}/tools"}}
    g = tool_loop(saver)
    first = [s for s in g.get_state_history(cfg) if s.next == ("model",)][-1]
    forked = g.update_state(first.config, {"messages": [HumanMessage(content="only A-1, please", id="human-2")]})
    g.invoke(None, forked)
    seen["fork"] = _seen(g, cfg)
    return seen


# --- the savers ------------------------------------------------------------------------------


@contextmanager
def _serve(env: dict[str, str], work: Path) -> Iterator[str]:
    serve = ServeProcess(env, work)
    try:
        serve.wait_ready(timeout_s=120)
        yield serve.url
    finally:
        assert serve.stop() == 0, serve.log()


def _compare(make: Callable[[], AbstractContextManager[Saver]]) -> None:
    want = script(InMemorySaver(), "thread")
    with make() as saver:
        got = script(saver, "thread")
    assert got.keys() == want.keys()
    for part in want:
        assert got[part] == want[part], part


def test_real_graphs_on_the_embedded_log_match_langgraphs_in_memory_saver(tmp_path: Path) -> None:
    _compare(lambda: RunstateSaver.from_conn_string(tmp_path / "rs"))


def test_real_graphs_through_a_serve_match_langgraphs_in_memory_saver(tmp_path: Path) -> None:
    with _serve(embedded_env(tmp_path), tmp_path) as url:
        _compare(lambda: RunstateSaver.from_conn_string(url))


@pytest.mark.kafka
def test_real_graphs_through_a_serve_on_kafka_match_langgraphs_in_memory_saver(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    from runstate.eventlog.kafka import KafkaLog

    KafkaLog(kafka_bootstrap, topics=kafka_topics).create_topics(3)
    env = {
        "RUNSTATE_LOG": f"kafka://{kafka_bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": kafka_topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(tmp_path / "state"),
    }
    with _serve(env, tmp_path) as url:
        _compare(lambda: RunstateSaver.from_conn_string(url))
