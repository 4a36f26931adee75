"""The HTTP API of ``runstate serve`` (FastAPI on uvicorn), and the MCP endpoint beside it.

FastAPI because its OpenAPI document is generated from the same pydantic models that are
the contract (``/openapi.json`` is what the schemathesis fuzz test and non-Python clients
read), and it is Starlette underneath, which gives Server-Sent Events and mounting the MCP
app without another framework.

Every error has one shape, ``{"error": {"code", "message", "field"}}``:
401/403 (token), 404 (no such run), 413 (patch too large), 422 (bad patch or parameter,
``field`` names it), 503 with ``Retry-After`` (the partition's owner is moving, restoring,
or not yet at ``min_revision``).
"""

from __future__ import annotations

import asyncio
import time
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from urllib.parse import parse_qsl, quote_from_bytes, unquote, urlencode
from typing import Annotated, Any

import msgspec
import orjson
import pydantic
from fastapi import APIRouter, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import AfterValidator, BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import runstate
from runstate.projector.store.document import unreadable
from runstate.projector.store.partition import RunOrder, activity_cursor
from runstate.schemas.errors import ContractError, PatchTooLarge, RunstateError
from runstate.schemas.patch import Decision, PatchDraft
from runstate.schemas.state import GraphCheckpointRead, RunState, RunStatus, RunSummary
from runstate.service.admission import Admission, Admit
from runstate.service.auth import AuthError, Identity, Tokens
from runstate.service.errors import answer, body
from runstate.service.deadline import within
from runstate.service.core import (
    DeadLetterOut,
    ErasedOut,
    FieldChangeOut,
    Forward,
    PartitionsOut,
    ResumeOut,
    Service,
    Submitted,
)
from runstate.service.node import Node
from runstate.service.routing import FORWARDED, HELLO_PATH, SIGNED, PeerGate, Router, body_digest
from runstate.snapshotter.checkpoint import Checkpoint


def _path_id(segment: str) -> str:
    """An id from its (still percent-encoded) path segment: the raw path is routed (RawPaths),
    so that a ``/`` in an id is never a separator. The same ids as the log takes: 1-200
    characters of UTF-8, no control characters."""
    try:
        value = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise ValueError("an id is UTF-8 text, percent-encoded in the path") from None
    if not 1 <= len(value) <= 200:
        raise ValueError(f"an id is 1-200 characters, got {len(value)}")
    if any(ord(c) < 0x20 for c in value):
        raise ValueError("an id has no control characters")
    return value


#: 200 characters of up to 4 UTF-8 bytes, each %XX, at most.
RUN_ID = Annotated[str, Path(min_length=1, max_length=2400), AfterValidator(_path_id)]
PATCH_ID = Annotated[str, Path(min_length=1, max_length=2400), AfterValidator(_path_id)]
#: The forwarding marker as it appears in the raw ASGI header list.
FORWARDED_B = FORWARDED.encode()
#: Longest ``wait`` a request may ask for (seconds).
MAX_WAIT_S = 60.0
#: How long a write waits for its decision (None: not at all).
WAIT = Annotated[float | None, Query(ge=0, le=MAX_WAIT_S)]


class _ClientGone(Exception):
    """The client disconnected before its request body was whole."""


class _BodyStalled(Exception):
    """The request body stopped arriving for longer than the body timeout, or did not
    arrive whole within the request timeout (``whole``)."""

    def __init__(self, after_s: float, setting: str, *, whole: bool = False) -> None:
        super().__init__(after_s)
        self.after_s, self.setting, self.whole = after_s, setting, whole


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: str
    owned_partitions: list[int]
    partitions: int
    restoring: dict[int, float]
    failed: str | None = None


class ContextOut(BaseModel):
    run_id: str
    context: str


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        401: "no or unknown token",
        403: "the token does not allow this",
        404: "no such run",
        409: "this deployment seals no content: erasure is unavailable (no master key)",
        410: "the run was erased (the body names who, when and why)",
        413: "patch too large",
        422: "invalid patch or parameter",
        503: "not available now (owner moving or restoring); see Retry-After",
    }
    return {c: {"model": ErrorBody, "description": what[c]} for c in codes}


def error_response(
    status: int, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body(code, message, field), status, headers=headers)


def translate(e: Exception) -> JSONResponse:
    """The response to ``e`` (:func:`runstate.service.errors.answer`); re-raises what is not runstate's."""
    got = answer(e)
    if got is None:
        raise e
    return JSONResponse(got.body, got.status, headers=got.headers)


