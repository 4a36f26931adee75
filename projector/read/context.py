"""The compact text projection of a Run State for an LLM prompt.

Facts, hypotheses and plans are printed in separate, labelled sections so that a model
reading the context cannot mistake "maybe" for "confirmed" or "planned" for "done".
Environment observations are shown as what was seen at a time, flagged stale after
``stale_after``: they are never presented as facts about the present.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from runstate.schemas.state import RunState


def _when(t: datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t else "?"


def render_context(state: RunState | msgspec.Struct, *, now: datetime | None = None,
                   stale_after: timedelta = timedelta(minutes=15)) -> str:
    """Render ``state`` as compact text. ``now`` (the caller's clock) enables stale flags.

    ``state`` is the :class:`RunState` or its msgspec struct (``structs.struct_of``: the
    same fields with the same types, what the queries decode for this without building the
    models, see ``document.load(..., "struct")``); both give the same text (a property test)."""
    s: Any = state
    lines: list[str] = []
    add = lines.append
    add(f"RUN {s.run_id} | status: {s.status} | phase: {s.phase or '-'} | revision {s.revision} | agent version {s.agent_version}")
    add(f"GOAL: {s.goal.statement}")
    if s.goal.scope.include or s.goal.scope.exclude:
        add(f"  scope: include [{', '.join(s.goal.scope.include)}] exclude [{', '.join(s.goal.scope.exclude)}]")
    for a in s.goal.acceptance:
        add(f"  accept when: {a}")
    for c in s.goal.constraints:
        note = f" (corrects {c.supersedes.value!r} set at r{c.supersedes.set_at_revision})" if c.supersedes else ""
        add(f"  constraint {c.key} = {c.value}{note}")

    add("CONFIRMED FACTS (evidence-backed):" if s.confirmed_facts else "CONFIRMED FACTS: none")
    for f in s.confirmed_facts:
        src = f.evidence or f"source: input {f.source}"
        scope = f" [scope {f.scope}]" if f.scope else ""
        add(f"  - [{f.id}] {f.statement} ({src}, observed {_when(f.observed_at)}){scope}")

    add("HYPOTHESES (unconfirmed, do not treat as facts):" if s.hypotheses else "HYPOTHESES: none")
    for h in s.hypotheses:
        add(f"  - [{h.id}] {h.statement} (confidence {h.confidence:.2f}; falsify by: {h.falsifier})")

    if s.open_questions:
        add("OPEN QUESTIONS:")
        for q in s.open_questions:
            add(f"  - [{q.id}] {q.text}")

    add("PLAN / TASKS (intentions, not results):" if s.tasks else "PLAN / TASKS: none")
    by_status: dict[str, list[Any]] = {}
    for t in s.tasks:
        by_status.setdefault(t.status, []).append(t)
    scoped_goal = bool(s.goal.scope.include or s.goal.scope.exclude)
    for status in ("running", "blocked", "pending"):
        for t in by_status.get(status, []):
            review = " (no scope under a scoped goal: review)" if scoped_goal and not t.scope else ""
            extra = f"{review} - blocked by: {t.blocked_by}" if t.blocked_by else review
            deps = f" (after {', '.join(t.depends_on)})" if t.depends_on and status == "pending" else ""
            mark = (f" (owner {t.owner})" if t.owner else "") + (" <- active" if t.id == s.active_task_id else "")
            add(f"  {status:8} [{t.id}] {t.title}{deps}{extra}{mark}")
    done = {k: len(v) for k, v in by_status.items() if k in ("completed", "failed", "cancelled")}
    if done:
        add("  finished: " + ", ".join(f"{n} {k}" for k, n in sorted(done.items())))

    if s.waiting:
        w = s.waiting
        overdue = " (OVERDUE)" if w.until and now is not None and now > w.until else ""
        until = f" until {_when(w.until)}{overdue}" if w.until else ""
        add(f"WAITING for {w.kind}: {w.reason} (since {_when(w.since)}{until}; resolve with wait_id {w.wait_id})")

    if s.environment_observations:
        add("ENVIRONMENT (last observations; re-read before risky writes):")
        for o in s.environment_observations:
            stale = ""
            if now is not None and now - o.observed_at > stale_after:
                stale = " STALE"
            ver = f" @ {o.observed_version}" if o.observed_version else ""
            add(f"  - {o.subject}{ver}: {o.observed_state} (seen {_when(o.observed_at)}){stale}")

    if s.artifacts or s.inputs:
        add(f"ARTIFACTS: {len(s.artifacts)} known" + (f"; INPUTS: {len(s.inputs)} recorded" if s.inputs else "")
            + " (what facts may cite)")  # fmt: skip
        for a in s.artifacts[-5:]:
            by = f" from {a.tool} ({a.call_id})" if a.tool else ""
            add(f"  - {a.id} [{a.kind}]{by} r{a.registered_at_revision}")
        for i in s.inputs[-5:]:
            add(f"  - input {i.id} from {i.origin}" + (f": {i.text}" if i.text else ""))
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
    if s.workspace_ref:
        ws = s.workspace_ref
        add(f"WORKSPACE: {ws.workspace_id} base {ws.base_commit or '?'} current {ws.current_commit or '?'}"
            + (f" uncommitted {ws.uncommitted_changes}" if ws.uncommitted_changes else ""))  # fmt: skip
    return "\n".join(lines) + "\n"
