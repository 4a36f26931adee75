"""A small client of ``runstate serve`` (sync :class:`Client` on the standard library's
``http.client``, asyncio :class:`AsyncClient` on aiohttp) with the verbs of
:class:`RunProducer` and :class:`Projection`, so a worker moves from local to remote by
changing a URL::

    with Client("http://127.0.0.1:8750", token=...) as rs:
        d = rs.submit("run_1", {"expected_revision": 0, "events": [...]})
        state = rs.state("run_1", min_revision=d.revision)

Errors are runstate's own: :class:`ContractError` (422 with ``field``, and 413: the patch
is too large), :class:`RunNotFound` (404), :class:`RunErased` (410), :class:`DecisionTimeout`,
:class:`ServiceError` (401/403 and the rest). A 503 (the owner of the run's partition is
moving) is retried, honouring ``Retry-After``, for up to ``retry_s`` seconds.
"""

from __future__ import annotations

import asyncio
import http.client
import random
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

import aiohttp
import httpx
import orjson
import yarl
from pydantic import TypeAdapter

from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import (
    ContractError,
    DecisionTimeout,
    FieldNeverSet,
    PatchTooLarge,
    RunErased,
    RunNotFound,
    RunstateError,
)
from runstate.schemas.patch import Decision, PatchDraft
from runstate.schemas.state import RunState, RunSummary

__all__ = ["AsyncClient", "Client", "ServiceError", "ServiceUnreachable", "Submitted"]

_DECISIONS = TypeAdapter(list[Decision])
_SUMMARIES = TypeAdapter(list[RunSummary])


class ServiceUnreachable(RunstateError):
    """No answer from the service at all (nothing listening, a reset, a timeout) for the
    client's whole retry window; names the URL."""

    def __init__(self, url: str, error: httpx.TransportError, retry_s: float) -> None:
        super().__init__(
            f"cannot reach runstate serve at {url}: {type(error).__name__}: {error or 'no answer'} "
            f"(tried for {retry_s:g} s; is it running, and is the URL right?)"
        )
        self.url = url


