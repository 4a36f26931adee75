"""Admission control: a bounded amount of work in flight per instance, the excess shed at once.

A service that queues without bound turns a burst into minutes of latency for everyone and
memory that grows until something dies. Here a request for a run (``/runs…``, ``/mcp``)
takes a slot for as long as it is served; when ``limit`` slots are taken, or its caller
(its token, else its address) already holds ``per_caller`` of them, it is answered at once
with 429 and ``Retry-After``, and nothing of it is done. Clients send it again (a patch with
the same id: a resend is idempotent). Health, readiness, metrics and the audit pages' files
never wait for a slot, and neither does a request another instance forwarded (the instance
that admitted it holds its slot).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from runstate.service.errors import body

#: The paths whose requests take a slot.
ADMITTED_PREFIXES = ("/runs", "/mcp", "/deadletters")


class Admission:
    """The slots of one instance. Event-loop thread only (no lock needed)."""

    def __init__(self, limit: int, per_caller: int, registry: CollectorRegistry) -> None:
        self.limit = limit
        self.per_caller = per_caller
        self.in_flight = 0
        self._by_caller: defaultdict[str, int] = defaultdict(int)
        self.shed = Counter(
            "runstate_http_shed",
            "Requests answered 429 at once: every slot taken (limit) or the caller's share taken (caller)",
            ["reason"],
            registry=registry,
        )
        self.gauge = Gauge(
            "runstate_http_in_flight",
            "Requests for runs being served now (RUNSTATE_MAX_IN_FLIGHT bounds them)",
            registry=registry,
        )
        self.gauge.set_function(lambda: self.in_flight)

    def enter(self, caller: str) -> str | None:
        """Take a slot for ``caller``; None, or why not (``limit`` / ``caller``)."""
        if self.in_flight >= self.limit:
            return "limit"
        if self._by_caller[caller] >= self.per_caller:
            return "caller"
        self.in_flight += 1
        self._by_caller[caller] += 1
        return None

    def leave(self, caller: str) -> None:
        self.in_flight -= 1
        n = self._by_caller[caller] - 1
        if n:
            self._by_caller[caller] = n
        else:
            del self._by_caller[caller]


def caller_of(scope: Scope) -> str:
    """Who a request is for fairness: its bearer token (hashed, never kept), else its address."""
    for k, v in scope["headers"]:
        if k == b"authorization":
            return "t:" + hashlib.blake2b(v, digest_size=8).hexdigest()
    client = scope.get("client")
    return f"a:{client[0] if client else '?'}"


class Admit:
    """The ASGI face of :class:`Admission`. Plain ASGI, as CountRequests."""

    def __init__(self, app: ASGIApp, admission: Admission, forwarded_header: bytes) -> None:
        self.app = app
        self.admission = admission
        self.forwarded = forwarded_header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # An event stream is held open for as long as its reader wants: it is not work in
        # flight (thousands of them must not take every slot).
        if (
            scope["type"] != "http"
            or not scope["path"].startswith(ADMITTED_PREFIXES)
            or scope["path"].endswith("/events")
            or any(k == self.forwarded for k, _v in scope["headers"])
        ):
            await self.app(scope, receive, send)
            return
        caller = caller_of(scope)
        why = self.admission.enter(caller)
        if why is not None:
            self.admission.shed.labels(why).inc()
            await _overloaded(why, self.admission, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave(caller)


async def _overloaded(why: str, a: Admission, send: Send) -> None:
    import orjson

    what = (
        f"this instance is serving {a.limit} requests (RUNSTATE_MAX_IN_FLIGHT)"
        if why == "limit"
        else f"this caller already has {a.per_caller} requests in flight here"
    )
    content = orjson.dumps(
        body(
            "overloaded",
            f"{what}: nothing was done; send it again after Retry-After "
            "(a patch with the same patch_id is decided once)",
        )
    )
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", b"1"),
                (b"content-length", str(len(content)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})
