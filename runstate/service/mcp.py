"""The Model Context Protocol side of ``runstate serve`` (the ``mcp`` SDK, streamable HTTP
at ``/mcp``): what an agent framework gives its model so that it can ask "where am I" and
record what it learned.

Tools call the same :class:`Service` operations as the HTTP routes (so they forward to the
partition's owner the same way), with the caller's bearer token. A failing call returns
``is_error`` with runstate's own error body as its text, the words HTTP sends
(``{"error": {"code", "message", "field"}}``), so a model can tell a mistyped run id from a
fault; only faults are logged with a traceback.

``tools/list`` is sent to the model on every step, so ``propose_patch``'s input schema names
the event types and leaves each event's fields to the server, which validates the patch
exactly as HTTP does (the error names the field); ``event_schema`` gives one event type's
fields on demand.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
import pydantic
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

import runstate
from runstate.projector.store import document
from runstate.client import path_segment
from runstate.schemas.errors import ContractError, describe_validation_error
from runstate.schemas.events import EVENT_TYPE_NAMES, EVENT_TYPES, OPERATOR_EVENT_TYPES
from runstate.service.auth import Identity, Tokens
from runstate.service.core import Forward, Service
from runstate.service.errors import Answer, answer, body

log = logging.getLogger("runstate.mcp")

INSTRUCTIONS = (
    "runstate keeps the durable state of agent runs. Before acting, read where the run is "
    "(run_context). Record what you learned or did as events with propose_patch, naming the revision "
    "you read (expected_revision); event_schema gives an event type's fields. A rejected decision "
    "says why (e.g. revision_conflict: read the context again and re-propose)."
)

P = ParamSpec("P")
R = TypeVar("R")


class EventInput(BaseModel):
    """One event: its ``type`` and that type's fields (see the event_schema tool). The
    schema lists the types; the server judges them, so an unknown one is runstate's
    ``invalid`` error naming the catalogue."""

    model_config = ConfigDict(extra="allow")
    # What an agent may send: an operator's events (RunErased) have their own route.
    type: Annotated[
        str, Field(json_schema_extra={"enum": [n for n in EVENT_TYPE_NAMES if n not in OPERATOR_EVENT_TYPES]})
    ]


class PatchInput(BaseModel):
    """The patch a model proposes. Each event's fields are checked on the server, as over
    HTTP; the error names the field."""

    model_config = ConfigDict(extra="forbid")
    expected_revision: Annotated[int, Field(ge=0, description="the revision you read")]
    events: Annotated[list[EventInput], Field(min_length=1, description="applied all or none")]
    rebase: Annotated[bool, Field(description="re-apply on the current revision if every event commutes")] = False
    patch_id: Annotated[str | None, Field(description="idempotency key: a resend gets the first decision")] = None
    agent_version: Annotated[str | None, Field(description="your version, recorded with the patch")] = None


def _text(fn: Callable[..., Any]) -> str:
    """A docstring as one paragraph of plain text (no source indentation)."""
    return " ".join(inspect.cleandoc(fn.__doc__ or "").split())


def _error_result(got: Answer) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(got.body, ensure_ascii=False))], is_error=True
    )


def _answering(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | CallToolResult]]:
    """Run a tool; runstate's errors become an ``is_error`` result holding the HTTP error
    body. Expected ones (not found, bad input, authority) are not logged; faults are, with
    their traceback. Anything else is a bug and left to the SDK."""

    @functools.wraps(fn)
    async def tool(*args: P.args, **kwargs: P.kwargs) -> R | CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except Exception as e:
            got = answer(e)
            if got is None:
                raise
            if not got.expected:
                log.error("MCP tool %s failed: %s", fn.__name__, got.body["error"]["message"], exc_info=e)
            return _error_result(got)

    return tool


def _who(ctx: Context, tokens: Tokens) -> Identity:
    request = ctx.request_context.request
    return tokens.identify(request.headers.get("authorization") if request is not None else None)


_EVENT_SCHEMAS: dict[str, dict[str, Any]] = {}


def event_json_schema(event_type: str) -> dict[str, Any]:
    """The JSON Schema of one event type, from the contract's model. Raises
    :class:`ContractError` for a type that is not in the catalogue, listing it."""
    if event_type not in EVENT_TYPE_NAMES:
        raise ContractError(
            f"unknown event type {event_type!r}; known: {', '.join(EVENT_TYPE_NAMES)}", field="event_type"
        )
    if not _EVENT_SCHEMAS:
        for model in EVENT_TYPES:
            _EVENT_SCHEMAS[model.__name__] = TypeAdapter(model).json_schema()
    return _EVENT_SCHEMAS[event_type]


class _Server(MCPServer):
    """The SDK's server, answering ``prompts/get`` of a prompt it does not have as the
    protocol's invalid-params error (the SDK raises a bare ValueError there, which reaches
    the client as an internal error and leaves a traceback in the log), and arguments that
    do not fit a tool with runstate's error body (the SDK sends pydantic's text)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            if not isinstance(e.__cause__, pydantic.ValidationError):
                raise
            field, message = describe_validation_error(e.__cause__)
            if name == "propose_patch" and field == "patch" and {"events", "expected_revision"} & set(arguments):
                message = (
                    'patch: the events go inside "patch": {"run_id": "...", "patch": {"expected_revision": N, '
                    '"events": [...]}, "wait_s": 5}'
                )
            return _error_result(Answer(422, body("invalid", message, field or None)))

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> Any:
        if name not in {p.name for p in await self.list_prompts()}:
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}: runstate offers no prompts")
        return await super().get_prompt(name, arguments, context)


