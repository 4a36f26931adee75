"""The checkpoint format: "is it safe to resume from here?", not only "what is the state".

A checkpoint is JSON (``Checkpoint.model_dump_json``), keyed by ``run_id`` on the
compacted checkpoints topic and kept per revision in the snapshotter's local store. It is
trusted only after :func:`validate`: the format and reducer versions must be current, the
digest must cover the whole checkpoint as it is (state, position, decisions, verdict), a
configured key (``RUNSTATE_CHECKPOINT_KEY``) must have signed it, and an older state
schema is migrated (``schemas.migrations``).

Beside the run checkpoints, each partition of the topic holds a *coverage* record
(:func:`make_coverage`): up to which offset every checkpoint of that partition is
published, so that recovery knows from where runs without a checkpoint must be replayed.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import typing
from collections.abc import Collection, Iterable
from typing import Any, Literal, NamedTuple, Protocol

import orjson
import pydantic
from pydantic import AwareDatetime

from runstate.eventlog.partitioner import partition_for
from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.store.keys import PATCH_ID_DIGEST, patch_id_digest
from runstate.schemas import structs
from runstate.schemas.errors import CheckpointInvalid, MigrationRequired, describe_validation_error
from runstate.schemas.events import Model
from runstate.schemas.migrations import load_state
from runstate.schemas.patch import Decision
from runstate.schemas.state import (
    COLLECTIONS,
    CURRENT_SCHEMA_VERSION,
    Effect,
    Observation,
    RunState,
    ToolCall,
    WorkspaceRef,
    raw_state_digest,
    state_digest,
)

#: Version of this checkpoint format. 2: the digest covers the whole checkpoint (not only
#: its state), an optional HMAC signature, and the run's decided patch ids.
FORMAT_VERSION = 2
#: Recent decisions carried by a checkpoint, so that a restored projector still answers a
#: producer's retry of a recent patch with its decision (older ones are known by id only).
RECENT_DECISIONS = 4
#: Fields a seal does not cover (it produces them).
_SEAL_FIELDS = ("digest", "signature")

#: A checkpoint's answer to "is it safe to resume from here?" (the ``verdict`` field).
ResumeVerdict = Literal["safe", "needs_reconciliation", "migration_required"]


class Reconciliation(Model):
    """What must be checked before resuming from this checkpoint."""

    #: side effects started and not recorded as committed or failed: outcome unknown.
    effects: list[Effect] = []
    #: side-effecting or costly tool calls still in flight at the checkpoint.
    tool_calls: list[ToolCall] = []
    #: observations of external systems: re-read (and compare versions) before a risky write.
    observations: list[Observation] = []
    #: an external effect ledger (from a migrated document): read it, its outcomes are not here.
    external_ledger: str | None = None


class Checkpoint(Model):
    """One run at one revision, with what a resume needs."""

    format_version: int = FORMAT_VERSION
    reducer_version: int = REDUCER_VERSION
    run_id: str
    revision: int
    #: the log position this checkpoint covers: every record of this run at an offset
    #: <= ``covers_offset`` of ``partition`` is included in ``state``.
    partition: int
    covers_offset: int
    schema_version: int
    agent_version: str
    workspace_ref: WorkspaceRef | None
    effect_ledger: list[Effect]
    pending_tool_calls: list[ToolCall]
    #: sha256 of the state alone (equal to ``state_digest`` of the same state anywhere).
    state_digest: str
    triggers: list[str]
    verdict: ResumeVerdict
    reconcile: Reconciliation
    recent_decisions: list[Decision] = []
    #: every patch id decided for the run up to ``covers_offset``, as concatenated
    #: 16-byte blake2b digests (base64): a restored projector deduplicates old resends
    #: exactly without carrying their decisions.
    patch_ids: str = ""
    #: the patch time of the revision (never the snapshotter's clock); None for states
    #: migrated from the reference schema (v3), which did not record it.
    at: AwareDatetime | None
    state: RunState
    #: sha256 of the canonical JSON of every other field (all but this and ``signature``).
    digest: str = ""
    #: HMAC-SHA256 of ``digest`` with the operator's key (``RUNSTATE_CHECKPOINT_KEY``), or None.
    signature: str | None = None


def verdict_of(state: RunState) -> tuple[ResumeVerdict, Reconciliation]:
    """``needs_reconciliation`` exactly when an effect was started and not recorded as
    committed/failed, a side-effecting call is still in flight, or the effect ledger is only
    an external reference (it must be read); else ``safe``."""
    if state.schema_version != CURRENT_SCHEMA_VERSION:
        return "migration_required", Reconciliation()
    effects = [e for e in state.effect_ledger if e.status == "started"]
    calls = [c for c in state.pending_tool_calls if c.side_effect]
    if effects or calls or state.effect_ledger_ref:
        return "needs_reconciliation", Reconciliation(
            effects=effects,
            tool_calls=calls,
            observations=list(state.environment_observations),
            external_ledger=state.effect_ledger_ref,
        )
    return "safe", Reconciliation(observations=list(state.environment_observations))


def verdict_of_doc(doc: Any) -> ResumeVerdict:
    """:func:`verdict_of`'s verdict for a run in its working form (``RunDoc``), reading
    only its effect ledger and tool calls."""
    h = doc.header
    if h.schema_version != CURRENT_SCHEMA_VERSION:
        return "migration_required"
    if (
        h.effect_ledger_ref
        or any(e is not None and e[1].status == "started" for e in doc.entries("effect_ledger").values())
        or any(e is not None and e[1].side_effect for e in doc.entries("pending_tool_calls").values())
    ):
        return "needs_reconciliation"
    return "safe"


def encode_patch_ids(patch_ids: Iterable[str]) -> str:
    """The compact form of a set of patch ids (sorted digests, base64)."""
    return base64.b64encode(b"".join(sorted({patch_id_digest(p) for p in patch_ids}))).decode()


def decode_patch_ids(text: str) -> bytes:
    """Concatenated digests, as :meth:`ProjectionStore.restore` keeps them."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % PATCH_ID_DIGEST:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {PATCH_ID_DIGEST}-byte digests")
    return raw


