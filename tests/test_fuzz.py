"""Coverage-guided fuzzing of the input edges (tests/fuzz_targets.py), bounded: each target
runs for seconds from its checked-in corpus (tests/data/fuzz/TARGET) in a process of its
own. Every input must be accepted, rejected with a typed error or dead-lettered; a crash or
a hang (libFuzzer's -timeout) fails the test and leaves the input beside the output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import THOROUGH

ROOT = Path(__file__).resolve().parent
TARGETS = ("record_decoder", "patch_parser", "checkpoint_reader", "http_body", "sealed_record")
#: Seconds per target: a smoke run locally, longer under CI.
SECONDS = 20 if THOROUGH else 4


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_never_crashes_or_hangs(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris") if not os.environ.get("CI") else None
    work = tmp_path / "corpus"
    shutil.copytree(ROOT / "data" / "fuzz" / target, work)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "fuzz_targets.py"),
            target,
            f"-max_total_time={SECONDS}",
            "-timeout=5",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/",
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        cwd=tmp_path,
    )
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert out.returncode == 0 and not found, (found, out.stderr[-4000:])
    assert "Done" in out.stderr, out.stderr[-2000:]