class Metrics:
    """Prometheus metrics of one instance (its own registry: several apps per process in tests)."""

    def __init__(self, node: Node) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "runstate_decisions",
            "Decisions made by this instance's projector",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.lag = Gauge("runstate_lag_records", "Records behind the log end", ["partition"], registry=self.registry)
        self.snapshot_lag = Gauge(
            "runstate_snapshotter_lag_records",
            "Records the in-process snapshotter is behind the log end (a lag lengthens a restore's tail)",
            ["partition"],
            registry=self.registry,
        )
        self.rate = Gauge(
            "runstate_projector_events_per_second", "Events per second since the first batch", registry=self.registry
        )
        self.records = Gauge("runstate_projector_records", "Records processed since start", registry=self.registry)
        self.restore = Gauge(
            "runstate_restore_progress_ratio",
            "Checkpoint restore progress (0..1)",
            ["partition"],
            registry=self.registry,
        )
        self.requests = Counter("runstate_http_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.slow_clients = Counter(
            "runstate_http_slow_clients",
            "Connections cut off for sending their headers or "
            "body too slowly (RUNSTATE_REQUEST_TIMEOUT_S, RUNSTATE_BODY_TIMEOUT_S)",
            ["phase"],
            registry=self.registry,
        )
        self.retention_due = Gauge(
            "runstate_retention_due_runs",
            "Runs the retention policy found due at its last check (RUNSTATE_RETENTION)",
            ["partition"],
            registry=self.registry,
        )
        self.retention_erased = Gauge(
            "runstate_retention_erased_runs",
            "Runs erased by the retention policy since this instance started",
            registry=self.registry,
        )
        self.untrusted = Gauge(
            "runstate_untrusted",
            "Refused since start for want of the instance secret: "
            "decisions on the topic no projector signed, peers that did not prove it, "
            "requests marked forwarded that no instance signed",
            ["source"],
            registry=self.registry,
        )
        #: source -> its count (set by create_app: the router and the gate are made there)
        self.untrusted_sources: dict[str, Callable[[], int]] = {"decisions_topic": lambda: node.decisions_ignored}
        self.node = node
        node.hub.on_decision.append(self._count)

    def _count(self, d: Decision, local: bool) -> None:
        if local:
            self.decisions.labels(d.outcome, d.reason or "").inc()

    def render(self) -> bytes:
        node = self.node
        stats = node.projector.stats
        self.rate.set(stats.rate())
        self.records.set(stats.records)
        self.lag.clear()  # partitions this instance no longer owns disappear
        for p, lag in node.projector.lags().items():
            if lag is not None:
                self.lag.labels(str(p)).set(lag)
        self.snapshot_lag.clear()
        if node.snapshotter is not None:
            for p, lag in node.snapshotter.projector.lags().items():
                if lag is not None:
                    self.snapshot_lag.labels(str(p)).set(lag)
        if node.snapshotter is not None:
            writer = node.snapshotter.writer
            for p, n in list(writer.retention_due.items()):
                self.retention_due.labels(str(p)).set(n)
            self.retention_erased.set(writer.retention_erased)
        for p, r in list(node.health.restoring.items()):
            self.restore.labels(str(p)).set(r.done / r.total if r.total else 0.0)
        for source, count in self.untrusted_sources.items():
            self.untrusted.labels(source).set(count())
        return generate_latest(self.registry)


async def _runstate_error(_req: Request, e: RunstateError) -> JSONResponse:
    return translate(e)


async def _bad_request(_req: Request, e: RequestValidationError) -> JSONResponse:
    errs = e.errors()
    first = errs[0] if errs else {}
    return _invalid(".".join(str(x) for x in first.get("loc", ())[1:]) or None, first.get("msg", "invalid"))


def _invalid(field: str | None, message: str) -> JSONResponse:
    """A request parameter's validation error, named (``loc`` without its ``path``/``query``)."""
    return error_response(422, "invalid", f"{field or 'request'}: {message}", field)


async def _client_gone(_req: Request, _e: _ClientGone) -> Response:
    # The client closed the connection while sending its body: nobody reads an answer.
    return Response(status_code=400)


async def _body_stalled(_req: Request, e: _BodyStalled) -> JSONResponse:
    what = f"did not arrive whole within {e.after_s:g} s" if e.whole else f"stopped arriving for {e.after_s:g} s"
    return error_response(
        408,
        "request_timeout",
        f"the request body {what} ({e.setting}); nothing was appended",
        headers={"Connection": "close"},
    )


