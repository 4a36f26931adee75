"""Sealed records: a run's content encrypted with the run's own key (crypto-shredding).

A sealed record is an Avro single-object record of ``schemas/avro/sealed.vN.avsc`` (Java's
Avro library reads it like every other record): the run id and, for a patch, its envelope
(patch id, expected revision, author, event types, time) in the clear, and the plain record
as AES-256-GCM ciphertext. The envelope and the run id are the cipher's associated data,
so neither can be changed without the record failing to open. Destroying the run's key
makes every copy of its content unreadable at once, wherever the log replicated it.

Pure: the caller brings the key and the nonce (the log layer holds the keys).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runstate.schemas import avrofast, codec
from runstate.schemas.errors import DecodeError

NONCE_BYTES = 12
KEY_BYTES = 32


class PatchEnvelope(NamedTuple):
    """What stays readable of a sealed patch: enough for history, routing and audit."""

    patch_id: str
    expected_revision: int
    agent_id: str
    agent_version: str
    event_types: list[str]
    created_at: str
    rebase: bool


class Sealed(NamedTuple):
    run_id: str
    #: which of the run's keys sealed it
    kid: str
    nonce: bytes
    ciphertext: bytes
    envelope: PatchEnvelope | None


#: The cipher of a run key, made once per key in use (making one costs as much as a decryption).
_aead = lru_cache(maxsize=4096)(AESGCM)


@lru_cache(maxsize=1)
def _writer() -> Any:
    return max(codec.published("sealed").values(), key=lambda w: w.version)


_headers: frozenset[bytes] | None = None


def is_sealed(value: bytes) -> bool:
    """Whether ``value`` is a sealed record (of any published version): one set lookup of its
    first ten bytes (every plain record read asks)."""
    global _headers
    if _headers is None:
        _headers = frozenset(codec.MAGIC + fp for fp in codec.published("sealed"))
    return value[: codec.HEADER_LEN] in _headers


def envelope_of(plain_patch: bytes) -> PatchEnvelope:
    """The envelope of a plain patch record (raises :class:`DecodeError` if it is not one)."""
    d = codec.decode_raw(plain_patch)
    author = d["author"]
    return PatchEnvelope(
        d["patch_id"],
        d["expected_revision"],
        author["agent_id"],
        author["agent_version"],
        [e[1]["type"] if isinstance(e, tuple) else e["type"] for e in d["events"]],
        d["created_at"],
        d["rebase"],
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    avrofast._write_long(out, n)
    return bytes(out)


def seal(plain: bytes, run_id: str, kid: str, key: bytes, nonce: bytes, envelope: PatchEnvelope | None = None) -> bytes:
    """The sealed record of ``plain`` (a nonce must never be used twice with one key: the
    caller draws 96 random bits per record). The associated data is the record's own bytes
    but the nonce and the ciphertext: its header, run id, key id and envelope as stored."""
    datum = {
        "run_id": run_id,
        "kid": kid,
        "nonce": b"",
        "ciphertext": b"",
        "envelope": None if envelope is None else envelope._asdict(),
    }
    bare = codec._write_record(_writer(), datum)  # nonce and ciphertext empty: one 0 byte each
    cut = codec.HEADER_LEN + _string_len(run_id) + _string_len(kid)
    head, tail = bare[:cut], bare[cut + 2 :]
    ct = _aead(key).encrypt(nonce, plain, head + tail)
    return b"".join((head, _varint(len(nonce)), nonce, _varint(len(ct)), ct, tail))


def _string_len(text: str) -> int:
    n = len(text.encode())
    return len(_varint(n)) + n


class Opening(NamedTuple):
    """What opening a sealed record needs, found without reading its envelope."""

    run_id: str
    kid: str
    nonce: bytes
    ciphertext: bytes
    aad: bytes


def split(value: bytes) -> Opening:
    """The parts of a sealed record (any published version: the fields before the envelope
    are the same). Raises :class:`DecodeError` (``corrupt_record``)."""
    try:
        fields: list[bytes] = []
        p, cut = codec.HEADER_LEN, 0
        for i in range(4):  # run_id, kid, nonce, ciphertext: each a length and its bytes
            n, p = avrofast._read_long(value, p)
            if n < 0 or p + n > len(value):
                raise ValueError(f"field {i} of {n} bytes runs past the record")
            fields.append(value[p : p + n])
            p += n
            if i == 1:
                cut = p
        run_id, kid = fields[0].decode(), fields[1].decode()
        if len(fields[2]) != NONCE_BYTES:
            raise ValueError(f"a nonce of {len(fields[2])} bytes")
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise DecodeError("corrupt_record", detail=f"not a sealed record: {e}") from e
    return Opening(run_id, kid, fields[2], fields[3], value[:cut] + value[p:])


def read(value: bytes) -> Sealed:
    """The readable part of a sealed record. Raises :class:`DecodeError`."""
    w = _writer()
    if value[: codec.HEADER_LEN] == codec.MAGIC + w.fingerprint and w.read is not None:
        d = codec._read_body(value, w.read)  # the current version: its generated reader, no lookup
    else:
        d = codec._read_record(value, codec._framed(value, "sealed"), None)
    env = d["envelope"]
    return Sealed(d["run_id"], d["kid"], d["nonce"], d["ciphertext"], None if env is None else PatchEnvelope(**env))


def unseal(opening: Opening, key: bytes) -> bytes:
    """The plain record (``opening``: :func:`split` of the sealed one). Raises
    :class:`DecodeError` (``sealed_damaged``) when the key is not the run's or anything of
    the record was changed."""
    try:
        return _aead(key).decrypt(opening.nonce, opening.ciphertext, opening.aad)
    except (InvalidTag, ValueError) as e:
        raise DecodeError(
            "sealed_damaged",
            detail=f"run {opening.run_id!r}: the record does not open with the "
            "run's key (damaged, or sealed with another key)",
        ) from e
