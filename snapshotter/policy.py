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
#: The purely periodic triggers the byte budget defers (with ``every_K``); every boundary of
#: the document is always taken, and so is ``age``, which bounds a restore's tail.
BUDGETED = frozenset({"quiet"})


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """``every`` revisions per run; ``max_age`` records: a run whose newest checkpoint
    covers less than ``log position - max_age`` is checkpointed again (trigger ``age``),
    so that recovery never has to read far back for an idle run; ``quiet_s`` seconds: once
    a partition has had no new record for that long, each run with records past its newest
    checkpoint is checkpointed (trigger ``quiet``), so that a quiet log is covered to its
    end and a restore replays nothing of it.

    ``bytes_ratio``: the checkpoints a run writes for the periodic triggers ``every_K`` and
    ``quiet`` weigh about this many times its records (``age`` is always taken: it bounds
    the restore's tail): such a trigger is taken once
    the records since the run's last checkpoint weigh ``1 / bytes_ratio`` of that
    checkpoint's head (what every checkpoint writes; its bundle follows what changed, which
    the records bound). The document's
    boundaries (the run's start, a group of tasks done, entering a wait, before a
    side-effecting or costly call, a new workspace version, a lease released, the end, an
    erasure) are always taken. None: every trigger is taken."""

    every: int = 50
    max_age: int = 20_000
    bytes_ratio: float | None = 2.0
    quiet_s: float = 5.0

    def __post_init__(self) -> None:
        if self.every < 1 or self.max_age < 1:
            raise ValueError("every and max_age must be >= 1")
        if self.quiet_s < 0:
            raise ValueError("quiet_s must be >= 0")
        if self.bytes_ratio is not None and self.bytes_ratio <= 0:
            raise ValueError("bytes_ratio must be > 0")

    def budgeted(self, triggers: list[str]) -> bool:
        """Whether every one of ``triggers`` is one the byte budget may defer."""
        return all(t in BUDGETED or t.startswith("every_") for t in triggers)

    def within_budget(self, since_bytes: int, last_checkpoint_bytes: int) -> bool:
        """Whether a run whose records since its last checkpoint (of ``last_checkpoint_bytes``)
        weigh ``since_bytes`` may be checkpointed now for a periodic trigger."""
        return self.bytes_ratio is None or since_bytes * self.bytes_ratio >= last_checkpoint_bytes

    def triggers(self, patch: Patch, revision: int, doc: RunDoc) -> list[str]:
        """Why the state after ``patch`` (at ``revision``) is a checkpoint; empty if not."""
        out = []
        types = {e.type for e in patch.events}
        if revision == 1:
            out.append("run_started")
        if revision % self.every == 0:
            out.append(f"every_{self.every}")
        if types & _TASK_ENDS and not doc.header.running_task_ids:  # the header's, not a walk of every task
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
