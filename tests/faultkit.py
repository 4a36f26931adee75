"""Kill-and-recover: the fault drill both backends run (a helper module, not a test).

Agents append while a real ``runstate project`` and a real ``runstate snapshot`` process
are SIGKILLed at random moments and restarted; then the whole state directory is deleted
and a new projector recovers it from the checkpoints topic + the log's tail. Counted: runs
lost, patches decided twice (or decided differently from a clean replay), and whether
``runstate verify`` passes.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import ev, fact, patch, start, task

from runstate.eventlog.base import EventLog
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import replay
from runstate.projector.core.runbook import RunBook
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch
from runstate.schemas import structs


def workload(runs: int, per_run: int, rng: random.Random) -> list[Patch]:
    """Interleaved patches for many runs: valid chains, stale and invalid patches, resends
    (of any earlier patch, rebase-able spends among them)."""
    book = RunBook()
    out: list[Patch] = []
    for r in range(runs):
        out.append(patch(f"run_{r}", 0, start()))
        book.apply(out[-1], 0, len(out))
    for i in range(runs * per_run):
        run = f"run_{rng.randrange(runs)}"
        doc = book.docs[run]
        assert doc is not None
        rev = doc.header.revision
        roll = rng.random()
        if roll < 0.05 and out:
            p = out[rng.randrange(len(out))]  # a resend: must be decided once
        elif roll < 0.15:
            p = patch(run, max(0, rev - 1), fact(f"s{i}"), ev("BudgetConsumed", tokens=3), rebase=rng.random() < 0.7)
        elif roll < 0.2:
            p = patch(run, rev, fact(f"x{i}", evidence=None))
        elif roll < 0.3:
            p = patch(run, rev, task(f"t{i}"), ev("ConstraintSet", constraint={"key": "k", "value": str(i)}))
        else:
            p = patch(run, rev, fact(f"f{i}"), ev("BudgetConsumed", tokens=1))
        book.apply(p, 0, len(out))
        out.append(p)
    return out


@dataclass
class DrillReport:
    runs: int
    patches: int
    projector_kills: int
    snapshotter_kills: int
    restored_runs: int
    lost_runs: int
    decided_twice: int
    differing: int
    verify_exit: int
    verify_output: str

    def line(self) -> str:
        return (
            f"{self.patches} patches over {self.runs} runs; {self.projector_kills} projector and "
            f"{self.snapshotter_kills} snapshotter SIGKILLs; state directory deleted and recovered: "
            f"{self.restored_runs} runs restored from checkpoints, {self.lost_runs} runs lost, "
            f"{self.decided_twice} patches decided twice, {self.differing} decisions unlike a replay, "
            f"verify exit {self.verify_exit}"
        )


def append_slowly(log: EventLog, patches: list[Patch], pause_s: float) -> None:
    """Append ``patches`` 40 at a time with a pause between: the appending goes on while
    the processes under test are killed and restarted."""
    prod = log.producer()
    for i in range(0, len(patches), 40):
        for p in patches[i : i + 40]:
            prod.append_async(log.topics.events, p.run_id, encode(p), lambda a, e: None)
        prod.flush()
        time.sleep(pause_s)
    prod.close()


def drill(
    log: EventLog,
    env: dict[str, str],
    state: Path,
    *,
    runs: int,
    per_run: int,
    seed: int,
    min_kills: int = 4,
    resends_after: int = 20,
) -> DrillReport:
    rng = random.Random(seed)
    patches = workload(runs, per_run, rng)

    cli = [sys.executable, "-m", "runstate.cli"]
    commands = {
        "project": [*cli, "project", "--batch-size", "37", "--quiet"],
        "snapshot": [*cli, "snapshot", "--every", "4", "--quiet"],
    }
    kills = {"project": 0, "snapshot": 0}
    producer = threading.Thread(target=append_slowly, args=(log, patches, 0.05))
    producer.start()
    procs = {
        name: subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, cmd in commands.items()
    }
    try:
        while producer.is_alive() or min(kills.values()) < min_kills:
            time.sleep(rng.uniform(0.2, 0.9))
            name = rng.choice(sorted(procs))
            os.kill(procs[name].pid, signal.SIGKILL)
            procs[name].wait()
            kills[name] += 1
            procs[name] = subprocess.Popen(
                commands[name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if sum(kills.values()) > 60:
                break
    finally:
        producer.join()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=120)
    for name in ("project", "snapshot"):
        done = subprocess.run(
            [*commands[name], "--until-caught-up"], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr

    # A new machine: no state at all. Agents retry old patches meanwhile.
    shutil.rmtree(state)
    prod = log.producer()
    for p in rng.sample(patches, resends_after):
        prod.append(log.topics.events, p.run_id, encode(p))
    prod.close()
    recovered = subprocess.run(
        [*cli, "-v", "project", "--until-caught-up", "--quiet"], env=env, capture_output=True, text=True, timeout=600
    )
    assert recovered.returncode == 0, recovered.stderr
    check = subprocess.run([*cli, "verify", "--quiet"], env=env, capture_output=True, text=True, timeout=600)

    ends = log.end_offsets(log.topics.events)
    oracle = replay(r for p_ in sorted(ends) for r in log.scan(log.topics.events, p_, 0, ends[p_]))
    first = {key: structs.to_model(d) for key, d in oracle.decided.items()}  # the core's structs as models
    lost = twice = differing = 0
    with Projection(state) as proj:
        restored = proj.restored()
        have = {h.run_id for h in proj.runs()}
        lost = len({r for r, doc in oracle.docs.items() if doc is not None} - have)
        for run in have:
            hist = proj.history(run)
            ids = [d.patch_id for d in hist]
            twice += len(ids) - len(set(ids))
            for d in hist:
                if d != first.get((run, d.patch_id)):
                    differing += 1
            doc = oracle.docs.get(run)
            if doc is None or proj.state(run) != doc.to_state():
                differing += 1
    return DrillReport(
        runs,
        len(patches),
        kills["project"],
        kills["snapshot"],
        len(restored),
        lost,
        twice,
        differing,
        check.returncode,
        check.stdout + check.stderr,
    )
