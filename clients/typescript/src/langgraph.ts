/**
 * runstate as LangGraph.js's checkpointer, backed by a `runstate serve`.
 *
 * A LangGraph thread is a run (its `thread_id` is the run id), as on the Python side
 * (`runstate.integrations.langgraph`): each checkpoint is a `GraphCheckpointSaved` event on
 * the run's log, each batch of pending writes a `GraphWritesSaved`, deleting the thread a
 * `GraphThreadDeleted` (or, where the serve seals content, an erasure). A thread written
 * from Python is read here and the other way round; the values are what each side's
 * serializer wrote (LangGraph.js reads JSON, Python's default writes msgpack: give the
 * Python saver a JSON serializer to continue a thread across languages).
 *
 *     const saver = RunstateSaver.fromConnString("http://127.0.0.1:8750", { token });
 *     const graph = builder.compile({ checkpointer: saver });
 */

import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
  TASKS,
  WRITES_IDX_MAP,
  compareWritesSortKeys,
  getCheckpointId,
  maxChannelVersion,
  writesSortKey,
} from "@langchain/langgraph-checkpoint";

import {
  Client,
  type ClientOptions,
  type Decision,
  type Event,
  type GraphCheckpointRead,
  PatchRejected,
  RunErased,
  RunNotFound,
  ServiceError,
  TERMINAL_STATUSES,
} from "./index.js";

type Blob = { type: string; data: string };
type Doc = GraphCheckpointRead;

/** The author of the saver's patches unless told otherwise (a serve with tokens uses the token's). */
export const DEFAULT_AUTHOR = { agent_id: "langgraph-js", agent_version: "0.1.0" };
/** The reason an erasure by `deleteThread` records, as the Python saver's. */
export const DELETE_REASON = "LangGraph delete_thread";

/** The longest run id the service takes. */
export const MAX_RUN_ID = 200;
/** How many checkpoints a saver remembers the generation of (the latest ones it wrote or read). */
export const REMEMBERED_CHECKPOINTS = 10_000;
const GENERATION = /^([\s\S]*)~([1-9][0-9]*)$/;

/**
 * The run that holds generation `n` (1, 2, ...) of a thread, as the Python saver names it:
 * the thread id itself for the first, `<thread id>~<n>` for the next ones (a conversation
 * after `deleteThread`). A thread id that already ends as a later generation's does
 * (`chat~2`) takes `~1` for its first, so that no two (thread, generation) share a run.
 */
export function generationRunId(threadId: string, n: number): string {
  if (n === 1 && !GENERATION.test(threadId)) return threadId;
  const runId = `${threadId}~${n}`;
  if ([...runId].length > MAX_RUN_ID) {
    throw new Error(
      `thread id ${JSON.stringify(threadId.slice(0, 40))}... (${[...threadId].length} characters) is too long for generation ${n} ` +
        `(a conversation after deleteThread): its run id would be over ${MAX_RUN_ID} characters`,
    );
  }
  return runId;
}

/** [thread id, generation] of a run the saver wrote: {@link generationRunId}'s inverse. */
export function threadOf(runId: string): [string, number] {
  const m = GENERATION.exec(runId);
  return m ? [m[1], Number(m[2])] : [runId, 1];
}

/** Whether a write was refused because its run has ended (so a newer generation may take it). */
const ended = (e: unknown): boolean =>
  e instanceof RunErased || (e instanceof PatchRejected && ["run_terminal", "run_erased"].includes(e.decision.reason ?? ""));

const toBlob = ([type, bytes]: [string, Uint8Array]): Blob => ({ type, data: Buffer.from(bytes).toString("base64") });
const fromBlob = (b: Blob): [string, Uint8Array] => [b.type, new Uint8Array(Buffer.from(b.data, "base64"))];

export interface SaverOptions extends ClientOptions {
  serde?: SerializerProtocol;
  author?: { agent_id: string; agent_version: string };
  /** Seconds a write waits for its decision. */
  timeoutS?: number;
}

/** LangGraph.js's `BaseCheckpointSaver` on a `runstate serve`. Make it with {@link RunstateSaver.fromConnString}. */
export class RunstateSaver extends BaseCheckpointSaver<string | number> {
  private readonly started = new Set<string>();
  /** thread id -> the generation this saver last found current (1 where not looked up) */
  private readonly generations = new Map<string, number>();
  /** [thread, namespace, checkpoint id] -> the generation it was written to or read from */
  private readonly generationOf = new Map<string, number>();