async def _http_error(_req: Request, e: StarletteHTTPException) -> JSONResponse:
    return error_response(e.status_code, "http_" + str(e.status_code), str(e.detail))


class Hello(BaseModel):
    """Another instance's challenge (routing.py)."""

    nonce: str = pydantic.Field(min_length=16, max_length=64)


@dataclasses.dataclass(frozen=True)
class AppContext:
    """What the routes of one app answer with (``request.app.state.runstate``)."""

    node: Node
    tokens: Tokens
    router: Router | None
    service: Service
    gate: PeerGate
    metrics: Metrics


def ctx(request: Request) -> AppContext:
    return request.app.state.runstate  # type: ignore[no-any-return]


def _ident(request: Request) -> Identity:
    # A forwarded request's caller, as the instance that verified its token saw it
    # (PeerCheck verified that instance's signature first).
    peer = request.scope.get(PEER_SCOPE_KEY)
    if peer is not None:
        return peer  # type: ignore[no-any-return]
    return ctx(request).tokens.identify(request.headers.get("authorization"))


#: Never the client's token: a forward carries the caller's identity, signed.
_KEEP = (b"last-event-id", b"content-type")


def _fwd(request: Request, body: bytes | None = None, who: Identity | None = None) -> Forward:
    # From the raw ASGI scope (as Starlette's URL and QueryParams read it, without building
    # them): built for every request, forwarded for few. ``who``: the caller, when known.
    scope = request.scope
    raw = scope["headers"]
    return Forward(
        scope["method"],
        scope["path"].replace("?", "%3F").replace("#", "%23").replace("\\", "%5C"),
        tuple(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)),
        tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k in _KEEP),
        body,
        forwarded=any(k == FORWARDED_B for k, _v in raw),
        who=_ident(request) if who is None else who,
    )


async def _read_body(request: Request, run_id: str) -> bytes:
    settings, metrics = ctx(request).node.settings, ctx(request).metrics
    limit = 2 * settings.max_patch_bytes  # JSON text is larger than its Avro encoding
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PatchTooLarge(run_id, int(declared), limit, as_json=True)
    chunks, size = [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.request_timeout_s
    # One timeout scope for the whole body, moved on at each part: a scope for each step of
    # Starlette's stream (the body, its end, the stop) cost more than parsing a small patch.
    try:
        async with asyncio.timeout(min(loop.time() + settings.body_timeout_s, deadline)) as scope:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise PatchTooLarge(run_id, size, limit, as_json=True)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
                scope.reschedule(min(loop.time() + settings.body_timeout_s, deadline))
    except TimeoutError:
        metrics.slow_clients.labels("body").inc()
        if scope.when() == deadline:
            raise _BodyStalled(settings.request_timeout_s, "RUNSTATE_REQUEST_TIMEOUT_S", whole=True) from None
        raise _BodyStalled(settings.body_timeout_s, "RUNSTATE_BODY_TIMEOUT_S") from None
    return b"".join(chunks)


def _json_out(model: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if isinstance(model, BaseModel):
        content = model.model_dump_json().encode()
    else:
        # pydantic's JSON writer in one call: the same bytes as dumping to Python data and
        # orjson, in about half the time.
        content = pydantic.TypeAdapter(type(model)).dump_json(model)
    return Response(content, status, headers=headers, media_type="application/json")


def _health(node: Node) -> Health:
    h = node.health
    restoring = {p: (r.done / r.total if r.total else 0.0) for p, r in h.restoring.items()}
    owned = node.owned()
    status = "failed" if h.failed else ("restoring" if restoring else ("serving" if owned else "starting"))
    return Health(
        status=status, owned_partitions=owned, partitions=node.partitions, restoring=restoring, failed=h.failed
    )


_PATCH_SCHEMA = PatchDraft.model_json_schema(ref_template="#/components/schemas/{model}")
_PATCH_DEFS = _PATCH_SCHEMA.pop("$defs", {})

#: Every route of the service, named at module level (``create_app`` includes them).
routes = APIRouter()


@routes.post(
    "/runs/{run_id}/patches",
    response_model=Submitted,
    status_code=200,
    responses={
        202: {"model": Submitted, "description": "appended, not decided within `wait`"},
        **_errors(401, 403, 410, 413, 422, 503),
    },
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _PATCH_SCHEMA}}}},
)
async def post_patch(request: Request, run_id: RUN_ID, wait: WAIT = None) -> Response:
    """Append a patch (the CLI's patch JSON). The author is the token's identity. With
    ``wait``: 200 with the decision (accepted or rejected); 202 ``pending`` with the patch id
    when not decided within it, or sent without one."""
    who = _ident(request)
    body = await _read_body(request, run_id)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ContractError(f"not JSON: {e}") from e
    # orjson refuses a lone surrogate (a string UTF-8 cannot encode) with where it is: the
    # data it returns needs no walk for one, as a patch file read by the CLI does.
    out = await ctx(request).service.submit(who, run_id, data, wait, _fwd(request, body, who))
    return _json_out(out, 200 if out.status == "decided" else 202)