def _canonical(doc: dict[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in doc.items() if k not in _SEAL_FIELDS}, option=orjson.OPT_SORT_KEYS)


class Signer(Protocol):
    """Signs checkpoints with keys that carry an id (the key store's checkpoint keys), so
    that a checkpoint names the key that signed it and a master key rotation leaves it
    verifiable."""

    def sign(self, digest: str) -> str: ...

    def verify(self, digest: str, signature: str) -> bool: ...


#: What signs and checks checkpoints: an operator's key (``RUNSTATE_CHECKPOINT_KEY``), a
#: :class:`Signer`, or None (a digest only: not authenticated).
SigningKey = bytes | Signer | None


def _sign(digest: str, key: bytes | Signer) -> str:
    if isinstance(key, bytes):
        return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()
    return key.sign(digest)


def _verify(digest: str, signature: str, key: bytes | Signer) -> bool:
    if isinstance(key, bytes):
        return hmac.compare_digest(signature.encode(), _sign(digest, key).encode())
    return key.verify(digest, signature)


def seal(doc: dict[str, Any], key: SigningKey) -> bytes:
    """Encode a checkpoint or coverage document with its digest (and signature, with a key)."""
    digest = hashlib.sha256(_canonical(doc)).hexdigest()
    return orjson.dumps({**doc, "digest": digest, "signature": None if key is None else _sign(digest, key)})


def _check_seal(doc: dict[str, Any], key: SigningKey, run_id: str | None) -> None:
    """Raises :class:`CheckpointInvalid` unless the digest covers the document as it is and,
    with a ``key``, the signature is the key's. Without a key a signature cannot be checked."""
    digest = doc.get("digest")
    # Compared as bytes: hmac.compare_digest refuses str with non-ASCII characters (TypeError).
    if not isinstance(digest, str) or not hmac.compare_digest(
        digest.encode(), hashlib.sha256(_canonical(doc)).hexdigest().encode()
    ):
        raise CheckpointInvalid(run_id, "digest does not match the checkpoint (corrupted or edited)")
    if key is not None:
        sig = doc.get("signature")
        if not sig:
            raise CheckpointInvalid(run_id, "not signed, and checkpoints are signed here")
        if not isinstance(sig, str) or not _verify(digest, sig, key):
            raise CheckpointInvalid(
                run_id,
                "wrong signature (not made with the configured checkpoint key, nor with "
                "a checkpoint key of the key store)",
            )


