// The TypeScript client and run handle against a real `runstate serve` (started here).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";

import {
  Client,
  ContractError,
  PatchRejected,
  RevisionConflict,
  RunErased,
  RunNotFound,
  ServiceUnreachable,
  openRun,
  pathSegment,
} from "../dist/index.js";
import { RunstateSaver, generationRunId, threadOf } from "../dist/langgraph.js";
import { Annotation, END, START, StateGraph } from "@langchain/langgraph";
import { startServe } from "./serve.mjs";

const TRUST = { external_evidence_schemes: ["artifact"] };
const start = (goal = "fix login") => ({ type: "RunStarted", goal: { statement: goal }, policy: TRUST });
const fact = (id) => ({ type: "FactConfirmed", fact: { id, statement: `statement ${id}`, evidence: "artifact://out/1" } });

let serve;
let rs;
before(async () => {
  serve = await startServe({ RUNSTATE_MASTER_KEY: randomBytes(32).toString("hex") });
  rs = new Client(serve.url);
});
after(async () => serve?.stop());

describe("the client", () => {
  it("appends, waits and reads what Python's client reads", async () => {
    const d = await rs.submit("ts-1", { expected_revision: 0, events: [start()] });
    assert.equal(d.outcome, "accepted");
    assert.equal((await rs.submit("ts-1", { expected_revision: 1, events: [fact("f1")] })).revision, 2);
    const state = await rs.state("ts-1", { minRevision: 2 });
    assert.deepEqual(state.confirmed_facts.map((f) => f.id), ["f1"]);
    assert.match(await rs.context("ts-1", { maxTokens: 500 }), /fix login/);
    assert.deepEqual((await rs.history("ts-1")).map((h) => h.event_types[0]), ["RunStarted", "FactConfirmed"]);
    assert.ok((await rs.runs()).some((r) => r.run_id === "ts-1"));
    const explained = await rs.explain("ts-1", "confirmed_facts.f1.statement");
    assert.deepEqual([explained[0].revision, explained[0].after], [2, "statement f1"]);
    const stale = await rs.submit("ts-1", { expected_revision: 1, events: [fact("f2")] });
    assert.equal(stale.outcome, "rejected");
    assert.equal(stale.reason, "revision_conflict");
  });

  it("quotes every id as one path segment, as the Python client does", async () => {
    assert.equal(pathSegment("a/../b"), "a%2F..%2Fb");
    assert.equal(pathSegment(".."), "%2E%2E");
    assert.equal(pathSegment("it's (100%)*!"), "it%27s%20%28100%25%29%2A%21");
    for (const id of ["user 42", "café", "100%", "#general", "slack/C123/1700000000.1", "x/../victim", "..", "a?b=1"]) {
      await rs.submit(id, { expected_revision: 0, events: [start(`goal of ${id}`)] });
      assert.equal((await rs.state(id)).run_id, id);
      assert.equal((await rs.state(id)).goal.statement, `goal of ${id}`);
    }
  });

  it("follows the decisions over SSE and resumes after the last one seen", { timeout: 30_000 }, async () => {
    await rs.submit("ts-sse", { expected_revision: 0, events: [start()] });
    const abort = new AbortController();
    const stream = rs.events("ts-sse", { signal: abort.signal });
    const first = stream.next(); // the request goes out: the stream is open before the next patches
    await new Promise((r) => setTimeout(r, 500));
    await rs.submit("ts-sse", { expected_revision: 1, events: [fact("f1")] });
    const seen = [(await first).value];
    const second = stream.next();
    await rs.submit("ts-sse", { expected_revision: 2, events: [fact("f2")] });
    seen.push((await second).value);
    abort.abort();
    assert.deepEqual(seen.map((d) => d.revision), [2, 3]);
    // Resumed after the first one seen: the second comes again.
    const again = new AbortController();
    const resumed = rs.events("ts-sse", { lastEventId: seen[0].offset, signal: again.signal });
    assert.equal((await resumed.next()).value.revision, 3);
    again.abort();
  });

  it("answers with typed errors carrying the service's code and message", async () => {
    await assert.rejects(rs.state("never-was"), (e) => e instanceof RunNotFound && e.status === 404 && e.code === "not_found");
    await assert.rejects(
      rs.submit("ts-1", { expected_revision: 0, events: [{ type: "FactConfirmed", fact: { statement: "no id" } }] }),
      (e) => e instanceof ContractError && /fact/.test(e.field ?? "") && /id/.test(e.message),
    );
    // Refused before it is sent, the field named.
    await assert.rejects(rs.append("ts-1", { expected_revision: -1, events: [start()] }), (e) => e instanceof ContractError && e.field === "expected_revision");
    await assert.rejects(rs.append("ts-1", { expected_revision: 0, events: [{ type: "FactConfirmd" }] }), (e) => e instanceof ContractError && e.field === "events[0].type");
    await assert.rejects(rs.append("ts-1", { expected_revision: 0, events: [] }), (e) => e instanceof ContractError && e.field === "events");
    await assert.rejects(
      rs.append("ts-1", { expected_revision: 0, events: [{ type: "RunErased", reason: "x" }] }),
      (e) => e instanceof ContractError && /operator/.test(e.message),
    );
    const dead = new Client("http://127.0.0.1:9", { retryMs: 300 });
    await assert.rejects(dead.state("x"), (e) => e instanceof ServiceUnreachable && e.message.includes("http://127.0.0.1:9"));
  });

  it("erases a run, and reading it then says who erased it and why", async () => {
    await rs.submit("ts-erase", { expected_revision: 0, events: [start("secret goal")] });
    const record = await rs.erase("ts-erase", "the customer asked");
    assert.equal(record.first, true);
    await assert.rejects(rs.state("ts-erase"), (e) => e instanceof RunErased && e.erasure.reason === "the customer asked");
  });
});

