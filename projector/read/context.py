"""The compact text projection of a Run State for an LLM prompt.

Facts, hypotheses and plans are printed in separate, labelled sections so that a model
reading the context cannot mistake "maybe" for "confirmed" or "planned" for "done".
Environment observations are shown as what was seen at a time, flagged stale after
``stale_after``: they are never presented as facts about the present.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec

from runstate.schemas.state import DONE_TASK_STATUSES, RunState


def _when(t: datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t else "?"


#: What a token is taken to be when a context is bounded: characters / 4, a stated
#: approximation (no tokenizer whose vocabulary ships inside a package is a dependency).
CHARS_PER_TOKEN = 4


def approx_tokens(text: str) -> int:
    """The approximate token count of ``text`` (characters / 4, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


class _Line(NamedTuple):
    text: str
    #: what is kept first when the context is bounded (lower first; ties: the order given)
    rank: tuple[int, int]
    #: what the line is one of, for the count of what was left out (None: never left out)
    group: str | None = None


def render_context(
    state: RunState | msgspec.Struct,
    *,
    now: datetime | None = None,
    stale_after: timedelta = timedelta(minutes=15),
    max_tokens: int | None = None,
) -> str:
    """Render ``state`` as compact text. ``now`` (the caller's clock) enables stale flags.

    ``state`` is the :class:`RunState` or its msgspec struct (``structs.struct_of``: the
    same fields with the same types, what the queries decode for this without building the
    models, see ``document.load(..., "struct")``); both give the same text (a property test).

    ``max_tokens`` bounds the text (tokens as characters / 4, :func:`approx_tokens`). What is
    kept first: the run line, the goal and its constraints, the active task, what blocks the
    run (waiting, blocked and running tasks, tool calls in flight, effects of unknown
    outcome), the budget; then open questions; then the facts, newest first; hypotheses;
    pending tasks; observations, stale ones first; finished work, artifacts and inputs. What
    is left out is counted in the text, section by section, and a last line says so. The
    first group is kept even when it alone is over the budget (the line says by how much)."""
    if max_tokens is None:
        texts: list[str] = []
        _lines(state, now, stale_after, lambda text, rank=_REQUIRED, group=None: texts.append(text))
        return "\n".join(texts) + "\n"
    lines: list[_Line] = []
    _lines(state, now, stale_after, lambda text, rank=_REQUIRED, group=None: lines.append(_Line(text, rank, group)))
    return _bounded(lines, max_tokens)


_REQUIRED = (0, 0)


def _lines(state: Any, now: datetime | None, stale_after: timedelta, add: Callable[..., None]) -> None:
    """Every line of the context, in order, each given to ``add(text, rank, group)`` (the
    whole context keeps only the text: no tuple per line where nothing is bounded)."""
    s: Any = state

    add(
        f"RUN {s.run_id} | status: {s.status} | phase: {s.phase or '-'} | revision {s.revision} "
        f"| agent version {s.agent_version}"
    )
    add(f"GOAL: {s.goal.statement}")
    if s.goal.scope.include or s.goal.scope.exclude:
        add(f"  scope: include [{', '.join(s.goal.scope.include)}] exclude [{', '.join(s.goal.scope.exclude)}]")
    for a in s.goal.acceptance:
        add(f"  accept when: {a}")
    for c in s.goal.constraints:
        note = f" (corrects {c.supersedes.value!r} set at r{c.supersedes.set_at_revision})" if c.supersedes else ""
        add(f"  constraint {c.key} = {c.value}{note}")

    add("CONFIRMED FACTS (evidence-backed):" if s.confirmed_facts else "CONFIRMED FACTS: none")
    n_facts = len(s.confirmed_facts)
    for k, f in enumerate(s.confirmed_facts):
        src = f.evidence or f"source: input {f.source}"
        scope = f" [scope {f.scope}]" if f.scope else ""
        add(f"  - [{f.id}] {f.statement} ({src}, observed {_when(f.observed_at)}){scope}", (2, n_facts - k), "facts")

    add("HYPOTHESES (unconfirmed, do not treat as facts):" if s.hypotheses else "HYPOTHESES: none")
    for k, h in enumerate(s.hypotheses):
        add(
            f"  - [{h.id}] {h.statement} (confidence {h.confidence:.2f}; falsify by: {h.falsifier})",
            (3, k),
            "hypotheses",
        )

    if s.open_questions:
        add("OPEN QUESTIONS:")
        for k, q in enumerate(s.open_questions):
            add(f"  - [{q.id}] {q.text}", (1, k), "open questions")

    add("PLAN / TASKS (intentions, not results):" if s.tasks else "PLAN / TASKS: none")
    by_status: dict[str, list[Any]] = {}
    for t in s.tasks:
        by_status.setdefault(t.status, []).append(t)
    scoped_goal = bool(s.goal.scope.include or s.goal.scope.exclude)
    for status in ("running", "blocked", "pending"):
        for k, t in enumerate(by_status.get(status, [])):
            review = " (no scope under a scoped goal: review)" if scoped_goal and not t.scope else ""
            extra = f"{review} - blocked by: {t.blocked_by}" if t.blocked_by else review
            deps = f" (after {', '.join(t.depends_on)})" if t.depends_on and status == "pending" else ""
            mark = (f" (owner {t.owner})" if t.owner else "") + (" <- active" if t.id == s.active_task_id else "")
            rank = _REQUIRED if status != "pending" or t.id == s.active_task_id else (4, k)
            add(
                f"  {status:8} [{t.id}] {t.title}{deps}{extra}{mark}",
                rank,
                None if rank == _REQUIRED else "pending tasks",
            )
    done = {k: len(v) for k, v in by_status.items() if k in DONE_TASK_STATUSES}
    if done:
        add("  finished: " + ", ".join(f"{n} {k}" for k, n in sorted(done.items())), (6, 0), "finished-task summaries")

    if s.waiting:
        w = s.waiting
        overdue = " (OVERDUE)" if w.until and now is not None and now > w.until else ""
        until = f" until {_when(w.until)}{overdue}" if w.until else ""
        add(f"WAITING for {w.kind}: {w.reason} (since {_when(w.since)}{until}; resolve with wait_id {w.wait_id})")

    if s.environment_observations:
        add("ENVIRONMENT (last observations; re-read before risky writes):")
        for k, o in enumerate(s.environment_observations):
            stale = ""
            if now is not None and now - o.observed_at > stale_after:
                stale = " STALE"
            ver = f" @ {o.observed_version}" if o.observed_version else ""
            add(
                f"  - {o.subject}{ver}: {o.observed_state} (seen {_when(o.observed_at)}){stale}",
                (5, 0 if stale else 1),
                "observations",
            )

    if s.artifacts or s.inputs:
        add(
            f"ARTIFACTS: {len(s.artifacts)} known"
            + (f"; INPUTS: {len(s.inputs)} recorded" if s.inputs else "")
            + " (what facts may cite)"
        )
        for k, a in enumerate(s.artifacts[-5:]):
            by = f" from {a.tool} ({a.call_id})" if a.tool else ""
            add(f"  - {a.id} [{a.kind}]{by} r{a.registered_at_revision}", (6, 1 + k), "artifacts")
        for k, i in enumerate(s.inputs[-5:]):
            add(f"  - input {i.id} from {i.origin}" + (f": {i.text}" if i.text else ""), (6, 10 + k), "inputs")
    if s.pending_tool_calls:
        add("TOOL CALLS IN FLIGHT:")
        for c in s.pending_tool_calls:
            flags = ", ".join(x for x, on in (("side effect", c.side_effect), ("costly", c.costly)) if on)
            add(f"  - {c.call_id}: {c.tool}{f' ({flags})' if flags else ''} since r{c.started_at_revision}")
    if s.effect_ledger_ref:
        add(f"EFFECTS: external ledger {s.effect_ledger_ref} (read it before resuming: its outcomes are not here)")
    open_effects = [e for e in s.effect_ledger if e.status == "started"]
    if s.effect_ledger:
        add(f"EFFECTS: {len(s.effect_ledger)} recorded, {len(open_effects)} with unknown outcome")
        for e in open_effects:
            add(f"  - {e.id}: {e.kind or 'effect'} on {e.target or '?'} started, outcome unknown")

    b = s.budgets
    parts = []
    if b.tokens_remaining is not None:
        flag = " (OVER BUDGET)" if b.tokens_remaining < 0 else " (EXHAUSTED)" if b.tokens_remaining == 0 else ""
        parts.append(f"tokens remaining {b.tokens_remaining}{flag}")
    if b.tokens_used:
        parts.append(f"used {b.tokens_used}")
    if b.deadline:
        late = " (PASSED)" if now is not None and now > b.deadline else ""
        parts.append(f"deadline {_when(b.deadline)}{late}")
    if parts:
        add("BUDGET: " + ", ".join(parts))
    if s.last_transition:
        lt = s.last_transition
        add(f"LAST TRANSITION: {lt.action}" + (f" -> {lt.result_ref}" if lt.result_ref else ""))
    if s.revoked_agents:
        add(f"REVOKED AGENTS (their patches are refused): {', '.join(s.revoked_agents)}")
    if s.workspace_ref:
        ws = s.workspace_ref
        add(
            f"WORKSPACE: {ws.workspace_id} base {ws.base_commit or '?'} current {ws.current_commit or '?'}"
            + (f" uncommitted {ws.uncommitted_changes}" if ws.uncommitted_changes else "")
        )


_SINGULAR = {"hypotheses": "hypothesis", "finished-task summaries": "finished-task summary"}


def _noun(n: int, group: str) -> str:
    """``group`` (a plural noun) for ``n`` of it: "facts", but "fact" for one."""
    return group if n != 1 else _SINGULAR.get(group, group[:-1] if group.endswith("s") else group)


def _counted(n: int, group: str) -> str:
    return f"{n} {_noun(n, group)}"


def _left_out(n: int, group: str) -> str:
    return f"  ... {n} more {_noun(n, group)} left out"


def _bounded(lines: list[_Line], max_tokens: int) -> str:
    """The lines that fit ``max_tokens`` by rank, in their order, with what was left out
    counted after each section and in a last line; the whole text, counts and last line
    included, holds the budget unless the required lines alone do not."""
    order = sorted(range(len(lines)), key=lambda i: lines[i].rank)  # sorted() is stable: ties keep their order
    required = {i for i in order if lines[i].rank == _REQUIRED}
    optional = [i for i in order if lines[i].rank != _REQUIRED]

    def text_keeping(k: int) -> str:
        return _render_kept(lines, required | set(optional[:k]), max_tokens)

    # The most lines (a prefix of the rank order: no gaps within a rank) whose whole text fits.
    lo, hi = 0, len(optional)
    if approx_tokens(text_keeping(hi)) > max_tokens:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if approx_tokens(text_keeping(mid)) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        hi = lo
    return text_keeping(hi)


def _render_kept(lines: list[_Line], keep: set[int], max_tokens: int) -> str:
    out: list[str] = []
    left: dict[str, int] = {}
    pending: dict[str, int] = {}
    for i, ln in enumerate(lines):
        if i in keep:
            out.append(ln.text)
        elif ln.group is not None:
            left[ln.group] = left.get(ln.group, 0) + 1
            pending[ln.group] = pending.get(ln.group, 0) + 1
        nxt = lines[i + 1].group if i + 1 < len(lines) else None
        for g in [g for g in pending if g != nxt]:
            out.append(_left_out(pending.pop(g), g))
    body = "\n".join(out) + "\n"
    what = ", ".join(_counted(n, g) for g, n in left.items()) or "nothing"

    def footer(tokens: int) -> str:
        over = (
            (
                f"; OVER the budget by {tokens - max_tokens}: the goal, the active task and what blocks the run are "
                "always kept"
            )
            if tokens > max_tokens
            else ""
        )
        return (
            f"CONTEXT: about {tokens} of {max_tokens} tokens (characters / 4), this line included; "
            f"left out: {what}{over}\n"
        )

    # The count in the last line is of the whole text, the line itself included.
    tokens = approx_tokens(body + footer(approx_tokens(body)))
    for _ in range(3):
        settled = approx_tokens(body + footer(tokens))
        if settled == tokens:
            break
        tokens = settled
    return body + footer(tokens)
