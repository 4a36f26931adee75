"""The layering contract (pyproject's [tool.importlinter]) holds, read from the imports by
import-linter; and the tool sees the layers (a reversed contract is broken)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def test_the_layering_contracts_are_kept() -> None:
    out = subprocess.run([LINT, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout


def test_the_tool_sees_every_layer_so_a_reversed_contract_breaks(tmp_path: Path) -> None:
    reversed_layers = tmp_path / "reversed.ini"
    reversed_layers.write_text(
        "[importlinter]\nroot_package = runstate\n\n[importlinter:contract:reversed]\n"
        "name = reversed\ntype = layers\nlayers =\n    runstate.schemas\n    runstate.eventlog\n"
        "    runstate.projector\n"
    )
    out = subprocess.run(
        [LINT, "--no-cache", "--config", str(reversed_layers)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and "BROKEN" in out.stdout, out.stdout[-3000:]
    assert "runstate.projector" in out.stdout and "Missing layer" not in out.stdout
