// LangGraph.js's own validation suite for checkpoint savers (validate-checkpointer) against
// RunstateSaver: each checkpointer on a serve of its own (the suite wants each one to see
// only its own state).
import { RunstateSaver } from "../dist/langgraph.js";
import { startServe } from "./serve.mjs";

const serves = new Map();

export default {
  checkpointerName: process.env.RUNSTATE_TEST_KAFKA ? "RunstateSaver (serve on Kafka)" : "RunstateSaver (serve)",
  async createCheckpointer() {
    const serve = await startServe();
    const saver = RunstateSaver.fromConnString(serve.url);
    serves.set(saver, serve);
    return saver;
  },
  async destroyCheckpointer(saver) {
    await serves.get(saver)?.stop();
    serves.delete(saver);
  },
};