  constructor(
    readonly client: Client,
    private readonly options: SaverOptions = {},
  ) {
    super(options.serde);
  }

  /** A saver on the `runstate serve` at `url` (`token` among the options where it needs one). */
  static fromConnString(url: string, options: SaverOptions = {}): RunstateSaver {
    return new RunstateSaver(new Client(url, options), options);
  }

  // -- writing ---------------------------------------------------------------------------

  private draft(revision: number, events: Event[], rebase: boolean) {
    return { expected_revision: revision, events, rebase, author: this.options.author ?? DEFAULT_AUTHOR };
  }

  /**
   * Write `events` (one patch) to the thread's run, starting the run where it has none
   * (unless `start` is off: then null). The same resolutions as the Python saver's, each
   * once: the run started meanwhile, a control event moved it on (name its revision).
   */
  private async write(threadId: string, events: Event[], opts: { start?: boolean; isNew?: boolean } = {}): Promise<Decision | null> {
    const start = opts.start ?? true;
    const [thread, n] = threadOf(threadId);
    const statement = `LangGraph thread ${thread}` + (n > 1 ? `, generation ${n}` : "");
    const begun = [{ type: "RunStarted", goal: { statement } } as Event, ...events];
    const send = (revision: number, evs: Event[], rebase: boolean) =>
      this.client.submit(threadId, this.draft(revision, evs, rebase), { timeoutS: this.options.timeoutS ?? 30 });
    let d: Decision | null = opts.isNew && start && !this.started.has(threadId) ? await send(0, begun, false) : null;
    if (d === null || d.reason === "revision_conflict") d = await send(0, events, true);
    if (d.reason === "superseded") d = await send(d.revision, events, true);
    else if (d.reason === "unknown_run") {
      if (!start) return null;
      d = await send(0, begun, false);
      if (d.reason === "revision_conflict") d = await send(0, events, true); // started meanwhile
    }
    if (d.outcome !== "accepted") throw new PatchRejected(d);
    this.started.add(threadId);
    return d;
  }

  // -- generations: a conversation after deleteThread is a run of its own -------------------

  private run(threadId: string): string {
    return generationRunId(threadId, this.generations.get(threadId) ?? 1);
  }

  private remember(threadId: string, ns: string, checkpointId: string, runId: string): void {
    const key = JSON.stringify([threadId, ns, checkpointId]);
    this.generationOf.delete(key);
    this.generationOf.set(key, threadOf(runId)[1]);
    if (this.generationOf.size > REMEMBERED_CHECKPOINTS) this.generationOf.delete(this.generationOf.keys().next().value as string);
  }

  /** The run of the generation this saver handled the checkpoint `names` ([ns, id]) in, if it did. */
  private runOf(threadId: string, names: [string, string] | null): string | null {
    const n = names ? this.generationOf.get(JSON.stringify([threadId, ...names])) : undefined;
    return n === undefined ? null : generationRunId(threadId, n);
  }

  private async hasEnded(runId: string): Promise<boolean> {
    if ((await this.client.graphCheckpoints(runId, { ns: "", limit: 1 })).length) return false;
    try {
      return TERMINAL_STATUSES.has((await this.client.state(runId)).status ?? "");
    } catch (e) {
      if (e instanceof RunErased) return true;
      if (e instanceof RunNotFound) return false;
      throw e;
    }
  }

  /** The run of the thread's current generation, looked up from the one this saver last used. */
  private async follow(threadId: string): Promise<string> {
    let n = this.generations.get(threadId) ?? 1;
    while (await this.hasEnded(generationRunId(threadId, n))) n += 1;
    this.generations.set(threadId, n);
    return this.run(threadId);
  }

  /**
   * Write `events` to the thread and return the run they went to: the generation of the
   * checkpoint they name where this saver handled that one (refused there once it ended: a
   * late write), else the current generation; refused because that run ended, to the one
   * current now where they belong there (they start a conversation, or name its checkpoint).
   */
  private async toThread(threadId: string, events: Event[], isNew: boolean, names: [string, string] | null): Promise<string> {
    const known = this.runOf(threadId, names);
    if (known !== null) {
      await this.write(known, events, { isNew });
      return known;
    }
    const run = this.run(threadId);
    try {
      await this.write(run, events, { isNew });
      return run;
    } catch (e) {
      if (!ended(e)) throw e;
      const now = await this.follow(threadId);
      const belongs =
        (isNew && names === null) ||
        (names !== null && (await this.client.graphCheckpoints(now, { ns: names[0], checkpointId: names[1], limit: 1 })).length > 0);
      if (now === run || !belongs) throw e;
      await this.write(now, events, { isNew });
      return now;
    }
  }