@routes.delete("/runs/{run_id}", response_model=ErasedOut, responses=_errors(401, 403, 404, 410, 409, 503))
async def delete_run(
    request: Request,
    run_id: RUN_ID,
    reason: Annotated[str, Query(min_length=1, max_length=2000)],
    wait: WAIT = None,
) -> Response:
    """Erase the run (a token allowed to erase: ``runstate token add --erase``): its keys
    are destroyed and its content leaves every store; what remains is who, when and
    ``reason``. Erasing it again answers the first record (``first`` false). 409 when
    this deployment seals no content (no master key)."""
    return _json_out(await ctx(request).service.erase(_ident(request), run_id, reason, wait))


@routes.get("/runs/{run_id}/decisions/{patch_id}", response_model=Decision, responses=_errors(401, 403, 404, 410, 503))
async def get_decision(request: Request, run_id: RUN_ID, patch_id: PATCH_ID) -> Response:
    """The decision on one patch; 404 while there is none."""
    _ident(request).may_read(run_id)
    return _json_out(await ctx(request).service.decision(run_id, patch_id, _fwd(request)))


@routes.get(
    "/runs/{run_id}",
    response_model=RunState,
    responses={304: {"description": "not modified"}, **_errors(401, 403, 404, 410, 422, 503)},
)
async def get_state(
    request: Request,
    run_id: RUN_ID,
    revision: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    min_revision: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 5.0,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The run's state. ``revision``: as it was then. ``min_revision``: wait (up to
    ``wait`` s) until the projection has reached it, else 503. ``ETag`` is the revision."""
    _ident(request).may_read(run_id)
    # The document as the store joins it, sent as it is: the bytes RunState.model_dump_json
    # gives (byte for byte in the tests), neither parsed nor dumped again here.
    doc = await ctx(request).service.state_json(
        run_id, _fwd(request), revision=revision, min_revision=min_revision, wait_s=wait
    )
    etag = _etag_of(doc, run_id)
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(doc, 200, headers={"ETag": etag}, media_type="application/json")


@routes.get("/runs/{run_id}/context", response_model=ContextOut, responses=_errors(401, 403, 404, 410, 503))
async def get_context(
    request: Request,
    run_id: RUN_ID,
    min_revision: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    max_tokens: Annotated[int | None, Query(ge=50, le=1_000_000)] = None,
) -> Response:
    """The compact context for a prompt. ``max_tokens`` bounds it (characters / 4): the goal,
    the active task and what blocks the run first, then open questions, recent facts,
    hypotheses, pending tasks, observations; what was left out is counted in the text."""
    _ident(request).may_read(run_id)
    text = await ctx(request).service.context(run_id, _fwd(request), min_revision, max_tokens)
    return _json_out(ContextOut(run_id=run_id, context=text))


@routes.get("/runs/{run_id}/history", response_model=list[Decision], responses=_errors(401, 403, 404, 410, 503))
async def get_history(
    request: Request,
    run_id: RUN_ID,
    start: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> Response:
    """Every decision on the run's patches in log order (``start``, ``limit``: one page of
    them; ``X-Total-Count`` says how many there are)."""
    _ident(request).may_read(run_id)
    # The owner is asked for the whole history (forwarded without the page): it is cut here.
    history = await ctx(request).service.history(run_id, dataclasses.replace(_fwd(request), params=()))
    page = history[start : None if limit is None else start + limit]
    return _json_out(page, headers={"X-Total-Count": str(len(history))})


@routes.get(
    "/runs/{run_id}/explain", response_model=list[FieldChangeOut], responses=_errors(401, 403, 404, 410, 422, 503)
)
async def get_explain(
    request: Request, run_id: RUN_ID, path: Annotated[str, Query(min_length=1, max_length=512)]
) -> Response:
    """Every accepted patch that changed ``path`` (e.g. ``facts.fact_1.statement``)."""
    _ident(request).may_read(run_id)
    return _json_out(await ctx(request).service.explain(run_id, path, _fwd(request)))


@routes.get("/runs/{run_id}/checkpoints", response_model=list[Checkpoint], responses=_errors(401, 403, 404, 410, 503))
async def get_checkpoints(request: Request, run_id: RUN_ID) -> Response:
    _ident(request).may_read(run_id)
    return _json_out(await ctx(request).service.checkpoints(run_id, _fwd(request)))


@routes.get("/runs/{run_id}/resume", response_model=ResumeOut, responses=_errors(401, 403, 404, 410, 503))
async def get_resume(request: Request, run_id: RUN_ID) -> Response:
    """The latest checkpoint's verdict and the patches after it, read from the log."""
    _ident(request).may_read(run_id)
    return _json_out(await ctx(request).service.resume(run_id, _fwd(request)))


