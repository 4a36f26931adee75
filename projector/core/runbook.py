"""RunBook: the one way records are folded through the pure core, for many runs at once.

A book holds the working state of the runs it has seen (a cache over the store for the
live projector, everything in memory for a replay) and the decisions taken, and turns
each log record into an outcome with :meth:`RunBook.apply_record`: decode → key check →
idempotency (a ``patch_id`` already decided) → :func:`decide`. The live projector, the
snapshotter, recovery's tail, ``verify``, ``state --revision`` and ``explain`` all go
through it, so the projection and a replay can only differ if the store loses or invents
something — which is what ``verify`` checks.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Literal

import msgspec

from runstate.eventlog.base import Record
from runstate.projector.core.decide import decide, erased_envelope_decision
from runstate.projector.core.outcomes import Applied, DeadLetter, Erased
from runstate.projector.core.reducer import READS
from runstate.projector.core.working import Entry, RunDoc
from runstate.schemas import sealed, structs
from runstate.schemas.codec import content_digest, encode, read_patch, writer_of
from runstate.schemas.errors import ContractError, DecodeError, StoreError
from runstate.schemas.generated.structs import Author, Decision, Patch
from runstate.schemas.patch import Patch as PatchModel
from runstate.schemas.structs import updated

log = logging.getLogger("runstate.projector")


#: What to do when deciding a well-formed patch raises (a bug in the core, not bad input):
#: dead-letter the record and go on (decisions are all-or-nothing, so no state is
#: half-applied, and a replay dead-letters it the same way), or raise.
InternalErrorPolicy = Literal["dead_letter", "fail"]


#: Dead-letter reasons that mean a record's content could not be read although nothing
#: erased it (a lost or damaged key, a record keyed by another run than it names): an
#: operator must act, so ``verify`` and ``status`` report them.
UNREADABLE = frozenset({"key_missing", "key_damaged", "key_destroyed", "key_mismatch", "sealed_no_key"})

#: The header a sealed log puts on a record it could not open (eventlog/sealed.py).
_KEY_HEADER = "runstate-key"


def _unopened(rec: Record) -> Erased | DeadLetter:
    """A sealed record the log could not open: an erased run's patch, or a dead letter
    saying which key is missing or damaged (or that no master key is configured)."""
    why = next((v for k, v in rec.headers if k == _KEY_HEADER), None)
    try:
        s = sealed.read(rec.value)
    except DecodeError as e:
        return _dead(rec, e.reason, e.detail)
    key = rec.key.decode(errors="replace") if rec.key is not None else None
    if key != s.run_id:
        # A run id changed in the envelope (damage or tampering) must not reach that run.
        return _dead(rec, "key_mismatch", f"record key {key!r} is not the sealed record's run_id {s.run_id!r}")
    if why == b"erased" and s.envelope is not None:
        return Erased(s.run_id, s.envelope)
    if why is None:
        return _dead(
            rec,
            "sealed_no_key",
            f"run {s.run_id!r}: the record is sealed and no master key is configured "
            "(RUNSTATE_MASTER_KEY or RUNSTATE_MASTER_KEY_FILE)",
        )
    reason = {b"erased": "key_destroyed", b"destroyed": "key_destroyed", b"missing": "key_missing"}.get(
        why, "key_damaged"
    )
    return _dead(
        rec, reason, f"run {s.run_id!r}: the record's key {s.kid} is {why.decode()}; its content is unreadable"
    )


def read_record(rec: Record) -> Patch | DeadLetter | Erased:
    """The patch a log record holds, or a :class:`DeadLetter` with the reason: damaged
    (checksum), a key that is not UTF-8, not a decodable valid patch, a patch of another
    run than its key names, sealed with a key that is missing or damaged; or, for a sealed
    patch of an erased run, its :class:`Erased` envelope. Pure: reads no state, so a caller
    may read a whole batch first."""
    if not rec.checksum_ok:
        return _dead(rec, "checksum", "the record's key and value do not match its checksum")
    if sealed.is_sealed(rec.value):
        return _unopened(rec)
    try:
        try:
            key = rec.key.decode() if rec.key is not None else None
        except UnicodeDecodeError as e:
            raise DecodeError("key_not_utf8", detail=f"record key {rec.key!r}: {e.reason} at byte {e.start}") from e
        patch = read_patch(rec.value)
        if key != patch.run_id:
            raise DecodeError("key_mismatch", detail=f"record key {key!r} is not the patch's run_id {patch.run_id!r}")
    except DecodeError as e:
        return _dead(rec, e.reason, e.detail)
    return patch


def _envelope_patch(got: Erased) -> Patch:
    """A patch struct standing for an unreadable one: its envelope, no events."""
    env = got.envelope
    return Patch(
        patch_id=env.patch_id,
        run_id=got.run_id,
        expected_revision=env.expected_revision,
        events=[],
        author=Author(agent_id=env.agent_id, agent_version=env.agent_version),
        created_at=datetime.fromisoformat(env.created_at),
        rebase=env.rebase,
    )


def _built_again(patch: Patch, record: bytes | None, prior: Decision) -> bool:
    """Whether ``patch`` is the patch ``prior`` decided, built again with a new time (as a
    client's resend through serve or a producer is): its ``record`` written with the prior's
    ``created_at``, in the record's own writer schema, has the prior's digest. A pure
    function of the record and the decision: every replay answers alike."""
    if record is None or prior.content_digest is None or patch.created_at == prior.created_at:
        return False
    try:
        again = structs.to_model(msgspec.structs.replace(patch, created_at=prior.created_at))
        return content_digest(encode(again, writer_of(record))) == prior.content_digest
    except (DecodeError, ContractError):
        return False  # a record of a schema it cannot be written in again: other content, as before


def _dead(rec: Record, reason: str, detail: str) -> DeadLetter:
    return DeadLetter(
        rec.partition, rec.offset, reason, detail, rec.key.decode(errors="replace") if rec.key else None, len(rec.value)
    )


class RunBook:
    """Working states and decisions for the runs of one partition (or one replay).

    ``load_doc(run_id)`` and ``load_decision(run_id, patch_id)`` reach persisted state on a
    cache miss; ``max_cached`` bounds the number of runs kept in memory (None: unbounded,
    for replays), and ``max_items`` the items a cached run may hold in memory (None:
    unbounded): a run a batch changed that then holds more leaves the cache, and its next
    patch reads its header again and each item an event touches (a long run's items would
    otherwise all stay in memory for as long as the run is cached: the cache is bounded in
    runs, not in their size).
    Eviction happens only in :meth:`settle`, after the caller has persisted the batch, so
    an evicted run never loses unwritten changes.

    The decisions it takes (``Applied.decision``, ``decided``) are the core's structs of
    :class:`Decision` (see :mod:`runstate.projector.core.decide`), read like the model;
    ``structs.to_model`` makes the model. The loaders give structs too (the store decodes
    straight into them: ``keys.decode_decision_struct``).
    """

    def __init__(
        self,
        load_doc: Callable[[str], RunDoc | None] = lambda _r: None,
        load_decision: Callable[[str, str], Decision | None] = lambda _r, _p: None,
        max_cached: int | None = None,
        decided_before_restore: Callable[[str, str], bool] = lambda _r, _p: False,
        load_docs: Callable[[list[str]], list[RunDoc | None]] | None = None,
        load_decisions: Callable[[list[tuple[str, str]]], list[Decision | None]] | None = None,
        load_items: Callable[[list[tuple[str, str, str]]], list[Entry | None]] | None = None,
        max_items: int | None = None,
    ) -> None:
        self._max_items = max_items
        #: runs decided since the last settle (whose cached items may have grown)
        self._touched: set[str] = set()
        self._load_items = load_items
        self._load_doc = load_doc
        self._load_docs = load_docs
        # Stored decisions come in the core's one form, their structs (the store decodes them so).
        self._load_decisions = load_decisions
        #: stored decisions (or None: none) of patch ids read ahead by :meth:`prefetch`;
        #: each is used once, by the patch it was read for
        self._read_ahead: dict[tuple[str, str], Decision | None] = {}
        self._load_decision = load_decision
        self._decided_before_restore = decided_before_restore
        self._max = max_cached
        self.docs: OrderedDict[str, RunDoc | None] = OrderedDict()
        self._unsettled: dict[tuple[str, str], Decision] = {}
        self._keep_decisions = max_cached is None
        self.decided: dict[tuple[str, str], Decision] = {}

    def doc(self, run_id: str) -> RunDoc | None:
        if run_id in self.docs:
            self.docs.move_to_end(run_id)
            return self.docs[run_id]
        d = self._load_doc(run_id)
        self.docs[run_id] = d
        return d

    def prefetch(self, patches: list[Patch]) -> None:
        """Read ahead what deciding ``patches`` reads from the store: the working states of
        their runs that are not cached (one call of ``load_docs``), the stored decisions of
        their patch ids (``load_decisions``) and the items their events' reducers read
        first (``reducer.READS``; ``load_items``). Any loader may be None: then that is
        read when each patch is decided, as without a prefetch. Called before any of
        ``patches`` is decided, so what it reads is what deciding the first would read."""
        docs = self.docs
        if self._load_docs is not None:
            runs = [r for r in dict.fromkeys(p.run_id for p in patches) if r not in docs]
            if runs:
                docs.update(zip(runs, self._load_docs(runs)))
        if self._load_items is not None:
            items: dict[tuple[str, str, str], RunDoc] = {}
            for p in patches:
                doc = docs.get(p.run_id)
                if doc is not None:
                    for e in p.events:
                        hint = READS.get(e.type)
                        if hint is not None:
                            kind, id_ = hint(e)
                            if doc.unread(kind, id_):
                                items[(p.run_id, kind, id_)] = doc
            if items:
                wanted = list(items)
                for key, entry in zip(wanted, self._load_items(wanted)):
                    items[key].read_ahead(key[1], key[2], entry)
        if self._load_decisions is not None:
            keys = [
                k
                for k in dict.fromkeys((p.run_id, p.patch_id) for p in patches)
                if k not in self._unsettled and k not in self.decided
            ]
            if keys:
                self._read_ahead.update(zip(keys, self._load_decisions(keys)))

    def apply(
        self,
        patch: Patch | PatchModel,
        partition: int,
        offset: int,
        digest: str | None = None,
        log_time_ms: int | None = None,
        record: bytes | None = None,
    ) -> Applied:
        """Decide one patch; a ``patch_id`` already decided returns the earlier decision
        (``duplicate``), unless both have a content ``digest`` and they differ: then the
        patch is rejected as ``patch_id_reused`` and the id keeps its first decision. The
        same patch built again (a client's resend takes a new ``created_at``) is the same
        content: with its ``record`` (the log's bytes), a patch whose record, given the
        first one's time, has the first one's digest is a duplicate. A validated model (a
        caller's) is taken as its struct."""
        if isinstance(patch, PatchModel):  # the struct the log would give: encoded and read back
            return self.apply(read_patch(encode(patch)), partition, offset, digest, log_time_ms, record)
        key = (patch.run_id, patch.patch_id)
        prior = self._unsettled.get(key) or self.decided.get(key)
        if prior is None:
            # Read ahead for this patch (a duplicate within the batch is in _unsettled by now).
            prior = self._read_ahead.pop(key) if key in self._read_ahead else self._load_decision(*key)
        if prior is None and self._decided_before_restore(*key):
            return Applied(patch, None, None, duplicate=True)
        if prior is not None:
            if (
                digest is None
                or prior.content_digest is None
                or digest == prior.content_digest
                or _built_again(patch, record, prior)
            ):
                return Applied(patch, prior, None, duplicate=True)
            doc = self.doc(patch.run_id)
            current = 0 if doc is None else doc.header.revision
            reused = updated(
                prior,
                {
                    "outcome": "rejected",
                    "revision": current,
                    "expected_revision": patch.expected_revision,
                    "reason": "patch_id_reused",
                    "rule": None,
                    "event_index": None,
                    "rebased": False,
                    "message": f"patch_id {patch.patch_id!r} was decided at offset {prior.offset} for other content",
                    "partition": partition,
                    "offset": offset,
                    "agent_id": patch.author.agent_id,
                    "agent_version": patch.author.agent_version,
                    "event_types": [e.type for e in patch.events],
                    "created_at": patch.created_at,
                    "content_digest": digest,
                },
            )
            return Applied(patch, reused, None)
        decided = decide(self.doc(patch.run_id), patch, partition, offset, digest, log_time_ms)
        if decided.doc is not None:
            self.docs[patch.run_id] = decided.doc
            if self._max_items is not None:
                self._touched.add(patch.run_id)
        if self._keep_decisions:
            self.decided[key] = decided.decision
        else:
            self._unsettled[key] = decided.decision
        return Applied(patch, decided.decision, decided.changes)

    def apply_record(
        self,
        rec: Record,
        on_internal_error: InternalErrorPolicy = "dead_letter",
        read: Patch | DeadLetter | Erased | None = None,
    ) -> Applied | DeadLetter:
        """Decide one log record. A record that is not a patch of the run it is keyed by is
        a :class:`DeadLetter` with the reason (see :func:`read_record`); so is a patch whose
        decision raised, unless ``on_internal_error`` is ``"fail"`` (then the error
        propagates). A :class:`StoreError` (the run's stored state cannot be read) always
        propagates. ``read``: what :func:`read_record` gave for ``rec``, when the caller
        read its batch first."""
        got = read_record(rec) if read is None else read
        if isinstance(got, DeadLetter):
            return got
        if isinstance(got, Erased):
            return self._erased(got, rec)
        patch = got
        try:
            # The record's time is the log's (its append time): what time-dependent rules use.
            return self.apply(
                patch, rec.partition, rec.offset, content_digest(rec.value), rec.timestamp_ms or None, rec.value
            )
        except StoreError:
            raise  # the stored state cannot be read: not this record's fault, and it must wait
        except Exception as e:  # a bug in the pure core, not bad input: see InternalErrorPolicy
            if on_internal_error == "fail":
                raise
            log.exception(
                "internal error deciding p%d@%d (run %r); dead-lettered", rec.partition, rec.offset, patch.run_id
            )
            return DeadLetter(
                rec.partition, rec.offset, "internal_error", f"{type(e).__name__}: {e}", patch.run_id, len(rec.value)
            )

    def _erased(self, got: Erased, rec: Record) -> Applied:
        """An erased run's unreadable patch: rejected ``run_erased`` from its envelope."""
        key = (got.run_id, got.envelope.patch_id)
        prior = self._unsettled.get(key) or self.decided.get(key) or self._load_decision(*key)
        if prior is not None:
            return Applied(_envelope_patch(got), prior, None, duplicate=True)
        decision = erased_envelope_decision(got.run_id, got.envelope, self.doc(got.run_id), rec.partition, rec.offset)
        (self.decided if self._keep_decisions else self._unsettled)[key] = decision
        return Applied(_envelope_patch(got), decision, None)

    def settle(self) -> None:
        """The caller persisted everything applied so far: forget in-flight decisions,
        evict the runs changed since the last settle that hold more than ``max_items``
        items, then the least recently used runs beyond ``max_cached``."""
        self._unsettled.clear()
        self._read_ahead.clear()
        if self._max_items is not None:
            for run_id in self._touched:
                doc = self.docs.get(run_id)
                if doc is not None and doc.cached_items() > self._max_items:
                    del self.docs[run_id]
        self._touched.clear()
        if self._max is not None:
            while len(self.docs) > self._max:
                self.docs.popitem(last=False)

    def discard(self) -> None:
        """The caller failed to persist: drop every cached state (they may hold unwritten
        changes) so that the next batch reloads from the store."""
        self._unsettled.clear()
        self._read_ahead.clear()
        self._touched.clear()
        self.docs.clear()
