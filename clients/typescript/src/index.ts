/**
 * A typed client for `runstate serve`, and a run handle for agent workers.
 *
 * The types are generated from the Python side (scripts/generate.py): the wire's shapes
 * from the pydantic models, the event types and their traits from `schemas/events.py`.
 * Errors are typed and carry the service's code and message. Ids are quoted in every path
 * the way the Python client quotes them (one path segment each, dot segments escaped).
 * A 429 (shed under load) or 503 (the run's owner moving) is retried with the same patch
 * id, honouring `Retry-After`, for up to `retryMs`.
 */

import { randomBytes, randomUUID } from "node:crypto";
import { type IncomingMessage, request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";

import type { components } from "./generated/api.js";
import { EVENT_TYPES, TERMINAL_STATUSES, TRAITS, type EventType } from "./generated/events.js";

export { EVENT_TYPES, TERMINAL_STATUSES, TRAITS };
export type { EventType, EventTraits } from "./generated/events.js";

type Schemas = components["schemas"];
export type Decision = Schemas["Decision"];
export type RunState = Schemas["RunState"];
export type RunSummary = Schemas["RunSummary"];
export type PatchDraft = Schemas["PatchDraft"];
export type Event = PatchDraft["events"][number];
export type GraphCheckpointRead = Schemas["GraphCheckpointRead"];
export type Author = Schemas["Author"];

// -- errors ----------------------------------------------------------------------------------

/** Every error this package raises. */
export class RunstateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A draft or event that is not valid, refused before it is sent (or by the service: 422). */
export class ContractError extends RunstateError {
  constructor(
    message: string,
    readonly field: string | null = null,
  ) {
    super(message);
  }
}

/** The service answered with an error: its HTTP status, its code and its message. */
export class ServiceError extends RunstateError {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly retryAfter: number | null = null,
    readonly body: unknown = null,
  ) {
    super(`${status} ${code}: ${message}`);
  }
}

/** 404: no such run. */
export class RunNotFound extends ServiceError {}

/** 410: the run was erased; `erasure` says who, when and why. */
export class RunErased extends ServiceError {
  get erasure(): { at?: string; by?: string; reason?: string } {
    return ((this.body as { error?: { erasure?: object } } | null)?.error?.erasure ?? {}) as never;
  }
}

/** 413: the patch is over the service's limit (`RUNSTATE_MAX_PATCH_BYTES`). */
export class PatchTooLarge extends ServiceError {}

/** No decision within the time asked. */
export class DecisionTimeout extends RunstateError {
  constructor(
    readonly runId: string,
    readonly patchId: string,
    readonly timeoutS: number,
  ) {
    super(`no decision on patch ${patchId} of run ${JSON.stringify(runId)} within ${timeoutS}s`);
  }
}

/** Nothing answers at the service's URL (for as long as the client retries). */
export class ServiceUnreachable extends RunstateError {
  constructor(
    readonly url: string,
    readonly cause: unknown,
    retryMs: number,
  ) {
    super(`cannot reach runstate serve at ${url} (${describe(cause)}; tried for ${retryMs / 1000}s): is it running?`);
  }
}

/** The run refused a patch: `decision` says why (`reason`, `rule`, `message`). */
export class PatchRejected extends RunstateError {
  constructor(readonly decision: Decision) {
    const rule = decision.rule ? ` [${decision.rule}]` : "";
    super(
      `patch ${decision.patch_id} of run ${JSON.stringify(decision.run_id)} rejected: ${decision.reason}${rule}` +
        (decision.message ? `: ${decision.message}` : ""),
    );
  }
}

/** The run moved on since the revision a patch was based on: `current`, and what was accepted since. */
export class RevisionConflict extends PatchRejected {
  readonly expected: number;
  readonly current: number;
  constructor(
    decision: Decision,
    readonly since: Decision[],
  ) {
    super(decision);
    this.expected = decision.expected_revision;
    this.current = decision.revision;
  }
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error ? `${e.message}: ${cause.message}` : e.message;
  }
  return String(e);
}

