"""The approval graph of ``clients/typescript/test/approval.mjs`` in Python: the same nodes,
channels and scripted model, so that one thread is continued from either language (with
:class:`~runstate.integrations.langgraph.JsonSerializer` on this side)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    approved: bool | None


def model(state: State) -> dict[str, Any]:
    # Scripted: the reply names the request it answers, as the JavaScript model's does.
    request = [m for m in state["messages"] if isinstance(m, HumanMessage)][-1].content
    llm = FakeListChatModel(responses=[f"draft: {request}"])
    return {"messages": [llm.invoke(state["messages"])], "approved": None}


def approve(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "send this draft?", "draft": state["messages"][-1].content})
    return {"approved": answer == "yes"}


def send(state: State) -> dict[str, Any]:
    return {"messages": [AIMessage("sent" if state["approved"] else "discarded")]}


def builder() -> StateGraph[State]:
    b = StateGraph(State)
    b.add_node("model", model)
    b.add_node("approve", approve)
    b.add_node("send", send)
    b.add_edge(START, "model")
    b.add_edge("model", "approve")
    b.add_edge("approve", "send")
    b.add_edge("send", END)
    return b
