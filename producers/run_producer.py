"""RunProducer: build a patch, validate it locally, append it keyed by run_id, await its
decision.

The producer never writes state. It proposes a patch; the projector decides. Local
validation uses the same models as the projector, so a malformed patch fails here with a
:class:`ContractError` naming the field, before it reaches the log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple

import pydantic

from runstate.eventlog.base import Appended, EventLog
from runstate.schemas.codec import content_digest, encode
from runstate.schemas.errors import ContractError, DecisionTimeout, PatchTooLarge
from runstate.schemas.patch import Author, Decision, Patch, PatchDraft, check_draft_shape, validated

DEFAULT_MAX_PATCH_BYTES = 1024 * 1024

#: Reads a decision for ``(run_id, patch_id)`` or None (the projection, wired by the caller:
#: producers do not depend on the projector).
DecisionSource = Callable[[str, str], Decision | None]
#: Reads the decision on the record at ``(run_id, offset)`` or None (the run's history).
DecisionAt = Callable[[str, int], Decision | None]


def _new_patch_id() -> str:
    """A fresh patch id: 128 random bits from the OS, as hex (what ``secrets.token_hex(16)``
    gives). Read 256 ids at a time: one ``getrandom`` system call per id was a tenth of a
    busy producer's profile. ``list.pop`` is atomic, so threads never share an id, and a
    forked child drops the ids its parent read (:func:`os.register_at_fork`): it would
    otherwise hand out the parent's next ids again."""
    try:
        return _ids.pop()
    except IndexError:
        raw = os.urandom(16 * _IDS_PER_READ).hex()
        _ids.extend([raw[i : i + 32] for i in range(0, len(raw), 32)])
        return _ids.pop()


_IDS_PER_READ = 256
_ids: list[str] = []
os.register_at_fork(after_in_child=_ids.clear)


class Receipt(NamedTuple):
    """Where an appended patch landed (a named tuple: one per delivery, built cheaply)."""

    patch_id: str
    run_id: str
    partition: int
    offset: int


def _receipt(
    on_delivery: Callable[[Receipt | None, Exception | None], None],
    patch_id: str,
    run_id: str,
    where: Appended | None,
    err: Exception | None,
) -> None:
    on_delivery(None if where is None else Receipt(patch_id, run_id, where.partition, where.offset), err)