def build_mcp(service: Service, tokens: Tokens) -> MCPServer:
    server = _Server(name="runstate", version=runstate.__version__, instructions=INSTRUCTIONS)

    async def run_context(run_id: str, ctx: Context, max_tokens: int | None = None) -> str:
        """The run's compact context: goal, confirmed facts, open hypotheses and questions,
        tasks with owners, waits, budgets, the current revision. Read it before acting.
        max_tokens (at least 50) bounds it; what was left out is counted in the text."""
        who = _who(ctx, tokens)
        who.may_read(run_id)
        if max_tokens is not None and max_tokens < 50:
            raise ContractError("max_tokens must be at least 50", field="max_tokens")
        params = () if max_tokens is None else (("max_tokens", str(max_tokens)),)
        return await service.context(
            run_id, Forward("GET", f"/runs/{path_segment(run_id)}/context", params, who=who), None, max_tokens
        )

    async def run_state(run_id: str, ctx: Context) -> dict[str, Any]:
        """The run's whole typed state (JSON), with its revision."""
        who = _who(ctx, tokens)
        who.may_read(run_id)
        # The document the HTTP route sends (the validated state's JSON, as stored), parsed.
        doc = await service.state_json(run_id, Forward("GET", f"/runs/{path_segment(run_id)}", who=who))
        return document.load(doc, run_id, "the projection", "data")  # type: ignore[no-any-return]

    async def propose_patch(run_id: str, patch: PatchInput, ctx: Context, wait_s: float = 5.0) -> dict[str, Any]:
        """Append events to the run, based on the revision you read (expected_revision).
        Returns the decision: accepted (the new revision) or rejected with its reason and
        the rule it broke; status "pending" if not decided within wait_s."""
        who = _who(ctx, tokens)
        data = patch.model_dump(mode="json", exclude_none=True, exclude={"agent_version"})
        if patch.agent_version is not None:
            data["author"] = {"agent_id": who.agent_id, "agent_version": patch.agent_version}
        out = await service.submit(
            who,
            run_id,
            data,
            min(max(wait_s, 0.0), 60.0),
            Forward("POST", f"/runs/{path_segment(run_id)}/patches", who=who),
            channel="mcp",
        )
        return out.model_dump(mode="json")

    async def run_history(run_id: str, ctx: Context) -> list[dict[str, Any]]:
        """Every decision on the run's patches in log order (who proposed what, accepted or why not)."""
        who = _who(ctx, tokens)
        who.may_read(run_id)
        decisions = await service.history(run_id, Forward("GET", f"/runs/{path_segment(run_id)}/history", who=who))
        return [d.model_dump(mode="json") for d in decisions]

    async def event_schema(event_type: str) -> dict[str, Any]:
        """The JSON Schema of one event type's fields (for propose_patch's events)."""
        return event_json_schema(event_type)

    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True)
    for fn, hints in (
        (run_context, read_only),
        (run_state, read_only),
        (propose_patch, None),
        (run_history, read_only),
        (event_schema, read_only),
    ):
        server.add_tool(_answering(fn), description=_text(fn), annotations=hints)

    async def context_resource(run_id: str) -> str:
        """The run's compact context, as the run_context tool (without a token: only on a server without tokens)."""
        try:
            who = tokens.identify(None)
            who.may_read(run_id)
            return await service.context(run_id, Forward("GET", f"/runs/{path_segment(run_id)}/context", who=who))
        except Exception as e:
            got = answer(e)
            if got is None:
                raise
            err = got.body["error"]
            if not got.expected:
                log.error("MCP resource of run %s failed: %s", run_id, err["message"], exc_info=e)
            raise (ResourceNotFoundError if got.status == 404 else ResourceError)(
                f"{err['code']}: {err['message']}"
            ) from e

    server.resource("runstate://runs/{run_id}/context", mime_type="text/plain", description=_text(context_resource))(
        context_resource
    )
    return server


def mount_mcp(api: FastAPI, server: MCPServer, tokens: Tokens, host: str = "127.0.0.1") -> None:
    """Add the streamable HTTP endpoint at ``/mcp`` (stateless, JSON responses: any instance
    can answer any call). ``host``: the address served, for DNS-rebinding protection."""
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*"],
        allowed_origins=[f"http://{host}:*", "http://127.0.0.1:*"],
    )
    sub = server.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True, transport_security=security, host=host
    )
    api.router.routes.extend(sub.routes)
