// A `runstate serve` of a test's own (Python's, the checkout's): on a free loopback port,
// with an embedded log in a directory of its own, or on Kafka (RUNSTATE_TEST_KAFKA) with
// topics of its own (named from RUNSTATE_TEST_TOPIC_PREFIX). RUNSTATE_PYTHON names the interpreter (the test suite sets it).
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const PYTHON = process.env.RUNSTATE_PYTHON ?? "python3";

export async function startServe(extraEnv = {}) {
  const dir = mkdtempSync(join(tmpdir(), "runstate-ts-"));
  const env = { ...process.env, RUNSTATE_STATE_DIR: join(dir, "state"), ...extraEnv };
  if (process.env.RUNSTATE_TEST_KAFKA) {
    env.RUNSTATE_LOG = `kafka://${process.env.RUNSTATE_TEST_KAFKA}`;
    const base = process.env.RUNSTATE_TEST_TOPIC_PREFIX ?? "ts";
    env.RUNSTATE_TOPIC_PREFIX = `${base}${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
    const made = spawnSync(PYTHON, ["-m", "runstate.cli", "topics", "create", "--partitions", "2"], { env, encoding: "utf8" });
    if (made.status !== 0) throw new Error(`topics create failed: ${made.stderr}`);
  } else {
    env.RUNSTATE_LOG = join(dir, "log.db");
  }
  // Port 0: the serve binds a port itself and announces it. A port picked here would be free
  // only until another process took it, and its /healthz would then answer for a serve not ours.
  const proc = spawn(PYTHON, ["-m", "runstate.cli", "serve", "--port", "0"], { env, stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  proc.stderr.on("data", (b) => (err += b));
  let url = null;
  const deadline = Date.now() + 120_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`serve exited ${proc.exitCode}: ${err}`);
    url ??= /^runstate serve: (http:\/\/\S+)/m.exec(err)?.[1] ?? null;
    try {
      const body = url && (await (await fetch(`${url}/healthz`)).json());
      if (body?.owned_partitions?.length) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`serve not ready: ${err}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    dir,
    env,
    async stop() {
      // A serve that failed a request (a traceback) says so, so that a test it failed can be read.
      // Its first error, which the ones after it (a shutdown cancelling requests) follow from.
      const first = Math.max(0, Math.min(...["Traceback", "runstate serve: stopping"].map((w) => err.indexOf(w)).filter((i) => i >= 0)));
      if (err.includes("Traceback")) console.error(`runstate serve ${url} logged an error:\n${err.slice(first, first + 4000)}`);
      proc.kill("SIGTERM");
      await new Promise((r) => (proc.exitCode !== null ? r() : proc.once("exit", r)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
