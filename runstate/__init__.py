"""runstate: a durable, typed answer to "where is this agent run now?".

One import root over the layers. Each layer keeps the folder the client gave it at the
repository's root; ``runstate/<layer>`` is a symbolic link to it, so that a checkout, an
editable install and the tools that read imports (import-linter) all see one package, and
the wheel maps the folders (``pyproject.toml``'s ``package-dir``)::

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

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

try:
    __version__: str = _version("runstate")
except _NotInstalled:  # a checkout imported without installing it
    __version__ = "0+unknown"

from runstate.eventlog import EventLog, open_log
from runstate.producers import Receipt, RunProducer
from runstate.projector import Projection, Projector, decision_reader
from runstate.schemas import Author, Decision, Patch, PatchDraft, RunState
from runstate.schemas.errors import (
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
from runstate.snapshotter import Snapshotter

__all__ = [
    "Author", "CheckpointInvalid", "ContractError", "Decision", "DecisionTimeout", "DecodeError",
    "DeliveryError", "EventLog", "LogConfigError", "LogError", "MigrationRequired", "Patch", "PatchDraft",
    "PatchTooLarge", "Projection", "Projector", "Receipt", "RevisionNotFound", "RunNotFound", "RunProducer",
    "RunState", "RunstateError", "Snapshotter", "StoreError", "StoreLocked", "UnknownEventType",
    "decision_reader", "open_log",
]  # fmt: skip
