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

from runstate.schemas import codec
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


_header: bytes | None = None


def is_sealed(value: bytes) -> bool:
    """Whether ``value`` is a sealed record (of any published version)."""
    global _header
    if _header is None:
        _header = codec.MAGIC + _writer().fingerprint
    if value[:codec.HEADER_LEN] == _header:
        return True
    return value[:2] == codec.MAGIC and bytes(value[2:codec.HEADER_LEN]) in codec.published("sealed")


def envelope_of(plain_patch: bytes) -> PatchEnvelope:
    """The envelope of a plain patch record (raises :class:`DecodeError` if it is not one)."""
    d = codec.decode_raw(plain_patch)
    author = d["author"]
    return PatchEnvelope(d["patch_id"], d["expected_revision"], author["agent_id"], author["agent_version"],
                         [e[1]["type"] if isinstance(e, tuple) else e["type"] for e in d["events"]],
                         d["created_at"], d["rebase"])  # fmt: skip


def _aad(run_id: str, kid: str, envelope: PatchEnvelope | None) -> bytes:
    if envelope is None:
        return f"{run_id}\0{kid}".encode()
    return (f"{run_id}\0{kid}\0{envelope.patch_id}\0{envelope.expected_revision}\0{envelope.agent_id}\0"
            f"{envelope.agent_version}\0{','.join(envelope.event_types)}\0{envelope.created_at}\0"
            f"{envelope.rebase}").encode()


def seal(plain: bytes, run_id: str, kid: str, key: bytes, nonce: bytes, envelope: PatchEnvelope | None = None) -> bytes:
    """The sealed record of ``plain`` (a nonce must never be used twice with one key: the
    caller draws 96 random bits per record)."""
    ct = _aead(key).encrypt(nonce, plain, _aad(run_id, kid, envelope))
    datum = {"run_id": run_id, "kid": kid, "nonce": nonce, "ciphertext": ct,
             "envelope": None if envelope is None else envelope._asdict()}  # fmt: skip
    return codec._write_record(_writer(), datum)


def read(value: bytes) -> Sealed:
    """The readable part of a sealed record. Raises :class:`DecodeError`."""
    w = _writer()
    if value[:codec.HEADER_LEN] == codec.MAGIC + w.fingerprint and w.read is not None:
        d = codec._read_body(value, w.read)  # the current version: its generated reader, no lookup
    else:
        d = codec._read_record(value, codec._framed(value, "sealed"), None)
    env = d["envelope"]
    return Sealed(d["run_id"], d["kid"], d["nonce"], d["ciphertext"], None if env is None else PatchEnvelope(**env))


def unseal(sealed: Sealed, key: bytes) -> bytes:
    """The plain record. Raises :class:`DecodeError` (``sealed_damaged``) when the key is
    not the run's or anything of the record was changed."""
    try:
        return _aead(key).decrypt(sealed.nonce, sealed.ciphertext, _aad(sealed.run_id, sealed.kid, sealed.envelope))
    except (InvalidTag, ValueError) as e:
        raise DecodeError("sealed_damaged", detail=f"run {sealed.run_id!r}: the record does not open with the "
                                                   "run's key (damaged, or sealed with another key)") from e
