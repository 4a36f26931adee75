"""The one error hierarchy of runstate.

Every error raised on purpose by runstate derives from :class:`RunstateError`, and each
carries the values involved (run, revision, offset, rule) so that a message can be acted
on without a debugger. Backend errors (SQLite, RocksDB, librdkafka) are translated at the
boundary with ``raise ... from e``.
"""

from __future__ import annotations

import pydantic


def describe_validation_error(err: pydantic.ValidationError) -> tuple[str, str]:
    """``(field, message)`` for the first error of a pydantic validation: the field as a
    dotted path (``events.1.fact.evidence``; empty for the whole object) and a message
    that starts with it. The one translation of pydantic's errors used everywhere."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return loc, f"{loc}: {first['msg']}" if loc else str(first["msg"])


class RunstateError(Exception):
    """Root of every error runstate raises on purpose."""


class ContractError(RunstateError):
    """Input does not match the contract (a patch, an event, a state document).

    ``where`` names the source (a file, a log position) and ``field`` the first bad field.
    """

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None) -> None:
        self.where = where
        self.field = field
        prefix = f"{where}: " if where else ""
        super().__init__(prefix + message)


class UnknownEventType(ContractError):
    """An event's ``type`` is not in the catalogue; ``known`` lists the catalogue."""

    def __init__(self, got: str, known: list[str], *, where: str | None = None) -> None:
        self.got = got
        self.known = known
        super().__init__(f"unknown event type {got!r}; known types: {', '.join(known)}", where=where, field="type")


class PatchTooLarge(ContractError):
    """An encoded patch is over the configured size limit."""

    def __init__(
        self, run_id: str, size: int, limit: int, *, as_json: bool = False, message: str | None = None
    ) -> None:
        self.run_id = run_id
        self.size = size
        self.limit = limit
        what, setting = (
            ("bytes of JSON", "twice RUNSTATE_MAX_PATCH_BYTES") if as_json else ("bytes", "RUNSTATE_MAX_PATCH_BYTES")
        )
        # ``message``: the server's own words, when a client raises it from a 413.
        super().__init__(
            message or f"patch for run {run_id!r} is {size} {what}, over the limit of {limit} bytes ({setting})"
        )


class DecodeError(RunstateError):
    """A log record could not be decoded into a patch (not ours, corrupt, unknown writer schema)."""

    def __init__(self, reason: str, *, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class MigrationRequired(RunstateError):
    """A state document cannot be migrated safely to the current schema version.

    The document is kept unchanged; it is never loaded with fields dropped.
    """

    def __init__(self, run_id: str | None, found_version: object, current: int, why: str) -> None:
        self.run_id = run_id
        self.found_version = found_version
        self.current = current
        self.why = why
        super().__init__(
            f"MIGRATION_REQUIRED: run {run_id!r} has schema_version {found_version!r} (current {current}): {why}"
        )


class LogError(RunstateError):
    """The log backend failed (I/O, broker, configuration)."""


class LogConfigError(LogError):
    """The log is configured wrongly (bad URL, missing topic, incompatible partitions)."""


class DeliveryError(LogError):
    """A record was not acknowledged by the log; the caller must retry or give up."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"append for run {run_id!r} failed: {reason}")


class ListenError(RunstateError):
    """A server could not listen on the address it was given (in use, not this machine's)."""


class StoreError(RunstateError):
    """The projection store failed (I/O, corruption, an incompatible format)."""


class StoreLocked(StoreError):
    """The store is open read-write in another process (or another handle of this one)."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"projection store {path} is in use by another process: {detail}")


class CheckpointInvalid(RunstateError):
    """A checkpoint that must not be trusted; ``reason`` says why."""

    def __init__(self, run_id: str | None, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"checkpoint of run {run_id!r} rejected: {reason}")


class DecisionTimeout(RunstateError):
    """No decision for a patch was seen within the timeout."""

    def __init__(self, run_id: str, patch_id: str, timeout_s: float) -> None:
        self.run_id = run_id
        self.patch_id = patch_id
        self.timeout_s = timeout_s
        super().__init__(
            f"no decision for patch {patch_id} of run {run_id!r} within {timeout_s:g}s (is a projector running?)"
        )


class RunNotFound(RunstateError):
    """The run has no projection (never started, or not in this store)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} not found in the projection")


class FieldNeverSet(RunstateError):
    """``explain``: no patch ever set ``path`` of the run (a typo, or a list item not
    addressed by its id)."""

    def __init__(self, run_id: str, path: str) -> None:
        self.run_id = run_id
        self.path = path
        super().__init__(f"{path} of run {run_id!r} was never set (check the path: list items by id)")


class RevisionNotFound(RunstateError):
    """A past revision was asked for that the run never had."""

    def __init__(self, run_id: str, revision: int, current: int) -> None:
        self.run_id = run_id
        self.revision = revision
        self.current = current
        super().__init__(f"run {run_id!r} has revisions 0..{current}; {revision} does not exist")


class RunErased(RunstateError):
    """The run was erased: its content is gone everywhere; what remains is who erased it,
    when and why (``erasure``: ``{"at", "by", "reason"}``)."""

    def __init__(self, run_id: str, erasure: dict[str, str] | None = None) -> None:
        self.run_id = run_id
        self.erasure = erasure or {}
        by = f" by {self.erasure['by']}" if self.erasure.get("by") else ""
        at = f" at {self.erasure['at']}" if self.erasure.get("at") else ""
        why = f": {self.erasure['reason']}" if self.erasure.get("reason") else ""
        super().__init__(f"run {run_id!r} was erased{by}{at}{why}")


class KeyStoreError(RunstateError):
    """The master key or the key store cannot be used (missing, malformed, or not the key
    the store was written with). runstate refuses to start rather than write a run key in
    the clear or under another master key."""


class LostAcknowledged(LogError):
    """The embedded log holds fewer records than it acknowledged (its write-ahead log was
    damaged, or the file was replaced by an older copy): refused on open."""

    def __init__(self, path: str, missing: int, heads: dict[str, int], mark: str) -> None:
        self.missing = missing
        ends = ", ".join(f"{k} ends at {v}" for k, v in sorted(heads.items()) if v)
        super().__init__(
            f"embedded log {path} lost {missing} acknowledged record(s): it ends before what it "
            f"acknowledged ({ends or 'it is empty'}); its write-ahead log was damaged, or the file is an "
            f"older copy. Restore it from a copy; to go on with what it holds (the missing records are "
            f"lost for good), delete {mark}"
        )


class LostRecords(LogError):
    """The log ends before records an observer saw in it: acknowledged appends were lost (a
    damaged write-ahead log, say) or this is another log. Names the lost offsets."""

    def __init__(self, partition: int, end: int, seen: int, observer: str) -> None:
        self.partition, self.end, self.seen = partition, end, seen
        super().__init__(
            f"the log lost offsets {end}..{seen - 1} of partition {partition}, which {observer} had seen "
            "(acknowledged appends: a damaged write-ahead log, or this is another log). Run `runstate "
            "verify --deep`; delete the state directory to rebuild from what the log holds"
        )
