"""Checkpoints as pieces (format 4): what a checkpoint writes is what changed since the
run's previous one.

A run's checkpoint is the store's own pieces of the run — one piece per item and the
patch ids it decided, in a few segments — each a record of the compacted checkpoints topic
keyed ``<run>\\0<piece>``, plus a **head** keyed ``<run>``: revision, covered offset,
verdict, triggers, the run's header and last decisions (which change with every
checkpoint, so they ride in the head rather than in pieces of their own) and a digest of
the whole set of pieces, sealed, signed and compressed. A checkpoint publishes the pieces
that changed since the run's previous checkpoint, then its head; compaction keeps the
newest value of every key, so the topic holds each run's live pieces once, whatever its
history (Kafka Streams' changelog topics work the same way).

**Segments of patch ids** are merged as they pile up, sixteen of a size into one of the
next (size-tiered, as an LSM tree's): a run holds a few dozen segments at most whatever its
length, and each id is rewritten two or three times (patch ids are digests: they do not
compress, so each rewrite costs what the id weighs).

**Epochs.** Every piece value starts with the run's *epoch*: the revision of the run's
last *base* checkpoint, one that wrote every piece (a run's first checkpoint, and its first
after the snapshotter (re)started or took its partition over). A head trusts only pieces
of its epoch, so pieces left by an older epoch — an item deleted while another instance
owned the partition, whose tombstone this one never wrote — are never restored.

**The digest** is a multiset hash over ``(piece name, value)`` (each piece's SHA-256,
expanded by SHAKE-256 to 2,048 bits, summed modulo 2^2048, as LtHash does), so that a
checkpoint updates it per changed piece and a restore recomputes it from what it loaded. A
missing, flipped, moved, stale or extra piece changes it; the head's own seal (a SHA-256
over its canonical JSON, HMAC-signed with the checkpoint key) covers the digest.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import typing

import orjson
import pydantic

from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.store import keys
from runstate.schemas.errors import CheckpointInvalid
from runstate.schemas.patch import Decision
from runstate.schemas.state import COLLECTIONS, RunHeader
from runstate.snapshotter.checkpoint import SigningKey, _check_seal, seal

#: The format of a head and its pieces (3: the header and last decisions were pieces).
FORMAT_VERSION = 4
#: Pieces of one run: its items and its decided patch ids.
_ITEM = "i\0"
_IDS = "p\0"
EPOCH_BYTES = 8
#: Modulus of the multiset hash (2,048-bit elements, as LtHash).
_MOD_BITS = 2048
_MOD = 1 << _MOD_BITS
_ACC_BYTES = _MOD_BITS // 8


def item_piece(kind: str, id_: str) -> str:
    return f"{_ITEM}{kind}\0{id_}"


def ids_piece(revision: int) -> str:
    """A segment of the patch ids a run decided, named by the revision of the checkpoint
    that wrote it (see :func:`merged_segments`)."""
    return f"{_IDS}{revision:016x}"


#: Segments of patch ids merge this many of a size into one (see :func:`merged_segments`):
#: an id is rewritten about log_FANOUT(segments) times, a run keeps up to FANOUT - 1 per tier.
SEGMENT_FANOUT = 16


def segment_tier(ids: int) -> int:
    """A segment's size class: 0 below ``SEGMENT_FANOUT`` ids, then one per power of it."""
    tier = 0
    while ids >= SEGMENT_FANOUT:
        ids //= SEGMENT_FANOUT
        tier += 1
    return tier


def merged_segments(segments: dict[str, int]) -> list[list[str]]:
    """Which of a run's segments (``name -> ids in it``) to merge now: groups of
    ``SEGMENT_FANOUT`` of one tier, smallest first, until no tier holds that many (each
    merged group becomes one segment, named by its newest member)."""
    sizes = dict(segments)
    out: list[list[str]] = []
    while True:
        tiers: dict[int, list[str]] = {}
        for name in sorted(sizes):
            tiers.setdefault(segment_tier(sizes[name]), []).append(name)
        full = [names for _t, names in sorted(tiers.items()) if len(names) >= SEGMENT_FANOUT]
        if not full:
            return out
        group = full[0][:SEGMENT_FANOUT]
        out.append(group)
        total = sum(sizes.pop(n) for n in group)
        sizes[group[-1]] = total


def is_item(name: str) -> bool:
    return name.startswith(_ITEM)


def is_ids(name: str) -> bool:
    return name.startswith(_IDS)


