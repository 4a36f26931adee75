"""When to checkpoint: every K revisions, and at the safe boundaries of the client's
document (a group of tasks finished, entering a wait, before a side-effecting or costly
action, a new workspace version, a lease released), plus the run's first revision and
its end so that every run has a checkpoint to recover from."""

from __future__ import annotations

from dataclasses import dataclass

from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Patch
from runstate.schemas.state import TERMINAL_STATUSES

_TASK_ENDS = frozenset({"TaskCompleted", "TaskFailed", "TaskCancelled"})


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """``every`` revisions per run; ``max_age`` records: a run whose newest checkpoint
    covers less than ``log position - max_age`` is checkpointed again (trigger ``age``),
    so that recovery never has to read far back for an idle run."""

    every: int = 50
    max_age: int = 100_000

    def __post_init__(self) -> None:
        if self.every < 1 or self.max_age < 1:
            raise ValueError("every and max_age must be >= 1")

    def triggers(self, patch: Patch, revision: int, doc: RunDoc) -> list[str]:
        """Why the state after ``patch`` (at ``revision``) is a checkpoint; empty if not."""
        out = []
        types = {e.type for e in patch.events}
        if revision == 1:
            out.append("run_started")
        if revision % self.every == 0:
            out.append(f"every_{self.every}")
        if types & _TASK_ENDS:
            tasks = doc.entries("tasks").values()
            if not any(e is not None and e[1].status == "running" for e in tasks):
                out.append("tasks_done")
        if "WaitingStarted" in types:
            out.append("waiting")
        if any(e.type == "ToolCallStarted" and (e.side_effect or e.costly) for e in patch.events):  # type: ignore[attr-defined]
            out.append("before_side_effect")
        if "WorkspaceUpdated" in types:
            out.append("workspace")
        if "LeaseReleased" in types:
            out.append("lease_released")
        if doc.header.status in TERMINAL_STATUSES:
            out.append("terminal")
        return out