def of_state(state: RunState) -> dict[str, Any]:
    """What a checkpoint takes from the state it stands for: the state itself, its digest, the
    fields a resume reads without it (versions, workspace, effects, calls in flight) and its
    verdict. The one list, for a checkpoint made whole and one rebuilt from its pieces."""
    verdict, reconcile = verdict_of(state)
    return {
        "schema_version": state.schema_version,
        "agent_version": state.agent_version,
        "workspace_ref": state.workspace_ref,
        "effect_ledger": state.effect_ledger,
        "pending_tool_calls": state.pending_tool_calls,
        "state_digest": state_digest(state),
        "verdict": verdict,
        "reconcile": reconcile,
        "at": state.updated_at or state.created_at,
        "state": state,
    }


def make_checkpoint(
    state: RunState,
    *,
    partition: int,
    covers_offset: int,
    triggers: list[str],
    recent: list[Decision],
    patch_ids: Iterable[str] = (),
    key: SigningKey = None,
) -> Checkpoint:
    """The checkpoint of ``state``, sealed (digest over all of it; signed with ``key``).
    ``patch_ids`` are the run's decided patch ids up to ``covers_offset``. ``recent``: the
    run's last decisions, as models or as the core's structs of them (projector/core/decide.py)."""
    cp = Checkpoint(
        **of_state(state),
        run_id=state.run_id,
        revision=state.revision,
        partition=partition,
        covers_offset=covers_offset,
        triggers=triggers,
        recent_decisions=[structs.to_model(d) for d in recent[-RECENT_DECISIONS:]],
        patch_ids=encode_patch_ids(patch_ids),
    )
    sealed = orjson.loads(seal(cp.model_dump(mode="json"), key))
    return cp.model_copy(update={"digest": sealed["digest"], "signature": sealed["signature"]})


def encode(cp: Checkpoint) -> bytes:
    return cp.model_dump_json().encode()


def _trusted_doc(raw: bytes, key: SigningKey) -> dict[str, Any]:
    """A checkpoint record as plain JSON data, with a current-schema state, once everything
    but its shape is checked (see :func:`validate`). Raises :class:`CheckpointInvalid`."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CheckpointInvalid(None, f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise CheckpointInvalid(None, "not a JSON object")
    run_id = doc.get("run_id")
    if doc.get("format_version") != FORMAT_VERSION:
        raise CheckpointInvalid(
            run_id, f"format_version {doc.get('format_version')!r}, this runstate reads {FORMAT_VERSION}"
        )
    _check_seal(doc, key, run_id)
    if doc.get("reducer_version") != REDUCER_VERSION:
        raise CheckpointInvalid(
            run_id,
            f"reducer_version {doc.get('reducer_version')!r} != {REDUCER_VERSION}: "
            "its state may differ from a replay with today's rules",
        )
    state_doc = doc.get("state")
    if not isinstance(state_doc, dict):
        raise CheckpointInvalid(run_id, "no state")
    if state_doc.get("run_id") != run_id or state_doc.get("revision") != doc.get("revision"):
        raise CheckpointInvalid(run_id, "state does not belong to this checkpoint's run/revision")
    if state_doc.get("schema_version") != CURRENT_SCHEMA_VERSION:
        try:
            migrated = load_state(state_doc)  # deterministic, or MIGRATION_REQUIRED
        except MigrationRequired as e:
            raise CheckpointInvalid(run_id, str(e)) from e
        state_json = migrated.model_dump(mode="json")
        doc = {
            **doc,
            "state": state_json,
            "schema_version": CURRENT_SCHEMA_VERSION,
            "state_digest": raw_state_digest(state_json),
        }
    return doc  # type: ignore[no-any-return]


def validate(raw: bytes, key: SigningKey = None) -> Checkpoint:
    """Check a checkpoint record and return it with a current-schema state.

    Raises :class:`CheckpointInvalid` when it is not JSON / not a checkpoint, from another
    format or reducer version, its digest does not cover it as it is (any field edited),
    it is unsigned or wrongly signed while a ``key`` is configured, its state is not its
    run's, or the state cannot be migrated."""
    doc = _trusted_doc(raw, key)
    run_id = doc.get("run_id")
    try:
        cp = Checkpoint.model_validate(doc)
        decode_patch_ids(cp.patch_ids)
    except pydantic.ValidationError as e:
        raise CheckpointInvalid(run_id, f"not a checkpoint: {describe_validation_error(e)[1]}") from e
    except ValueError as e:
        raise CheckpointInvalid(run_id, f"not a checkpoint: patch_ids: {e}") from e
    return cp


