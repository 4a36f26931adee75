"""The synchronous handle, :class:`Run`, and what the asyncio one shares with it: tool calls,
effects and the events they record."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from runstate.agent.backends import Backend, backend
from runstate.agent.patches import PatchRejected, RevisionConflict, _draft, _settled, _since
from runstate.schemas import events
from runstate.schemas.errors import (
    ContractError,
    RunNotFound,
)
from runstate.schemas.events import Model
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import RunState

R = TypeVar("R")


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
