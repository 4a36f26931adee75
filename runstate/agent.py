"""The run as an object an agent loop holds: ``runstate.agent``.

A :class:`Run` knows its run id, its author and the revision it last saw, and keeps that
revision current from the decisions it gets. It works the same over the local log (a
directory: the embedded log and the projections in it, the projector running in this
process or elsewhere) and over a ``runstate serve`` (an ``http(s)://`` URL), so a worker
moves from a laptop to a cluster by changing one string::

    with open_run(".runstate", "run_7", agent_id="coder", agent_version="2.1") as run:
        run.start("fix the login failure")
        prompt = run.context()
        with run.tool_call("run_tests") as call:
            call.result("artifact://test-output/48", kind="test_output")
        run.fact("fact_1", "the login test fails with RS256", evidence="artifact://test-output/48")

Every event is the contract's own model (``runstate.agent.events`` is
:mod:`runstate.schemas.events`): an editor completes them, and a mistake fails before
anything is sent. This module adds no rule of its own: every rule is the reducer's, and a
rejected patch is raised as :class:`PatchRejected` (:class:`RevisionConflict` for a
revision conflict, with the current revision and the decisions since) — never retried
blindly. Patches whose events all commute (a fact, a hypothesis, a question with a fresh
id, an observation, budget use) are sent with ``rebase`` by default.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pydantic
from pydantic import TypeAdapter

from runstate.schemas import events
from runstate.schemas.errors import (
    ContractError,
    DecisionTimeout,
    LogError,
    RunNotFound,
    RunstateError,
    describe_validation_error,
)
from runstate.schemas.events import Model
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import RunState

log = logging.getLogger("runstate.agent")
#: How long opening a handle waits for its projector to hold the log's group (or find it taken).
_JOIN_S = 10.0

__all__ = ["AsyncRun", "PatchRejected", "RevisionConflict", "Run", "ToolCall", "events", "open_run", "open_async_run"]

R = TypeVar("R")

#: Event types that commute with any concurrent patch (the catalogue's traits; here they
#: choose the default of ``rebase``, which the projector grants for the same set).
_COMMUTING = events.COMMUTING_EVENT_TYPES


_EVENT: TypeAdapter[Any] = TypeAdapter(events.Event)


def _event(data: dict[str, Any]) -> Model:
    """An event from its JSON form. Raises ``ContractError`` naming the field."""
    try:
        return _EVENT.validate_python(data)  # type: ignore[no-any-return]
    except pydantic.ValidationError as e:
        field_, msg = describe_validation_error(e)
        raise ContractError(f"invalid event: {msg}", field=field_) from e


def _draft(revision: int, evs: Sequence[Model | dict[str, Any]], rebase: bool | None) -> dict[str, Any]:
    """The patch draft of ``evs`` based on ``revision``; ``rebase`` defaults to whether every
    event commutes. Raises ``ContractError`` for an event that is not valid."""
    built = [e if isinstance(e, Model) else _event(e) for e in evs]
    if rebase is None:
        rebase = all(e.type in _COMMUTING for e in built) and revision > 0  # type: ignore[attr-defined]
    return {
        "expected_revision": revision,
        "events": [e.model_dump(mode="json", exclude_none=True) for e in built],
        "rebase": rebase,
    }


def _since(decision: Decision, history: list[Decision]) -> list[Decision]:
    return [d for d in history if d.outcome == "accepted" and d.revision > decision.expected_revision]


def _settled(decision: Decision, revision: int) -> int:
    """The handle's revision after an accepted ``decision``; raises :class:`PatchRejected`."""
    if decision.outcome != "accepted":
        raise PatchRejected(decision)
    return max(revision, decision.revision)


