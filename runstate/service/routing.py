"""Which instance owns a partition, and forwarding a request to it.

Owners are read from the projector's consumer group itself: each ``serve`` joins with the
client id ``runstate-serve|<its URL>``, and :meth:`EventLog.group_members` (Kafka's
``DescribeConsumerGroups``) returns every member's client id and assigned partitions. We
chose this over a membership record of our own because the group coordinator is the one
authority on who owns what: a record written by a member can outlive its ownership (a
SIGKILLed instance), the coordinator's assignment cannot. While the group rebalances there
is no answer (``None``), and the caller answers 503 with ``Retry-After``.

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
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from runstate.eventlog.base import EventLog
from runstate.schemas.errors import LogError, RunstateError
from runstate.service.node import CLIENT_ID_PREFIX

FORWARDED = "x-runstate-forwarded"


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The owner's answer to a forwarded request (header names lower-case)."""

    status_code: int
    content: bytes
    headers: Mapping[str, str]


class ForwardError(RunstateError):
    """The owner did not answer (refused, reset, timed out)."""


class Unavailable(RunstateError):
    """No instance can answer now (rebalancing, owner gone); retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Router:
    """Caches the group's assignment for ``ttl_s``; refreshed on demand after a miss."""

    def __init__(self, log: EventLog, group_id: str, me: str, ttl_s: float = 2.0) -> None:
        self.log = log
        self.group_id = group_id
        self.me = me
        self.ttl_s = ttl_s
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
                        url = m.client_id[len(CLIENT_ID_PREFIX):]
                        owners.update({p: url for p in m.partitions})
                self._owners = owners
                self._read_at = time.monotonic()
            return dict(self._owners)

    async def owner(self, partition: int, refresh: bool = False) -> str:
        url = (await self.owners(refresh)).get(partition)
        if url is None:
            raise Unavailable(f"partition {partition} has no serving owner (a projector without an address, or none)")
        if url == self.me:  # the group says us, our projector not yet: assignment in flight
            raise Unavailable(f"partition {partition} is being assigned to this instance")
        return url

    async def forward(self, url: str, method: str, path: str, params: list[tuple[str, str]],
                      headers: dict[str, str], body: bytes | None = None) -> Forwarded:
        """One forwarded request. Raises :class:`ForwardError` on transport errors."""
        if self._http is None:
            # A long timeout: a forwarded patch waits for its decision (up to 60 s).
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=70.0, sock_connect=2.0),
                                               connector=aiohttp.TCPConnector(limit=256), auto_decompress=False)  # fmt: skip
        try:
            async with self._http.request(method, url + path, params=params, data=body,
                                          headers={**headers, FORWARDED: self.me}) as resp:  # fmt: skip
                return Forwarded(resp.status, await resp.read(), {k.lower(): v for k, v in resp.headers.items()})
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ForwardError(f"{type(e).__name__}: {e}") from e

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
