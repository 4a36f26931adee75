"""What ``runstate serve`` does, independent of HTTP or MCP: every operation either runs
on this instance (it owns the run's partition) or is forwarded to the owner.

Each operation takes the :class:`Forward` that names it as an HTTP request of this same
service, so that the MCP tools and the HTTP routes forward the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
import orjson
from pydantic import BaseModel, TypeAdapter

from runstate import app
from runstate.projector.read.context import render_context
from runstate.projector.read.replay import explain, state_data_at
from runstate.projector.store import document
from runstate.projector.store.partition import RunOrder, activity_rank, cursor_rank
from runstate.client import path_segment
from runstate.schemas.errors import (
    ContractError,
    DecisionTimeout,
    FieldNeverSet,
    RevisionNotFound,
    RunNotFound,
    RunstateError,
)
from runstate.schemas.patch import Author, Decision, Patch
from runstate.schemas.state import RunHeader, RunSummary
from runstate.service.auth import AuthError, Identity
from runstate.service.deadline import within
from runstate.service.node import Node, NotOwner, Unavailable
from runstate.service.routing import Forwarded, ForwardError, Router
from runstate.snapshotter.checkpoint import Checkpoint

T = TypeVar("T")

#: How long a request keeps retrying an owner that is moving before it answers 503.
OWNER_RETRY_S = 3.0


class RemoteError(RunstateError):
    """The owner answered an error: passed on with its status and body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(str(err.get("message", f"HTTP {status}")))
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Forward:
    """The request as it would be forwarded: method, path, query, headers, body."""

    method: str
    path: str
    params: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    #: this request was forwarded to us: answer locally or 503, never forward again
    forwarded: bool = False
    #: the caller, as this instance verified it: what a forward sends in place of its token
    who: Identity | None = None


class Submitted(BaseModel):
    """The answer to a patch: ``decided`` with its decision, or ``pending`` (appended, not
    decided within the wait; ask ``GET /runs/{run_id}/decisions/{patch_id}``)."""

    status: str
    patch_id: str
    run_id: str
    partition: int
    offset: int
    decision: Decision | None = None


class ErasedOut(BaseModel):
    """The answer to an erasure: the record that stands (``first``: made by this request),
    and the erasure's decision when the projector took it within the wait."""

    run_id: str
    erasure: dict[str, Any]
    first: bool
    decision: Decision | None = None


class DeadLetterOut(BaseModel):
    """A record that could not be decided: where it is in the log, and why."""

    partition: int
    offset: int
    reason: str
    detail: str
    key: str | None = None
    size: int


class FieldChangeOut(BaseModel):
    revision: int
    offset: int
    agent_id: str
    agent_version: str
    event_types: list[str]
    before: Any = None
    after: Any = None


class PartitionsOut(BaseModel):
    """Which instance owns each partition of the events topic: a client that sends a run's
    requests to the owner of its partition (``partition_for(run_id, partitions)``) saves the
    forwarding hop. ``owners`` names only instances that proved the instance secret; a
    partition missing from it (moving, or owned by none that proved it): send to any
    instance."""

    partitions: int
    owners: dict[int, str]


class ResumeOut(BaseModel):
    checkpoint: Checkpoint
    current_revision: int | None
    tail: list[Decision]