class PatchRejected(RunstateError):
    """The run refused a patch: ``decision`` says why (``reason``, ``rule``, ``message``)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        rule = f" [{decision.rule}]" if decision.rule else ""
        super().__init__(
            f"patch {decision.patch_id} of run {decision.run_id!r} rejected: "
            f"{decision.reason}{rule}: {decision.message or ''}".rstrip(": ")
        )


class RevisionConflict(PatchRejected):
    """The patch was based on ``expected`` but the run is at ``current``: read again (the
    decisions accepted since are in ``since``) and propose anew; nothing is retried for you."""

    def __init__(self, decision: Decision, since: list[Decision]) -> None:
        super().__init__(decision)
        self.expected = decision.expected_revision
        self.current = decision.revision
        self.since = since


class Backend(Protocol):
    """Where a :class:`Run` sends patches and reads state: the local log or a serve."""

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision: ...
    def state(self, run_id: str, min_revision: int | None) -> RunState: ...
    def context(self, run_id: str, min_revision: int | None) -> str: ...
    def history(self, run_id: str) -> list[Decision]: ...
    def erase(self, run_id: str, reason: str) -> bool: ...
    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]: ...
    def run_ids(self) -> list[str]: ...
    def close(self) -> None: ...


class _Live:
    """The in-process projector's hooks, for the local backend: a decision reaches its
    waiter when its batch is stored (no polling of the projection), and reads use the
    projector's own stores (no read-only store opened per read)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.stores: dict[int, Any] = {}
        self.changed = threading.Condition()
        #: decisions awaited by a submit in this process, once made
        self.awaited: dict[tuple[str, str], Decision | None] = {}
        #: set once the projector holds every partition's store, or found the group taken
        self.ready = threading.Event()

    def on_assign(self, partition: int, store: Any) -> None:
        self.stores[partition] = store
        if len(self.stores) >= self.partitions:
            self.ready.set()

    def on_accepted(self, partition: int, patch: Any, decision: Any, doc: Any, batch: Any) -> None:
        pass

    def after_write(self, partition: int, batch: Any, store: Any) -> None:
        from runstate.schemas import structs

        with self.changed:
            for d in batch.decisions:
                key = (d.run_id, d.patch_id)
                if key in self.awaited:
                    self.awaited[key] = structs.to_model(d)
            self.changed.notify_all()


