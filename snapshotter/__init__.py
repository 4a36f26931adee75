"""Checkpoints at safe boundaries, their format and verdict, and recovery (checkpoint + tail)."""

from runstate.snapshotter.checkpoint import Checkpoint, CheckpointInvalid, validate
from runstate.snapshotter.history import CheckpointHistory
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.loop import Snapshotter, snapshotter_dir
from runstate.snapshotter.recovery import restore_partition

__all__ = [
    "Checkpoint",
    "CheckpointHistory",
    "CheckpointInvalid",
    "CheckpointPolicy",
    "Snapshotter",
    "restore_partition",
    "snapshotter_dir",
    "validate",
]
