"""The runstate contract: events, the patch envelope, the Run State, the log codec and
state migrations. Pure: no I/O, nothing else of runstate imported."""

from runstate.schemas.errors import (
    ContractError,
    DecodeError,
    MigrationRequired,
    RunstateError,
    UnknownEventType,
)
from runstate.schemas.events import CONTROL_EVENT_TYPES, EVENT_TYPE_NAMES, EVENT_TYPES, Event
from runstate.schemas.patch import Author, Decision, Patch, PatchDraft, parse_draft
from runstate.schemas.state import CURRENT_SCHEMA_VERSION, RunHeader, RunState

__all__ = [
    "CONTROL_EVENT_TYPES",
    "CURRENT_SCHEMA_VERSION",
    "EVENT_TYPES",
    "EVENT_TYPE_NAMES",
    "Author",
    "ContractError",
    "DecodeError",
    "Decision",
    "Event",
    "MigrationRequired",
    "Patch",
    "PatchDraft",
    "RunHeader",
    "RunState",
    "RunstateError",
    "UnknownEventType",
    "parse_draft",
]
