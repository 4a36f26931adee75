"""How long-running runstate processes (``runstate serve``, ``runstate project``) use
Python's cyclic garbage collector.

Why it needs a policy: a full (generation 2) collection walks every tracked object while
holding the GIL. A projector's working set is large and long-lived (modules, pydantic
validators, the cache of run states: about 100 objects per cached run), so with the
default settings ``runstate serve`` stalled every thread for 120-450 ms every few seconds
under 500 patches/s (1,000 to 10,000 runs), and those stalls were its append p99.

The policy, from when a projector starts (:func:`settle`):

- collect once, then ``gc.freeze()``: start-up objects (modules, classes, validators) go
  to the permanent generation, which collections do not walk;
- after every generation-1 collection, freeze its survivors too (``gc.freeze`` is a list
  splice, O(1)). Young garbage (the bulk: decoded records, decisions, request objects) is
  still collected by generations 0 and 1 before it can be frozen; generation 2 stays
  nearly empty, so its collections are short;
- what this gives up: a cycle that was alive at a collection and becomes garbage later
  is only reclaimed by a full collection. Our data is acyclic (full collections measured
  under load found 0-10 garbage objects), and :func:`collect_when_idle` runs a full one
  (``unfreeze`` + ``collect`` + ``freeze``) when the projector has had nothing to read, at
  most every ``FULL_EVERY_S``.

Frozen objects are still freed by reference counting as soon as they are unused.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("runstate.heap")

#: Least seconds between two full collections run by :func:`collect_when_idle`.
FULL_EVERY_S = 600.0

_settled = False
_last_full = 0.0


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    # After a collection of generation >= 1, generations 0 and 1 are empty: what is in
    # generation 2 now survived a collection; freezing moves it where collections do not walk.
    if phase == "stop" and info["generation"] >= 1:
        gc.freeze()


def settle() -> None:
    """Apply the policy (once per process; later calls do nothing)."""
    global _settled, _last_full
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
    _last_full = time.monotonic()
    gc.callbacks.append(_freeze_survivors)
    log.debug("heap settled: %d objects frozen", gc.get_freeze_count())


def collect_when_idle() -> int | None:
    """A full collection over the frozen objects too, if the policy is on and the last one
    is ``FULL_EVERY_S`` old; returns the objects collected (None when not due). Call it
    only when there is nothing else to do: it holds the GIL for as long as it walks."""
    global _last_full
    if not _settled or time.monotonic() - _last_full < FULL_EVERY_S:
        return None
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    _last_full = time.monotonic()
    log.debug("idle full collection: %d unreachable objects", found)
    return found


def settled() -> bool:
    """Whether :func:`settle` ran in this process."""
    return _settled