describe("the run handle", () => {
  it("records tool calls and effects, and rethrows what the body threw", async () => {
    const run = openRun(serve.url, "ts-run", { agentId: "ts-agent", agentVersion: "1.0" });
    await run.start("ship the fix", { policy: TRUST });
    const ref = await run.toolCall("pytest", async () => "artifact://out/1");
    assert.equal(ref, "artifact://out/1");
    await assert.rejects(
      run.toolCall("deploy", async () => {
        throw new Error("boom");
      }),
      /boom/,
    );
    const out = await run.effect("email", "mailto:ops@example.com", "mail-1", async (id) => `sent ${id}`);
    assert.match(out, /^sent effect_/);
    await run.fact("f1", "the fix works", { evidence: "artifact://out/1" });
    const state = await run.state();
    assert.deepEqual(state.pending_tool_calls, []);
    assert.deepEqual(state.effect_ledger.map((e) => [e.kind, e.status]), [["email", "committed"]]);
    const history = await run.client.history("ts-run");
    assert.deepEqual(
      history.map((d) => d.event_types.join("+")),
      ["RunStarted", "ToolCallStarted", "ToolSucceeded", "ToolCallStarted", "ToolFailed", "EffectRecorded", "EffectRecorded", "FactConfirmed"],
    );
    assert.ok(history.every((d) => d.agent_id === "ts-agent" && d.agent_version === "1.0"));
  });

  it("rebases what commutes and names the conflict otherwise", async () => {
    const a = openRun(serve.url, "ts-conflict", { agentId: "a", agentVersion: "1" });
    const b = openRun(serve.url, "ts-conflict", { agentId: "b", agentVersion: "1" });
    await a.start("two workers", { policy: TRUST });
    await b.state();
    await a.fact("f1", "first", { evidence: "artifact://out/1" });
    // b is one revision behind: a budget use commutes (rebased), a goal change does not.
    await b.submit([{ type: "BudgetConsumed", tokens: 5 }]);
    await a.state();
    await b.submit([{ type: "BudgetConsumed", tokens: 5 }]);
    await assert.rejects(
      a.submit([{ type: "PhaseChanged", phase: "review" }]),
      (e) => e instanceof RevisionConflict && e.current > e.expected && e.since.length >= 1,
    );
    await assert.rejects(a.fact("f9", "no evidence"), (e) => e instanceof PatchRejected && /evidence/.test(e.message));
  });
});

