"""Run the Java reference programs in tests/java/ (single-file source programs, no build
step) with the interop jars (conftest's ``java_interop`` fixture)."""

from __future__ import annotations

import subprocess
from pathlib import Path

JAVA_DIR = Path(__file__).parent / "java"


def run_java(jars: Path, program: str, *args: str, stdin: str = "", timeout: float = 120) -> list[str]:
    """Run ``tests/java/<program>.java`` and return its stdout lines; a non-zero exit
    raises ``AssertionError`` with its stderr."""
    cmd = ["java", "-cp", f"{jars}/*", str(JAVA_DIR / f"{program}.java"), *args]
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{program} exited {out.returncode}:\n{out.stderr[-3000:]}"
    return out.stdout.splitlines()