@routes.get(
    "/runs/{run_id}/graph/checkpoints",
    response_model=list[GraphCheckpointRead],
    responses=_errors(401, 403, 422, 503),
)
async def get_graph_checkpoints(
    request: Request,
    run_id: RUN_ID,
    ns: Annotated[str | None, Query(max_length=2000)] = None,
    checkpoint_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    before: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    limit: Annotated[int | None, Query(ge=1, le=2**31)] = None,
) -> Response:
    """The run's LangGraph checkpoints (runstate as LangGraph's checkpointer), newest
    first: of namespace ``ns`` (absent: every namespace), only ``checkpoint_id``, only
    those older than ``before``, at most ``limit``. An unknown run has none."""
    _ident(request).may_read(run_id)
    doc = await ctx(request).service.graph_checkpoints(
        run_id, _fwd(request), ns=ns, checkpoint_id=checkpoint_id, before=before, limit=limit
    )
    return Response(doc, 200, media_type="application/json")


@routes.get("/runs", response_model=list[RunSummary], responses=_errors(401, 422, 503))
async def get_runs(
    request: Request,
    status: RunStatus | None = None,
    q: Annotated[str | None, Query(max_length=256)] = None,
    order: RunOrder = "id",
    after: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> Response:
    """Every run (every partition, asked of their owners): its summary, the header without
    the projector's bookkeeping. ``order``: by run id (``id``), or the run whose last
    accepted patch is newest first (``recent``). ``q``: only ids containing it;
    ``limit``: one page (``X-Total-Count``: how many match), and where more follow,
    ``X-Next-After`` is the ``after`` of the next page (by id: the last run id; by
    ``recent``: a cursor, ``<microseconds>.<run id>``)."""
    who = _ident(request)
    if who.runs is not None or q:

        def keep(run_id: str) -> bool:
            return (not q or q in run_id) and (who.runs is None or _may(who, run_id))
    else:
        keep = None  # type: ignore[assignment]
    # Every owner counts and cuts its partitions with the same filters (the forwarded
    # request carries them, and the token); this instance merges the pages.
    # One more than the page: whether a next page exists, so the last one offers none.
    total, headers = await ctx(request).service.runs(
        status, keep, after, None if limit is None else limit + 1, _fwd(request), order
    )
    out = {"X-Total-Count": str(total)}
    if limit is not None and len(headers) > limit:
        headers = headers[:limit]
        last_id, last = headers[-1]
        out["X-Next-After"] = activity_cursor(last_id, last) if order == "recent" else last_id
    return Response(b"[" + b",".join([doc for _, doc in headers]) + b"]", media_type="application/json", headers=out)


@routes.get("/deadletters", response_model=list[DeadLetterOut], responses=_errors(401, 503))
async def get_dead_letters(request: Request) -> Response:
    """Records of the log that could not be decided (not decodable, not a patch), with
    the reason, from every partition. A token limited to some runs sees those of its runs."""
    who = _ident(request)
    letters = await ctx(request).service.dead_letters(_fwd(request))
    if who.runs is not None:
        letters = [d for d in letters if d.key is not None and _may(who, d.key)]
    return _json_out(letters)


@routes.get(
    "/runs/{run_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "decisions as Server-Sent Events"},
        **_errors(401, 403, 404, 503),
    },
)
async def get_events(
    request: Request, run_id: RUN_ID, last_event_id: Annotated[str | None, Header(max_length=32)] = None
) -> StreamingResponse:
    """Every decision of the run as it happens (``event: decision``, ``id`` = its log
    offset); resumable with ``Last-Event-ID`` (the missed ones are read from history)."""
    _ident(request).may_read(run_id)
    after = int(last_event_id) if last_event_id is not None and last_event_id.isdigit() else None
    q = ctx(request).node.hub.subscribe(run_id)  # before reading history: nothing falls between
    try:
        # A run nothing was decided on is 404, as on every other route (RunNotFound).
        history = await ctx(request).service.history(run_id, _fwd(request))
        missed: list[Decision] = [] if after is None else [d for d in history if d.offset > after]
    except BaseException:
        ctx(request).node.hub.unsubscribe(run_id, q)
        raise

    async def stream() -> AsyncIterator[bytes]:
        last = after if after is not None else -1
        try:
            yield b": runstate decisions of " + run_id.encode() + b"\n\n"
            for d in missed:
                last = d.offset
                yield _sse(d)
            while True:
                try:
                    d = await within(q.get(), 15.0)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if d.offset > last:  # the decisions topic may repeat one
                    last = d.offset
                    yield _sse(d)
        finally:
            ctx(request).node.hub.unsubscribe(run_id, q)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


