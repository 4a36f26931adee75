"""Real `runstate serve` processes for the service tests (no in-process shortcuts)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """``runstate serve`` on a loopback port it binds itself (``--port 0``); ``url`` once it
    has announced it. A port picked here and passed on would be free only until another
    test's process took it first, and a test that found that process's /healthz would
    talk to a serve that is not its own."""

    def __init__(self, env: dict[str, str], workdir: Path, *args: str, prelude: str = "") -> None:
        """``prelude``: Python run in the serve's process before the CLI (a fault to inject)."""
        self._url: str | None = None
        self.stderr_path = workdir / f"serve-{uuid.uuid4().hex[:8]}.log"
        self._err = open(self.stderr_path, "wb")
        port = () if "--port" in args else ("--port", "0")
        cli = ["-c", f"{prelude}\nfrom runstate.cli import main\nmain()"] if prelude else ["-m", "runstate.cli"]
        self.proc = subprocess.Popen(
            [sys.executable, *cli, "serve", *port, *args],
            env={**os.environ, **env},
            cwd=workdir,
            stdout=self._err,
            stderr=self._err,
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, as the serve announced it (waited for, 60 s at most)."""
        if self._url is None:
            deadline = time.monotonic() + 60
            while self._url is None:
                for line in self.stderr_path.read_text(errors="replace").splitlines():
                    if line.startswith("runstate serve: http"):
                        self._url = line.split()[2]
                        break
                else:
                    if self.proc.poll() is not None:
                        raise AssertionError(f"serve exited {self.proc.returncode}: {self.log()}")
                    if time.monotonic() > deadline:
                        raise AssertionError(f"serve announced no address in 60 s: {self.log()}")
                    time.sleep(0.05)
        return self._url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

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


@contextmanager
def serving(env: dict[str, str], workdir: Path, *args: str) -> Iterator[ServeProcess]:
    """A :class:`ServeProcess` that answers /healthz for the block and is stopped after it;
    after a block that passed, the serve must also have exited 0 (else its log is the
    failure). A block that failed keeps its own error."""
    proc = ServeProcess(env, workdir, *args)
    try:
        proc.wait_ready()
        yield proc
    except BaseException:
        proc.stop()
        raise
    code = proc.stop()
    assert code == 0, proc.log()


def mcp_session(url: str, token: str | None, calls: Any) -> Any:
    """Run ``calls(session)`` in one MCP client session and return what it returns."""
    from mcp import ClientSession
    import httpx2  # the MCP SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> Any:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url + "/mcp", http_client=http) as (read, write),
        ):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                return await calls(session, init)

    return asyncio.run(main())


def mcp_error(res: Any) -> dict[str, Any]:
    """The body of a tool's error answer: runstate's own code and message, nothing else."""
    assert res.is_error, res
    text = res.content[0].text
    body = json.loads(text)
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), text
    return body["error"]  # type: ignore[no-any-return]


_AWAIT_RESTORED = """
import asyncio, sys
from runstate.service.node import Node
from runstate.settings import Settings

async def main(run_id: str, patch_id: str, wait_s: float) -> None:
    node = Node(Settings(), "http://127.0.0.1:1")
    waiting = node.hub.expect(run_id, patch_id)  # as a request that appended it does
    node.start(asyncio.get_running_loop())
    try:
        d = await asyncio.wait_for(waiting, wait_s)
        print("answered:", d.outcome, d.patch_id)
    except TimeoutError:
        print(f"not answered in {wait_s:g} s")
    finally:
        await asyncio.to_thread(node.stop)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def await_on_start(env: dict[str, str], run_id: str, patch_id: str, wait_s: float) -> subprocess.CompletedProcess[str]:
    """A ``Node`` in a fresh process, on the settings of ``env``, that waits for the
    decision of ``patch_id`` as a request that appended it does, registered before the
    node starts (and restores its partitions): its last line is ``answered: <outcome>
    <patch id>`` or ``not answered in <wait_s> s``."""
    return subprocess.run(
        [sys.executable, "-c", _AWAIT_RESTORED, run_id, patch_id, str(wait_s)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=wait_s + 140,
    )