// -- drafts ----------------------------------------------------------------------------------

const KNOWN = new Set<string>(EVENT_TYPES);

/**
 * Refuse a malformed draft before it is sent, naming the field: the expected revision, the
 * events (at least one, each of a known type, none an operator's). The service checks the
 * rest of each event and answers a `ContractError` with the field it names.
 */
export function checkDraft(draft: PatchDraft): void {
  if (draft === null || typeof draft !== "object") throw new ContractError("a patch draft is an object", null);
  const rev = draft.expected_revision;
  if (!Number.isInteger(rev) || rev < 0) {
    throw new ContractError(`expected_revision must be a whole number >= 0, not ${JSON.stringify(rev)}`, "expected_revision");
  }
  if (!Array.isArray(draft.events) || draft.events.length === 0) {
    throw new ContractError("a patch needs at least one event", "events");
  }
  draft.events.forEach((e, i) => {
    const type = (e as { type?: unknown } | null)?.type;
    if (typeof type !== "string" || !KNOWN.has(type)) {
      throw new ContractError(
        `events[${i}].type ${JSON.stringify(type)} is not an event type (one of ${EVENT_TYPES.length}: ${EVENT_TYPES.slice(0, 4).join(", ")}, ...)`,
        `events[${i}].type`,
      );
    }
    if (TRAITS[type as EventType].operator) {
      throw new ContractError(`events[${i}]: ${type} is an operator's act (runstate erase), not an agent's`, `events[${i}].type`);
    }
  });
}

/** An id as one path segment, as the Python client writes it. */
export function pathSegment(value: string): string {
  const q = encodeURIComponent(value).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  return q === "." || q === ".." ? q.replaceAll(".", "%2E") : q;
}

// -- the client ------------------------------------------------------------------------------

/** Where a patch went: its id, and its decision when it was decided in time. */
export interface Submitted {
  patchId: string;
  runId: string;
  partition: number;
  offset: number;
  decision: Decision | null;
}

export interface ClientOptions {
  /** A bearer token (`runstate token add`). */
  token?: string;
  /** How long one request may take. */
  timeoutMs?: number;
  /** How long 429/503 answers and connection failures are retried. */
  retryMs?: number;
}

type Query = Record<string, string | number | undefined | null>;

const RETRIED = new Set([429, 503]);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** A client of one `runstate serve`. */
export class Client {
  readonly url: string;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly retryMs: number;

  constructor(url: string, options: ClientOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    this.headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    this.timeoutMs = options.timeoutMs ?? 70_000;
    this.retryMs = options.retryMs ?? 10_000;
  }

