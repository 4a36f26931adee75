"""The README's examples are executed as written (STYLE: README examples run in tests)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import readme_blocks as blocks

ROOT = Path(__file__).resolve().parents[1]


def test_quick_tour_and_python_api_run_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    [tour] = blocks("console")
    outputs: dict[str, str] = {}
    for line in tour.splitlines():
        assert line.startswith("$ runstate "), line
        args = shlex.split(line[2:])
        out = subprocess.run([sys.executable, "-m", "runstate.cli", *args[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, f"{line}\n{out.stdout}\n{out.stderr}"
        outputs[line[2:]] = out.stdout
    history = outputs["runstate history run_128"]
    assert "invalid [fact.evidence_required]" in history and "coder-2.1" in history
    assert "[fact_13]" in outputs["runstate context run_128"]
    assert "projection equals replay" in outputs["runstate verify"]
    assert '"revision": 1' in outputs["runstate state run_128 --json --revision 1"]
    assert '"running" -> "completed"' in outputs["runstate explain run_128 tasks.task_3.status"]
    assert "run_started" in outputs["runstate checkpoints run_128"]
    assert "verdict: SAFE" in outputs["runstate resume run_128"]

    python_blocks = [b for b in blocks("python") if "RunProducer" in b]
    [api] = python_blocks
    # A projector must be running for submit() to get its decision, as the README implies.
    script = ("import threading\nfrom runstate import Projector, open_log\n"
              "stop = threading.Event()\nt = threading.Thread(target=Projector(open_log('.runstate/log.db'), "
              "'.runstate/state').run, kwargs={'stop': stop, 'poll_timeout_s': 0.02})\nt.start()\ntry:\n"
              + "".join(f"    {line}\n" for line in api.splitlines())
              + "    assert decision.outcome == 'accepted', decision\n    assert state.phase == 'fix'\n"
              "    assert data == state.model_dump(mode='json')\n"
              "finally:\n    stop.set()\n    t.join()\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
