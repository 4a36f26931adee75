"""A request's headers must arrive within a deadline, however steadily they trickle.

uvicorn bounds an idle keep-alive connection but not one that sends its request line and
headers a byte at a time (or connects and sends nothing): such a client holds a connection,
and enough of them hold the server. This protocol arms a timer when a connection opens and
after each response, and disarms it when a request's headers are complete; when it fires
the connection is closed and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


T = TypeVar("T")


async def within(aw: Awaitable[T], timeout_s: float) -> T:
    """``await aw`` for at most ``timeout_s`` seconds, else :class:`TimeoutError` (``aw`` is
    cancelled, as with ``asyncio.wait_for``). On Python 3.11 ``wait_for`` wraps a coroutine
    in a task of its own, an extra task and loop turn for every body part and every waited
    decision of every request; a timeout scope needs neither."""
    async with asyncio.timeout(timeout_s):
        return await aw


def deadline_protocol(timeout_s: float, on_expired: Callable[[], None]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header deadline of ``timeout_s``."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                on_expired()
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