  private async request(method: string, path: string, query: Query = {}, body?: unknown): Promise<Reply> {
    const qs = Object.entries(query)
      .filter(([, v]) => v !== undefined && v !== null)
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`)
      .join("&");
    const headers: Record<string, string> =
      body === undefined ? { ...this.headers } : { ...this.headers, "content-type": "application/json" };
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const deadline = Date.now() + this.retryMs;
    let tries = 0; // answers sent again so far
    for (;;) {
      let resp: Reply;
      try {
        resp = await send(this.url, method, `${path}${qs ? `?${qs}` : ""}`, headers, payload, this.timeoutMs);
      } catch (e) {
        if (Date.now() >= deadline) throw new ServiceUnreachable(this.url, e, this.retryMs);
        await sleep(200);
        continue;
      }
      if (!RETRIED.has(resp.status) || Date.now() >= deadline) {
        if (resp.status >= 400) raiseFor(resp);
        return resp;
      }
      await sleep(pauseMs(resp, tries) * (0.5 + Math.random() / 2));
      tries += 1;
    }
  }

  private async json<T>(method: string, path: string, query: Query = {}, body?: unknown): Promise<T> {
    return JSON.parse((await this.request(method, path, query, body)).text) as T;
  }

  /** Append a patch (`waitS`: and wait that long for its decision). The patch id and time
   * are fixed here, so a retry is the same patch. Raises `ContractError` before sending a
   * malformed draft. */
  async append(runId: string, draft: PatchDraft, options: { waitS?: number } = {}): Promise<Submitted> {
    checkDraft(draft);
    const body = {
      ...draft,
      patch_id: draft.patch_id ?? randomBytes(16).toString("hex"),
      created_at: draft.created_at ?? new Date().toISOString(),
    };
    const got = await this.json<{ patch_id: string; run_id: string; partition: number; offset: number; decision?: Decision }>(
      "POST",
      `/runs/${pathSegment(runId)}/patches`,
      { wait: options.waitS },
      body,
    );
    return { patchId: got.patch_id, runId: got.run_id, partition: got.partition, offset: got.offset, decision: got.decision ?? null };
  }

  /** Append and wait for the decision. Raises `DecisionTimeout`. */
  async submit(runId: string, draft: PatchDraft, options: { timeoutS?: number } = {}): Promise<Decision> {
    const timeoutS = options.timeoutS ?? 10;
    const sub = await this.append(runId, draft, { waitS: timeoutS });
    if (sub.decision === null) throw new DecisionTimeout(runId, sub.patchId, timeoutS);
    return sub.decision;
  }

  /** The decision on a patch, waiting up to `timeoutS` for it. */
  async wait(runId: string, patchId: string, timeoutS = 10): Promise<Decision> {
    const deadline = Date.now() + timeoutS * 1000;
    for (;;) {
      const d = await this.decision(runId, patchId);
      if (d !== null) return d;
      if (Date.now() >= deadline) throw new DecisionTimeout(runId, patchId, timeoutS);
      await sleep(50);
    }
  }

  /** The decision on a patch, or null while there is none. */
  async decision(runId: string, patchId: string): Promise<Decision | null> {
    try {
      return await this.json<Decision>("GET", `/runs/${pathSegment(runId)}/decisions/${pathSegment(patchId)}`);
    } catch (e) {
      if (e instanceof ServiceError && e.status === 404) return null;
      throw e;
    }
  }

  /** The run's state (at `revision`, or once it holds `minRevision`: your own writes). */
  async state(runId: string, options: { revision?: number; minRevision?: number } = {}): Promise<RunState> {
    return this.json("GET", `/runs/${pathSegment(runId)}`, { revision: options.revision, min_revision: options.minRevision });
  }

  /** The compact context for a model's prompt (`maxTokens`: its budget). */
  async context(runId: string, options: { minRevision?: number; maxTokens?: number } = {}): Promise<string> {
    const got = await this.json<{ context: string }>("GET", `/runs/${pathSegment(runId)}/context`, {
      min_revision: options.minRevision,
      max_tokens: options.maxTokens,
    });
    return got.context;
  }

  /** Every decision on the run, in log order. */
  async history(runId: string): Promise<Decision[]> {
    return this.json("GET", `/runs/${pathSegment(runId)}/history`);
  }

  /** The runs, with their status and latest activity. */
  async runs(options: { status?: string } = {}): Promise<RunSummary[]> {
    return this.json("GET", "/runs", { status: options.status });
  }

  /** Which patches set a field of the run's state (`path`: e.g. `tasks.t1.status`). */
  async explain(runId: string, path: string): Promise<Record<string, unknown>[]> {
    return this.json("GET", `/runs/${pathSegment(runId)}/explain`, { path });
  }

  /** The run's LangGraph checkpoints, newest first. */
  async graphCheckpoints(
    runId: string,
    options: { ns?: string | null; checkpointId?: string | null; before?: string | null; limit?: number | null } = {},
  ): Promise<GraphCheckpointRead[]> {
    return this.json("GET", `/runs/${pathSegment(runId)}/graph/checkpoints`, {
      ns: options.ns,
      checkpoint_id: options.checkpointId,
      before: options.before,
      limit: options.limit,
    });
  }

  /** Erase the run (the token must allow erasing): the erasure record that stands. */
  async erase(runId: string, reason: string, options: { waitS?: number } = {}): Promise<Record<string, unknown>> {
    return this.json("DELETE", `/runs/${pathSegment(runId)}`, { reason, wait: options.waitS ?? 10 });
  }

  /**
   * The run's decisions as they happen (Server-Sent Events), after `lastEventId`; a dropped
   * connection is resumed where it stopped (`Last-Event-ID`). Ends when `signal` aborts.
   */
  async *events(runId: string, options: { lastEventId?: number; signal?: AbortSignal } = {}): AsyncGenerator<Decision> {
    let last = options.lastEventId;
    const path = `/runs/${pathSegment(runId)}/events`;
    while (!options.signal?.aborted) {
      const headers: Record<string, string> = { ...this.headers, accept: "text/event-stream" };
      if (last !== undefined) headers["last-event-id"] = String(last);
      let resp: IncomingMessage;
      try {
        resp = await open(this.url, "GET", path, headers, undefined, options.signal);
      } catch (e) {
        if (options.signal?.aborted) return;
        throw new ServiceUnreachable(this.url, e, 0);
      }
      if ((resp.statusCode ?? 500) >= 400) raiseFor(await reply(resp));
      try {
        for await (const ev of sse(resp)) {
          if (ev.id !== undefined) last = Number(ev.id);
          if (ev.data) yield JSON.parse(ev.data) as Decision;
        }
      } catch {
        if (options.signal?.aborted) return;
      }
      if (!options.signal?.aborted) await sleep(200); // dropped: resume after the last event seen
    }
  }
}

/** An answer, read whole. */
interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

/**
 * One request with the path sent as it is written: node's http, not fetch, whose URL
 * parser resolves an escaped dot segment (`%2E%2E`, a run named "..") to another path.
 */
function open(
  base: string,
  method: string,
  path: string,
  headers: Record<string, string>,
  body: string | undefined,
  signal?: AbortSignal,
  timeoutMs?: number,
): Promise<IncomingMessage> {
  const url = new URL(base);
  const prefix = url.pathname.replace(/\/+$/, "");
  const make = url.protocol === "https:" ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = make(
      {
        protocol: url.protocol,
        hostname: url.hostname.replace(/^\[|\]$/g, ""),
        port: url.port || undefined,
        path: prefix + path,
        method,
        headers: body === undefined ? headers : { ...headers, "content-length": String(Buffer.byteLength(body)) },
        signal,
      },
      resolve,
    );
    req.on("error", reject);
    if (timeoutMs !== undefined) req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
    req.end(body);
  });
}

async function reply(resp: IncomingMessage): Promise<Reply> {
  const chunks: Buffer[] = [];
  for await (const chunk of resp) chunks.push(chunk as Buffer);
  return { status: resp.statusCode ?? 500, headers: resp.headers, text: Buffer.concat(chunks).toString("utf8") };
}

async function send(
  base: string,
  method: string,
  path: string,
  headers: Record<string, string>,
  body: string | undefined,
  timeoutMs: number,
): Promise<Reply> {
  return reply(await open(base, method, path, headers, body, undefined, timeoutMs));
}

async function* sse(resp: IncomingMessage): AsyncGenerator<{ id?: string; data: string }> {
  const decoder = new TextDecoder();
  let buf = "";
  let id: string | undefined;
  let data: string[] = [];
  for await (const chunk of resp as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (data.length) yield { id, data: data.join("\n") };
        data = [];
        id = undefined;
      } else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      else if (line.startsWith("id:")) id = line.slice(3).trim();
    }
  }
}

/** How long before sending again a request answered `resp` (429 or 503) for the `tries`-th
 * time, before jitter (ms): `Retry-After-Ms` doubled at each try, up to `Retry-After` (1 s
 * at most), else `Retry-After`. Jittered by the caller, so that the clients an overloaded
 * instance shed do not come back at once. As the Python client's `_pause`. */
function pauseMs(resp: Reply, tries: number): number {
  const after = Number(resp.headers["retry-after"]);
  let base = Math.min(1, Number.isFinite(after) && after > 0 ? after : 0.2) * 1000;
  const sooner = Number(resp.headers["retry-after-ms"]);
  if (resp.headers["retry-after-ms"] !== undefined && Number.isFinite(sooner) && sooner >= 0) {
    base = Math.min(base, sooner * 2 ** Math.min(tries, 10));
  }
  return base;
}

function raiseFor(resp: Reply): never {
  let body: { error?: { code?: string; message?: string; field?: string | null } } | null = null;
  try {
    body = JSON.parse(resp.text);
  } catch {
    body = null;
  }
  const code = body?.error?.code ?? `http_${resp.status}`;
  const message = body?.error?.message ?? resp.text.slice(0, 200);
  const retry = Number(resp.headers["retry-after"]);
  const after = Number.isFinite(retry) && retry > 0 ? retry : null;
  if ((resp.status === 413 || resp.status === 422) && code !== "patch_too_large") {
    throw new ContractError(message, body?.error?.field ?? null);
  }
  const Kind =
    resp.status === 404 && code === "not_found"
      ? RunNotFound
      : resp.status === 410 && code === "erased"
        ? RunErased
        : resp.status === 413
          ? PatchTooLarge
          : ServiceError;
  throw new Kind(resp.status, code, message, after, body);
}

// -- the run handle --------------------------------------------------------------------------

export interface RunOptions extends ClientOptions {
  agentId: string;
  agentVersion: string;
  /** Seconds a patch waits for its decision. */
  timeoutS?: number;
}

/** One run as an agent worker sees it (one handle per worker): typed writes based on the
 * revision it last saw; conflicts on events that commute are rebased by the service. */
export class Run {
  /** The revision this handle last saw (0: not started, or not read yet). */
  revision = 0;
  private readonly openCalls = new Map<string, string>();

  constructor(
    readonly client: Client,
    readonly runId: string,
    readonly author: Author,
    readonly timeoutS = 10,
  ) {}

  /** The run's state, at least at the revision this handle last saw. */
  async state(): Promise<RunState> {
    const s = await this.client.state(this.runId, { minRevision: this.revision || undefined });
    this.revision = Math.max(this.revision, s.revision);
    return s;
  }

  /** The compact context for the model's prompt. */
  async context(options: { maxTokens?: number } = {}): Promise<string> {
    return this.client.context(this.runId, { minRevision: this.revision || undefined, maxTokens: options.maxTokens });
  }

  /**
   * Append `events` as one patch (all or none) based on the last seen revision; the
   * accepted decision. `rebase` defaults to whether every event commutes. Raises
   * `RevisionConflict` (with what was accepted since) or `PatchRejected`.
   */
  async submit(events: Event[], options: { rebase?: boolean } = {}): Promise<Decision> {
    const rebase = options.rebase ?? (this.revision > 0 && events.every((e) => TRAITS[e.type as EventType]?.commutes));
    const d = await this.client.submit(
      this.runId,
      { expected_revision: this.revision, events, rebase, author: this.author },
      { timeoutS: this.timeoutS },
    );
    if (d.reason === "revision_conflict" || d.reason === "superseded") {
      const history = await this.client.history(this.runId);
      throw new RevisionConflict(d, history.filter((h) => h.outcome === "accepted" && h.revision > d.expected_revision));
    }
    if (d.outcome !== "accepted") throw new PatchRejected(d);
    this.revision = Math.max(this.revision, d.revision);
    return d;
  }

  /** `RunStarted`: the run's first patch. */
  async start(goal: string, options: { include?: string[]; exclude?: string[]; policy?: Record<string, unknown> } = {}) {
    return this.submit([
      {
        type: "RunStarted",
        goal: { statement: goal, scope: { include: options.include ?? [], exclude: options.exclude ?? [] } },
        policy: options.policy ?? {},
      } as Event,
    ]);
  }

  /** `FactConfirmed`: needs `evidence` the run knows or an authoritative `source`. */
  async fact(id: string, statement: string, options: { evidence?: string; source?: string } = {}) {
    return this.submit([{ type: "FactConfirmed", fact: { id, statement, ...options } } as Event]);
  }

  /** `RunCompleted`. */
  async complete(options: { summary?: string; evidence?: string } = {}) {
    return this.submit([{ type: "RunCompleted", ...options } as Event]);
  }

  /**
   * Record `ToolCallStarted` before `fn` and `ToolSucceeded` (with the reference `fn`
   * returns) after it; a throw is recorded as `ToolFailed` and rethrown.
   */
  async toolCall<T extends string | void>(
    tool: string,
    fn: (callId: string) => Promise<T>,
    options: { sideEffect?: boolean; costly?: boolean; callId?: string } = {},
  ): Promise<T> {
    const callId = options.callId ?? `call_${randomUUID().replaceAll("-", "").slice(0, 12)}`;
    await this.submit([
      { type: "ToolCallStarted", call_id: callId, tool, side_effect: options.sideEffect ?? false, costly: options.costly ?? false } as Event,
    ]);
    this.openCalls.set(callId, tool);
    let ref: T;
    try {
      ref = await fn(callId);
    } catch (e) {
      this.openCalls.delete(callId);
      await this.submit([{ type: "ToolFailed", call_id: callId, error: describe(e).slice(0, 2000) } as Event]);
      throw e;
    }
    this.openCalls.delete(callId);
    try {
      await this.submit([{ type: "ToolSucceeded", call_id: callId, result_ref: ref || null } as Event], { rebase: false });
    } catch (e) {
      // The call ran; only its result was refused: closed as failed, or it stays in flight.
      if (e instanceof PatchRejected) {
        await this.submit([{ type: "ToolFailed", call_id: callId, error: `its result was rejected: ${e.message}` } as Event]);
      }
      throw e;
    }
    return ref;
  }

  /**
   * Record a side effect before making it (`EffectRecorded` started), committed after `fn`
   * or failed if it throws: a crash between leaves the run needing reconciliation.
   */
  async effect<T>(
    kind: string,
    target: string,
    idempotencyKey: string,
    fn: (effectId: string) => Promise<T>,
    options: { effectId?: string; callId?: string } = {},
  ): Promise<T> {
    const id = options.effectId ?? `effect_${randomUUID().replaceAll("-", "").slice(0, 12)}`;
    const spec = { id, kind, target, idempotency_key: idempotencyKey, call_id: options.callId ?? null };
    await this.submit([{ type: "EffectRecorded", effect: { ...spec, status: "started" } } as Event]);
    let out: T;
    try {
      out = await fn(id);
    } catch (e) {
      await this.submit([
        { type: "EffectRecorded", effect: { ...spec, status: "failed", evidence: describe(e).slice(0, 2000) } } as Event,
      ]);
      throw e;
    }
    await this.submit([{ type: "EffectRecorded", effect: { ...spec, status: "committed" } } as Event]);
    return out;
  }

  /** Record every tool call still open as failed (never left in flight silently). */
  async close(): Promise<void> {
    for (const callId of [...this.openCalls.keys()]) {
      await this.submit([{ type: "ToolFailed", call_id: callId, error: "the run handle closed with the call open" } as Event]);
    }
    this.openCalls.clear();
  }
}

/** A handle on run `runId` of the serve at `url`, writing as `agentId`/`agentVersion`. */
export function openRun(url: string, runId: string, options: RunOptions): Run {
  const client = new Client(url, options);
  return new Run(client, runId, { agent_id: options.agentId, agent_version: options.agentVersion }, options.timeoutS ?? 10);
}