class RestoreData(NamedTuple):
    """What recovery takes from a checkpoint record, as plain data (see :func:`restore_data`)."""

    run_id: str
    partition: int
    covers_offset: int
    #: the state as ``RunState.model_dump(mode="json")`` gives it (a current schema)
    state: dict[str, Any]
    #: the checkpoint's recent decisions, as the core's structs
    decisions: list[Any]
    patch_ids: bytes


_decision_decoder = structs.decoder(Decision)


def restore_data(raw: bytes, key: SigningKey = None) -> RestoreData:
    """:func:`validate` for recovery: the same checks of the record (format and reducer
    versions, digest, signature with a ``key``, the state's run and revision, an older schema
    migrated), its decisions and patch ids validated, the state kept as plain data, which
    ``RunDoc.from_state_data`` validates piece by piece as the store is written: a restore of
    100,000 runs does not build 100,000 ``RunState`` models. Raises :class:`CheckpointInvalid`."""
    doc = _trusted_doc(raw, key)
    run_id = doc.get("run_id")
    try:
        partition, covers = doc["partition"], doc["covers_offset"]
        if type(run_id) is not str or type(partition) is not int or type(covers) is not int:
            raise ValueError("run_id, partition and covers_offset must be a string and integers")
        state: dict[str, Any] = doc["state"]
        if not _complete(state):
            state = RunState.model_validate(state).model_dump(mode="json")
        decisions = [_decision_decoder(orjson.dumps(d)) for d in doc.get("recent_decisions") or ()]
        return RestoreData(run_id, partition, covers, state, decisions, decode_patch_ids(doc.get("patch_ids") or ""))
    except pydantic.ValidationError as e:
        raise CheckpointInvalid(run_id, f"not a checkpoint: {describe_validation_error(e)[1]}") from e
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointInvalid(run_id, f"not a checkpoint: {e}") from e


def state_data_of(raw: bytes, key: SigningKey = None) -> dict[str, Any]:
    """A checkpoint's state as plain JSON data (``RunState.model_dump(mode="json")`` of the
    state :func:`validate` returns), checked as :func:`validate` checks it (format and
    reducer versions, digest, signature with a ``key``, the state's run and revision; an
    older schema migrated) but without building the models: a checkpoint is only ever
    written from a validated state, and its digest proves it is that document (its
    signature, with a key, that this runstate wrote it), the trust a projection store's
    ``state_data`` has in what the projector wrote. Raises :class:`CheckpointInvalid`.
    The checkpoint's other fields (decisions, patch ids, verdict) are not read. A state
    written before a field of its schema version existed (fields were added with defaults)
    is read through the model once, so that it has that field's default, as ``validate``'s
    state has."""
    state: dict[str, Any] = _trusted_doc(raw, key)["state"]
    if not _complete(state):
        state = RunState.model_validate(state).model_dump(mode="json")
    return state


def _held_models() -> dict[str, tuple[str, ...]]:
    """For each field of RunState that holds a model (or None), that model's fields."""
    out: dict[str, tuple[str, ...]] = {}
    for name, field in RunState.model_fields.items():
        if typing.get_origin(field.annotation) is list:
            continue  # a collection: its items are counted (_ITEM_FIELDS)
        for tp in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
                out[name] = tuple(tp.model_fields)
    return out


#: What a complete state document has: RunState's fields, those of each model it holds
#: (its goal, policy, budgets, ...), and how many fields each collection's items have.
_STATE_FIELDS = tuple(RunState.model_fields)
_HELD = _held_models()
_ITEM_FIELDS = {kind: len(model.model_fields) for kind, model in COLLECTIONS.items()}