def item_of(name: str) -> tuple[str, str]:
    kind, id_ = name[len(_ITEM) :].split("\0", 1)
    return kind, id_


def record_key(run_id: str, piece: str) -> str:
    """The key of a piece on the checkpoints topic: the run, then a digest of the piece's
    name (ids hold no control characters). Not the name itself: item ids are content (an
    observation's subject, say), and keys are not sealed."""
    return f"{run_id}\0{hashlib.blake2b(piece.encode(), digest_size=16).hexdigest()}"


def split_key(key: bytes | None) -> tuple[str, str | None]:
    """``(run_id, piece digest)`` of a checkpoints-topic key; the digest None for a head."""
    if key is None:
        return "?", None
    run, sep, piece = key.decode(errors="replace").partition("\0")
    return run, (piece if sep else None)


def run_of_key(key: str) -> str:
    """The run a checkpoints-topic key belongs to ('' for a coverage record)."""
    return key.partition("\0")[0]


#: Bodies from this size on are published zlib-compressed with :data:`ZDICT` (flag byte 1;
#: 0: as stored) when that is smaller.
COMPRESS_FROM = 64


def _field_names(model: type[pydantic.BaseModel], seen: set[type]) -> list[str]:
    out: list[str] = []
    if model in seen:
        return out
    seen.add(model)
    for name, f in model.model_fields.items():
        out.append(f'"{name}":')
        for tp in (f.annotation, *typing.get_args(f.annotation)):
            for t in (tp, *typing.get_args(tp)):
                if isinstance(t, type) and issubclass(t, pydantic.BaseModel):
                    out += _field_names(t, seen)
    return out


def _zdict() -> bytes:
    """zlib's preset dictionary for pieces and heads: the field names of a head, the header,
    decisions and every item (a piece is one small JSON document, which compresses poorly
    on its own).
    Derived from the models, so its digest is in every head (:data:`ZDICT_ID`)."""
    seen: set[type] = set()
    names = [n for m in (RunHeader, Decision, *COLLECTIONS.values()) for n in _field_names(m, seen)]
    values = [f'"{v}"' for tp in _literals() for v in typing.get_args(tp)]
    head = (
        '{"kind":"head","format_version":"versions":"run_id":"revision":"partition":"covers_offset":"epoch":'
        '"pieces":"pieces_digest":"triggers":["run_started","tasks_done","waiting","before_side_effect",'
        '"workspace","lease_released","terminal","age","every_"],"verdict":"erased":"header":"recent":'
        '"digest":"signature":'
    )
    return (head + "".join(names) + ",".join(values) + "null,false,true,[],{},artifact://,T00:00:00Z").encode()


