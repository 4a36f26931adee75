// A LangGraph.js graph with a scripted model that asks for approval before it sends its
// draft: tests/clients/test_typescript.py runs each step as a process of its own, and runs the same
// graph in Python (tests/approval_graph.py) on the same thread.
//
//   node test/approval.mjs start  URL THREAD REQUEST   -> runs until the interrupt; prints it
//   node test/approval.mjs resume URL THREAD ANSWER    -> resumes it; prints the state
//   node test/approval.mjs state  URL THREAD           -> prints the state
import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { Annotation, Command, END, MessagesAnnotation, START, StateGraph, interrupt } from "@langchain/langgraph";

import { RunstateSaver } from "../dist/langgraph.js";

const State = Annotation.Root({
  ...MessagesAnnotation.spec,
  approved: Annotation(),
});

async function model(state) {
  // Scripted: the reply names the request it answers, so each language's model says the same.
  const request = state.messages.filter((m) => HumanMessage.isInstance(m)).at(-1).content;
  const llm = new FakeListChatModel({ responses: [`draft: ${request}`] });
  return { messages: [await llm.invoke(state.messages)], approved: null };
}

function approve(state) {
  const answer = interrupt({ question: "send this draft?", draft: state.messages.at(-1).content });
  return { approved: answer === "yes" };
}

function send(state) {
  return { messages: [new AIMessage(state.approved ? "sent" : "discarded")] };
}

const builder = new StateGraph(State)
  .addNode("model", model)
  .addNode("approve", approve)
  .addNode("send", send)
  .addEdge(START, "model")
  .addEdge("model", "approve")
  .addEdge("approve", "send")
  .addEdge("send", END);

const [mode, url, thread, arg] = process.argv.slice(2);
const graph = builder.compile({ checkpointer: RunstateSaver.fromConnString(url) });
const config = { configurable: { thread_id: thread } };
const show = (state) => ({
  messages: state.values.messages.map((m) => [m.getType(), m.content]),
  approved: state.values.approved ?? null,
  next: state.next,
  interrupts: state.tasks.flatMap((t) => t.interrupts.map((i) => i.value)),
});

if (mode === "start") await graph.invoke({ messages: [new HumanMessage(arg)] }, config);
else if (mode === "resume") await graph.invoke(new Command({ resume: arg }), config);
else if (mode !== "state") throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(show(await graph.getState(config))));
