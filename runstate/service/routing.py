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
"""

from __future__ import annotations

import asyncio
import time

import httpx

from runstate.eventlog.base import EventLog
from runstate.schemas.errors import LogError, RunstateError
from runstate.service.node import CLIENT_ID_PREFIX

FORWARDED = "x-runstate-forwarded"


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
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=2.0))

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
                      headers: dict[str, str], body: bytes | None = None) -> httpx.Response:
        """One forwarded request (raises :class:`httpx.HTTPError` on transport errors)."""
        return await self.http.request(method, url + path, params=params, content=body,
                                       headers={**headers, FORWARDED: self.me})  # fmt: skip

    async def close(self) -> None:
        await self.http.aclose()
