"""LangGraph.js with runstate's checkpointer, side by side with LangGraph.js's own SQLite
saver in one run.

    .venv/bin/python bench/bench_langgraph_js.py            # 5 rounds
    .venv/bin/python bench/bench_langgraph_js.py --quick    # 2 rounds

Per step of a 50-step LangGraph.js graph (one node appending a message per step, the graph
of ``bench_langgraph.py``), milliseconds, median over rounds; within a round the savers
take turns (A B / B A): ``MemorySaver``, ``SqliteSaver`` of
``@langchain/langgraph-checkpoint-sqlite`` (a file, its defaults) and ``RunstateSaver``
through a ``runstate serve`` on loopback (embedded log), all in one Node process.

The packages are installed on first use into ``.bench-peers/js`` with npm: LangGraph.js,
the SQLite saver (its ``better-sqlite3`` builds with node-gyp where no prebuilt binary is
downloadable) and runstate's two packages (``@runstate/client``, ``@runstate/langgraph``) from tarballs
of the checkout, as ``docs/typescript.md`` installs them. Needs Node 20+ and npm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_langgraph import serve

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "clients" / "typescript"
PEERS = ROOT / ".bench-peers" / "js"
STEPS = 50
#: What the peers directory installs, pinned as clients/typescript's dev dependencies are.
PACKAGES = {
    "@langchain/core": "1.4.0",
    "@langchain/langgraph": "1.7.3",
    "@langchain/langgraph-checkpoint": "1.2.2",
    "@langchain/langgraph-checkpoint-sqlite": "1.0.4",
}


def _run(args: list[str], cwd: Path, timeout: float = 900) -> None:
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")


def install() -> None:
    """The peers directory, with runstate's package packed from the checkout (again each run:
    the bench measures the checkout)."""
    if not (TS / "node_modules").exists():
        _run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], TS)
    _run(["npx", "tsc", "-p", "tsconfig.json"], TS)
    PEERS.mkdir(parents=True, exist_ok=True)
    for old in PEERS.glob("runstate-*.tgz"):
        old.unlink()
    _run(["npm", "pack", "--pack-destination", str(PEERS)], TS)
    _run(["npm", "pack", "--pack-destination", str(PEERS)], TS / "langgraph")
    tarballs = sorted(f"./{t.name}" for t in PEERS.glob("runstate-*.tgz"))
    if not (PEERS / "package.json").exists():
        (PEERS / "package.json").write_text(
            json.dumps({"name": "runstate-bench-peers", "private": True, "type": "module"})
        )
    print("installing LangGraph.js and its SQLite saver into .bench-peers/js ...", flush=True)
    pinned = [f"{name}@{version}" for name, version in PACKAGES.items()]
    _run(["npm", "install", "--no-audit", "--no-fund", *pinned, *tarballs], PEERS)
    shutil.copy(Path(__file__).with_name("langgraph_js_step.mjs"), PEERS / "langgraph_js_step.mjs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds = 2 if args.quick else 5
    missing = [t for t in ("node", "npm") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"this bench needs {', '.join(missing)}")
    install()
    with tempfile.TemporaryDirectory(prefix="runstate-bench-lgjs-") as tmp:
        work = Path(tmp)
        env = {"RUNSTATE_LOG": str(work / "serve" / "log.db"), "RUNSTATE_STATE_DIR": str(work / "serve" / "state")}
        with serve(env) as url:
            out = subprocess.run(
                ["node", "langgraph_js_step.mjs", url, str(work), str(rounds), str(STEPS)],
                cwd=PEERS,
                capture_output=True,
                text=True,
                timeout=1800,
                env={**os.environ},
            )
        if out.returncode != 0:
            raise SystemExit(out.stdout[-2000:] + out.stderr[-3000:])
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    med = {name: statistics.median(r[name] for r in rows) for name in rows[0]}
    base = med["SqliteSaver"]
    print(f"\nper step of a {STEPS}-step LangGraph.js graph, ms (median of {rounds} rounds); x = against SqliteSaver\n")
    print("| saver | graph step | x |")
    print("|---|---|---|")
    for name, ms in med.items():
        spread = f"{min(r[name] for r in rows):.2f}-{max(r[name] for r in rows):.2f}"
        print(f"| {name} | {ms:.2f} [{spread}] | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