describe("the LangGraph.js saver", () => {
  const Counter = Annotation.Root({ turns: Annotation({ reducer: (a, b) => a + b, default: () => 0 }) });
  const graph = (saver) =>
    new StateGraph(Counter)
      .addNode("turn", () => ({ turns: 1 }))
      .addEdge(START, "turn")
      .addEdge("turn", END)
      .compile({ checkpointer: saver });

  it("starts the thread's next generation after deleteThread, and refuses a late write to the old one", async () => {
    const saver = RunstateSaver.fromConnString(serve.url);
    const config = { configurable: { thread_id: "ts-chat" } };
    await graph(saver).invoke({}, config);
    await graph(saver).invoke({}, config);
    const old = await saver.getTuple(config);
    assert.equal(old.checkpoint.channel_values.turns, 2);
    await saver.deleteThread("ts-chat");
    assert.equal(await saver.getTuple(config), undefined);
    // Another process (a saver of its own) starts a new conversation on the id.
    const other = RunstateSaver.fromConnString(serve.url);
    await graph(other).invoke({}, config);
    assert.equal((await saver.getTuple(config)).checkpoint.channel_values.turns, 1);
    assert.deepEqual([threadOf("ts-chat~2"), generationRunId("ts-chat", 2), generationRunId("x~2", 1)], [["ts-chat", 2], "ts-chat~2", "x~2~1"]);
    const runs = (await rs.runs()).map((r) => r.run_id).filter((r) => r.startsWith("ts-chat"));
    assert.deepEqual(runs.sort(), ["ts-chat", "ts-chat~2"]);
    await assert.rejects(rs.state("ts-chat"), (e) => e instanceof RunErased && e.erasure.reason === "LangGraph delete_thread");
    assert.match((await rs.state("ts-chat~2")).goal.statement, /generation 2/);
    // A late write of the deleted conversation (it names its checkpoint) is refused, not moved.
    await assert.rejects(saver.putWrites(old.config, [["turns", 5]], "late-task"), (e) => e instanceof RunErased || e instanceof PatchRejected);
    assert.equal((await other.getTuple(config)).checkpoint.channel_values.turns, 1);
    const listed = [];
    for await (const t of saver.list({})) if (t.config.configurable.thread_id === "ts-chat") listed.push(t);
    // Only the new conversation's checkpoints (its input, the loop's start, the step): the old one's are erased.
    assert.deepEqual(listed.map((t) => t.metadata.step), [1, 0, -1]);
  });

  it("refuses a late subgraph checkpoint of a deleted conversation (it names its root's checkpoint)", async () => {
    const sub = new StateGraph(Counter).addNode("inner", () => ({ turns: 1 })).addEdge(START, "inner").compile();
    const nested = (saver) => new StateGraph(Counter).addNode("child", sub).addEdge(START, "child").compile({ checkpointer: saver });
    const saver = RunstateSaver.fromConnString(serve.url);
    const config = { configurable: { thread_id: "ts-nested" } };
    await nested(saver).invoke({}, config);
    const all = [];
    for await (const t of saver.list(config)) all.push(t);
    const old = all.find((t) => t.config.configurable.checkpoint_ns && !t.parentConfig);
    assert.ok(old && old.metadata.parents[""], "a subgraph's first checkpoint names its root's");
    await saver.deleteThread("ts-nested");
    await nested(RunstateSaver.fromConnString(serve.url)).invoke({}, config);
    const late = { configurable: { thread_id: "ts-nested", checkpoint_ns: old.config.configurable.checkpoint_ns } };
    await assert.rejects(
      saver.put(late, { ...old.checkpoint, id: `${old.checkpoint.id}-late` }, old.metadata, {}),
      (e) => e instanceof RunErased || e instanceof PatchRejected,
    );
  });
});
