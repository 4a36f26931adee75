"""Checkpoints as pieces in bundles (format 6): what a checkpoint writes is what changed
since the run's previous one.

A run's checkpoint is the store's own pieces of the run — one piece per item, the patch
ids it decided in a few segments, and its header — plus a **head** keyed ``<run>``:
revision, covered offset, verdict, triggers, the header's fields that changed since its
piece was written and the run's last decisions (which change with every checkpoint, so
they ride in the head), the digest of the whole set of pieces, and the **bundles** the
pieces are in, sealed, signed and compressed.

**Bundles.** A checkpoint publishes the pieces that changed since the run's previous one
as one record, a bundle (compressed as one: a run's pieces share most of their words),
into one of the run's ``SLOTS`` slots (key ``<run>\\0s<slot>``), then its head, which names
the bundles it stands on in the order they apply, each by its slot and the revision that
wrote it (a bundle says its epoch and revision before its compressed entries), and seals
them with one digest over their records' SHA-256s. A bundle goes to a slot the run's
newest head does not name, so a crash before the new head leaves the older one whole.
Bundles are merged size-tiered (:func:`absorbed`), and a run is based again once its
bundles hold more superseded pieces than live ones: a run stands on a few bundles, and
compaction, which keeps the newest record of each slot, bounds the topic by the live
state. A restore reads a run's head and its few bundles — records per run, not per piece
— and writes their bytes as they are.

**The header** changes with every patch (revision, time, counters) but only in a few of
its fields: its piece is written again in a base or a merge, or when the fields that
changed since weigh more than half of it; in between a head carries only those fields.

**Segments of patch ids** are merged as they pile up, sixteen of a size into one of the
next (size-tiered, as an LSM tree's): a run holds a few dozen segments at most whatever its
length, and each id is rewritten two or three times (patch ids are digests: they do not
compress, so each rewrite costs what the id weighs).

**Epochs.** A run's *epoch* is the revision of its last *base* checkpoint, one that wrote
every piece (a run's first checkpoint, and its first after the snapshotter (re)started or
took its partition over), and random bits. The snapshotter's local history keeps each
piece's versions with their epoch, so that time travel never mixes two bases.

**The digest** is a multiset hash over ``(piece name, value)`` (each piece's SHA-256,
expanded by SHAKE-256 to 2,048 bits, summed modulo 2^2048, as LtHash does), updated per
changed piece; time travel recomputes it from the local history. A restore checks the
bundles' SHA-256s against the head's digest of them and the number of pieces they add up
to; the head's own seal (a SHA-256 over its canonical JSON, HMAC-signed with the
checkpoint key) covers both.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import typing

import msgspec
import orjson
import pydantic
import zstandard

from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.store import keys
from runstate.schemas.errors import CheckpointInvalid
from runstate.schemas.patch import Decision
from runstate.schemas.state import COLLECTIONS, RunHeader
from runstate.snapshotter.checkpoint import SigningKey, _check_seal, seal

#: The format of a head and its pieces (3: the header and last decisions were pieces).
FORMAT_VERSION = 6
#: The format before, still read: the header whole in every head, each bundle named by
#: its SHA-256 (its bundles start ``\\x00rsb`` and hold their epoch and revision inside).
FORMAT_5 = 5
#: Pieces of one run: its items and its decided patch ids. An item's name after its prefix,
#: ``<kind>\0<id>``, is its key in the store after the run's items prefix (a restore writes it so).
ITEM_PREFIX = "i\0"
IDS_PREFIX = "p\0"
#: The run's header, as the store holds it (see :func:`header_changes`).
HEADER_PIECE = "h\0"
EPOCH_BYTES = 8
#: Modulus of the multiset hash (2,048-bit elements, as LtHash).
_MOD_BITS = 2048
_MOD = 1 << _MOD_BITS
_ACC_BYTES = _MOD_BITS // 8


def item_piece(kind: str, id_: str) -> str:
    return f"{ITEM_PREFIX}{kind}\0{id_}"


def ids_piece(revision: int) -> str:
    """A segment of the patch ids a run decided, named by the revision of the checkpoint
    that wrote it (see :func:`merged_segments`)."""
    return f"{IDS_PREFIX}{revision:016x}"


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
    return name.startswith(ITEM_PREFIX)


def is_ids(name: str) -> bool:
    return name.startswith(IDS_PREFIX)


def item_of(name: str) -> tuple[str, str]:
    kind, id_ = name[len(ITEM_PREFIX) :].split("\0", 1)
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
    """The compression dictionary of pieces and heads: the field names of a head, the header,
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
        '"digest":"signature":"bundles":'
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