class _Local:
    """The embedded log and projections under one directory (``log.db``, ``state/``); with
    ``project``, a projector runs in this process for as long as the backend is open."""

    def __init__(self, where: Path, author: Author, project: bool) -> None:
        from runstate.app import open_settings_log
        from runstate.producers import RunProducer
        from runstate.projector import Projector, decision_at_reader, decision_reader
        from runstate.settings import Settings

        where.mkdir(parents=True, exist_ok=True)
        self.state_dir = str(where / "state")
        self.author = author
        # RUNSTATE_MASTER_KEY (or _FILE) seals the runs' content, as everywhere: then erasable.
        settings = Settings(log=str(where / "log.db"), state_dir=self.state_dir)
        self.log = open_settings_log(settings)
        # RUNSTATE_MAX_PATCH_BYTES holds here as everywhere (the error names it).
        self.producer = RunProducer(
            self.log,
            author,
            decisions=decision_reader(self.state_dir),
            decisions_at=decision_at_reader(self.state_dir),
            max_patch_bytes=settings.max_patch_bytes,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: _Live | None = None
        self._layout: Any = None
        if project:
            live = _Live(self.log.partitions(self.log.topics.events))
            projector = Projector(
                self.log, self.state_dir, publish_dead_letters=False, hooks=live, destroy_erased_keys=True
            )
            taken: list[str] = []

            def run() -> None:
                try:
                    projector.run(stop=self._stop, poll_timeout_s=0.02)
                except LogError as e:
                    if "already has a member" not in str(e):
                        raise
                    taken.append(str(e))
                    live.ready.set()

            self._thread = threading.Thread(target=run, name="runstate-projector", daemon=True)
            self._thread.start()
            # Until the projector holds the log's group, or another process (or handle) does:
            # then that one decides, and this handle appends and reads its decisions from
            # the projection (as with project=False), instead of waiting on a dead thread.
            live.ready.wait(_JOIN_S)
            if taken:
                log.info(
                    "another projector decides %s (%s): this handle appends and reads its decisions",
                    where,
                    taken[0].split(": ", 1)[-1].split(".", 1)[0],
                )
                self._thread = None
            else:
                self._live = live

    def _store(self, run_id: str) -> Any:
        """The in-process projector's store of the run's partition, or None (no projector here, or not yet assigned)."""
        if self._live is None or not self._live.stores:
            return None
        from runstate.projector.store.statedir import Layout

        if self._layout is None:
            self._layout = Layout(self.state_dir)
        return self._live.stores.get(self._layout.partition_of(run_id))

    def _read(self, run_id: str, min_revision: int | None, how: str, timeout_s: float = 10.0) -> Any:
        """``Projection.<how>(run_id)``, once the projection holds ``min_revision`` (the
        handle's own writes); without one, as it is now. Raises ``RunNotFound``."""
        import time

        from runstate.projector import Projection
        from runstate.schemas.errors import RunNotFound

        deadline = time.monotonic() + timeout_s
        while True:
            # Opened anew each time: a read-only store sees the projection as of its opening.
            with Projection(self.state_dir) as proj:
                try:
                    if min_revision is None or proj.state_data(run_id)["revision"] >= min_revision:
                        return getattr(proj, how)(run_id)
                except RunNotFound:
                    if min_revision is None or time.monotonic() > deadline:
                        raise
                if time.monotonic() > deadline:
                    return getattr(proj, how)(run_id)
            time.sleep(0.02)

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        patch = self.producer.build(run_id, draft)
        live = self._live
        if live is None:
            return self.producer.submit(patch, timeout_s=timeout_s)
        import time

        key = (run_id, patch.patch_id)
        with live.changed:
            live.awaited[key] = None
        try:
            self.producer.append(patch)
            deadline = time.monotonic() + timeout_s
            with live.changed:
                while (d := live.awaited[key]) is None and time.monotonic() < deadline:
                    live.changed.wait(0.05)
                    if live.awaited[key] is None and (st := self._store(run_id)) is not None:
                        # A resent patch id gets no new decision: the earlier one is the answer.
                        live.awaited[key] = st.decision(run_id, patch.patch_id)
            if d is not None:
                return d
            try:  # the projection's answer, last (a decision stored before this wait began)
                return self.producer.wait(run_id, patch.patch_id, 0.0)
            except DecisionTimeout:
                raise DecisionTimeout(run_id, patch.patch_id, timeout_s) from None
        finally:
            with live.changed:
                live.awaited.pop(key, None)

    def state(self, run_id: str, min_revision: int | None) -> RunState:
        return self._read(run_id, min_revision, "state")  # type: ignore[no-any-return]

    def context(self, run_id: str, min_revision: int | None) -> str:
        return self._read(run_id, min_revision, "context")  # type: ignore[no-any-return]

    def history(self, run_id: str) -> list[Decision]:
        return self._read(run_id, None, "history")  # type: ignore[no-any-return]

    def erase(self, run_id: str, reason: str) -> bool:
        """Erase the run (False: content is not sealed here, no master key; nothing done)."""
        from runstate.app import erase_run
        from runstate.eventlog.sealed import SealedLog
        from runstate.schemas.errors import RunNotFound

        if not isinstance(self.log, SealedLog):
            return False
        try:
            done = erase_run(self.log, run_id, reason, self.author.agent_id, self.author, 0)
        except RunNotFound:
            return True  # nothing of it was ever sealed: nothing to erase
        if done.first and done.patch_id is not None:
            self.producer.wait(run_id, done.patch_id, 10.0)
        return True

    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        import orjson

        from runstate.projector import Projection

        st = self._store(run_id)
        if st is not None:  # the projector's own store: what it decided is there
            raw = st.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit)
        else:
            with Projection(self.state_dir) as proj:
                raw = proj.graph_checkpoints(run_id, ns, checkpoint_id=checkpoint_id, before=before, limit=limit)
        return [orjson.loads(r) for r in raw]

    def run_ids(self) -> list[str]:
        """Every run of the projection (what LangGraph's ``delete_for_runs`` searches)."""
        from runstate.projector import Projection

        with Projection(self.state_dir) as proj:
            return [h.run_id for h in proj.runs()]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.producer.close()
        self.log.close()


