"""The run handle for asyncio callers, :class:`AsyncRun`, and its backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from runstate.agent.backends import _Local
from runstate.agent.handle import (
    _CLOSED_OPEN,
    ToolCall,
    _Builders,
    _call_done,
    _call_failed,
    _call_started,
    _effect,
    _result_refused,
)
from runstate.agent.patches import PatchRejected, RevisionConflict, _draft, _settled, _since
from runstate.schemas.errors import (
    RunNotFound,
)
from runstate.schemas.events import Model
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import RunState


class AsyncBackend(Protocol):
    async def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision: ...
    async def state(self, run_id: str, min_revision: int | None) -> RunState: ...
    async def context(self, run_id: str, min_revision: int | None) -> str: ...
    async def history(self, run_id: str) -> list[Decision]: ...
    async def erase(self, run_id: str, reason: str) -> bool: ...
    async def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]: ...
    async def run_ids(self) -> list[str]: ...
    async def close(self) -> None: ...


class _AsyncLocal:
    """The local backend for asyncio callers: the embedded log's calls block, so each runs
    in a worker thread (``asyncio.to_thread``)."""

    def __init__(self, local: _Local) -> None:
        self.local = local

    async def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        return await asyncio.to_thread(self.local.submit, run_id, draft, timeout_s)

    async def state(self, run_id: str, min_revision: int | None) -> RunState:
        return await asyncio.to_thread(self.local.state, run_id, min_revision)

    async def context(self, run_id: str, min_revision: int | None) -> str:
        return await asyncio.to_thread(self.local.context, run_id, min_revision)

    async def history(self, run_id: str) -> list[Decision]:
        return await asyncio.to_thread(self.local.history, run_id)

    async def erase(self, run_id: str, reason: str) -> bool:
        return await asyncio.to_thread(self.local.erase, run_id, reason)

    async def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.local.graph_checkpoints, run_id, ns, checkpoint_id, before, limit)

    async def run_ids(self) -> list[str]:
        return await asyncio.to_thread(self.local.run_ids)

    async def close(self) -> None:
        await asyncio.to_thread(self.local.close)


class _AsyncRemote:
    """A ``runstate serve`` through ``runstate.client.AsyncClient``."""

    def __init__(self, url: str, token: str | None, author: Author) -> None:
        from runstate.client import AsyncClient

        self.client = AsyncClient(url, token)
        self.author = author

    async def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        return await self.client.submit(run_id, {**draft, "author": self.author.model_dump()}, timeout_s=timeout_s)

    async def state(self, run_id: str, min_revision: int | None) -> RunState:
        return await self.client.state(run_id, min_revision=min_revision)

    async def context(self, run_id: str, min_revision: int | None) -> str:
        return await self.client.context(run_id, min_revision=min_revision)

    async def history(self, run_id: str) -> list[Decision]:
        return await self.client.history(run_id)

    async def erase(self, run_id: str, reason: str) -> bool:
        from runstate.client import ServiceError

        try:
            await self.client.erase(run_id, reason)
        except ServiceError as e:
            if e.status == 409:
                return False
            if e.status != 404:
                raise
        return True

    async def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        return await self.client.graph_checkpoints(
            run_id, ns=ns, checkpoint_id=checkpoint_id, before=before, limit=limit
        )

    async def run_ids(self) -> list[str]:
        return [r.run_id for r in await self.client.runs()]

    async def close(self) -> None:
        await self.client.aclose()


class AsyncRun(_Builders[Awaitable[Decision]]):
    """:class:`Run` for asyncio: the same methods, awaited (``await run.fact(...)``), and
    ``async with`` scopes for tool calls and effects."""

    def __init__(self, backend: AsyncBackend, run_id: str, *, timeout_s: float = 10.0) -> None:
        super().__init__(run_id, timeout_s)
        self.backend = backend

    async def state(self) -> RunState:
        self._state = await self.backend.state(self.run_id, self.revision or None)
        self.revision = max(self.revision, self._state.revision)
        return self._state

    async def context(self) -> str:
        return await self.backend.context(self.run_id, self.revision or None)

    async def refresh(self) -> int:
        return (await self.state()).revision

    async def submit(self, *evs: Model | dict[str, Any], rebase: bool | None = None) -> Decision:  # type: ignore[override]
        """As :meth:`Run.submit`."""
        decision = await self.backend.submit(self.run_id, _draft(self.revision, evs, rebase), self.timeout_s)
        if decision.reason in ("revision_conflict", "superseded"):
            raise RevisionConflict(decision, _since(decision, await self.backend.history(self.run_id)))
        self.revision = _settled(decision, self.revision)
        self._state = None
        return decision

    @asynccontextmanager
    async def tool_call(
        self,
        tool: str,
        *,
        side_effect: bool = False,
        costly: bool = False,
        relies_on: Sequence[tuple[str, str]] = (),
        call_id: str | None = None,
    ) -> AsyncIterator[ToolCall]:
        """As :meth:`Run.tool_call`."""
        call = ToolCall(call_id or f"call_{uuid.uuid4().hex[:12]}", tool)
        await self.submit(_call_started(call, side_effect, costly, relies_on))
        self._open_calls[call.call_id] = call
        try:
            yield call
        except BaseException as e:
            if self._open_calls.pop(call.call_id, None) is None:
                raise  # aclose() already recorded it as failed
            await self.submit(_call_failed(call, e))
            raise
        self._open_calls.pop(call.call_id, None)
        try:
            await self.submit(*_call_done(call), rebase=False)
        except PatchRejected as e:
            await self.submit(_call_failed(call, _result_refused(e)))  # as in Run.tool_call
            raise

    @asynccontextmanager
    async def effect(
        self, kind: str, target: str, idempotency_key: str, *, effect_id: str | None = None, call_id: str | None = None
    ) -> AsyncIterator[str]:
        """As :meth:`Run.effect`."""
        eid = effect_id or f"effect_{uuid.uuid4().hex[:12]}"
        await self.submit(_effect(eid, "started", kind, target, idempotency_key, call_id))
        try:
            yield eid
        except BaseException as e:
            await self.submit(_effect(eid, "failed", kind, target, idempotency_key, call_id, e))
            raise
        await self.submit(_effect(eid, "committed", kind, target, idempotency_key, call_id))

    async def aclose(self) -> None:
        """As :meth:`Run.close`."""
        try:
            for call in list(self._open_calls.values()):
                await self.submit(_call_failed(call, _CLOSED_OPEN))
            self._open_calls.clear()
        finally:
            await self.backend.close()

    async def __aenter__(self) -> AsyncRun:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def async_backend(
    where: str | Path, author: Author, *, token: str | None = None, project: bool = True
) -> AsyncBackend:
    """:func:`backend` for asyncio callers."""
    text = str(where)
    if text.startswith(("http://", "https://")):
        return _AsyncRemote(text, token, author)
    return _AsyncLocal(await asyncio.to_thread(_Local, Path(text), author, project))


async def open_async_run(
    where: str | Path,
    run_id: str,
    *,
    agent_id: str,
    agent_version: str,
    token: str | None = None,
    project: bool = True,
    timeout_s: float = 10.0,
) -> AsyncRun:
    """:func:`open_run` for asyncio: an :class:`AsyncRun` (``async with await open_async_run(...)``)."""
    author = Author(agent_id=agent_id, agent_version=agent_version)
    run = AsyncRun(await async_backend(where, author, token=token, project=project), run_id, timeout_s=timeout_s)
    try:
        await run.refresh()
    except RunNotFound:
        pass  # not started yet (an unreachable service or an erased run is said at once)
    return run
