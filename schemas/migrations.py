"""Deterministic state migrations, keyed by ``schema_version``.

The versions:

- 1: what runstate 0.1 called the client's reference document (the same document as 3);
- 2: what runstate 0.1 wrote;
- 3: the client's reference Run State, as its document writes it (``schema_version: 3``);
- 4: what this code writes (items carry provenance, tasks an owner, runs a policy).

``MIGRATIONS[v]`` turns a version-``v`` document into the next version on its path
(1 → 3 → 4, 2 → 4). Each function is pure and raises :class:`MigrationRequired` when it
cannot carry every field over safely: a run is never loaded with fields dropped.
:func:`load_state` records where a migrated state came from (``migrated_from``: the
version it was written in and the path taken).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pydantic

from runstate.schemas.errors import MigrationRequired, describe_validation_error
from runstate.schemas.state import CURRENT_SCHEMA_VERSION, RunState

Doc = dict[str, Any]

_WORKSPACE_URI = re.compile(r"^workspace://(?P<ws>[^@/]+)(?:@commit:(?P<commit>[0-9A-Za-z]+))?$")

_V1_KEYS = frozenset(
    {
        "schema_version",
        "run_id",
        "revision",
        "goal",
        "phase",
        "status",
        "active_task_id",
        "confirmed_facts",
        "hypotheses",
        "open_questions",
        "tasks",
        "last_transition",
        "waiting",
        "budgets",
        "workspace_ref",
        "effect_ledger_ref",
        "agent_version",
        "updated_at",
    }
)


def relabel_v1_as_v3(doc: Doc) -> Doc:
    """runstate 0.1 accepted the reference document under ``schema_version: 1``."""
    return {**doc, "schema_version": 3}


def migrate_v2_to_v4(doc: Doc) -> Doc:
    """runstate 0.1's own documents: every field carries over; what v4 added (provenance,
    owners, the run's policy) takes its default (unknown provenance, no owner, no policy)."""
    return {**doc, "schema_version": 4}


def migrate_v3_to_v4(doc: Doc) -> Doc:
    """v3 is the client's reference schema: questions as plain strings, the workspace as a
    ``workspace://ID@commit:SHA`` string, the effect ledger as an external reference, and
    no per-item revisions. v4 makes each of them a typed object.
    """
    run_id = doc.get("run_id")
    unknown = set(doc) - _V1_KEYS
    if unknown:
        raise MigrationRequired(run_id, 3, CURRENT_SCHEMA_VERSION, f"unknown v3 fields {sorted(unknown)}")
    rev = doc.get("revision", 0)
    out: Doc = {k: v for k, v in doc.items() if k not in ("workspace_ref", "open_questions", "waiting")}
    out["schema_version"] = 4

    goal = dict(doc.get("goal") or {})
    goal.setdefault("constraints", [])
    out["goal"] = goal

    facts = []
    for f in doc.get("confirmed_facts") or []:
        if not f.get("observed_at"):
            raise MigrationRequired(run_id, 3, CURRENT_SCHEMA_VERSION, f"fact {f.get('id')!r} has no observed_at")
        facts.append({**f, "confirmed_at_revision": f.get("confirmed_at_revision", rev)})
    out["confirmed_facts"] = facts
    out["hypotheses"] = [{**h, "proposed_at_revision": rev} for h in doc.get("hypotheses") or []]
    out["tasks"] = [{**t, "updated_at_revision": rev} for t in doc.get("tasks") or []]
    out["open_questions"] = [
        {"id": f"q{i + 1}", "text": q, "opened_at_revision": rev} if isinstance(q, str) else q
        for i, q in enumerate(doc.get("open_questions") or [])
    ]

    ws = doc.get("workspace_ref")
    if isinstance(ws, str):
        m = _WORKSPACE_URI.match(ws)
        if not m:
            raise MigrationRequired(
                run_id, 3, CURRENT_SCHEMA_VERSION, f"workspace_ref {ws!r} is not workspace://ID[@commit:SHA]"
            )
        out["workspace_ref"] = {"workspace_id": m["ws"], "current_commit": m["commit"]}
    elif ws is not None:
        out["workspace_ref"] = ws
    waiting = doc.get("waiting")
    if waiting is not None:
        # The reference schema names no wait id: give it a deterministic one (the same
        # document always migrates to the same state) so that it can be resolved.
        w = waiting if isinstance(waiting, dict) else {"reason": str(waiting)}
        kind = w.get("kind", "external_event")
        if kind not in ("user", "approval", "external_event", "timer"):
            raise MigrationRequired(run_id, 3, CURRENT_SCHEMA_VERSION, f"v3 waiting kind {kind!r} is unknown")
        out["waiting"] = {
            "wait_id": w.get("wait_id") or f"migrated-r{rev}",
            "kind": kind,
            "reason": str(w.get("reason") or w.get("for") or "migrated wait"),
            "until": w.get("until"),
            "since": w.get("since"),
            "since_revision": rev,
        }
    out.setdefault("agent_version", "unknown(v3)")
    return out


MIGRATIONS: dict[int, Callable[[Doc], Doc]] = {1: relabel_v1_as_v3, 2: migrate_v2_to_v4, 3: migrate_v3_to_v4}


def load_state(raw: Doc) -> RunState:
    """Load a state document of any known version as the current :class:`RunState`.

    Raises :class:`MigrationRequired` (the input is left unchanged) when the version is
    unknown, newer than this code, or cannot be migrated without loss.
    """
    run_id = raw.get("run_id") if isinstance(raw, dict) else None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if not isinstance(version, int) or version < 1:
        raise MigrationRequired(
            run_id, version, CURRENT_SCHEMA_VERSION, "schema_version missing or not a positive integer"
        )
    if version > CURRENT_SCHEMA_VERSION:
        raise MigrationRequired(run_id, version, CURRENT_SCHEMA_VERSION, "written by a newer runstate")
    doc = raw
    path = [version]
    while doc["schema_version"] < CURRENT_SCHEMA_VERSION:
        step = MIGRATIONS.get(doc["schema_version"])
        if step is None:
            raise MigrationRequired(
                run_id, doc["schema_version"], CURRENT_SCHEMA_VERSION, "no migration from this version"
            )
        doc = step(doc)
        path.append(doc["schema_version"])
    if len(path) > 1:
        doc = {**doc, "migrated_from": {"version": version, "path": path}}
    try:
        return RunState.model_validate(doc)
    except pydantic.ValidationError as e:
        raise MigrationRequired(
            run_id, version, CURRENT_SCHEMA_VERSION, f"invalid after migration: {describe_validation_error(e)[1]}"
        ) from e
