// LangGraph.js's validation suite as a library (its `validate-checkpointer` CLI in 1.1.1
// cannot read any initializer: the schema it parses with is missing from its build).
import { validate } from "@langchain/langgraph-checkpoint-validation";

import { Client } from "../dist/index.js";
import initializer from "./validate.mjs";

// A request that takes long is named on stderr, so that a test the suite times out on a
// loaded machine says which request it waited on (the suite itself only says "timed out").
const SLOW_MS = 2000;
const request = Client.prototype.request;
Client.prototype.request = async function (method, path, ...rest) {
  const t0 = Date.now();
  let outcome = "threw";
  try {
    const reply = await request.call(this, method, path, ...rest);
    outcome = String(reply.status);
    return reply;
  } finally {
    const took = Date.now() - t0;
    if (took > SLOW_MS) console.error(`slow request: ${method} ${path} -> ${outcome} in ${took} ms`);
  }
};

validate(initializer);
