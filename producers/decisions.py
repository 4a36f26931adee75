"""Awaiting decisions without the projector's disk: the decisions topic.

The projector (on Kafka) copies every decision it stored to ``<prefix>.decisions``, keyed
by run id, after the batch that holds it is written. A worker on any machine follows that
topic from where it stood *before* it appended, so the decision cannot slip past it.

The copy is a notification, at least once (a decision can appear twice after a projector
restart) and best effort (a crash between the store write and the copy loses the copy):
the projection stays the record of decisions, and a waiter that times out asks it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

from runstate.eventlog.base import EventLog, LogReader
from runstate.eventlog.instancekey import InstanceKeys
from runstate.schemas.codec import decode_decision
from runstate.schemas.errors import DecodeError
from runstate.schemas.patch import Decision

log = logging.getLogger("runstate.decisions")


class DecisionFeed:
    """Follows the decisions topic (all partitions, from their end at creation, or from
    ``positions``). With ``keys`` (the instance secret), only records a projector signed
    are decisions; any other is counted in ``ignored`` and never heard. Not thread-safe:
    one reader thread."""

    def __init__(
        self, log_: EventLog, positions: dict[int, int] | None = None, *, keys: InstanceKeys | None = None
    ) -> None:
        topic = log_.topics.decisions
        start = positions if positions is not None else log_.end_offsets(topic)
        self._reader: LogReader = log_.reader(topic, start)
        self._keys = keys
        #: records on the topic that no projector holding the secret signed
        self.ignored = 0

    def poll(
        self, timeout_s: float, max_records: int = 1000, wanted: Callable[[str], bool] | None = None
    ) -> list[Decision]:
        """Decisions that arrived since the last poll (undecodable and, with ``keys``,
        unsigned records are skipped). ``wanted(run_id)``: only the decisions of runs it
        names are checked and decoded (a record's key is its run), the others passed over."""
        out = []
        for rec in self._reader.poll(max_records, timeout_s):
            if wanted is not None and not wanted(rec.key.decode(errors="replace") if rec.key else ""):
                continue
            if self._keys is not None and not self._keys.record_ok(rec):
                self.ignored += 1
                if self.ignored == 1 or self.ignored % 1000 == 0:
                    log.warning(
                        "ignoring %s[%d]@%d (%d so far): not signed with this instance's "
                        "RUNSTATE_INSTANCE_SECRET (forged, or a projector without it)",
                        rec.topic,
                        rec.partition,
                        rec.offset,
                        self.ignored,
                    )
                continue
            try:
                out.append(decode_decision(rec.value))
            except DecodeError as e:  # a foreign record must not stop the waiters
                log.warning("skipping %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, e)
        return out

    def close(self) -> None:
        self._reader.close()


class TopicDecisions:
    """A decision source for :class:`RunProducer` (``decisions=``) that reads the decisions
    topic. Create it before appending; it remembers the last ``keep`` decisions it saw."""

    def __init__(self, log_: EventLog, keep: int = 10_000, *, keys: InstanceKeys | None = None) -> None:
        self._feed = DecisionFeed(log_, keys=keys)
        self._seen: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        self._keep = keep

    def __call__(self, run_id: str, patch_id: str) -> Decision | None:
        for d in self._feed.poll(0.05):
            self._seen[(d.run_id, d.patch_id)] = d
            if len(self._seen) > self._keep:
                self._seen.popitem(last=False)
        return self._seen.get((run_id, patch_id))

    def close(self) -> None:
        self._feed.close()
