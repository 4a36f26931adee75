"""Retention: erase runs a given time after they ended, by status (``RUNSTATE_RETENTION``).

The policy is a comma-separated list of ``<status>=<age>``, the age in days (``d``), hours
(``h``), minutes (``m``) or seconds (``s``): ``completed=30d,failed=90d,cancelled=30d``. A
run whose status is listed is due once its last patch (the one that ended it) is older
than the age. The snapshotter applies it: it holds every run's header, and its clock is the
one place a wall clock may decide (the reducer never reads one). An erasure by retention is
an erasure like any other: who is ``retention``, why names the rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from runstate.schemas.errors import ContractError
from runstate.schemas.state import TERMINAL_STATUSES

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_RULE = re.compile(r"^\s*([a-z]+)\s*=\s*(\d+)\s*([dhms])\s*$")


@dataclass(frozen=True)
class RetentionPolicy:
    """Per ended status, how long a run is kept after it ended."""

    keep: dict[str, timedelta]

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """Raises :class:`ContractError` naming the part that is not ``<status>=<N><d|h|m|s>``."""
        keep: dict[str, timedelta] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = _RULE.match(part)
            if m is None:
                raise ContractError(
                    f"retention rule {part!r} is not <status>=<N><d|h|m|s> (e.g. completed=30d)",
                    where="RUNSTATE_RETENTION",
                )
            status, n, unit = m.groups()
            if status not in TERMINAL_STATUSES - {"erased"}:
                raise ContractError(
                    f"retention rule {part!r}: {status!r} is not an ended status "
                    f"({', '.join(sorted(TERMINAL_STATUSES - {'erased'}))})",
                    where="RUNSTATE_RETENTION",
                )
            keep[status] = timedelta(seconds=int(n) * _UNITS[unit])
        return cls(keep)

    def due(self, status: str, ended_at: datetime | None, now: datetime) -> bool:
        """Whether a run of ``status`` that ended at ``ended_at`` is due for erasure at ``now``."""
        age = self.keep.get(status)
        return age is not None and ended_at is not None and now - ended_at >= age

    def rule(self, status: str) -> str:
        age = int(self.keep[status].total_seconds())
        for unit, secs in _UNITS.items():
            if age % secs == 0:
                return f"{status}={age // secs}{unit}"
        return f"{status}={age}s"  # pragma: no cover - seconds always divide
