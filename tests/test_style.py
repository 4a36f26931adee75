"""The house's habits, checked: the whole tree is formatted by ruff's formatter and passes its
linter as ``pyproject.toml`` configures them (pycodestyle, pyflakes, no ``noqa`` marker that
silences nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe is not None, "ruff is in the test extra: pip install -e '.[test]'"
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_tree_is_formatted() -> None:
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout}{out.stderr}"


def test_the_tree_passes_the_linter() -> None:
    out = _ruff("check", "--output-format", "concise", ".")
    assert out.returncode == 0, out.stdout + out.stderr
