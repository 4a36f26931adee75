"""How long-running runstate processes (``runstate serve``, ``runstate project``) use
Python's cyclic garbage collector.

Why it needs a policy: a full (generation 2) collection walks every tracked object while
holding the GIL. A projector's working set is large and long-lived (modules, pydantic
validators, the cache of run states: about 100 objects per cached run), so with the
default settings ``runstate serve`` stalled every thread for hundreds of milliseconds every
few seconds under load, and those stalls were its append p99.

The policy, from when a projector starts (:func:`settle`):

- collect once, then ``gc.freeze()``: start-up objects (modules, classes, validators) go
  to the permanent generation, which collections do not walk;
- after every generation-1 collection, freeze its survivors too (``gc.freeze`` is a list
  splice, O(1)). Young garbage (the bulk: decoded records, decisions, request objects) is
  still collected by generations 0 and 1 before it can be frozen; generation 2 stays
  nearly empty, so its collections are short;
- while the projector decides and stores one poll batch or restores a partition
  (:func:`batch`), automatic collection is off, and what the batch leaves alive is frozen
  after it. (Collection is off during a batch in every process, the policy's or not: a
  catch-up run and a restore allocate as a batch does.) Most of what a
  batch allocates lives as long as the batch (its records, patches, decisions, the
  changes to write) or longer (the working states it caches): each collection during the
  batch walked those objects again and freed nothing (a batch makes no garbage cycles:
  a full collection after a long run with collection off during every batch found only
  objects made once, by msgspec's first conversions; refcounting frees the rest);
- what this gives up: a cycle that was alive at a collection and becomes garbage later
  is only reclaimed by a full collection, and so is a cycle another thread (``runstate
  serve``'s HTTP handlers) made and dropped during a batch. Our data is acyclic (full
  collections under load find next to no garbage), and a full one
  (``unfreeze`` + ``collect`` + ``freeze``) runs when the projector has had nothing to
  read (:func:`collect_when_idle`, at most every ``FULL_EVERY_S``), and after a batch when
  the projector has not been idle for ``FULL_OVERDUE_S`` (a pause then, but a bounded
  amount of garbage).

Frozen objects are still freed by reference counting as soon as they are unused.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("runstate.gc_policy")

#: Least seconds between two full collections run by :func:`collect_when_idle`.
FULL_EVERY_S = 600.0
#: Most seconds without a full collection: :func:`batch` runs one after a batch when the
#: projector has been busy (never idle) for this long.
FULL_OVERDUE_S = 3600.0

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
    log.debug("gc settled: %d objects frozen", gc.get_freeze_count())


@contextmanager
def batch() -> Iterator[None]:
    """One batch of the projector's work (or a partition's restore) with automatic
    collection off, in any process: it makes no garbage cycles, and a collection during it
    walks what it keeps alive again and frees nothing. Collection is on again afterwards
    (also when the batch raised). Where the policy is on (:func:`settle`), what the batch
    left alive is frozen first, and a full collection runs if one is ``FULL_OVERDUE_S``
    overdue. A process that turned automatic collection off itself keeps it off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if _settled:
            gc.freeze()
        gc.enable()
    if _settled and time.monotonic() - _last_full >= FULL_OVERDUE_S:
        _full("overdue")


def collect_when_idle() -> int | None:
    """A full collection over the frozen objects too, if the policy is on and the last one
    is ``FULL_EVERY_S`` old; returns the objects collected (None when not due). Call it
    only when there is nothing else to do: it holds the GIL for as long as it walks."""
    if not _settled or time.monotonic() - _last_full < FULL_EVERY_S:
        return None
    return _full("idle")


def _full(why: str) -> int:
    global _last_full
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    _last_full = time.monotonic()
    log.debug("%s full collection: %d unreachable objects", why, found)
    return found
