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

from runstate.agent.aio import AsyncBackend, AsyncRun, async_backend, open_async_run
from runstate.agent.backends import Backend, backend
from runstate.agent.handle import Run, ToolCall, open_run
from runstate.agent.patches import _COMMUTING, PatchRejected, RevisionConflict, _draft
from runstate.schemas import events

__all__ = [
    "AsyncBackend",
    "AsyncRun",
    "Backend",
    "PatchRejected",
    "RevisionConflict",
    "Run",
    "ToolCall",
    "async_backend",
    "backend",
    "events",
    "open_async_run",
    "open_run",
    "_COMMUTING",
    "_draft",
]
