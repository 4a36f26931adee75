"""The instance secret: how runstate's own processes know each other.

Every ``serve`` instance and projector of a deployment holds the same secret
(``RUNSTATE_INSTANCE_SECRET``). Membership of the projector's consumer group and write
access to the decisions topic prove nothing: any client the broker admits can join the
group under a serve instance's client id, or append a decision. What the secret proves:

- a decision on the decisions topic was written by a projector (an HMAC in a record
  header, checked by every waiter before anyone hears the decision);
- a peer that owns a partition is an instance (it answers a challenge bound to its own
  address before anything is forwarded to it);
- a forwarded request comes from an instance, for this address, with this body and this
  caller (the caller's identity travels signed; a client's token never leaves the instance
  it was sent to), and the owner's answer comes from the owner.

Several secrets may be given (comma-separated): the first signs, any verifies, so that a
secret is replaced without a moment where two instances disagree.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable

from runstate.eventlog.base import Headers, Record
from runstate.eventlog.keystore import KeyStoreError, parse_key_bytes

#: The record header that carries a decision's signature.
SIGNATURE_HEADER = "runstate-sig"


class InstanceKeys:
    """One or more instance secrets; the first signs. Signatures read ``<key id>:<hex MAC>``."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._by_id: dict[str, bytes] = {}
        for raw in secrets:
            self._by_id.setdefault(hashlib.blake2b(raw, digest_size=6, person=b"runstate-inst").hexdigest(), raw)
        if not self._by_id:
            raise KeyStoreError("no instance secret given")
        self._primary = next(iter(self._by_id))

    @classmethod
    def parse(cls, text: str, *, where: str = "RUNSTATE_INSTANCE_SECRET") -> InstanceKeys:
        """Secrets separated by commas, spaces or lines, each 64 hex digits (``runstate keys
        generate``). Raises :class:`KeyStoreError` (one line, naming ``where``)."""
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        if not parts:
            raise KeyStoreError(f"{where} is empty: give 64 hex digits, e.g. from `runstate keys generate`")
        return cls(parse_key_bytes(p, where=where, what="an instance secret") for p in parts)

    @staticmethod
    def _message(purpose: str, parts: Iterable[bytes | str]) -> bytes:
        # Length-prefixed, so that no two different part lists give the same message.
        out = bytearray(purpose.encode())
        for p in parts:
            b = p.encode() if isinstance(p, str) else p
            out += len(b).to_bytes(8, "big") + b
        return bytes(out)

    def sign(self, purpose: str, *parts: bytes | str) -> str:
        mac = hmac.new(self._by_id[self._primary], self._message(purpose, parts), hashlib.sha256).hexdigest()
        return f"{self._primary}:{mac}"

    def verify(self, signature: str | bytes | None, purpose: str, *parts: bytes | str) -> bool:
        """Whether ``signature`` is ``purpose`` over ``parts`` by any secret held."""
        if isinstance(signature, bytes):
            signature = signature.decode("latin-1")
        if not signature or ":" not in signature:
            return False
        kid, _, mac = signature.partition(":")
        secret = self._by_id.get(kid)
        if secret is None:
            return False
        want = hmac.new(secret, self._message(purpose, parts), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, mac)

    # -- decisions on the decisions topic -------------------------------------------------

    def record_headers(self, topic: str, key: str, value: bytes) -> Headers:
        """The header that signs one decisions-topic record."""
        return ((SIGNATURE_HEADER, self.sign("record", topic, key, value).encode()),)

    def record_ok(self, rec: Record) -> bool:
        sig = next((v for k, v in rec.headers if k == SIGNATURE_HEADER), None)
        return self.verify(sig, "record", rec.topic, rec.key or b"", rec.value)
