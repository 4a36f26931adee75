"""RunBook: decides a stream of patches for many runs (idempotency, working-state cache).

The same book drives the live projector (working states loaded from the store on a miss)
and the replay tools (everything in memory, starting empty), so the projection and a
replay can only differ if the store loses or invents something — which is what
``verify`` checks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from projector.decide import decide
from projector.doc import Changes, RunDoc
from schemas.patch import Decision, Patch


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of one patch: its decision, and what changed (None unless accepted now)."""

    decision: Decision
    changes: Changes | None
    duplicate: bool = False


class RunBook:
    """Working states and decisions for the runs of one partition (or one replay).

    ``load_doc(run_id)`` and ``load_decision(run_id, patch_id)`` reach persisted state on a
    cache miss; ``max_cached`` bounds the number of runs kept in memory (None: unbounded,
    for replays). Eviction happens only in :meth:`settle`, after the caller has persisted
    the batch, so an evicted run never loses unwritten changes.
    """

    def __init__(
        self,
        load_doc: Callable[[str], RunDoc | None] = lambda _r: None,
        load_decision: Callable[[str, str], Decision | None] = lambda _r, _p: None,
        max_cached: int | None = None,
    ) -> None:
        self._load_doc = load_doc
        self._load_decision = load_decision
        self._max = max_cached
        self.docs: OrderedDict[str, RunDoc | None] = OrderedDict()
        self._unsettled: dict[tuple[str, str], Decision] = {}
        self._keep_decisions = max_cached is None
        self.decided: dict[tuple[str, str], Decision] = {}

    def doc(self, run_id: str) -> RunDoc | None:
        if run_id in self.docs:
            self.docs.move_to_end(run_id)
            return self.docs[run_id]
        d = self._load_doc(run_id)
        self.docs[run_id] = d
        return d

    def apply(self, patch: Patch, partition: int, offset: int) -> Applied:
        """Decide one patch; a ``patch_id`` already decided returns the earlier decision."""
        key = (patch.run_id, patch.patch_id)
        prior = self._unsettled.get(key) or self.decided.get(key) or self._load_decision(*key)
        if prior is not None:
            return Applied(prior, None, duplicate=True)
        verdict = decide(self.doc(patch.run_id), patch, partition, offset)
        if verdict.doc is not None:
            self.docs[patch.run_id] = verdict.doc
        if self._keep_decisions:
            self.decided[key] = verdict.decision
        else:
            self._unsettled[key] = verdict.decision
        return Applied(verdict.decision, verdict.changes)

    def settle(self) -> None:
        """The caller persisted everything applied so far: forget in-flight decisions and
        evict least recently used runs beyond ``max_cached``."""
        self._unsettled.clear()
        if self._max is not None:
            while len(self.docs) > self._max:
                self.docs.popitem(last=False)

    def discard(self) -> None:
        """The caller failed to persist: drop every cached state (they may hold unwritten
        changes) so that the next batch reloads from the store."""
        self._unsettled.clear()
        self.docs.clear()
