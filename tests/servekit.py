"""Real `runstate serve` processes for the service tests (no in-process shortcuts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """``runstate serve`` on a free loopback port; ``url`` once it answers /healthz."""

    def __init__(self, env: dict[str, str], workdir: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = workdir / f"serve-{self.port}.log"
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", "serve", "--port", str(self.port), *args],
            env={**os.environ, **env},
            cwd=workdir,
            stdout=self._err,
            stderr=self._err,
        )

    def wait_ready(self, timeout_s: float = 60.0, owned: bool = True) -> dict[str, object]:
        """Until /healthz answers (and, with ``owned``, the instance owns partitions)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log()}")
            try:
                body = httpx.get(self.url + "/healthz", timeout=2).json()
                if not owned or body["owned_partitions"]:
                    return dict(body)
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve not ready in {timeout_s}s: {self.log()}")

    def log(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._err.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()
        return self.proc.returncode
