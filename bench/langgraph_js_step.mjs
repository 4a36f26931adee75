// One LangGraph.js graph step per saver, in turn (bench/bench_langgraph_js.py copies this
// into .bench-peers/js and runs it there, beside the packages it installed):
//   node langgraph_js_step.mjs SERVE_URL WORKDIR ROUNDS STEPS
// prints one JSON line per round: {saver: ms per step}.
import { join } from "node:path";

import { AIMessage } from "@langchain/core/messages";
import { Annotation, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";
import { RunstateSaver } from "@runstate/langgraph";

const [url, work, rounds, steps] = [process.argv[2], process.argv[3], Number(process.argv[4]), Number(process.argv[5])];

// As bench_langgraph.py's: one node appending a message per step, looping STEPS times.
const State = Annotation.Root({ ...MessagesAnnotation.spec, n: Annotation({ reducer: (_a, b) => b, default: () => 0 }) });
const graph = (saver) =>
  new StateGraph(State)
    .addNode("step", (s) => ({ messages: [new AIMessage(`step ${s.n}: looked at the failing test again`)], n: s.n + 1 }))
    .addEdge(START, "step")
    .addConditionalEdges("step", (s) => (s.n < steps ? "step" : END), ["step", END])
    .compile({ checkpointer: saver });

const savers = {
  MemorySaver: () => new MemorySaver(),
  SqliteSaver: () => SqliteSaver.fromConnString(join(work, "sqlite.db")),
  "RunstateSaver (serve)": () => RunstateSaver.fromConnString(url),
};
const made = Object.fromEntries(Object.entries(savers).map(([k, make]) => [k, make()]));

for (let r = 0; r < rounds; r++) {
  const names = Object.keys(made);
  if (r % 2) names.reverse(); // A B / B A: a busy moment slows each alike
  const row = {};
  for (const name of names) {
    const g = graph(made[name]);
    const t = performance.now();
    await g.invoke({ messages: [], n: 0 }, { configurable: { thread_id: `t-${r}-${name.split(" ")[0]}` }, recursionLimit: steps + 10 });
    row[name] = (performance.now() - t) / steps;
  }
  console.log(JSON.stringify(row));
}
