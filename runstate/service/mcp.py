"""The Model Context Protocol side of ``runstate serve`` (the ``mcp`` SDK, streamable HTTP
at ``/mcp``): what an agent framework gives its model so that it can ask "where am I" and
record what it learned.

Tools call the same :class:`Service` operations as the HTTP routes (so they forward to the
partition's owner the same way), with the caller's bearer token. ``propose_patch``'s input
schema is the JSON Schema of :class:`PatchDraft`, generated from the pydantic models: a
model's malformed tool call is refused by the SDK's validation before anything is appended.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from runstate.projector.store import parse_state_json
from runstate.schemas.patch import PatchDraft
from runstate.service.auth import Identity, Tokens
from runstate.service.core import Forward, Service

INSTRUCTIONS = """runstate keeps the durable state of agent runs. Before acting, read where the run
is (run_context). Record what you learned or did as events with propose_patch, naming the
revision you read (expected_revision); a rejected decision says why (e.g. revision_conflict:
read the context again and re-propose)."""


def _who(ctx: Context, tokens: Tokens) -> tuple[Identity, tuple[tuple[str, str], ...]]:
    request = ctx.request_context.request
    auth = request.headers.get("authorization") if request is not None else None
    return tokens.identify(auth), ((("authorization", auth),) if auth else ())


def build_mcp(service: Service, tokens: Tokens) -> MCPServer:
    server = MCPServer(name="runstate", instructions=INSTRUCTIONS)

    async def run_context(run_id: str, ctx: Context) -> str:
        """The run's compact context: goal, confirmed facts, open hypotheses and questions,
        tasks with owners, waits, budgets, the current revision. Read it before acting."""
        who, headers = _who(ctx, tokens)
        who.may_read(run_id)
        return await service.context(run_id, Forward("GET", f"/runs/{run_id}/context", headers=headers))

    async def run_state(run_id: str, ctx: Context) -> dict[str, Any]:
        """The run's whole typed state (JSON), with its revision."""
        who, headers = _who(ctx, tokens)
        who.may_read(run_id)
        # The document the HTTP route sends (the validated state's JSON, as stored), parsed:
        # the state's model_dump(mode="json"), without building the models.
        doc = await service.state_json(run_id, Forward("GET", f"/runs/{run_id}", headers=headers))
        return parse_state_json(doc, run_id, "the projection")

    async def propose_patch(run_id: str, patch: PatchDraft, ctx: Context, wait_s: float = 5.0) -> dict[str, Any]:
        """Append events to the run, based on the revision you read (expected_revision).
        Returns the decision: accepted (the new revision) or rejected with its reason and
        the rule it broke; status "pending" if not decided within wait_s."""
        who, headers = _who(ctx, tokens)
        data = patch.model_dump(mode="json", exclude_none=True)
        out = await service.submit(who, run_id, data, min(max(wait_s, 0.0), 60.0),
                                   Forward("POST", f"/runs/{run_id}/patches", headers=headers))  # fmt: skip
        return out.model_dump(mode="json")

    async def run_history(run_id: str, ctx: Context) -> list[dict[str, Any]]:
        """Every decision on the run's patches in log order (who proposed what, accepted or why not)."""
        who, headers = _who(ctx, tokens)
        who.may_read(run_id)
        decisions = await service.history(run_id, Forward("GET", f"/runs/{run_id}/history", headers=headers))
        return [d.model_dump(mode="json") for d in decisions]

    for fn in (run_context, run_state, propose_patch, run_history):
        server.add_tool(fn)

    @server.resource("runstate://runs/{run_id}/context", mime_type="text/plain")
    async def context_resource(run_id: str) -> str:
        """The run's compact context (as the run_context tool; needs no token only on a server without tokens)."""
        who = tokens.identify(None)
        who.may_read(run_id)
        return await service.context(run_id, Forward("GET", f"/runs/{run_id}/context"))

    return server


def mount_mcp(api: FastAPI, server: MCPServer, tokens: Tokens, host: str = "127.0.0.1") -> None:
    """Add the streamable HTTP endpoint at ``/mcp`` (stateless, JSON responses: any instance
    can answer any call). ``host``: the address served, for DNS-rebinding protection."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                         allowed_hosts=[f"{host}:*", "127.0.0.1:*", "localhost:*"],
                                         allowed_origins=[f"http://{host}:*", "http://127.0.0.1:*"])  # fmt: skip
    sub = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True,
                                     transport_security=security, host=host)  # fmt: skip
    api.router.routes.extend(sub.routes)