class _Remote:
    """A ``runstate serve`` at ``url`` (``runstate.client.Client``): the author is the token's."""

    def __init__(self, url: str, token: str | None, author: Author) -> None:
        from runstate.client import Client

        self.client = Client(url, token)
        self.author = author

    def submit(self, run_id: str, draft: dict[str, Any], timeout_s: float) -> Decision:
        return self.client.submit(run_id, {**draft, "author": self.author.model_dump()}, timeout_s=timeout_s)

    def state(self, run_id: str, min_revision: int | None) -> RunState:
        return self.client.state(run_id, min_revision=min_revision)

    def context(self, run_id: str, min_revision: int | None) -> str:
        return self.client.context(run_id, min_revision=min_revision)

    def history(self, run_id: str) -> list[Decision]:
        return self.client.history(run_id)

    def erase(self, run_id: str, reason: str) -> bool:
        from runstate.client import ServiceError

        try:
            self.client.erase(run_id, reason)
        except ServiceError as e:
            if e.status == 409:
                return False  # the deployment seals no content
            if e.status != 404:
                raise
        return True

    def graph_checkpoints(
        self, run_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> list[dict[str, Any]]:
        return self.client.graph_checkpoints(run_id, ns=ns, checkpoint_id=checkpoint_id, before=before, limit=limit)

    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.client.runs()]

    def close(self) -> None:
        self.client.close()


@dataclass
class ToolCall:
    """A tool call in flight (:meth:`Run.tool_call`): name its result with :meth:`result`."""

    call_id: str
    tool: str
    ref: str | None = None
    artifact: events.ArtifactSpec | None = field(default=None, repr=False)

    def result(self, ref: str, *, kind: str | None = None, digest: str | None = None) -> str:
        """The reference of what the tool returned (``artifact://…``): recorded with its
        success, it becomes an artifact of the run that facts may cite as evidence. Returns
        ``ref``."""
        self.ref = ref
        if kind is not None or digest is not None:
            self.artifact = events.ArtifactSpec(id=ref, kind=kind or "tool_result", digest=digest, call_id=self.call_id)
        return ref