class RunProducer:
    """Appends patches for runs. One per worker process; not thread-safe.

    ``clock`` gives the patch time (``created_at``) when a draft has none; it is the only
    clock in the write path, and the projector never reads one.
    """

    def __init__(
        self,
        log: EventLog,
        author: Author,
        *,
        decisions: DecisionSource | None = None,
        decisions_at: DecisionAt | None = None,
        max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.log = log
        self.author = author
        self.decisions = decisions
        self.decisions_at = decisions_at
        self.max_patch_bytes = max_patch_bytes
        self.clock = clock
        self._producer = log.producer()
        self._events_topic = log.topics.events

    def build(self, run_id: str, draft: PatchDraft | Any, *, where: str | None = None) -> Patch:
        """Complete a draft into a validated :class:`Patch` (assigns ``patch_id``, author,
        time). Raises :class:`ContractError` / :class:`UnknownEventType`."""
        if isinstance(draft, PatchDraft):
            draft = draft.model_dump(round_trip=True)
        # One validation, of the completed patch: a draft's fields are a patch's, with the
        # same names, so its errors name the same fields as PatchDraft's would (tested).
        if not isinstance(draft, dict):
            check_draft_shape(draft, where=where)  # raises: not a JSON object
        claimed = draft.get("run_id")
        if claimed is not None and claimed != run_id:
            check_draft_shape(draft, where=where)  # an unknown event type is named first, as in parse_draft
            raise ContractError(f"patch names run {claimed!r} but is sent for {run_id!r}", where=where, field="run_id")
        full = dict(draft)
        full["run_id"] = run_id
        if full.get("patch_id") is None:
            full["patch_id"] = _new_patch_id()
        if full.get("author") is None:
            full["author"] = self.author
        if full.get("created_at") is None:
            full["created_at"] = self.clock()
        return validated(Patch, full, where=where, drafted=True)

    def events(self, run_id: str, expected_revision: int, events: Sequence[Any], *, rebase: bool = False) -> Patch:
        """Build a patch from event models or dicts: what :meth:`build` makes of the draft
        ``{"expected_revision": ..., "events": ..., "rebase": ...}`` (tested), without the
        checks of a draft's own fields, which this one cannot get wrong. Models are dumped
        and validated again, so one built unvalidated (``model_construct``) is still checked."""
        # ``type(e) is dict`` first: isinstance against BaseModel's metaclass (an ABCMeta)
        # is slow for a dict, the common case.
        raw = [e if type(e) is dict or not isinstance(e, pydantic.BaseModel) else e.model_dump() for e in events]
        full = {
            "run_id": run_id,
            "patch_id": _new_patch_id(),
            "expected_revision": expected_revision,
            "events": raw,
            "author": self.author,
            "created_at": self.clock(),
            "rebase": rebase,
        }
        return validated(Patch, full, drafted=True)

    def encode(self, patch: Patch) -> bytes:
        """Encode and enforce the size limit (raises :class:`PatchTooLarge`)."""
        data = encode(patch)
        if len(data) > self.max_patch_bytes:
            raise PatchTooLarge(patch.run_id, len(data), self.max_patch_bytes)
        return data

    def append(self, patch: Patch) -> Receipt:
        """Append one patch and wait for the log's acknowledgement.

        Raises :class:`PatchTooLarge` or :class:`DeliveryError`; nothing is appended then.
        """
        where: Appended = self._producer.append(self.log.topics.events, patch.run_id, self.encode(patch))
        return Receipt(patch.patch_id, patch.run_id, where.partition, where.offset)

    def append_async(
        self,
        patch: Patch,
        on_delivery: Callable[[Receipt | None, Exception | None], None] | None = None,
        data: bytes | None = None,
    ) -> None:
        """Queue one patch; ``on_delivery`` gets its receipt or the delivery error. Without
        ``on_delivery`` no receipt is made (the cheaper path) and a failed delivery is
        raised by the next :meth:`flush` or :meth:`close` as :class:`DeliveryError`: never
        dropped silently either way. Call :meth:`flush` to wait for all. ``data``: the
        patch already :meth:`encode`-d (the size limit checked)."""
        data = self.encode(patch) if data is None else data
        run_id = patch.run_id
        if on_delivery is None:
            self._producer.append_async(self._events_topic, run_id, data, None)
            return
        # The callback holds the two ids, not the patch: a patch waiting for its delivery
        # report would otherwise survive into an older GC generation, and every collection
        # of a busy producer would walk it.
        self._producer.append_async(
            self._events_topic, run_id, data, partial(_receipt, on_delivery, patch.patch_id, run_id)
        )

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for every queued patch; returns how many are still queued (0: all
        delivered). Raises :class:`DeliveryError` if a patch appended without a callback
        failed since the last flush."""
        return self._producer.flush(timeout_s)

    def resend_of(self, patch: Patch, earlier: Decision) -> bool:
        """Whether ``patch`` is a resend of the patch ``earlier`` decided: the same record
        but for its time (a resend built again takes a new ``created_at``). Then
        ``earlier`` is its answer; else the id is reused for other content, which the
        projector records as ``patch_id_reused``."""
        if earlier.content_digest is None:
            return True  # decided before digests were recorded: the id answers
        again = patch.model_copy(update={"created_at": earlier.created_at})
        return content_digest(self.encode(again)) == earlier.content_digest

    def wait(
        self,
        run_id: str,
        patch_id: str,
        timeout_s: float = 10.0,
        *,
        source: DecisionSource | None = None,
        poll_s: float = 0.02,
        appended: Receipt | None = None,
        digest: str | None = None,
    ) -> Decision:
        """Wait for the projector's decision on a patch. With ``appended`` (its receipt)
        and ``digest`` (:func:`content_digest` of its record): where the id's decision is
        another content's, the answer is the decision on this record (``patch_id_reused``),
        read from the run's history. Raises :class:`DecisionTimeout`."""
        read = source or self.decisions
        if read is None:
            raise ContractError("waiting for a decision needs a decision source (the projection)")
        deadline = time.monotonic() + timeout_s
        while True:
            d = read(run_id, patch_id)
            if (
                d is not None
                and appended is not None
                and d.offset != appended.offset
                and d.content_digest not in (None, digest)
            ):
                d = self.decisions_at(run_id, appended.offset) if self.decisions_at is not None else None
            if d is not None:
                return d
            if time.monotonic() >= deadline:
                raise DecisionTimeout(run_id, patch_id, timeout_s)
            time.sleep(poll_s)

    def submit(self, patch: Patch, timeout_s: float = 10.0) -> Decision:
        """Append and wait for the decision (this record's: see :meth:`wait`)."""
        data = self.encode(patch)
        where: Appended = self._producer.append(self._events_topic, patch.run_id, data)
        receipt = Receipt(patch.patch_id, patch.run_id, where.partition, where.offset)
        return self.wait(patch.run_id, patch.patch_id, timeout_s, appended=receipt, digest=content_digest(data))

    def close(self) -> None:
        self._producer.close()