class ServiceError(RunstateError):
    """The service refused or failed a request; ``status`` and ``code`` say how."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Submitted:
    """Where a patch went: its id, and its decision when it was decided in time."""

    __slots__ = ("decision", "offset", "partition", "patch_id", "run_id")

    def __init__(self, body: dict[str, Any]) -> None:
        self.patch_id: str = body["patch_id"]
        self.run_id: str = body["run_id"]
        self.partition: int = body["partition"]
        self.offset: int = body["offset"]
        self.decision: Decision | None = Decision.model_validate(body["decision"]) if body.get("decision") else None


#: Answers sent again after ``Retry-After`` within the client's ``retry_s``: 503 (the run's
#: owner is moving or restoring) and 429 (the instance shed the request under load; a
#: patch resent with its patch id is decided once).
RETRIED = (429, 503)


def path_segment(value: str) -> str:
    """An id as one path segment: every reserved character escaped, so that a ``/``, ``?``
    or ``#`` in a thread id is part of it, and ``.``/``..`` escaped too (never dot segments,
    which clients and proxies resolve to another path). The server routes on the raw path."""
    q = quote(value, safe="")
    return q.replace(".", "%2E") if q in (".", "..") else q


def _draft(draft: PatchDraft | dict[str, Any]) -> bytes:
    data = draft.model_dump(mode="json", exclude_none=True) if isinstance(draft, PatchDraft) else dict(draft)
    # The idempotency key and the patch time are fixed here, so that a retry after a lost
    # answer is the same patch (a patch id resent with other content is patch_id_reused).
    data.setdefault("patch_id", secrets.token_hex(16))
    data.setdefault("created_at", datetime.now(UTC).isoformat())
    return orjson.dumps(data)


def _raise(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        err = orjson.loads(resp.content).get("error", {})
    except (orjson.JSONDecodeError, AttributeError):
        err = {}
    code, message = str(err.get("code", "error")), str(err.get("message", resp.text[:200]))
    # The run id of the request, decoded from its path segment (/runs/{id}/…).
    parts = resp.request.url.raw_path.decode("ascii").split("?")[0].split("/")
    run_id = unquote(parts[2]) if len(parts) > 2 else "?"
    if resp.status_code == 413 and code == "patch_too_large":
        raise PatchTooLarge(run_id, int(err.get("size") or 0), int(err.get("limit") or 0), message=message)
    if resp.status_code in (413, 422):
        raise ContractError(message, field=err.get("field"))
    if resp.status_code == 404 and code == "never_set":
        raise FieldNeverSet(run_id, resp.request.url.params.get("path", "?"))
    if resp.status_code == 404 and code == "not_found":
        raise RunNotFound(run_id)
    if resp.status_code == 410 and code == "erased":
        raise RunErased(run_id, err.get("erasure"))
    retry = resp.headers.get("retry-after")
    raise ServiceError(resp.status_code, code, message, float(retry) if retry and retry.isdigit() else None)


#: How long a routing client (``route=True``) trusts the map of partition owners it read,
#: and how long it sends everything to its URL after an owner did not answer.
OWNERS_TTL_S = 10.0


#: What a request's policy asks its client to do: ("owners", path), ("send", path or URL),
#: ("sleep", seconds).
_Step = tuple[str, str | float]


class _Base:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 70.0,
        retry_s: float = 10.0,
        route: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.retry_s = retry_s
        self.route = route
        self._owners: dict[int, str] = {}
        self._partitions = 0
        self._owners_until = 0.0
        self._connect(timeout_s)

    def _connect(self, timeout_s: float) -> None:
        """Make the client's HTTP side (each request and each read bounded by ``timeout_s``)."""
        raise NotImplementedError

    def _url(self, target: str, params: dict[str, Any] | None) -> str:
        """Where a request goes: ``target`` (a path under :attr:`url`, or an owner's URL)
        with ``params`` as its query."""
        url = target if target.startswith(("http://", "https://")) else self.url + target
        return f"{url}?{_query(params)}" if params else url

    def _owners_due(self) -> bool:
        return self.route and time.monotonic() >= self._owners_until

    def _learn(self, resp: httpx.Response | None) -> None:
        """Take ``GET /partitions``' answer as the map of owners until it is due again; an
        answer that is not one (an older serve, a rebalance, no answer): no map meanwhile,
        every request to :attr:`url`."""
        self._owners_until = time.monotonic() + OWNERS_TTL_S
        self._owners, self._partitions = {}, 0
        if resp is None or resp.status_code != 200:
            return
        try:
            body = resp.json()
            self._partitions = int(body["partitions"])
            self._owners = {int(p): str(u).rstrip("/") for p, u in body["owners"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            self._owners, self._partitions = {}, 0

    def _target(self, path: str) -> str | None:
        """The owner's URL for a request about one run (``/runs/<id>...``) when the map
        names another instance than :attr:`url`; else None (send it to :attr:`url`)."""
        if not self._owners or self._partitions < 1 or not path.startswith("/runs/"):
            return None
        owner = self._owners.get(partition_for(unquote(path.split("/", 3)[2]), self._partitions))
        return None if owner is None or owner == self.url else owner + path

    def _missed(self) -> None:
        """An owner did not answer, or answered 503 (its partition moving): every request
        to :attr:`url`, which forwards, until the map is read again."""
        self._owners, self._owners_until = {}, time.monotonic() + OWNERS_TTL_S

    @staticmethod
    def _pause(resp: httpx.Response, tries: int) -> float:
        """How long to wait before sending again a request answered ``resp`` (429 or 503)
        for the ``tries``-th time: ``Retry-After-Ms`` doubled at each try, up to
        ``Retry-After`` (1 s at most), else ``Retry-After``; jittered, so that the clients an
        overloaded instance shed do not come back at once."""
        retry = resp.headers.get("retry-after")
        base = min(1.0, float(retry)) if retry and retry.isdigit() else 0.2
        sooner = resp.headers.get("retry-after-ms")
        if sooner and sooner.isdigit():
            base = min(base, int(sooner) / 1000 * 2 ** min(tries, 10))
        return base * random.uniform(0.5, 1.0)

    def _exchange(self, path: str) -> Generator[_Step, httpx.Response | httpx.TransportError | None, httpx.Response]:
        """One request's policy, written once for both clients: it yields what to do (read
        the owners, send to a URL, sleep) and is sent the outcome (the response, the
        transport error, or None); it returns the answer, or raises runstate's error for it.
        Owners are tried first; :attr:`url` (which forwards) is retried on transport errors
        and :data:`RETRIED` statuses for :attr:`retry_s`."""
        deadline = time.monotonic() + self.retry_s
        tries = 0  # answers sent again so far
        while True:
            if self._owners_due():
                partitions = yield ("owners", "/partitions")
                self._learn(partitions if isinstance(partitions, httpx.Response) else None)
            target = self._target(path)
            resp = yield ("send", target or path)
            if isinstance(resp, httpx.TransportError):
                if target is not None:
                    self._missed()
                    continue
                if time.monotonic() >= deadline:
                    raise ServiceUnreachable(self.url, resp, self.retry_s) from resp
                yield ("sleep", 0.2)
                continue
            assert resp is not None
            if target is not None and resp.status_code == 503:
                self._missed()
                continue
            if resp.status_code not in RETRIED or time.monotonic() >= deadline:
                _raise(resp)
                return resp
            yield ("sleep", self._pause(resp, tries))
            tries += 1


class Client(_Base):
    """Synchronous client; thread-safe (share one between threads, as LangGraph's thread
    pool does). ``route``: send each run's requests to the instance that owns its
    partition (read from ``GET /partitions`` every :data:`OWNERS_TTL_S`), not through
    ``url``, which forwards them: on Kafka with several instances that saves a hop per
    request. The instances' advertised addresses must then be reachable from here.

    Sent with the standard library's ``http.client`` over kept-alive connections
    (:class:`_Connections`), not httpx's ``Client``: httpx and its HTTP parser cost about
    three times the CPU per request, and a LangGraph step through serve waits on two
    requests in turn (the performance page). Answers and transport errors are httpx's
    types, as :class:`AsyncClient`'s are, so that both share one policy
    (``_Base._exchange``)."""

    def _connect(self, timeout_s: float) -> None:
        self._connections = _Connections(timeout_s)

    def _send(
        self,
        method: str,
        target: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """The whole answer to one request (``target``: a path under :attr:`url`, or an
        owner's URL). Transport failures raise httpx's errors."""
        url = self._url(target, params)
        return self._connections.send(method, url, {**self.headers, **headers} if headers else self.headers, content)

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        steps = self._exchange(path)
        outcome: httpx.Response | httpx.TransportError | None = None
        try:
            while True:
                what, arg = steps.send(outcome)
                outcome = None
                if what == "sleep":
                    time.sleep(float(arg))
                    continue
                try:
                    outcome = self._send("GET", str(arg)) if what == "owners" else self._send(method, str(arg), **kw)
                except httpx.TransportError as e:
                    outcome = e
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # -- RunProducer's verbs -----------------------------------------------------------

    def append(self, run_id: str, draft: PatchDraft | dict[str, Any], *, wait_s: float | None = None) -> Submitted:
        """Append a patch (``wait_s``: and wait that long for its decision)."""
        params = {"wait": wait_s} if wait_s else {}
        return Submitted(
            self._request(
                "POST",
                f"/runs/{path_segment(run_id)}/patches",
                content=_draft(draft),
                params=params,
                headers={"content-type": "application/json"},
            ).json()
        )

    def erase(self, run_id: str, reason: str, *, wait_s: float = 10.0) -> dict[str, Any]:
        """Erase the run (``DELETE /runs/{id}``; the token must allow erasing): the erasure
        record that stands. Raises :class:`ServiceError` (404: unknown run; 409: the
        deployment seals no content)."""
        resp = self._request("DELETE", f"/runs/{path_segment(run_id)}", params={"reason": reason, "wait": wait_s})
        return dict(resp.json())

    def submit(self, run_id: str, draft: PatchDraft | dict[str, Any], timeout_s: float = 10.0) -> Decision:
        """Append and wait for the decision. Raises :class:`DecisionTimeout`."""
        sub = self.append(run_id, draft, wait_s=timeout_s)
        if sub.decision is None:
            raise DecisionTimeout(run_id, sub.patch_id, timeout_s)
        return sub.decision

    def wait(self, run_id: str, patch_id: str, timeout_s: float = 10.0) -> Decision:
        deadline = time.monotonic() + timeout_s
        while True:
            d = self.decision(run_id, patch_id)
            if d is not None:
                return d
            if time.monotonic() >= deadline:
                raise DecisionTimeout(run_id, patch_id, timeout_s)
            time.sleep(0.05)

    # -- Projection's verbs ------------------------------------------------------------

    def decision(self, run_id: str, patch_id: str) -> Decision | None:
        try:
            return Decision.model_validate_json(
                self._request("GET", f"/runs/{path_segment(run_id)}/decisions/{path_segment(patch_id)}").content
            )
        except ServiceError as e:
            if e.status == 404:
                return None
            raise

    def state(self, run_id: str, *, revision: int | None = None, min_revision: int | None = None) -> RunState:
        params = {k: v for k, v in {"revision": revision, "min_revision": min_revision}.items() if v is not None}
        return RunState.model_validate_json(
            self._request("GET", f"/runs/{path_segment(run_id)}", params=params).content
        )

    def context(self, run_id: str, *, min_revision: int | None = None, max_tokens: int | None = None) -> str:
        params = {k: v for k, v in {"min_revision": min_revision, "max_tokens": max_tokens}.items() if v is not None}
        return str(self._request("GET", f"/runs/{path_segment(run_id)}/context", params=params).json()["context"])

    def history(self, run_id: str) -> list[Decision]:
        return _DECISIONS.validate_json(self._request("GET", f"/runs/{path_segment(run_id)}/history").content)

    def runs(self, status: str | None = None) -> list[RunSummary]:
        return _SUMMARIES.validate_json(
            self._request("GET", "/runs", params={"status": status} if status else {}).content
        )

    def explain(self, run_id: str, path: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/runs/{path_segment(run_id)}/explain", params={"path": path}).json())

    def graph_checkpoints(
        self,
        run_id: str,
        *,
        ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The run's LangGraph checkpoints, newest first (``GET /runs/{id}/graph/checkpoints``)."""
        params = _graph_params(ns, checkpoint_id, before, limit)
        return list(self._request("GET", f"/runs/{path_segment(run_id)}/graph/checkpoints", params=params).json())

    def events(self, run_id: str, last_event_id: int | None = None) -> Iterator[Decision]:
        """The run's decisions as they happen (Server-Sent Events), after ``last_event_id``."""
        headers = {**self.headers, "accept": "text/event-stream"}
        if last_event_id is not None:
            headers["last-event-id"] = str(last_event_id)
        url = f"{self.url}/runs/{path_segment(run_id)}/events"
        conn = self._connections.open(url, timeout_s=None)  # a stream of its own, waiting as long as it lasts
        try:
            try:
                conn.request("GET", urlsplit(url).path, headers=headers)
                resp = conn.getresponse()
                if resp.status >= 400:
                    _raise(_answer(resp.status, resp.getheaders(), resp.read(), "GET", url))
            except (OSError, http.client.HTTPException) as e:
                raise _transport_error(e, "GET", url) from e
            events = _EventLines()
            while True:
                try:
                    raw = resp.readline()  # any length: http.client reads a line whole
                except (OSError, http.client.HTTPException) as e:
                    raise _transport_error(e, "GET", url) from e
                if not raw:
                    return
                if (decision := events.feed(raw.decode().rstrip("\r\n"))) is not None:
                    yield decision
        finally:
            conn.close()

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _graph_params(ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None) -> dict[str, Any]:
    given = {"ns": ns, "checkpoint_id": checkpoint_id, "before": before, "limit": limit}
    return {k: v for k, v in given.items() if v is not None}


def _transport_error(e: BaseException, method: str, url: str) -> httpx.TransportError:
    """The transport's failure (aiohttp's, or the standard library's) as httpx's, which the
    clients' shared policy retries."""
    request = httpx.Request(method, url)
    if isinstance(e, aiohttp.ClientConnectorError | ConnectionRefusedError | socket.gaierror):
        return httpx.ConnectError(str(e), request=request)
    if isinstance(e, aiohttp.ServerTimeoutError | asyncio.TimeoutError | TimeoutError):
        return httpx.ReadTimeout(str(e) or "timed out", request=request)
    return httpx.ReadError(str(e) or type(e).__name__, request=request)


def _answer(status: int, headers: Any, body: bytes, method: str, url: str) -> httpx.Response:
    """An answer as an ``httpx.Response`` (which decodes a compressed body); with its
    request only when it is an error, which :func:`_raise` reads the run id from."""
    answer = httpx.Response(status, headers=headers, content=body)
    if status >= 400:
        answer.request = httpx.Request(method, url)
    return answer


class _EventLines:
    """The lines of a stream of Server-Sent Events, as decisions: each event's ``data:``
    lines joined, one decision at the blank line that ends it."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> Decision | None:
        """Take one line (without its line break); the decision it completes, if any."""
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip())
        elif not line and self._data:
            text, self._data = "\n".join(self._data), []
            return Decision.model_validate_json(text)
        return None


#: What a kept-alive connection that the server has closed meanwhile fails with, before
#: any answer: sent again once, on a new connection (a resent patch is applied once).
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)


class _Connections:
    """Kept-alive HTTP/1.1 connections of the standard library, shared by the threads of
    one :class:`Client`: a request takes an idle connection to its origin (the service's,
    or an owner's) or opens one, and gives it back once its answer is read. Each request
    and each read is bounded by ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, str], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def open(self, url: str, timeout_s: float | None) -> http.client.HTTPConnection:
        """A new connection to ``url``'s origin (not pooled)."""
        parts = urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.netloc, timeout=timeout_s)

    def send(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> httpx.Response:
        parts = urlsplit(url)
        origin = (parts.scheme, parts.netloc)
        target = f"{parts.path}?{parts.query}" if parts.query else parts.path
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            reused = conn is not None
            if conn is None:
                conn = self.open(url, self.timeout_s)
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                content = resp.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and isinstance(e, _STALE):
                    continue
                raise _transport_error(e, method, url) from e
            if resp.will_close:
                conn.close()
            else:
                with self._lock:
                    if self._closed:
                        conn.close()
                    else:
                        self._idle.setdefault(origin, []).append(conn)
            return _answer(resp.status, resp.getheaders(), content, method, url)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


def _query(params: dict[str, Any]) -> str:
    """``params`` as a query string, each value as httpx writes it (the sync client's)."""
    return urlencode({k: ("true" if v is True else "false" if v is False else v) for k, v in params.items()})


class AsyncClient(_Base):
    """The same verbs for asyncio (``route``: as :class:`Client`'s), sent with aiohttp.

    Not httpx's ``AsyncClient``: with many requests in flight at once (a LangGraph app's
    threads) httpcore's pool checked every connection on every request, and httpx's own
    building of each request (its URL parsed and merged, cookies, hooks) cost more of a
    LangGraph client's CPU than aiohttp's sending it (the performance page). Answers and
    transport errors are httpx's types, so that both clients share one policy
    (``_Base._exchange``)."""

    def _connect(self, timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No limit of its own: the timeouts bound each request; a compressed body is
            # decoded by the httpx.Response made of it.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        return self._session

    async def _open(
        self,
        method: str,
        target: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[aiohttp.ClientResponse, str]:
        """Send a request (``target``: a path under :attr:`url`, or an owner's URL) and
        return the response, its body not read yet, and the URL it went to. Transport
        failures raise httpx's errors (a refused connection is ``httpx.ConnectError``)."""
        url = self._url(target, params)
        try:
            resp = await self._pool().request(
                method,
                # As written: aiohttp must not decode or normalize an id's escapes (x%2F..%2Fvictim
                # is one run, not a path to another).
                yarl.URL(url, encoded=True),
                headers={**self.headers, **headers} if headers else self.headers,
                data=content,
                timeout=timeout or self._timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise _transport_error(e, method, url) from e
        return resp, url

    async def _send(self, method: str, target: str, **kw: Any) -> httpx.Response:
        """The whole answer to one request, as an ``httpx.Response``."""
        resp, url = await self._open(method, target, **kw)
        try:
            body = await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise _transport_error(e, method, url) from e
        finally:
            resp.release()
        return _answer(resp.status, resp.raw_headers, body, method, url)

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        steps = self._exchange(path)
        outcome: httpx.Response | httpx.TransportError | None = None
        try:
            while True:
                what, arg = steps.send(outcome)
                outcome = None
                if what == "sleep":
                    await asyncio.sleep(float(arg))
                    continue
                try:
                    outcome = await (
                        self._send("GET", str(arg)) if what == "owners" else self._send(method, str(arg), **kw)
                    )
                except httpx.TransportError as e:
                    outcome = e
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def append(
        self, run_id: str, draft: PatchDraft | dict[str, Any], *, wait_s: float | None = None
    ) -> Submitted:
        params = {"wait": wait_s} if wait_s else {}
        resp = await self._request(
            "POST",
            f"/runs/{path_segment(run_id)}/patches",
            content=_draft(draft),
            params=params,
            headers={"content-type": "application/json"},
        )
        return Submitted(resp.json())

    async def erase(self, run_id: str, reason: str, *, wait_s: float = 10.0) -> dict[str, Any]:
        """As :meth:`Client.erase`."""
        resp = await self._request("DELETE", f"/runs/{path_segment(run_id)}", params={"reason": reason, "wait": wait_s})
        return dict(resp.json())

    async def submit(self, run_id: str, draft: PatchDraft | dict[str, Any], timeout_s: float = 10.0) -> Decision:
        sub = await self.append(run_id, draft, wait_s=timeout_s)
        if sub.decision is None:
            raise DecisionTimeout(run_id, sub.patch_id, timeout_s)
        return sub.decision

    async def decision(self, run_id: str, patch_id: str) -> Decision | None:
        try:
            resp = await self._request("GET", f"/runs/{path_segment(run_id)}/decisions/{path_segment(patch_id)}")
        except ServiceError as e:
            if e.status == 404:
                return None
            raise
        return Decision.model_validate_json(resp.content)

    async def state(self, run_id: str, *, revision: int | None = None, min_revision: int | None = None) -> RunState:
        params = {k: v for k, v in {"revision": revision, "min_revision": min_revision}.items() if v is not None}
        return RunState.model_validate_json(
            (await self._request("GET", f"/runs/{path_segment(run_id)}", params=params)).content
        )

    async def context(self, run_id: str, *, min_revision: int | None = None, max_tokens: int | None = None) -> str:
        params = {k: v for k, v in {"min_revision": min_revision, "max_tokens": max_tokens}.items() if v is not None}
        return str(
            (await self._request("GET", f"/runs/{path_segment(run_id)}/context", params=params)).json()["context"]
        )

    async def history(self, run_id: str) -> list[Decision]:
        return _DECISIONS.validate_json((await self._request("GET", f"/runs/{path_segment(run_id)}/history")).content)

    async def runs(self, status: str | None = None) -> list[RunSummary]:
        resp = await self._request("GET", "/runs", params={"status": status} if status else {})
        return _SUMMARIES.validate_json(resp.content)

    async def graph_checkpoints(
        self,
        run_id: str,
        *,
        ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """As :meth:`Client.graph_checkpoints`."""
        params = _graph_params(ns, checkpoint_id, before, limit)
        return list(
            (await self._request("GET", f"/runs/{path_segment(run_id)}/graph/checkpoints", params=params)).json()
        )

    async def events(self, run_id: str, last_event_id: int | None = None) -> AsyncIterator[Decision]:
        headers = {"last-event-id": str(last_event_id)} if last_event_id is not None else {}
        resp, url = await self._open(
            "GET", f"/runs/{path_segment(run_id)}/events", headers=headers, timeout=aiohttp.ClientTimeout(total=None)
        )
        try:
            if resp.status >= 400:
                body = await resp.read()
                _raise(_answer(resp.status, resp.raw_headers, body, "GET", url))
            events = _EventLines()
            pending = b""  # a line's start, until its end arrives (a line may be any length)
            try:
                async for chunk in resp.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for raw in lines:
                        if (decision := events.feed(raw.decode().rstrip("\r"))) is not None:
                            yield decision
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                raise _transport_error(e, "GET", url) from e
        finally:
            resp.release()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
