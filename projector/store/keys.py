"""The keyspace of a partition's projection store: every key and every value encoding.

Only :mod:`runstate.projector.store.partition` reads and writes these keys; everything else (the
snapshotter's checkpoint history, recovery) goes through the store's methods. Keys are
bytes; ``\\0`` separates parts (ids cannot contain control characters, see
``schemas.events.Id``), and offsets/revisions are fixed-width hex so that keys sort in
log/revision order::

    m:format                          store format version
    m:next_offset                     next log offset to apply (8 bytes, big-endian)
    m:restoring                       a restore from checkpoints began and did not finish
    h:<run>                           run header (RunHeader JSON)
    i:<run>\\0<collection>\\0<id>       one collection item: 8-byte insertion seq + item JSON
    l:<run>\\0<offset 16 hex>          decision of the patch at that offset (history, log order)
    d:<run>\\0<patch_id>               offset of the patch's decision (idempotency index)
    x:<offset 16 hex>                 a dead-lettered record: reason and detail (JSON)
    k:<run>                           the run was restored from a checkpoint covering the log
                                      up to this offset (8 bytes); its earlier history is not here
    s:<run>                           the patch ids decided before that restore (concatenated
                                      16-byte digests): old resends are duplicates, exactly
    c:<run>\\0<revision 16 hex>        a checkpoint of the run (the snapshotter's stores: local
                                      history; its head, opaque to the store)
    v:<run>\\0<piece>\\0<revision 16 hex> a piece of the run as the checkpoint at that revision
                                      published it (opaque; its newest version at or below a
                                      revision is the piece's value in that checkpoint)
    a:<run>                           the digest of the run's live pieces after its newest
                                      checkpoint (opaque)
    o:<run>\\0<revision 16 hex>        outbox: that checkpoint's records, stored but not yet published

Values are JSON written by pydantic's serializer (one encoder for runs, whichever path
writes them: live patches or a restore from checkpoints).
"""

from __future__ import annotations

import hashlib

from runstate.projector.core.working import Entry, Header, decode_header_json, encode_header_json
from runstate.schemas import structs
from runstate.schemas.events import Model
from runstate.schemas.patch import Decision
from runstate.schemas.state import COLLECTIONS, RunHeader

STORE_FORMAT = b"3"  # 2: run headers track their running tasks; 3: run policies name input_authority
FORMAT = b"m:format"
NEXT_OFFSET = b"m:next_offset"
#: a restore from checkpoints began and has not finished: the store is not to be used
RESTORING = b"m:restoring"
HEADERS = b"h:"
DEAD_LETTERS = b"x:"
RESTORED = b"k:"
RESTORED_IDS = b"s:"
CHECKPOINTS = b"c:"
OUTBOX = b"o:"
DEDUPE = b"d:"
PIECES = b"v:"
TALLIES = b"a:"
#: runs whose erasure is stored but not finished (keys destroyed, bytes compacted away)
ERASING = b"e:"


def _run(run_id: str) -> bytes:
    return run_id.encode()


def header_key(run_id: str) -> bytes:
    return HEADERS + _run(run_id)


def run_items_prefix(run_id: str) -> bytes:
    """Every item of every collection of one run (kinds in order, then ids)."""
    return b"i:" + _run(run_id) + b"\0"


def items_prefix(run_id: str, kind: str) -> bytes:
    """Every item of one collection of one run."""
    return b"i:" + _run(run_id) + b"\0" + kind.encode() + b"\0"


def item_key(run_id: str, kind: str, id_: str) -> bytes:
    return items_prefix(run_id, kind) + id_.encode()


def history_prefix(run_id: str) -> bytes:
    return b"l:" + _run(run_id) + b"\0"


def history_key(run_id: str, offset: int) -> bytes:
    return history_prefix(run_id) + f"{offset:016x}".encode()


def dedupe_prefix(run_id: str) -> bytes:
    return DEDUPE + _run(run_id) + b"\0"


def dedupe_key(run_id: str, patch_id: str) -> bytes:
    return dedupe_prefix(run_id) + patch_id.encode()


def dead_letter_key(offset: int) -> bytes:
    return DEAD_LETTERS + f"{offset:016x}".encode()


def restored_key(run_id: str) -> bytes:
    return RESTORED + _run(run_id)


def restored_ids_key(run_id: str) -> bytes:
    return RESTORED_IDS + _run(run_id)


def outbox_key(run_id: str, revision: int) -> bytes:
    return OUTBOX + _run(run_id) + b"\0" + f"{revision:016x}".encode()