  /** The thread's checkpoints in its current generation (an empty answer looks it up again). */
  private async read(threadId: string, q: Parameters<RunstateSaver["docs"]>[1]): Promise<[string, Doc[]]> {
    const known = this.generations.has(threadId);
    const run = this.run(threadId);
    const docs = await this.docs(run, q);
    if (docs.length || (known && q.ns)) return [run, docs];
    const now = await this.follow(threadId);
    return now === run ? [run, docs] : [now, await this.docs(now, q)];
  }

  /**
   * A channel's next version, as LangGraph's own SQL savers make it: the count, then random
   * digits, so that two branches of a thread (a fork) never give one channel the same
   * version, under which its value is kept once. Reads the Python saver's versions too.
   */
  getNextVersion(current: string | number | undefined): string {
    const n = current === undefined ? 0 : typeof current === "number" ? current : Number(String(current).split(".")[0]);
    return `${String(n + 1).padStart(32, "0")}.${Math.random().toFixed(16).slice(2)}`;
  }

  /**
   * Save a checkpoint as LangGraph's own SQL savers store one: each channel's value once
   * per version, written only for the channels in `newVersions` (one that kept its version
   * is read from the value saved with it).
   */
  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const threadId = config.configurable?.thread_id;
    if (threadId === undefined || threadId === null || threadId === "") {
      throw new Error("runstate's checkpointer needs configurable.thread_id (a thread is a run)");
    }
    const ns: string = config.configurable?.checkpoint_ns ?? "";
    const parentId: string | undefined = config.configurable?.checkpoint_id;
    const values = checkpoint.channel_values as Record<string, unknown>;
    const [cp, md, kept] = await Promise.all([
      this.serde.dumpsTyped({ ...checkpoint, channel_values: {} }),
      this.serde.dumpsTyped(metadata),
      Promise.all(
        Object.entries(newVersions).map(async ([channel, version]) => ({
          channel,
          version: String(version),
          value: channel in values ? toBlob(await this.serde.dumpsTyped(values[channel])) : null,
        })),
      ),
    ]);
    const event = {
      type: "GraphCheckpointSaved",
      checkpoint: {
        ns,
        id: checkpoint.id,
        parent_id: parentId ?? null,
        checkpoint: toBlob(cp),
        metadata: toBlob(md),
        versions: Object.entries(checkpoint.channel_versions).map(([channel, v]) => ({ channel, version: String(v) })),
        values: kept,
      },
    } as unknown as Event;
    const thread = String(threadId);
    // The checkpoint it names: its parent; a subgraph's first checkpoint names its root graph's (`parents`).
    const root = ns ? (metadata as { parents?: Record<string, string> }).parents?.[""] : undefined;
    const names: [string, string] | null = parentId !== undefined ? [ns, parentId] : root ? ["", root] : null;
    const run = await this.toThread(thread, [event], parentId === undefined, names);
    this.remember(thread, ns, checkpoint.id, run);
    return { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ""): Promise<void> {
    const threadId = config.configurable?.thread_id;
    const checkpointId = config.configurable?.checkpoint_id;
    if (threadId === undefined) throw new Error("runstate's checkpointer needs configurable.thread_id");
    if (checkpointId === undefined) throw new Error("putWrites needs configurable.checkpoint_id (the checkpoint the writes belong to)");
    const saved = await Promise.all(
      writes.map(async ([channel, value], i) => ({
        task_id: taskId,
        idx: WRITES_IDX_MAP[channel] ?? i,
        channel,
        value: toBlob(await this.serde.dumpsTyped(value)),
        task_path: taskPath,
      })),
    );
    const ns: string = config.configurable?.checkpoint_ns ?? "";
    const event = { type: "GraphWritesSaved", ns, checkpoint_id: checkpointId, writes: saved } as unknown as Event;
    await this.toThread(String(threadId), [event], false, [ns, String(checkpointId)]);
  }

  /**
   * Erase the thread's run where the serve seals content (a master key, and a token
   * allowed to erase); elsewhere remove its checkpoints and writes from its Run State and
   * cancel its run. A late write to it is refused. A missing thread is no error.
   */
  async deleteThread(threadId: string): Promise<void> {
    const run = await this.follow(String(threadId));
    try {
      await this.client.erase(run, DELETE_REASON);
      return;
    } catch (e) {
      if (e instanceof ServiceError && e.status === 404) return;
      if (!(e instanceof ServiceError && e.status === 409)) throw e; // 409: this serve seals no content
    }
    await this.write(run, [{ type: "GraphThreadDeleted" } as Event], { start: false });
  }