def _literals() -> list[Any]:
    """The Literal types (statuses, outcomes, ...) the models' fields take."""
    out: list[Any] = []
    seen: set[type] = set()

    def walk(model: type[pydantic.BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for f in model.model_fields.values():
            for tp in (f.annotation, *typing.get_args(f.annotation)):
                if typing.get_origin(tp) is typing.Literal and tp not in out:
                    out.append(tp)
                for t in (tp, *typing.get_args(tp)):
                    if isinstance(t, type) and issubclass(t, pydantic.BaseModel):
                        walk(t)

    for m in (RunHeader, Decision, *COLLECTIONS.values()):
        walk(m)
    return out


ZDICT = _zdict()
ZDICT_ID = hashlib.sha256(ZDICT).hexdigest()[:16]
#: What a head's pieces depend on: the reducer's version, the store's format (pieces are
#: its bytes) and the compression dictionary; a head of other ones is not trusted.
VERSIONS = f"{REDUCER_VERSION}/{keys.STORE_FORMAT.decode()}/{ZDICT_ID}"


def _compress(body: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, ZDICT)
    return c.compress(body) + c.flush()


def _decompress(payload: bytes) -> bytes:
    d = zlib.decompressobj(15, ZDICT)
    return d.decompress(payload) + d.flush()


def piece_value(epoch: int, name: str, body: bytes) -> bytes:
    """A piece as published: its epoch, its name, then the store's bytes, compressed when
    that pays (an empty body: the piece is gone in this epoch). An empty value is a piece
    gone with its epoch (a base's or an erasure's)."""
    n = name.encode()
    packed = _compress(body) if len(body) >= COMPRESS_FROM else b""
    flag, payload = (b"\x01", packed) if packed and len(packed) < len(body) else (b"\x00", body)
    return epoch.to_bytes(EPOCH_BYTES, "big") + len(n).to_bytes(2, "big") + n + flag + payload


def unpack(value: bytes) -> tuple[int, str, bytes] | None:
    """``(epoch, name, body)`` of a piece's value (the body as stored); None for an empty
    or malformed one."""
    if len(value) < EPOCH_BYTES + 3:
        return None
    n = int.from_bytes(value[EPOCH_BYTES : EPOCH_BYTES + 2], "big")
    start = EPOCH_BYTES + 2
    if len(value) < start + n + 1:
        return None
    try:
        name = value[start : start + n].decode()
        flag, payload = value[start + n], value[start + n + 1 :]
        body = payload if flag == 0 else _decompress(payload) if flag == 1 else None
    except (UnicodeDecodeError, zlib.error):
        return None
    if body is None:
        return None
    return int.from_bytes(value[:EPOCH_BYTES], "big"), name, body


def live(value: bytes | None, epoch: int) -> bytes | None:
    """A piece's body when it is one of ``epoch``'s and not gone, else None."""
    if value is None or int.from_bytes(value[:EPOCH_BYTES], "big") != epoch:
        return None  # another epoch's: not decompressed for nothing
    got = unpack(value)
    return got[2] if got is not None and got[2] else None


# --- the multiset digest ----------------------------------------------------------------------


def element(name: str, epoch: int, body: bytes) -> int:
    """One piece's share of the digest: its name, epoch and body as stored (not as
    compressed, which another zlib may do otherwise)."""
    return _element(name.encode(), epoch.to_bytes(8, "big"), body)


def _element(name: bytes, epoch: bytes, body: bytes) -> int:
    h = hashlib.sha256(len(name).to_bytes(4, "big") + name + epoch + body).digest()
    return int.from_bytes(hashlib.shake_256(h).digest(_ACC_BYTES), "little")


class Tally(NamedTuple):
    """A run's live pieces as the digest sees them: their number and the sum of their elements."""

    count: int = 0
    acc: int = 0

    def add(self, name: str, epoch: int, body: bytes) -> Tally:
        return Tally(self.count + 1, (self.acc + element(name, epoch, body)) % _MOD)

    def remove(self, name: str, epoch: int, body: bytes) -> Tally:
        return Tally(self.count - 1, (self.acc - element(name, epoch, body)) % _MOD)

    def digest(self) -> str:
        return hashlib.sha256(self.count.to_bytes(8, "big") + self.acc.to_bytes(_ACC_BYTES, "little")).hexdigest()

    def encode(self, epoch: int) -> bytes:
        return epoch.to_bytes(8, "big") + self.count.to_bytes(8, "big") + self.acc.to_bytes(_ACC_BYTES, "little")

    @staticmethod
    def decode(raw: bytes) -> tuple[int, Tally]:
        """``(epoch, tally)`` as :meth:`encode` wrote them."""
        return int.from_bytes(raw[:8], "big"), Tally(
            int.from_bytes(raw[8:16], "big"), int.from_bytes(raw[16:], "little")
        )


def tally_of(epoch: int, bodies: Iterable[tuple[str, bytes]]) -> Tally:
    """The digest of pieces of ``epoch``: ``(name, body)`` (summed, then reduced once)."""
    ep = epoch.to_bytes(8, "big")
    count = acc = 0
    for name, body in bodies:
        acc += _element(name.encode(), ep, body)
        count += 1
    return Tally(count, acc % _MOD)


# --- the head ----------------------------------------------------------------------------------


class Head(NamedTuple):
    """A checked head (see :func:`check_head`)."""

    run_id: str
    revision: int
    partition: int
    covers_offset: int
    epoch: int
    pieces: int
    pieces_digest: str
    triggers: list[str]
    verdict: str
    #: an erased run's tombstone header (content-free), or None
    erased: str | None
    #: the run's header as the store holds it
    header: bytes
    #: the run's last decisions: ``[offset, patch id, reused, decision JSON]``
    recent: list[Any]
    doc: dict[str, Any]


def make_head(
    *,
    run_id: str,
    revision: int,
    partition: int,
    covers_offset: int,
    epoch: int,
    tally: Tally,
    triggers: list[str],
    verdict: str,
    key: SigningKey,
    header: bytes,
    recent: list[Any],
    erased: str | None = None,
) -> bytes:
    """A head as published: sealed (digest over all of it; signed with ``key``), then
    compressed behind :data:`HEAD_MAGIC`. ``header``: the run's header as the store holds
    it (the state's schema version and time are its); ``recent``: its last decisions."""
    doc = seal(
        {
            "kind": "head",
            "format_version": FORMAT_VERSION,
            "versions": VERSIONS,
            "run_id": run_id,
            "revision": revision,
            "partition": partition,
            "covers_offset": covers_offset,
            "epoch": epoch,
            "pieces": tally.count,
            "pieces_digest": tally.digest(),
            "triggers": triggers,
            "verdict": verdict,
            "erased": erased,
            "header": header.decode(),
            "recent": recent,
        },
        key,
    )
    return head_value(doc)


def head_value(doc: bytes) -> bytes:
    """A sealed head document as a head record holds it."""
    return HEAD_MAGIC + _compress(doc)


def is_head(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == "head"


#: How a head record starts: then its sealed JSON, compressed. (A format 3 head was that
#: JSON as it is, starting with :data:`_HEAD3_START`: ``seal`` keeps the document's order.)
HEAD_MAGIC = b"\x00rsh"
_HEAD3_START = b'{"kind":"head"'


def is_head_record(raw: bytes) -> bool:
    """Whether a run-keyed record of the checkpoints topic is a head (format 3 or 4) rather
    than a whole checkpoint (format 2), told without parsing it."""
    return raw.startswith(HEAD_MAGIC) or raw.startswith(_HEAD3_START)


def head_document(raw: bytes) -> Any:
    """A head record's JSON document, parsed (not checked); a whole checkpoint's (format 2)
    too. Raises ``ValueError``."""
    try:
        return orjson.loads(_decompress(raw[len(HEAD_MAGIC) :]) if raw.startswith(HEAD_MAGIC) else raw)
    except zlib.error as e:
        raise ValueError(f"not a compressed head: {e}") from e


def head_of(doc: dict[str, Any]) -> Head:
    """A head document's fields, not checked (:func:`check_head` checks them). Raises
    ``KeyError`` for a missing one."""
    return Head(
        doc["run_id"],
        doc["revision"],
        doc["partition"],
        doc["covers_offset"],
        doc["epoch"],
        doc["pieces"],
        doc["pieces_digest"],
        doc["triggers"],
        doc["verdict"],
        doc.get("erased"),
        doc["header"].encode(),
        doc["recent"],
        doc,
    )


def check_head(doc: dict[str, Any], key: SigningKey) -> Head:
    """A head record's promise, once its seal, versions and shape are checked. Raises
    :class:`CheckpointInvalid`."""
    run_id = doc.get("run_id")
    if doc.get("format_version") != FORMAT_VERSION:
        raise CheckpointInvalid(
            run_id, f"format_version {doc.get('format_version')!r}, this runstate reads {FORMAT_VERSION}"
        )
    _check_seal(doc, key, run_id if isinstance(run_id, str) else None)
    if doc.get("versions") != VERSIONS:
        raise CheckpointInvalid(
            run_id,
            f"written by other rules or forms (reducer/store format/dictionary "
            f"{doc.get('versions')!r}, this runstate {VERSIONS!r}): its state may "
            "differ from a replay with today's rules",
        )
    try:
        head = head_of(doc)
    except (KeyError, AttributeError) as e:
        raise CheckpointInvalid(run_id, f"not a checkpoint head: no {e}") from e
    if (
        not all(type(v) is int for v in (head.revision, head.partition, head.covers_offset, head.epoch, head.pieces))
        or type(head.run_id) is not str
        or type(head.pieces_digest) is not str
        or type(head.recent) is not list
    ):
        raise CheckpointInvalid(run_id, "not a checkpoint head: wrong field types")
    return head


def load_head(raw: bytes, key: SigningKey) -> Head:
    try:
        doc = head_document(raw)
    except ValueError as e:  # orjson's errors are ValueErrors too
        raise CheckpointInvalid(None, f"not a head: {e}") from e
    if not is_head(doc):
        raise CheckpointInvalid(doc.get("run_id") if isinstance(doc, dict) else None, "not a checkpoint head")
    return check_head(doc, key)


def check_pieces(head: Head, tally: Tally) -> None:
    """Raises :class:`CheckpointInvalid` unless the pieces found are the head's."""
    if tally.count != head.pieces or tally.digest() != head.pieces_digest:
        raise CheckpointInvalid(
            head.run_id,
            f"its pieces do not match its head ({tally.count} found of "
            f"{head.pieces}, digest differs): a piece is missing, damaged or "
            "not this checkpoint's",
        )
