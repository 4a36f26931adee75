"""The one mapping of runstate's errors to what a caller is told, for HTTP and MCP alike:
a status, and the body ``{"error": {"code", "message", "field"}}``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runstate.schemas.errors import (
    ContractError,
    DecisionTimeout,
    FieldNeverSet,
    LogError,
    PatchTooLarge,
    RevisionNotFound,
    KeyStoreError,
    RunErased,
    RunNotFound,
    RunstateError,
)
from runstate.service.auth import AuthError
from runstate.service.core import RemoteError
from runstate.service.node import Unavailable


@dataclass(frozen=True, slots=True)
class Answer:
    """An error as a caller is told it. ``expected``: the caller's mistake or a passing
    state (no traceback in the server's log); else a fault of the server."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None = None
    expected: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return str(self.body.get("error", {}).get("code", "internal"))


def body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def answer(e: Exception) -> Answer | None:
    """What a caller is told of ``e``; None for an exception that is not runstate's (a bug:
    let it propagate)."""
    if isinstance(e, RemoteError):
        return Answer(e.status, e.body, expected=e.status < 500)
    if isinstance(e, AuthError):
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return Answer(e.status, body("unauthorized" if e.status == 401 else "forbidden", str(e)), headers)
    if isinstance(e, PatchTooLarge):
        b = body("patch_too_large", str(e))
        b["error"].update(size=e.size, limit=e.limit)
        return Answer(413, b)
    if isinstance(e, ContractError):
        return Answer(422, body("invalid", str(e), e.field))
    if isinstance(e, RunErased):
        b = body("erased", str(e))
        b["error"]["erasure"] = e.erasure
        return Answer(410, b)
    if isinstance(e, KeyStoreError):
        return Answer(409, body("erasure_unavailable", str(e)))
    if isinstance(e, FieldNeverSet):
        return Answer(404, body("never_set", str(e), "path"))
    if isinstance(e, RunNotFound | RevisionNotFound):
        return Answer(404, body("not_found", str(e)))
    if isinstance(e, DecisionTimeout):
        return Answer(404, body("not_decided", "no decision on this patch (yet)"))
    if isinstance(e, Unavailable):
        return Answer(503, body("unavailable", str(e)), {"Retry-After": str(max(1, round(e.retry_after)))})
    if isinstance(e, LogError):
        return Answer(503, body("log_unavailable", str(e)), {"Retry-After": "1"})
    if isinstance(e, RunstateError):
        return Answer(500, body("internal", f"{type(e).__name__}: {e}"), expected=False)
    return None
