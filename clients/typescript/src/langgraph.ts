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

import { Client, type ClientOptions, type Decision, type Event, type GraphCheckpointRead, PatchRejected, RunErased, ServiceError } from "./index.js";

type Blob = { type: string; data: string };
type Doc = GraphCheckpointRead;

/** The author of the saver's patches unless told otherwise (a serve with tokens uses the token's). */
export const DEFAULT_AUTHOR = { agent_id: "langgraph-js", agent_version: "0.1.0" };
/** The reason an erasure by `deleteThread` records, as the Python saver's. */
export const DELETE_REASON = "LangGraph delete_thread";

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
    const begun = [{ type: "RunStarted", goal: { statement: `LangGraph thread ${threadId}` } } as Event, ...events];
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
    await this.write(String(threadId), [event], { isNew: parentId === undefined });
    return { configurable: { thread_id: String(threadId), checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
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
    const event = {
      type: "GraphWritesSaved",
      ns: config.configurable?.checkpoint_ns ?? "",
      checkpoint_id: checkpointId,
      writes: saved,
    } as unknown as Event;
    await this.write(String(threadId), [event]);
  }

  /**
   * Erase the thread's run where the serve seals content (a master key, and a token
   * allowed to erase); elsewhere remove its checkpoints and writes from its Run State and
   * cancel its run. A late write to it is refused. A missing thread is no error.
   */
  async deleteThread(threadId: string): Promise<void> {
    try {
      await this.client.erase(threadId, DELETE_REASON);
      return;
    } catch (e) {
      if (e instanceof ServiceError && e.status === 404) return;
      if (!(e instanceof ServiceError && e.status === 409)) throw e; // 409: this serve seals no content
    }
    await this.write(threadId, [{ type: "GraphThreadDeleted" } as Event], { start: false });
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
  private async tuple(threadId: string, doc: Doc): Promise<CheckpointTuple> {
    const ns = doc.ns ?? "";
    const checkpoint = (await this.serde.loadsTyped(...fromBlob(doc.checkpoint as Blob))) as Checkpoint;
    const values = (checkpoint.channel_values ??= {}) as Record<string, unknown>;
    for (const v of doc.values ?? []) {
      if (v.value) values[v.channel] = await this.serde.loadsTyped(...fromBlob(v.value as Blob));
    }
    if (checkpoint.v < 4 && doc.parent_id) {
      // Before format 4 a step's sends were its parent's writes to TASKS, as MemorySaver migrates them.
      const [parent] = await this.docs(threadId, { ns, checkpointId: doc.parent_id, limit: 1 });
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
    const docs = await this.docs(String(threadId), { ns, checkpointId: checkpointId || null, limit: 1 });
    return docs.length ? this.tuple(String(threadId), docs[0]) : undefined;
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter } = options;
    let limit = options.limit;
    if (limit !== undefined && limit <= 0) return;
    const conf = config.configurable ?? {};
    const threads: string[] = conf.thread_id !== undefined ? [String(conf.thread_id)] : (await this.client.runs()).map((r) => r.run_id);
    for (const threadId of threads) {
      if (limit !== undefined && limit <= 0) return;
      const docs = await this.docs(threadId, {
        ns: conf.checkpoint_ns ?? null,
        checkpointId: conf.checkpoint_id ?? null,
        before: before?.configurable?.checkpoint_id ?? null,
        limit: filter ? null : (limit ?? null),
      });
      for (const doc of docs) {
        const tup = await this.tuple(threadId, doc);
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
