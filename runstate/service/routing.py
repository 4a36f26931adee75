"""Which instance owns a partition, and forwarding a request to it.

Owners are read from the projector's consumer group itself: each ``serve`` joins with the
client id ``runstate-serve|<its URL>``, and :meth:`EventLog.group_members` (Kafka's
``DescribeConsumerGroups``) returns every member's client id and assigned partitions. We
chose this over a membership record of our own because the group coordinator is the one
authority on who owns what: a record written by a member can outlive its ownership (a
SIGKILLed instance), the coordinator's assignment cannot. While the group rebalances there
is no answer (``None``), and the caller answers 503 with ``Retry-After``.

Group membership proves nothing (any client the broker admits may join under a serve
instance's client id), so instances prove the instance secret
(:mod:`runstate.eventlog.instancekey`) before anything reaches a peer: a peer first answers
a challenge bound to its own address (cached for :data:`PROOF_TTL_S`); each forwarded
request is signed over its target address, method, path, query, body and the caller's
identity, which travels in place of the client's token (never forwarded); the owner signs
its answer over the request's nonce, and the forwarder relays no answer it cannot verify.
Without the secret an instance forwards nothing and accepts nothing forwarded.

A forwarded request carries ``X-Runstate-Forwarded``; its receiver never forwards again:
if it no longer owns the partition it answers 503, and the first instance retries with a
fresh view of the group. No request is answered from a partition the answering instance
does not own at that moment (``Node.read`` checks under the projector's lock).

Forwarding goes through aiohttp's client: under load, httpx's connection pool (httpcore)
spent most of a serve instance's CPU in its own bookkeeping, which grows with the number
of connections and queued requests (known upstream, encode/httpcore#1035), until the
instance fell behind for good.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

import aiohttp
import orjson
import yarl

from runstate.eventlog.base import EventLog
from runstate.eventlog.instancekey import InstanceKeys
from runstate.schemas.errors import LogError, RunstateError
from runstate.service.auth import AuthError, Identity
from runstate.service.node import CLIENT_ID_PREFIX, Unavailable

log = logging.getLogger("runstate.serve")

FORWARDED = "x-runstate-forwarded"
#: The caller's identity as the forwarding instance verified it (base64url JSON).
IDENTITY = "x-runstate-identity"
#: ``<unix s>;<nonce>;<signature>`` on a request, ``<signature>`` on its answer.
SIGNED = "x-runstate-signed"
#: The challenge every peer answers before it is forwarded anything.
HELLO_PATH = "/peer/hello"
#: How long a peer's answer to the challenge is trusted.
PROOF_TTL_S = 30.0
#: How far a forwarded request's clock may be from ours.
SKEW_S = 60.0
NO_SECRET = (
    "set the same RUNSTATE_INSTANCE_SECRET on every serve instance: without it instances "
    "neither forward nor accept forwarded requests"
)


def body_digest(body: bytes | None) -> str:
    return hashlib.sha256(body or b"").hexdigest()


def identity_header(who: Identity) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(dataclasses.asdict(who))).decode()


def identity_from_header(value: str) -> Identity:
    data = orjson.loads(base64.urlsafe_b64decode(value.encode()))
    runs = data.get("runs")
    return Identity(**{**data, "runs": None if runs is None else tuple(runs)})


class PeerGate:
    """The owner's side: checks forwarded requests and signs their answers."""

    def __init__(self, keys: InstanceKeys | None, me: str) -> None:
        self.keys = keys
        self.me = me
        self._nonces: dict[str, float] = {}
        #: forwarded requests refused (counted in /metrics)
        self.refused = 0

    def hello(self, nonce: str) -> str:
        """The proof that this instance at ``me`` holds the secret. Raises :class:`AuthError`."""
        if self.keys is None:
            raise AuthError(f"this instance has no instance secret: {NO_SECRET}", 403)
        return self.keys.sign("hello", self.me, nonce)

    def check(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> tuple[Identity, str, str]:
        """A forwarded request's identity, the body digest it was signed with, and its
        nonce. Raises :class:`AuthError` (401) unless an instance holding the secret
        signed it for this address, within :data:`SKEW_S`, once."""
        try:
            return self._check(method, path, query, headers)
        except AuthError as e:
            self.refused += 1
            log.warning("refused a request marked forwarded: %s", e)
            raise

    def refuse_body(self) -> AuthError:
        self.refused += 1
        log.warning("refused a forwarded request whose body is not the one signed")
        return AuthError("a forwarded request whose body is not the one signed", 401)

    def _check(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> tuple[Identity, str, str]:
        if self.keys is None:
            raise AuthError(f"a forwarded request reached an instance without an instance secret: {NO_SECRET}", 401)
        ident, signed, digest = headers.get(IDENTITY), headers.get(SIGNED), headers.get("x-runstate-body-sha256")
        parts = (signed or "").split(";")
        if ident is None or digest is None or len(parts) != 3:
            raise AuthError("a forwarded request must be signed by an instance (RUNSTATE_INSTANCE_SECRET)", 401)
        ts, nonce, sig = parts
        now = time.time()
        if not ts.isdigit() or abs(now - int(ts)) > SKEW_S:
            raise AuthError(f"a forwarded request signed at {ts!r}, more than {SKEW_S:g} s from now", 401)
        if not self.keys.verify(sig, "request", self.me, method, path, query, ident, ts, nonce, digest):
            raise AuthError(
                "a forwarded request not signed by an instance for this address "
                "(RUNSTATE_INSTANCE_SECRET differs, or an impostor)",
                401,
            )
        if nonce in self._nonces:
            raise AuthError("a forwarded request seen before (replayed)", 401)
        if len(self._nonces) > 10_000:
            self._nonces = {n: t for n, t in self._nonces.items() if t > now - 2 * SKEW_S}
        self._nonces[nonce] = now
        try:
            return identity_from_header(ident), digest, nonce
        except (ValueError, TypeError) as e:
            raise AuthError(f"a forwarded identity that does not read: {e}", 401) from e

    def sign_answer(self, nonce: str, status: int, body: bytes) -> str:
        assert self.keys is not None
        return self.keys.sign("answer", nonce, str(status), body_digest(body))


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The owner's answer to a forwarded request (header names lower-case)."""

    status_code: int
    content: bytes
    headers: Mapping[str, str]


class ForwardError(RunstateError):
    """The owner did not answer (refused, reset, timed out), or did not prove it is one."""


class Router:
    """Caches the group's assignment for ``ttl_s``; refreshed on demand after a miss."""

    def __init__(self, log: EventLog, group_id: str, me: str, keys: InstanceKeys | None, ttl_s: float = 2.0) -> None:
        self.log = log
        self.group_id = group_id
        self.me = me
        self.keys = keys
        self.ttl_s = ttl_s
        #: peer URL -> until when its proof of the secret holds
        self._proved: dict[str, float] = {}
        #: peers that failed to prove it (counted in /metrics)
        self.refused = 0
        self._owners: dict[int, str] = {}
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        #: made in the event loop, at the first forward
        self._http: aiohttp.ClientSession | None = None

    async def owners(self, refresh: bool = False) -> dict[int, str]:
        """partition -> URL of its owner. Raises :class:`Unavailable` while rebalancing."""
        async with self._lock:
            if refresh or time.monotonic() - self._read_at > self.ttl_s:
                try:
                    members = await asyncio.to_thread(self.log.group_members, self.group_id)
                except LogError as e:
                    raise Unavailable(f"cannot read the projector group: {e}") from e
                if members is None:
                    raise Unavailable("the projector group is rebalancing")
                owners = {}
                for m in members:
                    if m.client_id.startswith(CLIENT_ID_PREFIX):
                        url = m.client_id[len(CLIENT_ID_PREFIX) :]
                        owners.update({p: url for p in m.partitions})
                self._owners = owners
                self._read_at = time.monotonic()
            return dict(self._owners)

    async def proven_owners(self) -> dict[int, str]:
        """partition -> URL of its owner, for the owners that proved the instance secret
        (this instance included): what a client may be told to send a run's requests to,
        never an impostor that joined the group under a serve's client id. Raises
        :class:`Unavailable` while rebalancing."""
        owners = await self.owners()
        if self.keys is None:
            return {p: url for p, url in owners.items() if url == self.me}
        proven = {self.me}
        for url in set(owners.values()) - proven:
            try:
                await self._prove(url)
                proven.add(url)
            except ForwardError:
                pass
        return {p: url for p, url in owners.items() if url in proven}

    async def owner(self, partition: int, refresh: bool = False) -> str:
        url = (await self.owners(refresh)).get(partition)
        if url is None:
            raise Unavailable(f"partition {partition} has no serving owner (a projector without an address, or none)")
        if url == self.me:  # the group says us, our projector not yet: assignment in flight
            raise Unavailable(f"partition {partition} is being assigned to this instance")
        return url

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # A long timeout: a forwarded patch waits for its decision (up to 60 s).
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=70.0, sock_connect=2.0),
                connector=aiohttp.TCPConnector(limit=256),
                auto_decompress=False,
            )
        return self._http

    def _refuse(self, url: str, why: str) -> ForwardError:
        self._proved.pop(url, None)
        self.refused += 1
        log.warning("not forwarding to %s: %s", url, why)
        return ForwardError(f"the instance at {url} {why}")

    async def _prove(self, url: str) -> None:
        """Unless ``url`` proved the secret within :data:`PROOF_TTL_S`: challenge it.
        Raises :class:`ForwardError`."""
        assert self.keys is not None
        if self._proved.get(url, 0.0) > time.monotonic():
            return
        nonce = secrets.token_hex(16)
        try:
            async with self._session().post(
                url + HELLO_PATH, json={"nonce": nonce}, timeout=aiohttp.ClientTimeout(total=5.0)
            ) as resp:
                answer = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ForwardError(f"{type(e).__name__}: {e}") from e
        try:
            proof = orjson.loads(answer).get("proof") if resp.status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            proof = None
        if not isinstance(proof, str) or not self.keys.verify(proof, "hello", url, nonce):
            raise self._refuse(
                url, "did not prove the instance secret (an impostor in the group, or RUNSTATE_INSTANCE_SECRET differs)"
            )
        self._proved[url] = time.monotonic() + PROOF_TTL_S

    async def forward(
        self,
        url: str,
        method: str,
        path: str,
        params: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | None = None,
        *,
        who: Identity | None,
    ) -> Forwarded:
        """One forwarded request, as ``who``, to an instance that proved the secret; its
        answer only if the owner signed it. Raises :class:`Unavailable` without a secret,
        :class:`ForwardError` on transport errors and unproved peers."""
        if self.keys is None:
            raise Unavailable(f"this run's partition is owned by another instance; {NO_SECRET}", 5.0)
        if who is None:
            raise ForwardError("a forward without the caller's identity (a defect: Forward.who unset)")
        await self._prove(url)
        ts, nonce, ident, digest = str(int(time.time())), secrets.token_hex(16), identity_header(who), body_digest(body)
        sig = self.keys.sign("request", url, method, path, urlencode(params), ident, ts, nonce, digest)
        sent = {
            **headers,
            FORWARDED: self.me,
            IDENTITY: ident,
            SIGNED: f"{ts};{nonce};{sig}",
            "x-runstate-body-sha256": digest,
        }
        # Sent as it is: the path's ids are percent-encoded (a "/" in a run id is %2F), which
        # a re-quoting client would undo or change, and the owner checks the path it signed.
        query = urlencode(params)
        target = yarl.URL(url + path + (f"?{query}" if query else ""), encoded=True)
        try:
            async with self._session().request(method, target, data=body, headers=sent) as resp:
                content = await resp.read()
                got = {k.lower(): v for k, v in resp.headers.items()}
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ForwardError(f"{type(e).__name__}: {e}") from e
        if not self.keys.verify(got.get(SIGNED), "answer", nonce, str(status), body_digest(content)):
            raise self._refuse(url, f"answered {status} without the owner's signature")
        return Forwarded(status, content, got)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