def run_and_revision(key: bytes, prefix: bytes) -> tuple[str, int]:
    """``(run_id, revision)`` of a ``c:``/``o:`` key."""
    run, rev = key[len(prefix) :].rsplit(b"\0", 1)
    return run.decode(), int(rev, 16)


def checkpoints_prefix(run_id: str) -> bytes:
    return CHECKPOINTS + _run(run_id) + b"\0"


def checkpoint_key(run_id: str, revision: int) -> bytes:
    return checkpoints_prefix(run_id) + f"{revision:016x}".encode()


def pieces_prefix(run_id: str) -> bytes:
    return PIECES + _run(run_id) + b"\0"


def piece_version_key(run_id: str, piece: str, revision: int) -> bytes:
    return pieces_prefix(run_id) + piece.encode() + b"\0" + revision_suffix(revision)


def revision_suffix(revision: int) -> bytes:
    """How a piece version's key ends: its revision in fixed-width hex (ordered as bytes)."""
    return f"{revision:016x}".encode()


def tally_key(run_id: str) -> bytes:
    return TALLIES + _run(run_id)


def erasing_key(run_id: str) -> bytes:
    return ERASING + _run(run_id)


def run_ranges(run_id: str) -> list[tuple[bytes, bytes]]:
    """Every key range that holds something of one run, as ``[start, end)`` pairs."""
    run = _run(run_id)
    out = []
    for prefix in (b"i:", b"l:", b"d:", CHECKPOINTS, OUTBOX, PIECES):
        start = prefix + run + b"\0"
        out.append((start, prefix + run + b"\1"))
    for prefix in (HEADERS, RESTORED, RESTORED_IDS, TALLIES):
        out.append((prefix + run, prefix + run + b"\0"))
    return out


def run_of(key: bytes, prefix: bytes) -> str:
    """The run id of a ``h:``/``k:``/``c:`` key."""
    return key[len(prefix) :].split(b"\0", 1)[0].decode()


# --- values -------------------------------------------------------------------------------


def dump(model: Model) -> bytes:
    """A contract model, or its struct, as JSON bytes: the bytes of the model's
    ``model_dump_json``, by msgspec where that writes the same (see
    :func:`structs.json_writer`), else pydantic's serializer."""
    return _json_writer(type(model))(model)


_json_writer = structs.json_writer


#: Size of a patch id's digest where ids are kept by digest (restored runs, checkpoints).
PATCH_ID_DIGEST = 16


def patch_id_digest(patch_id: str) -> bytes:
    return hashlib.blake2b(patch_id.encode(), digest_size=PATCH_ID_DIGEST).digest()


def split_patch_ids(raw: bytes) -> frozenset[bytes]:
    """The set of patch-id digests in their concatenated form (checkpoints, restored runs)."""
    return frozenset(raw[i : i + PATCH_ID_DIGEST] for i in range(0, len(raw), PATCH_ID_DIGEST))


def encode_int(n: int) -> bytes:
    return n.to_bytes(8, "big")


def decode_int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def encode_item(entry: Entry) -> bytes:
    seq, item = entry
    return encode_int(seq) + dump(item)


def decode_item(kind: str, raw: bytes) -> Entry:
    """A stored item in its working form (the struct of its collection's model, validated
    as the model's ``model_validate_json`` validates it; see :func:`structs.decoder`).
    Raises ``pydantic.ValidationError``."""
    return decode_int(raw[:8]), _item_decoders[kind](raw[8:])


_item_decoders = {kind: structs.decoder(model) for kind, model in COLLECTIONS.items()}


def decode_header(raw: bytes) -> RunHeader:
    """A stored header as the public model (queries, the API)."""
    return RunHeader.model_validate_json(raw)


def decode_working_header(raw: bytes) -> Header:
    """A stored header in the projector's working form (:class:`working.Header`), validated
    as :func:`decode_header` validates it (see :func:`structs.decoder`). Raises
    ``pydantic.ValidationError``."""
    return decode_header_json(raw)  # type: ignore[no-any-return]


def encode_header(header: Header) -> bytes:
    """A working header as stored: the bytes ``model_dump_json`` writes for the equal model."""
    return encode_header_json(header)


def decode_decision(raw: bytes) -> Decision:
    """A stored decision as the public model (queries, the service)."""
    return Decision.model_validate_json(raw)


#: A stored decision straight into the core's form (its struct), as :func:`decode_decision`
#: validates it (see :func:`structs.decoder`).
decode_decision_struct = structs.decoder(Decision)
