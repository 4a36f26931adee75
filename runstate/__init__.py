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

from typing import TYPE_CHECKING, Any

import importlib
from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

try:
    __version__: str = _version("runstate")
except _NotInstalled:  # a checkout imported without installing it
    __version__ = "0+unknown"

# The public names are imported on first use (PEP 562), so that importing one layer (say
# ``runstate.schemas.structs``, which writes the generated module the core imports) does not
# import every other layer first.
_WHERE: dict[str, str] = {
    "EventLog": "runstate.eventlog",
    "open_log": "runstate.eventlog",
    "Receipt": "runstate.producers",
    "RunProducer": "runstate.producers",
    "Projection": "runstate.projector",
    "Projector": "runstate.projector",
    "decision_reader": "runstate.projector",
    "Author": "runstate.schemas",
    "Decision": "runstate.schemas",
    "Patch": "runstate.schemas",
    "PatchDraft": "runstate.schemas",
    "RunState": "runstate.schemas",
    "Snapshotter": "runstate.snapshotter",
    **{
        name: "runstate.schemas.errors"
        for name in (
            "CheckpointInvalid",
            "ContractError",
            "DecisionTimeout",
            "DecodeError",
            "DeliveryError",
            "LogConfigError",
            "LogError",
            "MigrationRequired",
            "PatchTooLarge",
            "RevisionNotFound",
            "RunNotFound",
            "RunstateError",
            "StoreError",
            "StoreLocked",
            "UnknownEventType",
        )
    },
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'runstate' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
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
    "Author",
    "CheckpointInvalid",
    "ContractError",
    "Decision",
    "DecisionTimeout",
    "DecodeError",
    "DeliveryError",
    "EventLog",
    "LogConfigError",
    "LogError",
    "MigrationRequired",
    "Patch",
    "PatchDraft",
    "PatchTooLarge",
    "Projection",
    "Projector",
    "Receipt",
    "RevisionNotFound",
    "RunNotFound",
    "RunProducer",
    "RunState",
    "RunstateError",
    "Snapshotter",
    "StoreError",
    "StoreLocked",
    "UnknownEventType",
    "decision_reader",
    "open_log",
]
