"""Builders shared by the tests (not fixtures: plain functions, so hypothesis can use them)."""

from __future__ import annotations

import itertools
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from runstate import app
from runstate.eventlog.base import EventLog
from runstate.projector import Projector
from runstate.projector.core.outcomes import DeadLetter
from runstate.projector.core.runbook import RunBook
from runstate.schemas.codec import encode
from runstate.schemas.errors import RunNotFound
from runstate.schemas.patch import Author, Decision, Patch
from runstate.settings import Settings

T0 = datetime(2026, 8, 11, 8, 0, tzinfo=UTC)

#: The thorough run (CI, or RUNSTATE_THOROUGH=1) draws every property's full number of
#: examples; a local run draws a sixth of them, so that the default run stays fast.
THOROUGH = os.environ.get("CI", "").lower() in ("1", "true", "yes") or bool(os.environ.get("RUNSTATE_THOROUGH"))


def embedded_env(where: Path) -> dict[str, str]:
    """The settings (environment) of runstate on an embedded log in ``where``: ``log.db``, ``state/``."""
    return {"RUNSTATE_LOG": str(where / "log.db"), "RUNSTATE_STATE_DIR": str(where / "state")}


def cli_env(settings: Settings, master_key: str | None = None) -> dict[str, str]:
    """The environment of a CLI command on ``settings``' embedded log: its state directory,
    partitions and master key (``master_key`` instead of the settings' own)."""
    if master_key is None and settings.master_key is not None:
        master_key = settings.master_key.get_secret_value()
    env = {"RUNSTATE_LOG": settings.log, "RUNSTATE_STATE_DIR": settings.state_dir}
    env["RUNSTATE_PARTITIONS"] = str(settings.partitions)
    if master_key is not None:
        env["RUNSTATE_MASTER_KEY"] = master_key
    return env


def publish_all(settings: Settings, run_id: str, patches: list[dict[str, Any]]) -> None:
    """Publish ``patches`` to ``run_id`` in order, without waiting for their decisions."""
    for p in patches:
        app.publish(settings, run_id, p, where="test")


def unservable_letters(settings: Settings, run_id: str) -> list[DeadLetter]:
    """Project the log, check that ``run_id`` has no state to serve, and return its dead letters."""
    app.project(settings, until_caught_up=True)
    try:
        app.get_state(settings, run_id)
    except RunNotFound:
        return [d for d in app.dead_letters(settings) if d.key == run_id]
    raise AssertionError(f"run {run_id!r} has a state")


def examples(n: int, floor: int = 15) -> int:
    """How many examples a property with ``n`` in the thorough run draws in this run."""
    return n if THOROUGH else max(floor, n // 6)


#: The client's example patch (its document, chapter Run State), verbatim.
CLIENT_EXAMPLE = """{"expected_revision": 18,
 "events": [
   {"type": "FactConfirmed", "fact": {"id": "fact_13", "statement": "...", "evidence": "artifact://test-output/48"}},
   {"type": "TaskCompleted", "task_id": "task_3", "evidence": "artifact://test-output/48"}]}"""
_ids = itertools.count()


#: The client's reference Run State document, as runstate 0.1 labelled it (schema_version 1; the document says 3).
V1_DOC = {  # the client's reference document
    "schema_version": 1,
    "run_id": "run_128",
    "revision": 18,
    "goal": {
        "statement": "修复依赖升级后的登录失败",
        "scope": {"include": ["src/auth", "tests/login"], "exclude": ["public_api"]},
        "acceptance": ["test_login_refresh 通过", "公开 API 无变化"],
    },
    "phase": "diagnose",
    "status": "running",
    "active_task_id": "task_3",
    "confirmed_facts": [
        {
            "id": "fact_12",
            "statement": "session token 实际使用 RS256",
            "evidence": "artifact://test-output/47",
            "observed_at": "2026-08-11T16:22:10+08:00",
        }
    ],
    "hypotheses": [
        {
            "id": "hyp_4",
            "statement": "配置覆盖顺序在依赖升级后发生变化",
            "confidence": 0.66,
            "falsifier": "运行配置解析单测",
        }
    ],
    "open_questions": ["测试 fixture 是否仍显式固定 HS256？"],
    "tasks": [{"id": "task_3", "title": "确认算法配置来源", "status": "running", "depends_on": []}],
    "last_transition": {"action": "run_test", "result_ref": "artifact://test-output/47"},
    "waiting": None,
    "budgets": {"tokens_remaining": 84000, "deadline": "2026-08-11T18:00:00+08:00"},
    "workspace_ref": "workspace://ws_71@commit:3bc92e",
    "effect_ledger_ref": "effects://run_128@rev4",
}


#: The repository's root, and the tests' own folder (shared helpers, data/): what a test
#: in any room names paths by, whatever its depth.
ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
#: The pages whose examples the tests run: the README and the docs site.
DOC_PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))


