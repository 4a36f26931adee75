"""runstate: a durable, typed answer to "where is this agent run now?".

One import root over the layers (each its own folder in the repository)::

    runstate.schemas      the contract: events, patch, decision, Run State, Avro codec, migrations
    runstate.eventlog     the log interface, the embedded SQLite log, the Kafka backend
    runstate.producers    RunProducer (what an agent worker appends with)
    runstate.projector    decide + reduce (pure), the RocksDB store, the consume loop, queries, replay
    runstate.snapshotter  checkpoints at safe boundaries, recovery (checkpoint + tail)
    runstate.testing      the log conformance suite, for any backend
    runstate.compose      how a Kafka broker starts (docker-compose file, a no-Docker broker)

The names below are the public API; everything else is reached through its layer.
"""

from __future__ import annotations

import os as _os
from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

try:
    __version__: str = _version("runstate")
except _NotInstalled:  # a checkout imported without installing it
    __version__ = "0+unknown"

# In a source checkout the layers are sibling folders of this one (the client fixed that
# layout); an installed wheel has them inside it (pyproject's package-dir mapping). Adding
# the checkout's root to this package's path makes ``runstate.schemas`` resolve to
# ``schemas/`` when the checkout itself is imported (from its root, or without installing),
# so every way of running imports the same files.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
_LAYERS = ("schemas", "eventlog", "producers", "projector", "snapshotter")
if not _os.path.isdir(_os.path.join(_here, "schemas")) and all(
    _os.path.isfile(_os.path.join(_root, layer, "__init__.py")) for layer in _LAYERS
):
    __path__.append(_root)  # noqa: F821 - defined for packages

from runstate.eventlog import EventLog, open_log  # noqa: E402
from runstate.producers import Receipt, RunProducer  # noqa: E402
from runstate.projector import Projection, Projector, decision_reader  # noqa: E402
from runstate.schemas import Author, Decision, Patch, PatchDraft, RunState  # noqa: E402
from runstate.schemas.errors import (  # noqa: E402
    CheckpointInvalid,
    ContractError,
    DecisionTimeout,
    DecodeError,
    DeliveryError,
    LogConfigError,
    LogError,
    MigrationRequired,
    PatchTooLarge,
    RevisionNotFound,
    RunNotFound,
    RunstateError,
    StoreError,
    StoreLocked,
    UnknownEventType,
)
from runstate.snapshotter import Snapshotter  # noqa: E402

__all__ = [
    "Author", "CheckpointInvalid", "ContractError", "Decision", "DecisionTimeout", "DecodeError",
    "DeliveryError", "EventLog", "LogConfigError", "LogError", "MigrationRequired", "Patch", "PatchDraft",
    "PatchTooLarge", "Projection", "Projector", "Receipt", "RevisionNotFound", "RunNotFound", "RunProducer",
    "RunState", "RunstateError", "Snapshotter", "StoreError", "StoreLocked", "UnknownEventType",
    "decision_reader", "open_log",
]  # fmt: skip
