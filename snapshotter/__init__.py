"""Checkpoints at safe boundaries, their format and verdict, and recovery (checkpoint + tail)."""

from snapshotter.checkpoint import Checkpoint, CheckpointInvalid, validate
from snapshotter.history import CheckpointHistory
from snapshotter.policy import CheckpointPolicy
from snapshotter.process import Snapshotter, snapshotter_dir
from snapshotter.recovery import restore_partition

__all__ = [
    "Checkpoint", "CheckpointHistory", "CheckpointInvalid", "CheckpointPolicy", "Snapshotter",
    "restore_partition", "snapshotter_dir", "validate",
]  # fmt: skip
