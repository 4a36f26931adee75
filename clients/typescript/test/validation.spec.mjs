// LangGraph.js's validation suite as a library (its `validate-checkpointer` CLI in 1.1.1
// cannot read any initializer: the schema it parses with is missing from its build).
import { validate } from "@langchain/langgraph-checkpoint-validation";

import initializer from "./validate.mjs";

validate(initializer);