def doc_blocks(lang: str, page: str | None = None) -> list[str]:
    """The fenced code blocks of ``lang`` in ``page`` (every page: None), as written."""
    out = []
    for name in DOC_PAGES if page is None else (page,):
        out += re.findall(rf"```{lang}\n(.*?)```", (ROOT / name).read_text(), flags=re.S)
    return out


def readme_blocks(lang: str) -> list[str]:
    """The README's fenced code blocks of ``lang``, as written."""
    return doc_blocks(lang, "README.md")


def patch(
    run_id: str,
    expected: int,
    *events: dict[str, Any],
    rebase: bool = False,
    patch_id: str | None = None,
    agent: str = "agent-1",
    version: str = "v1",
    minute: int = 0,
) -> Patch:
    """A validated patch with deterministic ids/times unless given."""
    return Patch.model_validate(
        {
            "patch_id": patch_id or f"p{next(_ids)}",
            "run_id": run_id,
            "expected_revision": expected,
            "events": list(events),
            "author": Author(agent_id=agent, agent_version=version),
            "created_at": T0 + timedelta(minutes=minute),
            "rebase": rebase,
        }
    )


#: Tests of other rules cite ``artifact://`` references they never register; their runs trust
#: that scheme. The evidence rules are tested on runs that trust none (tests/projector/test_rules.py).
TRUST_ARTIFACTS = {"external_evidence_schemes": ["artifact"]}


def start(
    goal: str = "fix login",
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "type": "RunStarted",
        "goal": {"statement": goal, "scope": {"include": include or [], "exclude": exclude or []}},
        "policy": {**TRUST_ARTIFACTS, **(policy or {})},
    }


def fact(id_: str, evidence: str | None = "artifact://out/1", **kw: Any) -> dict[str, Any]:
    return {"type": "FactConfirmed", "fact": {"id": id_, "statement": f"statement {id_}", "evidence": evidence, **kw}}


def task(id_: str, deps: list[str] | None = None, scope: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "TaskCreated",
        "task": {"id": id_, "title": f"task {id_}", "depends_on": deps or [], "scope": scope or []},
    }


def ev(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, **fields}


def append_all(log: EventLog, patches: list[Patch]) -> list[tuple[Patch, int, int]]:
    """Append patches keyed by run; returns (patch, partition, offset) in append order."""
    prod = log.producer()
    out = []
    for p in patches:
        a = prod.append(log.topics.events, p.run_id, encode(p))
        out.append((p, a.partition, a.offset))
    prod.close()
    return out


def project_all(log: EventLog, state_dir: str | Path, **kw: Any) -> Projector:
    """Project ``log`` into the stores in ``state_dir`` until it is caught up; ``kw`` for the
    :class:`Projector` (no dead-letter topic unless ``publish_dead_letters``)."""
    pr = Projector(log, str(state_dir), **{"publish_dead_letters": False, **kw})
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    return pr


def fold(placed: list[tuple[Patch, int, int]]) -> RunBook:
    """The pure core over ``(patch, partition, offset)`` in the given order, in memory: the
    oracle the tests compare the projector (log -> store) against."""
    book = RunBook()
    for p, partition, offset in placed:
        book.apply(p, partition, offset)
    return book


def rejected_decision(p: Patch, message: str = "at 3") -> Decision:
    """A ``revision_conflict`` rejection of ``p`` with every field set: what the codec tests
    write and read back (runstate's and Java's)."""
    return Decision(
        patch_id=p.patch_id,
        run_id=p.run_id,
        outcome="rejected",
        revision=3,
        expected_revision=0,
        reason="revision_conflict",
        message=message,
        partition=2,
        offset=41,
        agent_id="a",
        agent_version="1",
        event_types=["FactConfirmed"],
        created_at=p.created_at,
        content_digest="ab" * 16,
    )