@routes.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "not healthy"}})
async def healthz(request: Request) -> Response:
    """Liveness: 200 while the projector runs (starting, restoring or serving); 503 once
    it failed (restart the process)."""
    body = _health(ctx(request).node)
    return _json_out(body, 503 if body.failed else 200)


@routes.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "not ready"}})
async def readyz(request: Request) -> Response:
    """Readiness: 200 once this instance answers for the runs of its partitions — on the
    embedded log every partition is assigned and restored; on Kafka it owns some and
    restores none (one that owns none forwards only: not ready, the others are)."""
    body = _health(ctx(request).node)
    every = ctx(request).router is None
    ready = body.status == "serving" and (len(body.owned_partitions) == body.partitions or not every)
    return _json_out(body, 200 if ready else 503)


@routes.get("/partitions", response_model=PartitionsOut, responses=_errors(401, 503))
async def get_partitions(request: Request) -> Response:
    """Which instance owns each partition (any valid token): ``runstate.client``'s
    ``route=True`` sends each run's requests to its owner with it, instead of through an
    instance that forwards them. 503 while the group rebalances."""
    _ident(request)
    return _json_out(await ctx(request).service.partitions())


@routes.get("/metrics", response_class=PlainTextResponse, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def get_metrics(request: Request) -> Response:
    """Prometheus text: lag per partition, decisions by outcome and reason, projector
    rate, restore progress. Where serve needs tokens, any valid token reads it, unless
    ``RUNSTATE_METRICS_PUBLIC`` is set."""
    if not ctx(request).node.settings.metrics_public:
        _ident(request)
    return Response(await asyncio.to_thread(ctx(request).metrics.render), media_type=CONTENT_TYPE_LATEST)


@routes.post(HELLO_PATH, include_in_schema=False)
async def peer_hello(request: Request, hello: Hello) -> dict[str, str]:
    """Another instance's challenge: the proof that this instance, at its advertised
    address, holds the instance secret (routing.py)."""
    return {"proof": ctx(request).gate.hello(hello.nonce)}


def create_app(node: Node, tokens: Tokens, router: Router | None = None, *, mcp: bool = True) -> FastAPI:
    """The ASGI app over a started-or-not ``node`` (the lifespan starts and stops it): the
    module's :data:`routes`, its error handlers, the audit pages, MCP and the middleware."""
    service = Service(node, router)
    gate = PeerGate(node.settings.instance_keys(), node.advertise)
    metrics = Metrics(node)
    metrics.untrusted_sources["forwarded_requests"] = lambda: gate.refused
    if router is not None:
        metrics.untrusted_sources["peers"] = lambda: router.refused
    mcp_server = None
    if mcp:
        from runstate.service.mcp import build_mcp

        mcp_server = build_mcp(service, tokens)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        node.start(asyncio.get_running_loop())
        try:
            if mcp_server is not None:
                async with mcp_server.session_manager.run():
                    yield
            else:
                yield
        finally:
            await asyncio.to_thread(node.stop)
            if router is not None:
                await router.close()

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, blank on a machine
    # without internet. /openapi.json is the API's description.
    api = FastAPI(
        title="runstate",
        version=runstate.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Where is this run now? Typed, durable Run State for AI agents.",
    )
    api.state.runstate = AppContext(node, tokens, router, service, gate, metrics)
    api.add_exception_handler(RunstateError, _runstate_error)  # type: ignore[arg-type]
    api.add_exception_handler(RequestValidationError, _bad_request)  # type: ignore[arg-type]
    api.add_exception_handler(_ClientGone, _client_gone)  # type: ignore[arg-type]
    api.add_exception_handler(_BodyStalled, _body_stalled)  # type: ignore[arg-type]
    api.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    api.include_router(routes)

    from runstate.service.pages import mount_pages

    mount_pages(api)
    api.add_middleware(PatchRoute)  # innermost: after the peer's check and admission
    api.add_middleware(PeerCheck, gate=gate)
    api.add_middleware(McpBodies, settings=node.settings, counter=metrics.slow_clients)
    # Outside the body readers: a shed request costs no read of its body.
    admission = Admission(node.settings.max_in_flight, metrics.registry, target_s=node.settings.admit_target_ms / 1000)
    service.on_latency = admission.observe
    api.add_middleware(Admit, admission=admission, forwarded_header=FORWARDED_B)
    api.add_middleware(CountRequests, counter=metrics.requests)
    api.add_middleware(RawPaths)

    if mcp_server is not None:
        from runstate.service.mcp import mount_mcp

        mount_mcp(api, mcp_server, tokens)

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=api.title, version=api.version, description=api.description, routes=api.routes)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, d in _PATCH_DEFS.items():
                comps.setdefault(name, d)
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
    api.state.metrics = metrics
    return api