  // -- reading ---------------------------------------------------------------------------

  private async docs(threadId: string, q: { ns?: string | null; checkpointId?: string | null; before?: string | null; limit?: number | null }): Promise<Doc[]> {
    try {
      return await this.client.graphCheckpoints(threadId, q);
    } catch (e) {
      if (e instanceof RunErased) return [];
      throw e;
    }
  }

  private async writesOf(doc: Doc): Promise<CheckpointPendingWrite[]> {
    const writes = [...(doc.writes ?? [])].sort((a, b) =>
      compareWritesSortKeys(writesSortKey(a.task_path ?? "", a.task_id, a.idx), writesSortKey(b.task_path ?? "", b.task_id, b.idx)),
    );
    return Promise.all(
      writes.map(async (w) => [w.task_id, w.channel, await this.serde.loadsTyped(...fromBlob(w.value as Blob))] as CheckpointPendingWrite),
    );
  }

  /** A stored checkpoint as LangGraph's: the values kept once per version put back. */
  private async tuple(threadId: string, runId: string, doc: Doc): Promise<CheckpointTuple> {
    const ns = doc.ns ?? "";
    const checkpoint = (await this.serde.loadsTyped(...fromBlob(doc.checkpoint as Blob))) as Checkpoint;
    const values = (checkpoint.channel_values ??= {}) as Record<string, unknown>;
    for (const v of doc.values ?? []) {
      if (v.value) values[v.channel] = await this.serde.loadsTyped(...fromBlob(v.value as Blob));
    }
    if (checkpoint.v < 4 && doc.parent_id) {
      // Before format 4 a step's sends were its parent's writes to TASKS, as MemorySaver migrates them.
      const [parent] = await this.docs(runId, { ns, checkpointId: doc.parent_id, limit: 1 });
      const sends = parent ? (await this.writesOf(parent)).filter(([, channel]) => channel === TASKS) : [];
      values[TASKS] = sends.map(([, , value]) => value);
      const versions = Object.values(checkpoint.channel_versions ?? {});
      checkpoint.channel_versions[TASKS] = versions.length ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
    }
    const out: CheckpointTuple = {
      config: { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: doc.id } },
      checkpoint,
      metadata: (await this.serde.loadsTyped(...fromBlob(doc.metadata as Blob))) as CheckpointMetadata,
      pendingWrites: await this.writesOf(doc),
    };
    if (doc.parent_id) out.parentConfig = { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: doc.parent_id } };
    return out;
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id;
    if (threadId === undefined) return undefined;
    const ns: string = config.configurable?.checkpoint_ns ?? "";
    const checkpointId = getCheckpointId(config);
    const thread = String(threadId);
    const [run, docs] = await this.read(thread, { ns, checkpointId: checkpointId || null, limit: 1 });
    if (!docs.length) return undefined;
    this.remember(thread, ns, docs[0].id, run);
    return this.tuple(thread, run, docs[0]);
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter } = options;
    let limit = options.limit;
    if (limit !== undefined && limit <= 0) return;
    const conf = config.configurable ?? {};
    const q = {
      ns: conf.checkpoint_ns ?? null,
      checkpointId: conf.checkpoint_id ?? null,
      before: before?.configurable?.checkpoint_id ?? null,
      limit: filter ? null : (limit ?? null),
    };
    // One thread: its current generation; every thread: each generation's run.
    const entries: Array<[string, string | null]> =
      conf.thread_id !== undefined
        ? [[String(conf.thread_id), null]]
        : (await this.client.runs()).map((r) => [threadOf(r.run_id)[0], r.run_id]);
    for (const [threadId, given] of entries) {
      if (limit !== undefined && limit <= 0) return;
      const [run, docs] = given === null ? await this.read(threadId, q) : [given, await this.docs(given, q)];
      for (const doc of docs) {
        const tup = await this.tuple(threadId, run, doc);
        if (filter && !Object.entries(filter).every(([k, v]) => (tup.metadata as Record<string, unknown>)?.[k] === v)) continue;
        if (limit !== undefined) {
          if (limit <= 0) return;
          limit -= 1;
        }
        yield tup;
      }
    }
  }
}