#: Heads and bundles are compressed with Zstandard (level 6) and :data:`ZDICT` as its raw
#: content dictionary; format 5 and older local histories used zlib with the same one.
ZSTD_LEVEL = 6
#: The most a head or bundle may decompress to: a frame that names more is refused.
MAX_DECOMPRESSED = 1 << 30
_ZSTD_FRAME = b"\x28\xb5\x2f\xfd"  # how a Zstandard frame starts (a zlib stream starts 0x78)
_ZSTD_DICT = zstandard.ZstdCompressionDict(ZDICT, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_codecs = threading.local()  # a Zstandard context serves one thread at a time


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    pair = getattr(_codecs, "pair", None)
    if pair is None:
        pair = _codecs.pair = (
            zstandard.ZstdCompressor(
                level=ZSTD_LEVEL,
                dict_data=_ZSTD_DICT,
                write_content_size=True,
                write_checksum=False,
                write_dict_id=False,
            ),
            zstandard.ZstdDecompressor(dict_data=_ZSTD_DICT),
        )
    return pair  # type: ignore[no-any-return]


def _compress(body: bytes) -> bytes:
    return _zstd()[0].compress(body)  # type: ignore[no-any-return]


def _decompress(payload: bytes) -> bytes:
    """A head's or bundle's payload (Zstandard, or zlib as format 5 wrote it) decompressed.
    Raises ``ValueError``."""
    try:
        if payload[:4] == _ZSTD_FRAME:
            size = zstandard.frame_content_size(payload)
            if not 0 <= size <= MAX_DECOMPRESSED:
                raise ValueError(f"a compressed frame of {size} bytes (unknown: -1) is refused")
            return _zstd()[1].decompress(payload)  # type: ignore[no-any-return]
        d = zlib.decompressobj(15, ZDICT)
        return d.decompress(payload) + d.flush()
    except (zlib.error, zstandard.ZstdError) as e:
        raise ValueError(f"cannot decompress: {e}") from e


def piece_value(epoch: int, name: str, body: bytes) -> bytes:
    """A piece as the snapshotter's history keeps it: its epoch, its name, then the store's
    bytes (an empty body: the piece is gone in this epoch). An empty value is a piece gone
    with its epoch (a base's or an erasure's). Not compressed here (flag byte 0): the
    store's block compression does that in RocksDB's own threads, off the snapshotter's;
    flag 1 (zlib with :data:`ZDICT`), which format 4 published and older histories hold, is
    still read."""
    n = name.encode()
    return epoch.to_bytes(EPOCH_BYTES, "big") + len(n).to_bytes(2, "big") + n + b"\x00" + body


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
    except (UnicodeDecodeError, ValueError):
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


def live_bodies(values: Iterable[tuple[str, bytes]], epoch: int) -> dict[str, bytes]:
    """:func:`live` of many pieces (``(name, value)``): the bodies of those of ``epoch``
    not gone. An uncompressed body (flag 0, as this runstate keeps them) is sliced out
    without decoding the value's name again."""
    ep = epoch.to_bytes(EPOCH_BYTES, "big")
    out: dict[str, bytes] = {}
    for name, value in values:
        if value[:EPOCH_BYTES] != ep:
            continue
        start = EPOCH_BYTES + 2 + int.from_bytes(value[EPOCH_BYTES : EPOCH_BYTES + 2], "big")
        if len(value) > start and value[start] == 0:
            body: bytes | None = value[start + 1 :]
        else:
            body = live(value, epoch)
        if body:
            out[name] = body
    return out


# --- bundles: the pieces as the checkpoints topic holds them ----------------------------------

#: Slots of a run on the checkpoints topic (keys ``<run>\\0s<slot>``): each holds one bundle,
#: compaction keeps its newest, so the topic holds at most this many bundles of a run.
SLOTS = 32
#: How a bundle record starts: then the run's epoch and the revision that wrote it (8 bytes
#: each, big-endian), then its entries, compressed. (Format 5's started ``\\x00rsb``.)
BUNDLE_MAGIC = b"\x00rb6"
_NAME_END = len(BUNDLE_MAGIC) + 16
#: Bundles are merged size-tiered, as an LSM tree's files: a checkpoint's bundle absorbs
#: the run's newest bundles while MERGE_FANOUT - 1 of them are of its size class or smaller
#: (each class MERGE_FANOUT times the one below, from TIER_BYTES), so a run stands on a few
#: bundles and a piece is rewritten about once per class.
MERGE_FANOUT = 8
TIER_BYTES = 1024
#: A base is written again once the run's bundles weigh more than this many times its
#: live pieces (what they hold that newer bundles superseded is then dropped) ...
REBASE_RATIO = 2
#: ... plus this many bytes (a tiny run is not based again for every few bytes).
REBASE_FLOOR = 4096


def slot_key(run_id: str, slot: int) -> str:
    return f"{run_id}\0s{slot}"


def slot_of(piece: str) -> int | None:
    """The slot a checkpoints-topic key's suffix names, or None (a format 4 piece's)."""
    digits = piece[1:]
    if piece[:1] != "s" or not (digits.isascii() and digits.isdigit()) or str(int(digits)) != digits:
        return None
    return int(digits) if int(digits) < SLOTS else None


class Bundle(NamedTuple):
    """One bundle a run's newest checkpoint stands on: its slot, the revision that wrote it,
    its :func:`bundle_digest`, the bytes of its entries before compression, and the names
    of its pieces (None for a base, which is never absorbed)."""

    slot: int
    revision: int
    sha: str
    raw: int
    names: list[str] | None


def bundle_value(epoch: int, revision: int, entries: dict[str, bytes]) -> bytes:
    """A bundle as published: the run's epoch and the revision that wrote it, then its
    entries ``name -> body as stored`` (an empty body: the piece is gone), compressed as
    one (the pieces of a run share most of their words, which compress poorly one by one)."""
    name = epoch.to_bytes(8, "big") + revision.to_bytes(8, "big")
    return BUNDLE_MAGIC + name + _compress(_BUNDLE.encode(list(entries.items())))


def bundle_name(value: bytes) -> tuple[int, int] | None:
    """``(epoch, revision)`` a bundle record says it is of, read without decompressing it;
    None for what is not a bundle of this format."""
    if len(value) < _NAME_END or not value.startswith(BUNDLE_MAGIC):
        return None
    start = len(BUNDLE_MAGIC)
    return int.from_bytes(value[start : start + 8], "big"), int.from_bytes(value[start + 8 : _NAME_END], "big")


def bundle_entries(value: bytes) -> list[tuple[str, bytes]]:
    """A bundle's entries (of this format or format 5), in the order they apply. Raises
    ``ValueError``."""
    try:
        if bundle_name(value) is not None:
            return _UNBUNDLE.decode(_decompress(value[_NAME_END:]))
        if value.startswith(_BUNDLE5_MAGIC):
            return _UNBUNDLE5.decode(_decompress(value[len(_BUNDLE5_MAGIC) :]))[2]
    except (ValueError, msgspec.DecodeError) as e:
        raise ValueError(f"not a bundle: {e}") from e
    raise ValueError("not a bundle")


def bundle_digest(value: bytes) -> str:
    """A bundle record's SHA-256 (the first 128 bits), of which a head seals its bundles'."""
    return hashlib.sha256(value).hexdigest()[:32]


def bundles_digest(shas: Iterable[str]) -> str:
    """What a head names its bundles' contents by: one digest over their
    :func:`bundle_digest`, in the order they apply."""
    return hashlib.sha256("".join(shas).encode()).hexdigest()[:32]


def bundle_raw(entries: dict[str, bytes]) -> int:
    return sum(len(n) + len(b) for n, b in entries.items())


_BUNDLE = msgspec.msgpack.Encoder()
_UNBUNDLE = msgspec.msgpack.Decoder(list[tuple[str, bytes]])
_BUNDLE5_MAGIC = b"\x00rsb"
_UNBUNDLE5 = msgspec.msgpack.Decoder(tuple[int, int, list[tuple[str, bytes]]])


def size_class(raw: int) -> int:
    t = 0
    while raw >= TIER_BYTES * MERGE_FANOUT**t:
        t += 1
    return t


def absorbed(bundles: list[Bundle], raw: int, live: int) -> int | None:
    """How many of the run's newest ``bundles`` a checkpoint writing ``raw`` bytes of changed
    pieces absorbs into its own bundle, or None when it must be a base instead (too many
    bundles, or too much of them superseded; ``live``: the bytes of the run's live pieces)."""
    m, size = 0, raw
    while True:
        t, k = size_class(size), 0
        for b in reversed(bundles[: len(bundles) - m]):
            if b.names is None or size_class(b.raw) > t:
                break
            k += 1
        if k < MERGE_FANOUT - 1:
            break
        size += sum(b.raw for b in bundles[len(bundles) - m - k : len(bundles) - m])
        m += k
    kept = bundles[: len(bundles) - m]
    if len(kept) + 1 > SLOTS - 1 or sum(b.raw for b in kept) + size > REBASE_RATIO * live + REBASE_FLOOR:
        return None
    return m


def free_slot(bundles: list[Bundle]) -> int:
    """A slot no bundle of the run's newest checkpoint is in (its head stays whole on the
    topic while the next checkpoint's bundle is written)."""
    used = {b.slot for b in bundles}
    return next(s for s in range(SLOTS) if s not in used)


class Published(NamedTuple):
    """What the snapshotter keeps of a run's newest checkpoint: its epoch, the digest of its
    live pieces, their bytes, and its bundles in the order they apply."""

    epoch: int
    tally: Tally
    live: int
    bundles: list[Bundle]

    def encode(self) -> bytes:
        b = [[x.slot, x.revision, x.sha, x.raw, x.names] for x in self.bundles]
        t = self.tally
        return _STATE_MAGIC + _BUNDLE.encode([self.epoch, t.count, t.acc.to_bytes(_ACC_BYTES, "little"), self.live, b])

    @staticmethod
    def decode(raw: bytes) -> Published | None:
        """As :meth:`encode` wrote it; None for an older format's (format 4 kept only a tally).
        Format 5's bundles had no revision (-1 here): the run's next checkpoint is a base,
        which only needs to know the slots they hold."""
        if raw.startswith(_STATE_MAGIC):
            epoch, count, acc, live, b = msgspec.msgpack.decode(raw[len(_STATE_MAGIC) :])
            bundles = [Bundle(*x) for x in b]
        elif raw.startswith(_STATE5_MAGIC):
            epoch, count, acc, live, b = msgspec.msgpack.decode(raw[len(_STATE5_MAGIC) :])
            bundles = [Bundle(s, -1, h, r, n) for s, h, r, n in b]
        else:
            return None
        return Published(epoch, Tally(count, int.from_bytes(acc, "little")), live, bundles)


_STATE_MAGIC = b"\x00rs6"
_STATE5_MAGIC = b"\x00rs5"


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
    #: the header's fields that differ from its piece's (see :func:`header_of`)
    header_changes: dict[str, Any]
    #: the run's last decisions: ``[offset, patch id, reused, decision JSON]``
    recent: list[Any]
    #: the bundles its pieces are in, in the order they apply: ``[slot, revision that wrote it]``
    bundles: list[Any]
    #: :func:`bundles_digest` of those bundles' records
    bundles_digest: str
    #: a format 5 head's: the run's whole header as the store holds it (its bundles are
    #: named ``[slot, SHA-256 of the record]``, ``bundles_digest`` is empty), else None
    header5: bytes | None
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
    header_changes: dict[str, Any],
    recent: list[Any],
    bundles: list[Bundle],
    erased: str | None = None,
) -> bytes:
    """A head as published: sealed (digest over all of it; signed with ``key``), then
    compressed behind :data:`HEAD_MAGIC`. ``header_changes``: the header's fields that
    differ from its piece's (:func:`header_changes`); ``recent``: its last decisions."""
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
            "header": header_changes,
            "recent": recent,
            "bundles": [[b.slot, b.revision] for b in bundles],
            "bundles_digest": bundles_digest(b.sha for b in bundles),
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
    if not raw.startswith(HEAD_MAGIC):
        return orjson.loads(raw)
    try:
        doc = _decompress(raw[len(HEAD_MAGIC) :])
    except ValueError as e:
        raise ValueError(f"not a compressed head: {e}") from e
    return orjson.loads(doc)