class _Builders(Generic[R]):
    """A handle's own state (run id, last seen revision, open calls) and the typed wrappers
    over the contract's events, shared by :class:`Run` and
    :class:`AsyncRun`: each returns what ``submit`` returns (a decision, or an awaitable of
    one). Nothing here adds a rule: the reducer decides."""

    def __init__(self, run_id: str, timeout_s: float) -> None:
        self.run_id = run_id
        self.timeout_s = timeout_s
        #: the revision this handle last saw (0: not started, or not read yet)
        self.revision = 0
        self._state: RunState | None = None
        self._open_calls: dict[str, ToolCall] = {}

    def submit(self, *evs: Model | dict[str, Any], rebase: bool | None = None) -> R:
        raise NotImplementedError

    def start(
        self,
        goal: str,
        *,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        acceptance: Sequence[str] = (),
        policy: dict[str, Any] | None = None,
    ) -> Decision:
        """``RunStarted``: the run's first patch (revision 0 → 1)."""
        spec = events.GoalSpec(
            statement=goal,
            scope=events.Scope(include=list(include), exclude=list(exclude)),
            acceptance=list(acceptance),
        )
        return self.submit(events.RunStarted(goal=spec, policy=events.RunPolicy(**(policy or {}))))

    def fact(
        self,
        fact_id: str,
        statement: str,
        *,
        evidence: str | None = None,
        source: str | None = None,
        observed_at: datetime | None = None,
        scope: str | None = None,
    ) -> Decision:
        """``FactConfirmed``: needs ``evidence`` the run knows or an authoritative ``source``."""
        return self.submit(
            events.FactConfirmed(
                fact=events.FactSpec(
                    id=fact_id,
                    statement=statement,
                    evidence=evidence,
                    source=source,
                    observed_at=observed_at,
                    scope=scope,
                )
            )
        )

    def hypothesis(self, hypothesis_id: str, statement: str, *, confidence: float, falsifier: str) -> Decision:
        """``HypothesisProposed``: a guess, with how sure and how to prove it wrong."""
        return self.submit(
            events.HypothesisProposed(
                hypothesis=events.HypothesisSpec(
                    id=hypothesis_id, statement=statement, confidence=confidence, falsifier=falsifier
                )
            )
        )

    def confirm(
        self,
        hypothesis_id: str,
        *,
        fact_id: str,
        statement: str,
        evidence: str | None = None,
        source: str | None = None,
    ) -> Decision:
        """The hypothesis becomes a fact (``FactConfirmed(replaces_hypothesis_id=…)``)."""
        return self.submit(
            events.FactConfirmed(
                fact=events.FactSpec(id=fact_id, statement=statement, evidence=evidence, source=source),
                replaces_hypothesis_id=hypothesis_id,
            )
        )

    def observe(
        self,
        subject: str,
        state: str,
        *,
        version: str | None = None,
        evidence: str | None = None,
        observed_at: datetime | None = None,
    ) -> Decision:
        """``ObservationRecorded``: what was seen of an external system, never a fact."""
        return self.submit(
            events.ObservationRecorded(
                observation=events.ObservationSpec(
                    subject=subject,
                    observed_state=state,
                    observed_version=version,
                    evidence=evidence,
                    observed_at=observed_at,
                )
            )
        )

    def task(self, task_id: str, title: str, *, depends_on: Sequence[str] = (), scope: Sequence[str] = ()) -> Decision:
        """``TaskCreated``: a pending task (dependencies must exist: checked here against the
        last state read, and by the reducer)."""
        self._known_tasks(depends_on)
        return self.submit(
            events.TaskCreated(
                task=events.TaskSpec(id=task_id, title=title, depends_on=list(depends_on), scope=list(scope))
            )
        )

    def start_task(self, task_id: str) -> Decision:
        self._known_tasks([task_id])
        return self.submit(events.TaskStarted(task_id=task_id))

    def complete_task(self, task_id: str, *, evidence: str) -> Decision:
        self._known_tasks([task_id])
        return self.submit(events.TaskCompleted(task_id=task_id, evidence=evidence))

    def block_task(self, task_id: str, *, reason: str) -> Decision:
        self._known_tasks([task_id])
        return self.submit(events.TaskBlocked(task_id=task_id, reason=reason))

    def wait_for_approval(self, wait_id: str, reason: str, *, until: datetime | None = None) -> Decision:
        """``WaitingStarted`` of kind approval: side-effecting calls are refused until resolved."""
        return self.submit(
            events.WaitingStarted(
                waiting=events.WaitingSpec(wait_id=wait_id, kind="approval", reason=reason, until=until)
            )
        )

    def resolve_wait(self, wait_id: str) -> Decision:
        return self.submit(events.WaitingResolved(wait_id=wait_id))

    def budget(self, *, tokens_remaining: int | None = None, deadline: datetime | None = None) -> Decision:
        return self.submit(events.BudgetSet(tokens_remaining=tokens_remaining, deadline=deadline))

    def consume(self, tokens: int) -> Decision:
        return self.submit(events.BudgetConsumed(tokens=tokens))

    def complete(self, *, summary: str | None = None, evidence: str | None = None) -> Decision:
        return self.submit(events.RunCompleted(summary=summary, evidence=evidence))

    def _known_tasks(self, task_ids: Sequence[str]) -> None:
        """Refuse, before sending, a task id the last state read does not have."""
        if self._state is None or not task_ids:
            return
        known = {t.id for t in self._state.tasks}
        unknown = [t for t in task_ids if t not in known]
        if unknown:
            raise ContractError(
                f"run {self.run_id!r} at revision {self._state.revision} has no task {', '.join(map(repr, unknown))}",
                field="task_id",
            )


