"""Admission control: a bounded amount of work in flight per instance, the excess shed at once.

A service that queues without bound turns a burst into minutes of latency for everyone and
memory that grows until something dies. Here a request for a run (``/runs…``, ``/mcp``)
takes a slot for as long as it is served; when ``limit`` slots are taken, or its caller
(its token, else its address) already holds ``per_caller`` of them while other callers
want slots too, it is answered at once
with 429 and ``Retry-After``, and nothing of it is done. Clients send it again (a patch with
the same id: a resend is idempotent). Health, readiness, metrics and the audit pages' files
never wait for a slot, and neither does a request another instance forwarded (the instance
that admitted it holds its slot).

The bound follows the instance's own latency, as TCP's congestion window follows the
network's (Netflix's concurrency limits and Envoy's adaptive concurrency do it for
services): an admitted request waits behind about as many others as the bound lets in, so
when its patches' latency rises above a target the bound shrinks, and while it stays below
half of it the bound grows back towards its maximum. Many requests that the instance
answers in time keep the bound where it is; an open-loop flood brings it down early.
What is measured is the instance's own work: each patch appended here, from its append
to its answer (``Service.on_latency``). Not a read waiting for a revision (it holds its
slot as long as the revision takes to come), nor a request forwarded to an owner that is
slow to answer, nor how fast a client sends its body.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from runstate.service.errors import body

#: The paths whose requests take a slot.
ADMITTED_PREFIXES = ("/runs", "/mcp", "/deadletters")


#: Seconds of patches' latencies judged together.
WINDOW_S = 0.25
#: The bound never shrinks below this (nor above the maximum): a few slots keep an
#: instance deciding while it recovers.
MIN_LIMIT = 8
#: An instance that measured no patch for this long starts again from its maximum: the
#: load that shrank its bound is gone.
IDLE_S = 5.0
#: Seconds the other callers' shares bind after a caller's request found every slot taken.
CONTENDED_S = 3.0


class Admission:
    """The slots of one instance. Event-loop thread only (no lock needed).

    ``limit`` is the bound now, between :data:`MIN_LIMIT` and ``max_limit``, moved by
    :meth:`observe` to keep the 90th percentile of the patches' latency under ``target_s``
    (``0``: fixed at ``max_limit``). A caller holds at most three quarters of it where
    others want slots too (:meth:`enter`)."""

    def __init__(
        self,
        max_limit: int,
        registry: CollectorRegistry,
        *,
        target_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_limit = self.limit = max_limit
        self.min_limit = min(MIN_LIMIT, max_limit)
        self.target_s = target_s
        self.in_flight = 0
        self._by_caller: defaultdict[str, int] = defaultdict(int)
        self._clock = clock
        self._window: list[float] = []
        self._window_end = clock() + WINDOW_S
        self._cooling = False
        #: caller -> until when its refusal (every slot taken) makes the others' shares bind
        self._refused: dict[str, float] = {}
        self.shed = Counter(
            "runstate_http_shed",
            "Requests answered 429 at once: every slot taken (limit) or the caller's share taken (caller)",
            ["reason"],
            registry=registry,
        )
        self.gauge = Gauge(
            "runstate_http_in_flight",
            "Requests for runs being served now (at most runstate_http_in_flight_limit)",
            registry=registry,
        )
        self.gauge.set_function(lambda: self.in_flight)
        self.limit_gauge = Gauge(
            "runstate_http_in_flight_limit",
            "The bound on requests in flight now: RUNSTATE_MAX_IN_FLIGHT, lowered while the patches' "
            "latency is above RUNSTATE_ADMIT_TARGET_MS",
            registry=registry,
        )
        self.limit_gauge.set_function(lambda: self.limit)

    @property
    def retry_ms(self) -> int:
        """When a shed request may be sent again (ms): the latency the bound keeps, or a
        second for a fixed bound. Clients double it at each shed of the same request, up
        to ``Retry-After``."""
        return max(10, round(self.target_s * 1000)) if self.target_s else 1000

    @property
    def per_caller(self) -> int:
        return max(1, (self.limit * 3) // 4)

    def enter(self, caller: str) -> str | None:
        """Take a slot for ``caller``; None, or why not (``limit`` / ``caller``). A caller
        alone may take every slot; its share binds while another caller holds a slot, or
        for :data:`CONTENDED_S` after another caller's request found every slot taken, so
        that the slots its own requests free go to the others."""
        if self.in_flight >= self.limit:
            now = self._clock()
            if len(self._refused) > 1024:  # many callers refused: forget those long gone
                self._refused = {c: t for c, t in self._refused.items() if t > now}
            self._refused[caller] = now + CONTENDED_S
            return "limit"
        if self._by_caller.get(caller, 0) >= self.per_caller and (
            len(self._by_caller) > 1 or self._others_refused(caller)
        ):
            return "caller"
        self.in_flight += 1
        self._by_caller[caller] += 1
        return None

    def _others_refused(self, caller: str) -> bool:
        now = self._clock()
        return any(until > now for c, until in self._refused.items() if c != caller)

    def leave(self, caller: str) -> None:
        self.in_flight -= 1
        n = self._by_caller[caller] - 1
        if n:
            self._by_caller[caller] = n
        else:
            del self._by_caller[caller]

    def observe(self, latency_s: float) -> None:
        """A patch appended here took ``latency_s`` from its append to its answer; once a window
        has passed, the bound moves: a fifth down when the window's 90th percentile is above
        the target (and the next window is not judged: the requests admitted before the cut
        are still ending), one up when it is below half of it. Down fast and up slowly, as
        TCP's congestion window: a bound that came back as fast as it went swung between
        its floor and its maximum under a steady overload."""
        if not self.target_s:
            return
        now = self._clock()
        if now - self._window_end > IDLE_S:
            self.limit, self._window = self.max_limit, []
        self._window.append(latency_s)
        if now < self._window_end:
            return
        window, self._window, self._window_end = self._window, [], now + WINDOW_S
        if self._cooling:  # the requests admitted before the bound shrank are still ending
            self._cooling = False
            return
        window.sort()
        p90 = window[(len(window) * 9 - 1) // 10]  # nearest rank
        if p90 > self.target_s:
            self.limit = max(self.min_limit, (self.limit * 4) // 5)
            self._cooling = True
        elif p90 < self.target_s / 2:
            self.limit = min(self.max_limit, self.limit + 1)


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
        f"this instance is serving {a.limit} requests, its bound now (RUNSTATE_MAX_IN_FLIGHT, lowered while its "
        "patches' latency is above RUNSTATE_ADMIT_TARGET_MS)"
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
                # Sooner than a whole second, as OpenAI's and Azure's APIs say it: a slot
                # frees within about the latency the bound keeps, and a client that holds
                # many requests (LangGraph's threads) is not held a second for each shed one.
                (b"retry-after-ms", str(a.retry_ms).encode()),
                (b"content-length", str(len(content)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})