def _complete(state: dict[str, Any]) -> bool:
    """Whether a state document has every field its models have now, in their order, at the
    levels fields were ever added (the document, the models it holds, the items of its
    collections): a dump of a validated state always has. Items are counted, not named
    (fields are only ever added within a schema version, so a dump of an older model has
    fewer), in C: naming each item's keys in Python was slow on large states."""
    if tuple(state) != _STATE_FIELDS:
        return False
    for name, fields in _HELD.items():
        value = state[name]
        if isinstance(value, dict) and tuple(value) != fields:
            return False
    for kind, n in _ITEM_FIELDS.items():
        if not {n}.issuperset(map(len, state["goal"]["constraints"] if kind == "constraints" else state[kind])):
            return False
    return True


# --- coverage -------------------------------------------------------------------------------------

#: Coverage records are keyed below every run id (ids cannot hold control characters).
_COVERAGE_PREFIX = "\x00runstate.coverage."


@functools.lru_cache(maxsize=64)
def coverage_keys(partitions: int) -> tuple[str, ...]:
    """Per partition, the key of its coverage record on the checkpoints topic: a key that
    the partitioner places on that partition (found once, deterministically)."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        key = f"{_COVERAGE_PREFIX}{i}"
        keys.setdefault(partition_for(key, partitions), key)
        i += 1
    return tuple(keys[p] for p in range(partitions))


def is_coverage_key(key: bytes | None) -> bool:
    return key is not None and key.startswith(_COVERAGE_PREFIX.encode())


class Coverage(NamedTuple):
    """A partition's coverage record: below ``covers_below`` every run with a record has a
    published checkpoint; ``runs`` runs had one when it was written, ``runs_digest`` over
    their ids (:func:`runs_digest`). None for both: a record written before they were
    recorded (it cannot be checked, so it is not trusted). ``dense``: the stronger promise
    that each run's records below ``covers_below`` are all in its newest published
    checkpoint (so a restore's tail starts there, not at the oldest run's checkpoint)."""

    covers_below: int
    runs: int | None
    runs_digest: str | None
    dense: bool = False


def runs_digest(run_ids: Iterable[str]) -> str:
    """An order-free digest of a set of run ids: the XOR of their blake2b-64 digests, as hex."""
    acc = 0
    for r in run_ids:
        acc ^= int.from_bytes(hashlib.blake2b(r.encode(), digest_size=8).digest(), "big")
    return f"{acc:016x}"


def make_coverage(
    partition: int, covers_below: int, key: SigningKey, runs: Collection[str] = (), dense: bool = False
) -> bytes:
    """The snapshotter's promise for one partition: every checkpoint it made for records
    below ``covers_below`` is published, so every run with an accepted record there has
    one; ``runs`` are the runs it has published checkpoints of (named by count and digest,
    so that recovery can tell when one of them went missing from the topic). Recovery
    replays every other run from the log, from this offset on."""
    return seal(
        {
            "kind": "coverage",
            "format_version": FORMAT_VERSION,
            "partition": partition,
            "covers_below": covers_below,
            "runs": len(runs),
            "runs_digest": runs_digest(runs),
            "dense": dense,
        },
        key,
    )


def validate_coverage(raw: bytes, partition: int, key: SigningKey = None) -> Coverage:
    """A coverage record's promise. Raises :class:`CheckpointInvalid`."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CheckpointInvalid(None, f"coverage record is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != "coverage" or doc.get("format_version") != FORMAT_VERSION:
        raise CheckpointInvalid(None, "not a coverage record of this format")
    _check_seal(doc, key, None)
    below = doc.get("covers_below")
    if doc.get("partition") != partition or not isinstance(below, int) or below < 0:
        raise CheckpointInvalid(None, f"coverage record for partition {doc.get('partition')!r} found on {partition}")
    runs, digest = doc.get("runs"), doc.get("runs_digest")
    if not (isinstance(runs, int) and isinstance(digest, str)):
        runs, digest = None, None
    return Coverage(below, runs, digest, doc.get("dense") is True)