def _call_started(
    call: ToolCall, side_effect: bool, costly: bool, relies_on: Sequence[tuple[str, str]]
) -> events.ToolCallStarted:
    return events.ToolCallStarted(
        call_id=call.call_id,
        tool=call.tool,
        side_effect=side_effect,
        costly=costly,
        relies_on=[events.ObservedVersion(subject=s, observed_version=v) for s, v in relies_on],
    )


def _call_failed(call: ToolCall, error: BaseException | str) -> events.ToolFailed:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return events.ToolFailed(call_id=call.call_id, error=text[:2000], result_ref=call.ref)


def _call_done(call: ToolCall) -> list[Model]:
    """The events that close a call that succeeded: its result's artifact (when named with
    a kind or digest), then ``ToolSucceeded``."""
    done: list[Model] = [] if call.artifact is None else [events.ArtifactRecorded(artifact=call.artifact)]
    return [*done, events.ToolSucceeded(call_id=call.call_id, result_ref=call.ref)]


def _effect(
    eid: str,
    status: str,
    kind: str,
    target: str,
    idempotency_key: str,
    call_id: str | None,
    error: BaseException | None = None,
) -> events.EffectRecorded:
    evidence = None if error is None else f"{type(error).__name__}: {error}"[:2000]
    return events.EffectRecorded(
        effect=events.EffectSpec(
            id=eid,
            status=status,
            kind=kind,
            target=target,  # type: ignore[arg-type]
            idempotency_key=idempotency_key,
            call_id=call_id,
            evidence=evidence,
        )
    )


_CLOSED_OPEN = "the run handle closed with the call open"


def _result_refused(e: PatchRejected) -> str:
    d = e.decision
    return f"its result was rejected: {d.reason}{f' [{d.rule}]' if d.rule else ''}: {d.message or ''}".rstrip(": ")


