"""A LangGraph tool-calling agent that stops for a person's approval, checkpointed by runstate.

    python examples/langgraph_approval.py DIR_OR_URL THREAD_ID            # runs until it asks
    python examples/langgraph_approval.py DIR_OR_URL THREAD_ID --approve  # a new process resumes it

The "model" is scripted (no network): it asks for the refund tool, then summarises. The
tool node calls LangGraph's ``interrupt`` before the side effect, so the first process
stops there with the question in its checkpoint; the second, started later (on another
machine, given a ``runstate serve`` URL), resumes the same thread from runstate and
finishes. ``runstate history THREAD_ID`` shows every checkpoint the graph saved.
"""

from __future__ import annotations

import argparse
import json
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

from runstate.integrations.langgraph import RunstateSaver


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def model(state: State) -> dict[str, Any]:
    """The scripted model: a refund tool call first, a summary once the tool answered."""
    if not any(isinstance(m, ToolMessage) for m in state["messages"]):
        call = {"name": "refund", "args": {"order": "A-1042", "amount": 30}, "id": "call_refund_1"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"Done: {state['messages'][-1].content}")]}


def tools(state: State) -> dict[str, Any]:
    """Runs the model's tool calls; a refund waits for a person's approval first."""
    out = []
    for call in state["messages"][-1].tool_calls:  # type: ignore[union-attr]
        answer = interrupt({"approve": f"refund {call['args']['amount']} on order {call['args']['order']}?"})
        result = "refunded" if answer == "yes" else "refund declined"
        out.append(ToolMessage(content=result, tool_call_id=call["id"]))
    return {"messages": out}


def route(state: State) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


def build(saver: RunstateSaver) -> Any:
    g = StateGraph(State)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("where", help="a directory (embedded log) or a runstate serve URL")
    ap.add_argument("thread_id")
    ap.add_argument("--approve", action="store_true", help="resume the thread with the approval")
    args = ap.parse_args()
    config = {"configurable": {"thread_id": args.thread_id}}
    with RunstateSaver.from_conn_string(args.where) as saver:
        graph = build(saver)
        if args.approve:
            result = graph.invoke(Command(resume="yes"), config)
        else:
            result = graph.invoke({"messages": [("user", "refund order A-1042")]}, config)
        pending = [i.value for i in result.get("__interrupt__", [])]
        print(json.dumps({"last": result["messages"][-1].content, "waiting_for": pending}))


if __name__ == "__main__":
    main()