def _replaying(content: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives a body already read whole, then what the client sends next
    (its disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": content, "more_body": False}
        return await receive()

    return replay


class RawPaths:
    """Routes ``/runs/…`` on the raw path: uvicorn decodes ``%2F`` before routing, which
    would make a thread named ``a/context`` the route ``context`` of run ``a`` and
    ``x%2F..%2Fvictim`` run ``victim``. Here the path keeps its percent-encoding, ids are
    decoded by their parameter's type (``RUN_ID``), and a literal ``..`` or ``.`` segment
    matches no route (404), never another run."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw is not None and raw.startswith(b"/runs/"):
            # Bytes a client sent unescaped (UTF-8) become %XX; existing escapes stay.
            scope["path"] = quote_from_bytes(raw.split(b"?", 1)[0], safe="/%:@!$&'()*+,;=-._~")
        await self.app(scope, receive, send)


class PatchRoute:
    """``POST /runs/{run_id}/patches``, the route every write takes, dispatched straight to
    :func:`post_patch`, because FastAPI's routing and parameter solving are a share of
    serve's CPU per patch worth saving (the performance page). The parameters are validated by the route's own
    types (``RUN_ID``, ``WAIT``) and answered as FastAPI answers them, errors by the app's
    exception handlers, and the route is recorded in the scope (``CountRequests``). Any
    other request, and a path this does not take whole (a ``.``/``..`` segment, a trailing
    slash), goes to FastAPI. Plain ASGI, inside the middleware that authenticates a
    forwarding peer and admits requests."""

    _PATH = "/runs/{run_id}/patches"
    _run_id = pydantic.TypeAdapter(RUN_ID)
    _wait = pydantic.TypeAdapter(WAIT)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._route: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"] if scope["type"] == "http" and scope["method"] == "POST" else ""
        segment = path[6:-8] if path.startswith("/runs/") and path.endswith("/patches") else ""
        if not segment or "/" in segment or segment in (".", ".."):
            await self.app(scope, receive, send)
            return
        if self._route is None:
            self._route = next(r for r in routes.routes if getattr(r, "path", None) == self._PATH)
        scope["route"] = self._route
        request = Request(scope, receive)
        response: Response
        try:
            run_id = self._run_id.validate_python(segment)
        except pydantic.ValidationError as e:
            response = _invalid("run_id", e.errors()[0]["msg"])
        else:
            try:
                wait = self._wait.validate_python(request.query_params.get("wait"))
            except pydantic.ValidationError as e:
                response = _invalid("wait", e.errors()[0]["msg"])
            else:
                try:
                    response = await post_patch(request, run_id, wait)
                except Exception as e:  # answered as FastAPI's exception middleware would
                    response = await self._handled(request, e)
        await response(scope, receive, send)

    @staticmethod
    async def _handled(request: Request, e: Exception) -> Response:
        """The app's handler of ``e``'s class (the nearest in its MRO); re-raises ``e`` without one."""
        handlers = request.app.exception_handlers
        for cls in type(e).__mro__:
            if (handler := handlers.get(cls)) is not None:
                return await handler(request, e)  # type: ignore[no-any-return]
        raise e


class McpBodies:
    """``POST /mcp``: the body read whole, under the same deadlines as a patch's body
    (``RUNSTATE_BODY_TIMEOUT_S`` between parts, ``RUNSTATE_REQUEST_TIMEOUT_S`` for the
    whole) and bounded, before the MCP SDK sees it; a client that trickles or stalls is
    answered 408 and does not hold the connection. Plain ASGI, as CountRequests."""

    def __init__(self, app: ASGIApp, settings: Any, counter: Counter) -> None:
        self.app = app
        self.settings = settings
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/mcp"):
            await self.app(scope, receive, send)
            return
        st = self.settings
        limit = 2 * st.max_patch_bytes + 65536  # a patch in a JSON-RPC envelope
        deadline = time.monotonic() + st.request_timeout_s
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            try:
                message = await within(receive(), min(st.body_timeout_s, max(left, 0.0)))
            except TimeoutError:
                self.counter.labels("body").inc()
                whole = left <= st.body_timeout_s
                setting = "RUNSTATE_REQUEST_TIMEOUT_S" if whole else "RUNSTATE_BODY_TIMEOUT_S"
                after = st.request_timeout_s if whole else st.body_timeout_s
                what = f"did not arrive whole within {after:g} s" if whole else f"stopped arriving for {after:g} s"
                await error_response(
                    408, "request_timeout", f"the request body {what} ({setting})", headers={"Connection": "close"}
                )(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > limit:
                await error_response(
                    413, "too_large", f"an MCP request over {limit} bytes", headers={"Connection": "close"}
                )(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await self.app(scope, _replaying(b"".join(chunks), receive), send)


#: Where PeerCheck leaves a forwarded request's verified caller in the ASGI scope.
PEER_SCOPE_KEY = "runstate.peer"


class PeerCheck:
    """Requests forwarded by another instance: answered only when an instance holding the
    secret signed them for this address (with this body), and their answers signed for the
    forwarder (routing.py). Other requests pass untouched. Plain ASGI, as CountRequests."""

    def __init__(self, app: ASGIApp, gate: PeerGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not any(k == FORWARDED_B for k, _v in scope["headers"]):
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k.startswith(b"x-runstate-")
        }
        query = urlencode(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        try:
            who, digest, nonce = self.gate.check(scope["method"], scope["path"], query, headers)
        except AuthError as e:
            await translate(e)(scope, receive, send)
            return
        chunks = []  # from an instance that signed it: already bounded there
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        content = b"".join(chunks)
        if body_digest(content) != digest:
            await translate(self.gate.refuse_body())(scope, receive, send)
            return
        replay = _replaying(content, receive)
        start: Message | None = None
        parts: list[bytes] = []

        async def send_signed(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                return
            answer_ = b"".join(parts)
            sig = self.gate.sign_answer(nonce, start["status"], answer_)
            await send({**start, "headers": [*start.get("headers", []), (SIGNED.encode(), sig.encode())]})
            await send({"type": "http.response.body", "body": answer_})

        scope[PEER_SCOPE_KEY] = who
        await self.app(scope, replay, send_signed)


class CountRequests:
    """Counts HTTP requests by route template and status.

    Plain ASGI on purpose: Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``)
    runs every request in an extra task group and pipes the response through a stream; under
    500 patches/s that was a fifth of the event loop's time."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the server sends when the app raises before starting a response

        async def send_counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            # The router stores the matched route in the (shared) scope.
            route = scope.get("route")
            self.counter.labels(getattr(route, "path", "other"), str(status)).inc()


class _Revision(msgspec.Struct):
    """The one field of a state document the route reads (for its ETag); msgspec skips the
    rest without building it."""

    revision: int


_revision_of = msgspec.json.Decoder(_Revision).decode


def _etag_of(doc: bytes, run_id: str) -> str:
    """The ETag of a run's state document: its revision. Reading it checks that the whole
    document is JSON (msgspec reads past the rest): a stored record that is not is a
    StoreError naming the run (a 500 with its reason), never a 200 with a broken body."""
    try:
        return f'"{_revision_of(doc).revision}"'
    except msgspec.DecodeError as e:
        raise unreadable(run_id, None, e) from e


def _may(who: Identity, run_id: str) -> bool:
    try:
        who.may_read(run_id)
        return True
    except AuthError:
        return False


def _sse(d: Decision) -> bytes:
    return b"id: %d\nevent: decision\ndata: %s\n\n" % (d.offset, d.model_dump_json().encode())


__all__ = ["create_app", "translate"]