def head_of(doc: dict[str, Any]) -> Head:
    """A head document's fields, not checked (:func:`check_head` checks them). Raises
    ``KeyError`` for a missing one."""
    v5 = doc.get("format_version") == FORMAT_5
    header5 = doc["header"] if v5 else None
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
        {} if v5 else doc["header"],
        doc["recent"],
        doc["bundles"],
        "" if v5 else doc["bundles_digest"],
        header5.encode() if type(header5) is str else None,
        doc,
    )


def check_head(doc: dict[str, Any], key: SigningKey) -> Head:
    """A head record's promise, once its seal, versions and shape are checked. Raises
    :class:`CheckpointInvalid`."""
    run_id = doc.get("run_id")
    if doc.get("format_version") not in (FORMAT_VERSION, FORMAT_5):
        raise CheckpointInvalid(
            run_id, f"format_version {doc.get('format_version')!r}, this runstate reads {FORMAT_VERSION} and {FORMAT_5}"
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
        or type(head.header_changes) is not dict
        or type(head.recent) is not list
        or type(head.bundles) is not list
        or type(head.bundles_digest) is not str
        or (head.header5 is None) != (doc["format_version"] == FORMAT_VERSION)
        or not all(
            type(b) is list
            and len(b) == 2
            and type(b[0]) is int
            and 0 <= b[0] < SLOTS
            and type(b[1]) is (int if head.header5 is None else str)
            for b in head.bundles
        )
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


def header_changes(header: bytes, piece: bytes | None) -> dict[str, Any] | None:
    """The fields of ``header`` (as the store holds it) that differ from its ``piece``'s,
    from which :func:`header_of` makes its exact bytes again; None where it cannot (no
    piece, other fields, or bytes JSON would not write back alike): the piece is written
    again."""
    if piece is None:
        return None
    if piece == header:
        return {}
    now, was = orjson.loads(header), orjson.loads(piece)
    if now.keys() != was.keys():
        return None
    changes = {k: v for k, v in now.items() if was[k] != v}
    return changes if _merged(was, changes) == header else None


def header_of(head: Head, piece: bytes | None) -> bytes:
    """The run's header as the store holds it, from its piece and the head's changes (an
    erased run's: its tombstone; a format 5 head's: its own). Raises ``ValueError`` for a
    header piece missing or not a JSON object, or changes naming a field it does not have."""
    if head.erased is not None:
        return head.erased.encode()
    if head.header5 is not None:
        return head.header5
    if piece is None:
        raise ValueError("no header piece")
    if not head.header_changes:
        return piece
    was = orjson.loads(piece)
    if type(was) is not dict or not head.header_changes.keys() <= was.keys():
        raise ValueError("the head's header changes do not fit its header piece")
    return _merged(was, head.header_changes)


def _merged(was: dict[str, Any], changes: dict[str, Any]) -> bytes:
    return orjson.dumps({**was, **changes})


def check_pieces(head: Head, tally: Tally) -> None:
    """Raises :class:`CheckpointInvalid` unless the pieces found are the head's."""
    if tally.count != head.pieces or tally.digest() != head.pieces_digest:
        raise CheckpointInvalid(
            head.run_id,
            f"its pieces do not match its head ({tally.count} found of "
            f"{head.pieces}, digest differs): a piece is missing, damaged or "
            "not this checkpoint's",
        )
