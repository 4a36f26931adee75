"""The TypeScript client (clients/typescript) against a real ``runstate serve``: its own
tests with Node's test runner, and LangGraph.js's validation suite for checkpoint savers
(``@langchain/langgraph-checkpoint-validation``) against its ``RunstateSaver``. Node and npm
are needed (skipped without them, except under ``CI=true``, where that fails)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "clients" / "typescript"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("typescript")]


@pytest.fixture(scope="module")
def built() -> Path:
    """The package installed (``npm ci``, once per lockfile) and built (``tsc``)."""
    missing = [t for t in ("node", "npm") if shutil.which(t) is None]
    if missing:
        msg = f"the TypeScript client's tests need {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    stamp = TS / "node_modules" / ".runstate-lock"
    lock = (TS / "package-lock.json").read_text()
    if not stamp.exists() or stamp.read_text() != lock:
        # No dependency needs an install script; one that builds native code from source
        # fails on a machine without its prebuilt binary.
        out = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=TS,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        stamp.write_text(lock)
    out = subprocess.run(["npx", "tsc", "-p", "tsconfig.json"], cwd=TS, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return TS


def _node(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNSTATE_PYTHON": sys.executable, "NO_COLOR": "1"}
    env.pop("RUNSTATE_TEST_KAFKA", None)
    return subprocess.run(args, cwd=TS, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_generated_types_are_those_of_the_python_side(built: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(TS / "scripts" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_client_and_the_run_handle_against_a_real_serve(built: Path) -> None:
    out = _node(["node", "--test", "--test-timeout=60000", "test/client.test.mjs"], timeout=300)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert "# fail 0" in out.stdout and "# pass 7" in out.stdout, out.stdout[-3000:]


def test_langgraph_js_validation_suite_passes_through_a_serve(built: Path) -> None:
    out = _node(["npx", "vitest", "run", "test/validation.spec.mjs", "--globals", "--reporter=dot"], timeout=900)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert "718 passed (718)" in out.stdout, out.stdout[-3000:]