class Run(_Builders[Decision]):
    """One run as an agent worker sees it. Not thread-safe: one handle per worker."""

    def __init__(self, backend: Backend, run_id: str, *, timeout_s: float = 10.0) -> None:
        super().__init__(run_id, timeout_s)
        self.backend = backend

    # -- reading ------------------------------------------------------------------------

    def state(self) -> RunState:
        """The run's state, at least at the revision this handle last saw."""
        self._state = self.backend.state(self.run_id, self.revision or None)
        self.revision = max(self.revision, self._state.revision)
        return self._state

    def context(self) -> str:
        """The compact context for the model's prompt (at least at the last seen revision)."""
        return self.backend.context(self.run_id, self.revision or None)

    def refresh(self) -> int:
        """Read the run again; returns its current revision."""
        return self.state().revision

    # -- writing ------------------------------------------------------------------------

    def submit(self, *evs: Model | dict[str, Any], rebase: bool | None = None) -> Decision:
        """Append ``evs`` as one patch (all or none), based on the last seen revision, and
        return the accepted decision. ``rebase`` defaults to whether every event commutes.

        Raises :class:`RevisionConflict` (with the current revision and what was accepted
        since), :class:`PatchRejected` for any other rejection, ``ContractError`` for an
        event that is not valid before anything is sent."""
        decision = self.backend.submit(self.run_id, _draft(self.revision, evs, rebase), self.timeout_s)
        if decision.reason in ("revision_conflict", "superseded"):
            raise RevisionConflict(decision, _since(decision, self.backend.history(self.run_id)))
        self.revision = _settled(decision, self.revision)
        self._state = None
        return decision

    @contextmanager
    def tool_call(
        self,
        tool: str,
        *,
        side_effect: bool = False,
        costly: bool = False,
        relies_on: Sequence[tuple[str, str]] = (),
        call_id: str | None = None,
    ) -> Iterator[ToolCall]:
        """Record ``ToolCallStarted`` before the body and ``ToolSucceeded`` (with the result
        named by :meth:`ToolCall.result`) after it; an exception in the body is recorded as
        ``ToolFailed`` and re-raised. ``relies_on``: ``(subject, observed_version)`` of the
        observations a side-effecting call depends on (refused when stale)."""
        call = ToolCall(call_id or f"call_{uuid.uuid4().hex[:12]}", tool)
        self.submit(_call_started(call, side_effect, costly, relies_on))
        self._open_calls[call.call_id] = call
        try:
            yield call
        except BaseException as e:
            if self._open_calls.pop(call.call_id, None) is None:
                raise  # close() already recorded it as failed
            self.submit(_call_failed(call, e))
            raise
        self._open_calls.pop(call.call_id, None)
        try:
            self.submit(*_call_done(call), rebase=False)
        except PatchRejected as e:
            # The call ran; only its result was refused. Closed as failed with the reason,
            # or it stays in flight and the run can never complete.
            self.submit(_call_failed(call, _result_refused(e)))
            raise

    @contextmanager
    def effect(
        self, kind: str, target: str, idempotency_key: str, *, effect_id: str | None = None, call_id: str | None = None
    ) -> Iterator[str]:
        """Record the side effect *before* making it (``EffectRecorded`` started), then
        committed after the body or failed if it raises. A crash between the two leaves the
        run ``needs_reconciliation`` with this effect named. Yields the effect id."""
        eid = effect_id or f"effect_{uuid.uuid4().hex[:12]}"
        self.submit(_effect(eid, "started", kind, target, idempotency_key, call_id))
        try:
            yield eid
        except BaseException as e:
            self.submit(_effect(eid, "failed", kind, target, idempotency_key, call_id, e))
            raise
        self.submit(_effect(eid, "committed", kind, target, idempotency_key, call_id))

    def close(self) -> None:
        """Record every tool call still open as failed (never left in flight silently), then
        release the backend."""
        try:
            for call in list(self._open_calls.values()):
                self.submit(_call_failed(call, _CLOSED_OPEN))
            self._open_calls.clear()
        finally:
            self.backend.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def backend(where: str | Path, author: Author, *, token: str | None = None, project: bool = True) -> Backend:
    """The backend for ``where``: a ``runstate serve`` for an ``http(s)://`` URL (``token``
    if it needs one), else the embedded log and projections in that directory (created if
    missing; ``project``: with a projector in this process while the backend is open)."""
    text = str(where)
    if text.startswith(("http://", "https://")):
        return _Remote(text, token, author)
    return _Local(Path(text), author, project)


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


def open_run(
    where: str | Path,
    run_id: str,
    *,
    agent_id: str,
    agent_version: str,
    token: str | None = None,
    project: bool = True,
    timeout_s: float = 10.0,
) -> Run:
    """A :class:`Run` handle on ``run_id``.

    ``where``: an ``http(s)://`` URL of a ``runstate serve`` (``token`` if it needs one), or
    a directory holding the embedded log and its projections (``log.db``, ``state/``),
    created if missing; there ``project`` runs the projector in this process while the
    handle is open (leave it off when ``runstate project`` or ``serve`` runs on that log).
    The handle reads the run's revision now if the run exists."""
    author = Author(agent_id=agent_id, agent_version=agent_version)
    run = Run(backend(where, author, token=token, project=project), run_id, timeout_s=timeout_s)
    try:
        run.refresh()
    except RunNotFound:
        pass  # not started yet (an unreachable service or an erased run is said at once)
    return run