class _LiveRuns:  # a replay.RunRecords
    """What the replay tools read from a projection, from the owner's live stores."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def header(self, run_id: str) -> RunHeader | None:
        return self.node.read(run_id, lambda st: st.header(run_id))

    def history(self, run_id: str) -> list[Decision]:
        return self.node.read(run_id, lambda st: st.history(run_id))

    def accepted_positions(
        self, run_id: str, after_revision: int, up_to_revision: int | None = None
    ) -> list[tuple[int, int, int]]:
        return self.node.read(run_id, lambda st: st.accepted_positions(run_id, after_revision, up_to_revision))


def _state_json(node: Node, run_id: str) -> bytes:
    # Only the read holds the projector's lock; the caller parses or validates the document
    # (or sends it as it is) after the lock is released.
    doc = node.read(run_id, lambda st: st.read_state(run_id, "json"))
    if doc is None:
        raise RunNotFound(run_id)
    return doc


_SUMMARIES = TypeAdapter(list[RunSummary])
#: A stored header's public fields as their JSON spans: a listing drops the projector's
#: bookkeeping without parsing the rest (msgspec skips the fields the struct does not name).
_SummarySpans = msgspec.defstruct("_SummarySpans", [(name, msgspec.Raw) for name in RunSummary.model_fields])
_summary_spans = msgspec.json.Decoder(_SummarySpans).decode
_encode_spans = msgspec.json.Encoder().encode


def summary_json(header_json: bytes) -> bytes:
    """The :class:`RunSummary` JSON of a stored header's JSON (``RunHeader.model_dump_json``):
    the same bytes, field for field, without :data:`HEADER_INTERNAL_FIELDS`."""
    return _encode_spans(_summary_spans(header_json))


def _state_struct(node: Node, run_id: str) -> Any:
    """The run's state as its msgspec struct (``document.load(..., "struct")``): for readers of
    its fields that hand out no model."""
    return document.load(_state_json(node, run_id), run_id, "this instance's projection", "struct")


class Service:
    def __init__(self, node: Node, router: Router | None) -> None:
        self.node = node
        self.router = router
        self.settings = node.settings
        #: (Loop thread.) Told of each patch appended here, the seconds from its append to
        #: its answer: the admission's bound follows them (``admission.Admission.observe``).
        self.on_latency: Callable[[float], None] = lambda _s: None

    # -- local or owner -------------------------------------------------------------------

    async def on_owner(
        self, run_id: str, fwd: Forward, local: Callable[[], Awaitable[T]], parse: Callable[[Any], T]
    ) -> T:
        """``local()`` if this instance owns the run's partition, else the owner's answer
        to ``fwd`` parsed by ``parse``. Raises :class:`Unavailable` after retrying for
        :data:`OWNER_RETRY_S` while the owner is moving."""
        deadline = time.monotonic() + OWNER_RETRY_S
        refresh = False
        while True:
            try:
                return await local()
            except NotOwner as e:
                if self.router is None or fwd.forwarded:
                    raise Unavailable(str(e)) from e
                partition = e.partition
            try:
                url = await self.router.owner(partition, refresh)
                resp = await self.router.forward(
                    url, fwd.method, fwd.path, list(fwd.params), dict(fwd.headers), fwd.body, who=fwd.who
                )
                if resp.status_code != 503:
                    return parse(self._json(resp))
                why = f"the owner of partition {partition} is handing it over"
            except Unavailable as e:
                why = str(e)
            except ForwardError as e:
                why = f"the owner of partition {partition} does not answer ({e})"
            if time.monotonic() >= deadline:
                raise Unavailable(why)
            refresh = True
            await asyncio.sleep(0.1)

    @staticmethod
    def _json(resp: Forwarded) -> Any:
        body = orjson.loads(resp.content) if resp.content else None
        if resp.status_code >= 400:
            raise RemoteError(resp.status_code, body if isinstance(body, dict) else {})
        return body

    async def scatter(
        self, fwd: Forward, local: Callable[[], T], parse: Callable[[Any], T], *, raw: bool = False
    ) -> list[T]:
        """``local()`` here and ``fwd`` on every other serving member (one answer each);
        ``parse`` gets each answer's JSON, or (``raw``) the response itself."""
        out = [local()]
        if self.router is None or fwd.forwarded:
            return out
        owners = await self.router.owners(refresh=True)
        urls = sorted(set(owners.values()) - {self.router.me})
        for url in urls:
            try:
                resp = await self.router.forward(
                    url, fwd.method, fwd.path, list(fwd.params), dict(fwd.headers), who=fwd.who
                )
            except ForwardError as e:
                raise Unavailable(f"instance {url} does not answer ({e})") from e
            if resp.status_code == 503:
                raise Unavailable(f"instance {url} is not ready")
            if resp.status_code == 404:  # not there: the others may have it
                continue
            out.append(parse(resp) if raw else parse(self._json(resp)))
        missing = set(range(self.node.partitions)) - set(owners) - set(self.node.owned())
        if missing:
            raise Unavailable(f"partitions {sorted(missing)} have no serving owner")
        return out

    # -- writes ----------------------------------------------------------------------------

    async def partitions(self) -> PartitionsOut:
        """The owners of the partitions (see :class:`PartitionsOut`); none named on the
        embedded log, where this instance owns them all."""
        owners = {} if self.router is None else await self.router.proven_owners()
        return PartitionsOut(partitions=self.node.partitions, owners=owners)

    async def submit(
        self, who: Identity, run_id: str, data: Any, wait_s: float | None, fwd: Forward, channel: str = "http"
    ) -> Submitted:
        """Validate, append and (``wait_s``) await the decision of one patch. The author is
        the caller's identity; a trusted caller (no tokens file) may name one, and is else
        recorded as ``<its identity>@<channel>`` (``anonymous@http``). Raises
        :class:`ContractError`, :class:`PatchTooLarge`, :class:`AuthError`."""
        who.may_write(run_id)
        if not isinstance(data, dict):
            raise ContractError(f"a patch must be a JSON object, got {type(data).__name__}")
        author = data.get("author")
        if who.trusted and author is None:
            data = {**data, "author": {"agent_id": who.agent_id, "agent_version": channel}}
        if not who.trusted:
            claimed = author.get("agent_id") if isinstance(author, dict) else None
            if claimed is not None and claimed != who.agent_id:
                raise AuthError(f"the token is agent {who.agent_id!r}; a patch cannot claim author {claimed!r}", 403)
            version = author.get("agent_version") if isinstance(author, dict) else None
            data = {**data, "author": {"agent_id": who.agent_id, "agent_version": version or "unknown"}}
        patch = self.node.producer.build(run_id, data)
        who.may_propose(patch.events)
        encoded = self.node.producer.encode(patch)
        resend_possible = data.get("patch_id") is not None
        if self.router is None or fwd.forwarded:
            return await self._submit_here(run_id, patch, encoded, resend_possible, wait_s, fwd)

        async def here() -> Submitted:
            self.node.read(run_id, lambda _store: None)  # NotOwner: the owner's answer instead
            return await self._submit_here(run_id, patch, encoded, resend_possible, wait_s, fwd)

        # The owner appends it: it checks a resend against its own store and hears its own
        # decision. One hop, where appending here costs a lookup there for the resend check
        # and the decision's way back through the decisions topic.
        body = orjson.dumps({**data, "patch_id": patch.patch_id})
        ask = Forward(
            "POST",
            f"/runs/{path_segment(run_id)}/patches",
            (("wait", repr(wait_s)),) if wait_s else (),
            fwd.headers,
            body,
            who=who,
        )
        return await self.on_owner(run_id, ask, here, Submitted.model_validate)

    async def _submit_here(
        self, run_id: str, patch: Patch, encoded: bytes, resend_possible: bool, wait_s: float | None, fwd: Forward
    ) -> Submitted:
        """Append ``patch`` from this instance and (``wait_s``) await its decision; a patch
        whose id the caller chose may be a resend, answered by its first decision."""
        earlier = None
        if resend_possible:
            # A resend (a client retrying after a lost answer): the first decision is the
            # answer, and appending again would only add a duplicate to the log. The same id
            # for other content is appended: the projector records it as patch_id_reused.
            earlier = await self.decision_or_none(run_id, patch.patch_id, fwd)
            if earlier is not None and self.node.producer.resend_of(patch, earlier):
                return Submitted(
                    status="decided",
                    patch_id=patch.patch_id,
                    run_id=run_id,
                    partition=earlier.partition,
                    offset=earlier.offset,
                    decision=earlier,
                )
        hub = self.node.hub
        if hub.failed is not None:
            raise hub.stopping()  # nothing appended: no projector here will decide it
        waiting = hub.expect(run_id, patch.patch_id) if wait_s else None
        appended = time.monotonic()
        try:
            receipt = await asyncio.wrap_future(self.node.append(patch, encoded))
            out = Submitted(
                status="pending",
                patch_id=patch.patch_id,
                run_id=run_id,
                partition=receipt.partition,
                offset=receipt.offset,
            )
            if waiting is None:
                return out
            try:
                decision = await within(asyncio.shield(waiting), wait_s)
            except TimeoutError:
                # A resent patch id is a duplicate (no new decision), or the copy of the
                # decision was lost: ask the owner before answering "pending".
                decision = await self.decision_or_none(run_id, patch.patch_id, fwd)
            if earlier is not None and decision is not None and decision.offset == earlier.offset:
                decision = None  # the other content's decision, not this record's: still pending
            if decision is not None:
                out.status, out.decision = "decided", decision
            return out
        finally:
            if waiting is not None:
                hub.forget(run_id, patch.patch_id, waiting)
            self.on_latency(time.monotonic() - appended)

    async def erase(self, who: Identity, run_id: str, reason: str, wait_s: float | None) -> ErasedOut:
        """Erase a run (:func:`app.erase_run`) from any instance. Raises :class:`AuthError`,
        :class:`KeyStoreError`, :class:`RunNotFound`."""
        who.may_erase(run_id)
        try:
            header = self.node.read(run_id, lambda st: st.header(run_id))
        except NotOwner:
            header = None  # the owner keeps the revision; the record's is informational
        patch_id = uuid.uuid4().hex
        hub = self.node.hub
        waiting = hub.expect(run_id, patch_id) if wait_s else None
        author = Author(agent_id=who.agent_id, agent_version="erase")
        try:
            done = await asyncio.to_thread(
                app.erase_run,
                self.node.log,
                run_id,
                reason,
                who.agent_id,
                author,
                0 if header is None else header.revision,
                known=header is not None,
                patch_id=patch_id,
            )
            out = ErasedOut(run_id=run_id, erasure=done.erasure, first=done.first)
            if waiting is not None and done.first:
                try:
                    out.decision = await within(asyncio.shield(waiting), wait_s)
                except (TimeoutError, Unavailable):  # the erasure is recorded; its decision is not known here
                    pass
            return out
        finally:
            if waiting is not None:
                hub.forget(run_id, patch_id, waiting)

    # -- reads -------------------------------------------------------------------------------

    async def decision(self, run_id: str, patch_id: str, fwd: Forward) -> Decision:
        async def local() -> Decision:
            d = self.node.read(run_id, lambda st: st.decision(run_id, patch_id))
            if d is None:
                raise DecisionTimeout(run_id, patch_id, 0)
            return d

        return await self.on_owner(run_id, fwd, local, Decision.model_validate)

    async def decision_or_none(self, run_id: str, patch_id: str, fwd: Forward) -> Decision | None:
        """The patch's decision, or None: not decided, or its owner not reachable. Every
        patch whose id its client chose is looked up before it is appended (a resend?):
        where this instance owns the run, that is one read of the store."""
        try:
            return self.node.read(run_id, lambda st: st.decision(run_id, patch_id))
        except NotOwner:
            if self.router is None or fwd.forwarded:
                return None
        try:
            return await self.decision(
                run_id,
                patch_id,
                Forward(
                    "GET",
                    f"/runs/{path_segment(run_id)}/decisions/{path_segment(patch_id)}",
                    headers=fwd.headers,
                    who=fwd.who,
                ),
            )
        except (DecisionTimeout, Unavailable):
            return None
        except RemoteError as e:
            if e.status == 404:
                return None
            raise

    async def state_json(
        self,
        run_id: str,
        fwd: Forward,
        *,
        revision: int | None = None,
        min_revision: int | None = None,
        wait_s: float = 5.0,
    ) -> bytes:
        """The run's state (``revision``: as it was then) as JSON, the bytes
        ``RunState.model_dump_json`` gives (see :meth:`ProjectionStore.read_state`):
        what the HTTP route sends and the MCP tool parses, joined from the stored records,
        neither validated nor dumped again (a run's state as of ``revision`` is rebuilt as
        plain data and dumped). ``min_revision``: wait up to ``wait_s`` until the projection
        reached it (read-your-writes), else :class:`Unavailable`."""

        async def local() -> bytes:
            if revision is not None:
                live = _LiveRuns(self.node)
                live.header(run_id)  # NotOwner before any log read
                return orjson.dumps(await asyncio.to_thread(self._state_data_at, live, run_id, revision))
            if min_revision is not None:
                await self._reach(run_id, min_revision, wait_s)
            return _state_json(self.node, run_id)

        return await self.on_owner(run_id, fwd, local, orjson.dumps)

    def _state_data_at(self, live: _LiveRuns, run_id: str, revision: int) -> dict[str, Any]:
        # The instance's own log (the tail is read from it) and its snapshotter's stores.
        return state_data_at(self.node.log, live, run_id, revision, nearest=self.node.nearest_checkpoint())

    async def _reach(self, run_id: str, min_revision: int, wait_s: float) -> None:
        """Return once the run is at ``min_revision`` here. While this instance's projector
        is behind the log on the run's partition (it just took the partition over), wait up
        to ``wait_s`` (then :class:`Unavailable`: retry). Caught up and still below it: the
        log holds no such revision (:class:`RevisionNotFound` / :class:`RunNotFound`) — a
        revision a client saw decided is always stored before its decision is visible."""

        def current() -> int:
            h = self.node.read(run_id, lambda st: st.header(run_id))
            return -1 if h is None else h.revision

        def not_there() -> RunstateError | None:
            # Caught up first, then the revision: the projector may store the batch with the
            # revision between the two reads, and a revision read before "caught up" is stale.
            if not self.node.caught_up(run_id):
                return None
            at = current()
            if at >= min_revision:
                return None
            return RunNotFound(run_id) if at < 0 else RevisionNotFound(run_id, min_revision, at)

        at = current()
        if at >= min_revision:
            return
        if (missing := not_there()) is not None:
            raise missing
        w = self.node.hub.watch(run_id, min_revision)
        deadline = time.monotonic() + wait_s
        try:
            while (at := current()) < min_revision:  # re-read after registering: no wake-up is missed
                if (missing := not_there()) is not None:
                    raise missing
                if current() >= min_revision:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(
                        f"run {run_id!r} is at revision {at} here, still catching up to {min_revision}", retry_after=1.0
                    )
                with contextlib.suppress(TimeoutError):
                    # woken by the revision, or re-checking the lag now and then
                    await within(asyncio.shield(w.future), min(left, 0.1))
        finally:
            self.node.hub.unwatch(run_id, w)

    async def context(
        self, run_id: str, fwd: Forward, min_revision: int | None = None, max_tokens: int | None = None
    ) -> str:
        async def local() -> str:
            if min_revision is not None:
                await self._reach(run_id, min_revision, 5.0)
            return render_context(_state_struct(self.node, run_id), now=datetime.now(UTC), max_tokens=max_tokens)

        return await self.on_owner(run_id, fwd, local, lambda body: str(body["context"]))

    async def history(self, run_id: str, fwd: Forward) -> list[Decision]:
        async def local() -> list[Decision]:
            out = self.node.read(run_id, lambda st: st.history(run_id))
            if not out:
                raise RunNotFound(run_id)
            return out

        return await self.on_owner(run_id, fwd, local, TypeAdapter(list[Decision]).validate_python)

    async def explain(self, run_id: str, path: str, fwd: Forward) -> list[FieldChangeOut]:
        async def local() -> list[FieldChangeOut]:
            live = _LiveRuns(self.node)
            live.header(run_id)

            def run() -> list[FieldChangeOut]:
                changes = explain(self.node.log, live, run_id, path)
                if not changes:
                    raise FieldNeverSet(run_id, path)
                return [FieldChangeOut(**vars(c)) for c in changes]

            return await asyncio.to_thread(run)

        return await self.on_owner(run_id, fwd, local, TypeAdapter(list[FieldChangeOut]).validate_python)

    async def graph_checkpoints(
        self,
        run_id: str,
        fwd: Forward,
        *,
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
    ) -> bytes:
        """The run's LangGraph checkpoints, newest first, as a JSON array of the stored
        documents (:meth:`ProjectionStore.graph_checkpoints`); none for an unknown run."""

        async def local() -> bytes:
            raw = self.node.read(
                run_id,
                lambda st: st.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit),
            )
            return b"[" + b",".join(raw) + b"]"

        return await self.on_owner(run_id, fwd, local, orjson.dumps)

    async def runs(
        self,
        status: str | None,
        keep: Callable[[str], bool] | None,
        after: str | None,
        limit: int | None,
        fwd: Forward,
        order: RunOrder = "id",
    ) -> tuple[int, list[tuple[str, bytes]]]:
        """How many runs match (``status``, ``keep(run_id)``) on every partition, and the page
        after ``after`` (at most ``limit``, by run id or, ``order="recent"``, the latest
        activity first) as ``(run_id, summary JSON)``: each owner counts and cuts its own
        partitions (:meth:`ProjectionStore.runs_page`), this instance merges. ``fwd``
        carries the same filters to the other instances."""

        def local() -> tuple[int, list[tuple[str, bytes]]]:
            per = self.node.read_partitions(lambda _p, st: st.runs_page(status, keep, after, limit, order))
            return sum(t for t, _ in per.values()), [
                (r, summary_json(doc)) for _, page in per.values() for r, doc in page
            ]

        def parse(resp: Forwarded) -> tuple[int, list[tuple[str, bytes]]]:
            page = [(h.run_id, h.model_dump_json().encode()) for h in _SUMMARIES.validate_python(self._json(resp))]
            return int(resp.headers.get("x-total-count", len(page))), page

        if order == "recent" and after is not None:
            cursor_rank(after)  # a bad cursor is the caller's error here, before any instance is asked
        parts = await self.scatter(fwd, local, parse, raw=True)
        merged = (h for _, hs in parts for h in hs)
        page = sorted(merged, key=(lambda h: activity_rank(*h)) if order == "recent" else (lambda h: h[0]))
        return sum(t for t, _ in parts), page if limit is None else page[:limit]

    async def dead_letters(self, fwd: Forward) -> list[DeadLetterOut]:
        """Every dead letter of every partition (asked of their owners), by partition and offset."""

        def local() -> list[DeadLetterOut]:
            per = self.node.read_partitions(lambda _p, st: st.dead_letters())
            return [DeadLetterOut(**vars(d)) for ds in per.values() for d in ds]

        parts = await self.scatter(fwd, local, TypeAdapter(list[DeadLetterOut]).validate_python)
        return sorted((d for ds in parts for d in ds), key=lambda d: (d.partition, d.offset))

    async def checkpoints(self, run_id: str, fwd: Forward) -> list[Checkpoint]:
        """The checkpoints this instance's snapshotter wrote of the run, else another's."""

        def local() -> list[Checkpoint]:
            try:
                return app.checkpoints(self.settings, run_id)
            except RunstateError:
                return []

        for found in await self.scatter(fwd, local, TypeAdapter(list[Checkpoint]).validate_python):
            if found:
                return found
        raise RunNotFound(run_id)

    async def resume(self, run_id: str, fwd: Forward) -> ResumeOut:
        def local() -> ResumeOut | None:
            try:
                plan = app.resume_plan(self.settings, run_id)
            except RunNotFound:
                return None
            return ResumeOut(checkpoint=plan.checkpoint, current_revision=plan.current_revision, tail=plan.tail)

        def parse(body: Any) -> ResumeOut | None:
            return None if body is None else ResumeOut.model_validate(body)

        for found in await self.scatter(fwd, lambda: local(), parse):
            if found is not None:
                return found
        raise RunNotFound(run_id)
