"""The snapshotter: its own consumer group and projection, the projector's pure core, and
checkpoints written at the policy's boundaries.

Write/publish order (what recovery relies on):

1. per accepted patch that hits a trigger, the checkpoint (state at that revision,
   covering the patch's offset, with every patch id the run decided so far) goes into the
   same RocksDB WriteBatch as the snapshotter's own state and position, under its local
   history key and an *outbox* key;
2. after the batch is stored, everything in the outbox is published to the checkpoints
   topic keyed by run_id (compacted on Kafka) and, once the log acknowledged all of it,
   the outbox keys are cleared;
3. only then the partition's *coverage* record is published (after checkpoints went out,
   or every ``COVERAGE_EVERY`` records): every checkpoint made for records below the
   batch's end is out, so recovery may start runs without one there.

A crash anywhere leaves the outbox to publish on restart, before new work (at least once;
a checkpoint is idempotent). A delivery failure keeps the outbox and the coverage where
they were; the next batch tries again.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import orjson

from runstate.eventlog.base import Appended, EventLog
from runstate.eventlog.sealed import CONTENT_FREE, SealedLog
from runstate.projector.runtime.loop import Projector, ProjectorStats
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Decision, Patch
from runstate.projector.store import keys
from runstate.projector.store.keys import patch_id_digest
from runstate.projector.store.partition import CheckpointWrite
from runstate.schemas.state import COLLECTIONS
from runstate.snapshotter import pieces
from runstate.snapshotter.checkpoint import RECENT_DECISIONS, SigningKey, coverage_keys, make_coverage, verdict_of_doc
from runstate.schemas.errors import KeyStoreError, RunNotFound
from runstate.schemas.patch import Author
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.retention import RetentionPolicy

log = logging.getLogger("runstate.snapshotter")

GROUP = "runstate-snapshotter"
#: Who an erasure by retention is recorded as.
_RETENTION = Author(agent_id="runstate-retention", agent_version="1")
#: Without new checkpoints, the coverage record is republished only after this many records
#: (a batch without checkpoints then costs no round trip to the log).
COVERAGE_EVERY = 1000
#: Once a batch smaller than the batch size has drained the log, the snapshotter waits this
#: long before its next poll: nobody waits on it, and a batch's fixed cost (the store's
#: write, the outbox, the commit, a cold start of the code) then falls on several records
#: instead of one or two.
LINGER_S = 0.2


def snapshotter_dir(state_dir: str | Path) -> Path:
    """Where the snapshotter keeps its projection and checkpoint history."""
    return Path(state_dir) / "snapshotter"


@dataclass
class _Tracking:
    """What changed in a partition's runs since their newest checkpoint, for the runs this
    snapshotter based (checkpointed whole) since it took the partition: for the others it
    does not know, and their next checkpoint is a base."""

    based: set[str] = field(default_factory=set)
    #: run -> the item pieces changed since its newest checkpoint
    changed: dict[str, set[str]] = field(default_factory=dict)
    #: run -> the patch ids it decided since its newest checkpoint (stored batches)
    ids: dict[str, list[str]] = field(default_factory=dict)
    #: run -> the offset up to which its patch ids are in a checkpoint (the batch being decided)
    ids_upto: dict[str, int] = field(default_factory=dict)
    #: run -> its live segments of patch ids: name -> how many ids
    segments: dict[str, dict[str, int]] = field(default_factory=dict)


class _Newest:
    """What this writer's stored checkpoints of recently checkpointed runs stand on: their
    :class:`pieces.Published` and the newest values of the pieces it wrote, so that a run's
    next checkpoint does not read them back from the store (a reverse seek per piece).
    Only what is stored enters (:meth:`keep`, after the store's write); least recently
    checkpointed runs leave once the values pass ``budget`` bytes. A run kept since a base
    is *whole*: a piece it lacks is not in the store either (a new item's, most often).
    Otherwise a miss is read from the store, so dropping an entry is always safe."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0
        self._runs: OrderedDict[tuple[int, str], _Kept] = OrderedDict()

    def get(self, partition: int, run: str) -> _Kept | None:
        return self._runs.get((partition, run))

    def keep(self, partition: int, run: str, state: pieces.Published, values: dict[str, bytes], base: bool) -> None:
        """The run's newest checkpoint is stored: ``state``, and ``values`` of the pieces it
        wrote (every piece of the run, for a ``base``)."""
        old = self._runs.pop((partition, run), None)
        if old is None:
            kept = _Kept(state, dict(values), base, sum(map(len, values.values())))
        else:
            self.size -= old.size
            size = old.size + sum(len(v) - len(old.values.get(n, b"")) for n, v in values.items())
            old.values.update(values)
            kept = _Kept(state, old.values, old.whole or base, size)
        self._runs[(partition, run)] = kept
        self.size += kept.size
        while self.size > self.budget and self._runs:
            self.size -= self._runs.popitem(last=False)[1].size

    def drop(self, partition: int, run: str | None = None) -> None:
        """Forget the run (None: every run of the partition)."""
        if run is not None:
            gone = self._runs.pop((partition, run), None)
            self.size -= 0 if gone is None else gone.size
            return
        for k in [k for k in self._runs if k[0] == partition]:
            self.size -= self._runs.pop(k).size


class _Kept(NamedTuple):
    """A run's entry in :class:`_Newest` (``size``: the bytes of ``values``)."""

    state: pieces.Published
    values: dict[str, bytes]
    whole: bool
    size: int


class CheckpointWriter:
    """The projector hooks that turn accepted patches into checkpoints. ``key`` signs
    them (HMAC-SHA256; ``RUNSTATE_CHECKPOINT_KEY``)."""

    def __init__(
        self,
        log_: EventLog,
        policy: CheckpointPolicy,
        key: SigningKey = None,
        retention: RetentionPolicy | None = None,
        retention_every_s: float = 60.0,
        newest_bytes: int = 32 << 20,
    ) -> None:
        self.log = log_
        self.policy = policy
        self.key = key
        self.retention = retention
        self.retention_every_s = retention_every_s
        self._retention_checked: dict[int, float] = {}
        #: per partition, the runs the last retention check found due; erased since start
        self.retention_due: dict[int, int] = {}
        self.retention_erased = 0
        #: per partition, per run: the bytes of its records since its last checkpoint and that
        #: checkpoint's head's (the policy's byte budget: a base's bundle is paid once, not
        #: by every later checkpoint); in memory only: after a restart a run's next trigger
        #: is taken
        self._weights: dict[int, dict[str, list[Any]]] = {}
        #: bytes of the checkpoints published since start
        self.written_bytes = 0
        #: per partition, what tells a run's next checkpoint what changed (see :class:`_Tracking`)
        self._tracked: dict[int, _Tracking] = {}
        #: per partition, the pieces checkpoints of the batch being decided published, not stored yet
        self._staged: dict[int, dict[tuple[str, str], bytes]] = {}
        #: (partition, run) -> what the run's newest checkpoint of the batch being decided
        #: stands on (epoch, digest, bundles), not stored yet
        self._published: dict[tuple[int, str], pieces.Published] = {}
        #: the same of stored checkpoints, for the runs checkpointed lately
        self._newest = _Newest(newest_bytes)
        #: the batch's decisions by run (see :meth:`_decided`)
        self._index: tuple[list[Decision], int, dict[str, list[Decision]]] | None = None
        #: (partition, run) based by the batch being decided
        self._based: set[tuple[int, str]] = set()
        #: the partitions the projector owns now (set by :class:`Snapshotter`)
        self.owned: Callable[[], set[int]] = lambda: set(self.stores)
        self.producer = log_.producer()
        self.stores: dict[int, ProjectionStore] = {}
        #: newest covered offset per run, per partition
        self.covered: dict[int, dict[str, int]] = {}
        #: per partition, the runs with records their newest checkpoint does not cover, and
        #: the first such record's offset: the coverage record promises nothing past the
        #: lowest (its ``dense`` promise), and the ``age`` trigger checkpoints those that
        #: wait too long; a run whose records are all covered costs neither. Kept in offset
        #: order (a run enters with a record newer than every one there), so the lowest is
        #: the first, read per batch in O(1)
        self.dirty: dict[int, OrderedDict[str, int]] = {}
        self._age_checked: dict[int, int] = {}
        #: per partition, the offset the last coverage record published promised
        self._coverage_sent: dict[int, int] = {}
        #: partitions whose outbox is known to be empty (the last publish cleared it): their
        #: next outbox is exactly what the next batch adds, no scan needed. A scan is not
        #: free: it seeks over the tombstones of every cleared entry not yet compacted away
        #: (what it cost is on the performance page).
        self._outbox_empty: set[int] = set()
        self.written = 0
        #: per partition, its position when last seen idle, and since when it has not moved
        self._quiet: dict[int, tuple[int, float]] = {}
        #: set while a run ``until_caught_up``: a quiet partition is settled at once, so
        #: that catching up ends with the log covered
        self.catching_up = False

    def on_assign(self, partition: int, store: ProjectionStore) -> None:
        self.stores[partition] = store
        # Another instance may have checkpointed its runs meanwhile: each run's next
        # checkpoint here is a base, in an epoch of its own.
        self._tracked[partition] = _Tracking()
        self._staged.pop(partition, None)
        self._newest.drop(partition)
        covered: dict[str, int] = {}
        for run, value in store.all_checkpoints():
            covers = int(pieces.head_document(value)["covers_offset"])
            covered[run] = max(covers, covered.get(run, -1))
        self.covered[partition] = covered
        found = []
        for run, covers in covered.items():  # one seek per run: which have records past their checkpoint
            first = store.first_decision_after(run, covers)
            if first is not None:
                found.append((first, run))
        self.dirty[partition] = OrderedDict((run, first) for first, run in sorted(found))
        self._outbox_empty.discard(partition)
        self._publish(partition, store, self._covers_below(partition, store.next_offset()), None)  # what a crash left

    def on_accepted(self, partition: int, patch: Patch, decision: Decision, doc: RunDoc, batch: PendingBatch) -> None:
        run = doc.header.run_id
        weights = self._weights.setdefault(partition, {})
        w = weights.get(run)
        if w is None:
            w = weights[run] = [0, 0]  # records' bytes since the last checkpoint, that checkpoint's head's
        w[0] += batch.record_bytes
        tracking = self._tracking(partition)
        if run in tracking.based and batch.changes is not None:
            changed = tracking.changed.setdefault(run, set())
            changed.update(pieces.item_piece(kind, id_) for kind, id_ in batch.changes.puts)
            changed.update(pieces.item_piece(kind, id_) for kind, id_ in batch.changes.deletes)
        if doc.header.status == "erased":
            # An erased run's tombstone replaces its checkpoints (on the compacted topic too),
            # so that a restore knows the run and never brings it back.
            triggers = ["erased"]
        else:
            triggers = self.policy.triggers(patch, decision.revision, doc)
            if triggers and self.policy.budgeted(triggers) and not self.policy.within_budget(w[0], w[1]):
                return  # only periodic triggers, and the run's checkpoints would outweigh its records
        if triggers:
            self._checkpoint(partition, doc, decision.offset, triggers, batch)

    def _decided(self, batch: PendingBatch, run: str) -> list[Decision]:
        """The batch's decisions of ``run`` so far: indexed by run as the batch grows rather
        than scanned at each checkpoint (a batch holds hundreds of one run's checkpoints).
        An erasure replaces the batch's list: then indexed again."""
        index = self._index
        if index is None or index[0] is not batch.decisions:
            index = (batch.decisions, 0, {})
        decisions, seen, by_run = index
        for d in decisions[seen:]:
            by_run.setdefault(d.run_id, []).append(d)
        self._index = (decisions, len(decisions), by_run)
        return by_run.get(run, [])

    def _tracking(self, partition: int) -> _Tracking:
        t = self._tracked.get(partition)
        if t is None:
            t = self._tracked[partition] = _Tracking()
        return t

    def _checkpoint(
        self, partition: int, doc: RunDoc, covers: int, triggers: list[str], batch: PendingBatch | None
    ) -> tuple[int, CheckpointWrite]:
        """The run's checkpoint at ``doc``'s revision, covering the log up to ``covers``:
        the pieces that changed since its previous one (all of them for a base: the run's
        first checkpoint since this snapshotter took its partition) in one bundle, which
        absorbs the run's newest smaller bundles, or is a base again once the run's bundles
        hold too much that newer ones superseded (:func:`pieces.absorbed`); then its head."""
        run = doc.header.run_id
        store = self.stores[partition]
        tracking = self._tracking(partition)
        staged = self._staged.setdefault(partition, {})
        unwritten = self._decided(batch, run) if batch is not None else []
        revision = doc.header.revision
        prior = self._published.get((partition, run))
        newest = self._newest.get(partition, run)
        if prior is None and newest is not None:
            prior = newest.state
        older: list[str] = []  # format 4 pieces of the run on the topic, to empty
        if prior is None:
            raw = store.tally(run)
            prior = None if raw is None else pieces.Published.decode(raw)
            if raw is not None and prior is None:
                older = list(store.pieces_at(run))
        out: dict[str, bytes] = {}  # the pieces' new versions, for the local history
        bundle: dict[str, bytes] | None = None
        names: list[str] | None = None
        header = keys.encode_header(doc.header)
        changes: dict[str, Any] = {}
        if doc.header.status == "erased":
            # Every piece the run had goes (content-free: the keys that sealed them are gone).
            for name in {*store.pieces_at(run), *(n for (r, n) in staged if r == run)}:
                out[name] = b""
            state = pieces.Published(0, pieces.Tally(), 0, [])
            tracking.based.discard(run)
            tracking.segments.pop(run, None)
            erased: str | None = keys.encode_header(doc.header).decode()
            self._newest.drop(partition, run)
            recent: list[Any] = []
        else:
            erased = None
            recent = self._recent(store, run, unwritten)
            ids = self._ids_since(tracking, run, unwritten, covers)
            if run not in tracking.based or prior is None:
                # A base: every piece, in a new epoch (the revision, and random bits: two
                # instances that based the run at one revision do not share an epoch).
                epoch = revision << 20 | secrets.randbits(20)
                current = self._all_pieces(doc, store, unwritten, epoch, header)
                for name in {*store.pieces_at(run), *(n for (r, n) in staged if r == run)} - current.keys():
                    out[name] = b""  # of an older epoch: not in this one
                for name, (_body, value) in current.items():
                    out[name] = value
                bundle = {name: body for name, (body, _v) in current.items()}
                state = pieces.Published(
                    epoch, pieces.tally_of(epoch, bundle.items()), sum(map(len, bundle.values())), []
                )
                tracking.based.add(run)
                self._based.add((partition, run))
                tracking.segments[run] = {
                    n: len(b) // keys.PATCH_ID_DIGEST for n, b in bundle.items() if pieces.is_ids(n)
                }
            else:
                epoch, tally, live, _b = prior

                def was(name: str) -> bytes | None:
                    """The piece's body in the run's newest checkpoint (None: not there)."""
                    old = staged.get((run, name))
                    if old is None and newest is not None:
                        old = newest.values.get(name)
                        if old is None and newest.whole:
                            return None
                    return pieces.live(store.piece(run, name) if old is None else old, epoch)

                bodies = self._item_bodies(store, run, tracking.changed.pop(run, ()), batch)
                piece = was(pieces.HEADER_PIECE)
                got = pieces.header_changes(header, piece)
                if got is None or len(orjson.dumps(got)) > len(header) // 2:
                    bodies[pieces.HEADER_PIECE] = header  # its piece again; the head then carries no changes
                else:
                    changes = got
                if ids:
                    bodies.update(self._segments(tracking.segments.setdefault(run, {}), revision, ids, was))
                for name, body in bodies.items():
                    old = was(name)
                    if old is not None:
                        tally = tally.remove(name, epoch, old)
                        live -= len(old)
                    out[name] = pieces.piece_value(epoch, name, body or b"")
                    if body:
                        tally = tally.add(name, epoch, body)
                        live += len(body)
                delta = {name: body or b"" for name, body in bodies.items()}
                m = pieces.absorbed(prior.bundles, pieces.bundle_raw(delta), live)
                if m is None:  # based again, in the same epoch: only the live pieces
                    segments = tracking.segments.get(run, {})
                    items = self._item_names(doc)
                    now = self._item_bodies(store, run, [n for n in items if n not in delta], batch)
                    bundle = {
                        n: b
                        for n in {*items, *segments, pieces.HEADER_PIECE}
                        if (b := delta[n] if n in delta else now[n] if n in now else was(n))
                    }
                    state = pieces.Published(epoch, tally, live, [])
                else:
                    # The newest bundles it absorbs hold the newest versions of their pieces:
                    # their bodies now, or gone.
                    absorbed = [n for b in prior.bundles[len(prior.bundles) - m :] for n in b.names or ()]
                    now = self._item_bodies(store, run, [n for n in absorbed if pieces.is_item(n)], batch)
                    bundle = {n: (now[n] if n in now else was(n)) or b"" for n in absorbed}
                    bundle.update(delta)
                    names = list(bundle)
                    state = pieces.Published(epoch, tally, live, prior.bundles[: len(prior.bundles) - m])
        records: list[tuple[str, bytes, bool]] = []
        if bundle is not None:
            slot = pieces.free_slot(prior.bundles if prior is not None else [])
            value = pieces.bundle_value(state.epoch, revision, bundle)
            records.append((pieces.slot_key(run, slot), value, False))
            state = state._replace(
                bundles=[
                    *state.bundles,
                    pieces.Bundle(slot, revision, pieces.bundle_digest(value), pieces.bundle_raw(bundle), names),
                ]
            )
        head = pieces.make_head(
            run_id=run,
            revision=revision,
            partition=partition,
            covers_offset=covers,
            epoch=state.epoch,
            tally=state.tally,
            triggers=triggers,
            verdict=verdict_of_doc(doc),
            key=self.key,
            header_changes=changes,
            recent=recent,
            bundles=state.bundles,
            erased=erased,
        )
        free = erased is not None
        records.append((run, head, free))
        if erased is not None:  # every slot the run may have used holds sealed content
            records += [(pieces.slot_key(run, s), b"", True) for s in range(pieces.SLOTS)]
            older = list(out)
        # Pieces of format 4 are records of their own: emptied once the run's first bundle
        # (or its erasure) is published.
        records += [(pieces.record_key(run, name), b"", free) for name in older]
        # An erased run's history is gone: its tombstones are published, not kept (their
        # names are the run's item ids, content).
        kept = {} if erased is not None else out
        cp = CheckpointWrite(head, kept, state.encode(), msgspec.msgpack.encode(records))
        for name, value in kept.items():
            staged[(run, name)] = value
        self._published[(partition, run)] = state
        if batch is not None:
            batch.checkpoints[(run, revision)] = cp
        self.covered.setdefault(partition, {})[run] = covers
        self._weights.setdefault(partition, {})[run] = [0, len(head)]
        return revision, cp

    @staticmethod
    def _item_names(doc: RunDoc) -> list[str]:
        return [
            pieces.item_piece(kind, id_)
            for kind in COLLECTIONS
            for id_, e in doc.entries(kind).items()
            if e is not None
        ]

    @staticmethod
    def _item_bodies(
        store: ProjectionStore, run: str, names: Iterable[str], batch: PendingBatch | None
    ) -> dict[str, bytes | None]:
        """Item pieces' bodies now, as the store holds the items (None: gone): as ``batch``
        staged them where it changed them, else as the store has them (it holds everything
        before the batch). The store's own bytes, read, rather than the items encoded again."""
        out: dict[str, bytes | None] = {}
        rest: list[tuple[str, tuple[str, str]]] = []
        puts, deletes = (batch.puts, batch.deletes) if batch is not None else ({}, set())
        for name in names:
            kind, id_ = pieces.item_of(name)
            k = keys.item_key(run, kind, id_)
            if k in puts:
                out[name] = puts[k]
            elif k in deletes:
                out[name] = None
            else:
                rest.append((name, (kind, id_)))
        if rest:
            for (name, _w), raw in zip(rest, store.item_bytes(run, [w for _n, w in rest]), strict=True):
                out[name] = raw
        return out

    def _ids_since(self, tracking: _Tracking, run: str, unwritten: list[Decision], covers: int) -> list[str]:
        """The patch ids the run decided since its previous checkpoint, up to ``covers``."""
        done = tracking.ids_upto.get(run, -1)
        ids = tracking.ids.pop(run, [])
        ids += [d.patch_id for d in unwritten if done < d.offset <= covers]
        tracking.ids_upto[run] = covers
        return ids

    @staticmethod
    def _segments(
        segments: dict[str, int], revision: int, ids: list[str], was: Callable[[str], bytes | None]
    ) -> dict[str, bytes | None]:
        """The segments of patch ids a checkpoint at ``revision`` writes: one of ``ids``, and
        the merges that makes due (``segments``, the run's, updated; ``was``: a segment's
        body as published), a merged-away segment as None (gone)."""
        name = pieces.ids_piece(revision)
        bodies: dict[str, bytes | None] = {name: b"".join(patch_id_digest(i) for i in ids)}
        segments[name] = len(ids)
        for group in pieces.merged_segments(segments):
            merged = b"".join(bodies[n] if n in bodies else was(n) or b"" for n in group)  # type: ignore[misc]
            for n in group[:-1]:
                bodies[n] = None
                del segments[n]
            bodies[group[-1]] = merged
            segments[group[-1]] = len(merged) // keys.PATCH_ID_DIGEST
        return bodies

    def _all_pieces(
        self, doc: RunDoc, store: ProjectionStore, unwritten: list[Decision], epoch: int, header: bytes
    ) -> dict[str, tuple[bytes, bytes]]:
        """Every piece of the run now: ``name -> (body, value as published in epoch)``
        (``header``: the run's, as the store holds it)."""
        run = doc.header.run_id
        bodies = {pieces.HEADER_PIECE: header}
        for kind in COLLECTIONS:
            for id_, e in doc.entries(kind).items():
                if e is not None:
                    bodies[pieces.item_piece(kind, id_)] = keys.encode_item(e)
        ids = {*store.patch_ids(run), *(d.patch_id for d in unwritten)}
        if ids:
            bodies[pieces.ids_piece(doc.header.revision)] = b"".join(sorted(patch_id_digest(i) for i in ids))
        return {name: (body, pieces.piece_value(epoch, name, body)) for name, body in bodies.items()}

    @staticmethod
    def _recent(store: ProjectionStore, run: str, unwritten: list[Decision]) -> list[Any]:
        """The run's last decisions (for a restored projector's answers to retries), as a
        head holds them."""
        recent = unwritten[-RECENT_DECISIONS:]
        out = [[d.offset, d.patch_id, d.reason == "patch_id_reused", keys.dump(d).decode()] for d in recent]
        if len(recent) < RECENT_DECISIONS:  # the store's own JSON, not decoded and written again
            stored = [
                (orjson.loads(raw), raw) for raw in store.recent_history_json(run, RECENT_DECISIONS - len(recent))
            ]
            out = [
                [d["offset"], d["patch_id"], d["reason"] == "patch_id_reused", raw.decode()] for d, raw in stored
            ] + out
        return out

    def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
        self._index = None
        self._settle(partition, batch)
        self._track(partition, batch)
        aged = self._age(partition, batch.next_offset, store)
        self._publish(partition, store, self._covers_below(partition, batch.next_offset), {**batch.checkpoints, **aged})
        self.apply_retention(partition, store)

    def _settle(self, partition: int, batch: PendingBatch) -> None:
        """After ``batch`` is stored: what its checkpoints staged is in the store now, and
        the patch ids decided after a run's newest checkpoint wait for its next one."""
        self._keep_staged(partition)
        tracking = self._tracking(partition)
        for d in batch.decisions:
            if d.run_id in tracking.based and d.offset > tracking.ids_upto.get(d.run_id, -1):
                tracking.ids.setdefault(d.run_id, []).append(d.patch_id)
        tracking.ids_upto.clear()

    def _track(self, partition: int, batch: PendingBatch) -> None:
        """Which runs have records past their newest checkpoint, after ``batch`` (whose
        checkpoints are already in :attr:`covered`). A run never started (its patches
        refused ``unknown_run``) has no checkpoint and is not tracked, as before."""
        covered = self.covered.get(partition, {})
        dirty = self.dirty.setdefault(partition, OrderedDict())
        fresh: dict[str, int] = {}
        for d in batch.decisions:  # in log order: the first uncovered one of each run
            c = covered.get(d.run_id)
            if c is not None and d.offset > c and d.run_id not in fresh:
                fresh[d.run_id] = d.offset
        for run, _revision in batch.checkpoints:
            dirty.pop(run, None)
        for run, offset in fresh.items():
            dirty.setdefault(run, offset)

    def _covers_below(self, partition: int, next_offset: int) -> int:
        """What the partition's coverage may promise: below the first record a run's newest
        checkpoint does not cover (the position, when none)."""
        dirty = self.dirty.get(partition)
        return next(iter(dirty.values()), next_offset) if dirty else next_offset

    def on_idle(self) -> None:
        owned = self.owned()
        for partition, store in list(self.stores.items()):
            if partition in owned:  # a revoked partition's store is closed
                self._settle_quiet(partition, store)
                self.apply_retention(partition, store)

    def _settle_quiet(self, partition: int, store: ProjectionStore) -> None:
        """Once the partition has had no new record for ``policy.quiet_s`` (at once while
        :attr:`catching_up`), checkpoint each run with records past its newest checkpoint,
        within the byte budget, and publish: the coverage then reaches the partition's end.
        A run the budget defers is looked at again after another quiet spell."""
        dirty = self.dirty.get(partition)
        if not dirty:
            return
        position, now = store.next_offset(), time.monotonic()
        seen = self._quiet.get(partition)
        if seen is None or seen[0] != position:
            self._quiet[partition] = seen = (position, now)
        if not self.catching_up and now - seen[1] < self.policy.quiet_s:
            return
        self._quiet[partition] = (position, now)
        weights = self._weights.get(partition, {})
        due = [r for r in dirty if (w := weights.get(r)) is None or self.policy.within_budget(w[0], w[1])]
        settled = self._checkpoint_runs(partition, store, due, position - 1, "quiet")
        if settled:
            self._publish(partition, store, self._covers_below(partition, position), settled)

    def apply_retention(self, partition: int, store: ProjectionStore, now: datetime | None = None) -> int:
        """Erase the partition's runs the retention policy has due (at most every
        ``retention_every_s`` per partition); returns how many were erased now."""
        if self.retention is None or not isinstance(self.log, SealedLog):
            return 0
        clock = time.monotonic()
        if now is None and clock - self._retention_checked.get(partition, -1e9) < self.retention_every_s:
            return 0
        self._retention_checked[partition] = clock
        at = now or datetime.now(UTC)
        due = []
        for status in self.retention.keep:
            for run_id, raw in store.headers_json(status):
                header = orjson.loads(raw)
                ended = header.get("updated_at")
                if self.retention.due(status, None if ended is None else datetime.fromisoformat(ended), at):
                    due.append((run_id, status, int(header["revision"])))
        self.retention_due[partition] = len(due)
        erased = 0
        for run_id, status, revision in due:
            try:
                self.log.erase(run_id, f"retention: {self.retention.rule(status)}", "retention", _RETENTION, revision)
                erased += 1
            except RunNotFound:  # stored before content was sealed: its content cannot be erased from the log
                log.warning("retention: run %r is due but was stored before content was sealed; not erasable", run_id)
        self.retention_erased += erased
        return erased

    def _publish(
        self,
        partition: int,
        store: ProjectionStore,
        covers_below: int,
        added: dict[tuple[str, int], CheckpointWrite] | None,
    ) -> None:
        """Publish the outbox, clear what the log acknowledged, then (all out) the coverage.
        ``added``: the checkpoints stored since the last publish (None: unknown, read the
        outbox)."""
        topic = self.log.topics.checkpoints
        if added is not None and partition in self._outbox_empty:
            pending = [(run, rev, cp.records) for (run, rev), cp in added.items()]
        else:
            pending = store.outbox()
        self._outbox_empty.discard(partition)
        failed: list[Exception] = []

        def delivered(_where: Appended | None, err: Exception | None) -> None:
            if err is not None:
                failed.append(err)

        sent = 0
        for _run, _rev, records in pending:
            # Pieces first, then the head that names them, all on the run's partition.
            for key, value, free in msgspec.msgpack.decode(records):
                # An erased run's tombstone holds no content: written readable, to outlive its keys.
                self.producer.append_async(
                    topic, key, value, delivered, CONTENT_FREE if free else (), partition=partition
                )
                sent += len(value)
        left = self.producer.flush(60)
        if failed or left:
            # Kept in the outbox: the next batch (or a restart) publishes them again.
            log.error(
                "%d checkpoints of partition %d not published (%s); kept in the outbox",
                len(failed) + left,
                partition,
                failed[0] if failed else "flush timed out",
            )
            return
        if pending:
            store.clear_outbox((run, rev) for run, rev, _ in pending)
            self.written += len(pending)
            self.written_bytes += sent
        self._outbox_empty.add(partition)
        if not pending and covers_below - self._coverage_sent.get(partition, -COVERAGE_EVERY) < COVERAGE_EVERY:
            return  # nothing new to promise yet; a coverage that lags only lengthens a restore's tail
        self._coverage_sent[partition] = covers_below
        key = coverage_keys(self.log.partitions(topic))[partition]
        covered = self.covered.get(partition, {}).keys()  # every run of it with a checkpoint: all published now
        self.producer.append_async(
            topic, key, make_coverage(partition, covers_below, self.key, covered, dense=True), delivered
        )
        if self.producer.flush(60) or failed:
            log.error("coverage of partition %d not published; the next batch tries again", partition)

    def _age(self, partition: int, next_offset: int, store: ProjectionStore) -> dict[tuple[str, int], CheckpointWrite]:
        """Checkpoint runs with a record their newest checkpoint does not cover, older than
        ``max_age`` records (stored, and returned): what holds the coverage, and so a
        restore's tail, back. A run whose records are all covered is never checkpointed
        again for its age. The walk is done every ``max_age / 10`` records, not per batch."""
        if next_offset - self._age_checked.get(partition, 0) < max(1, self.policy.max_age // 10):
            return {}
        self._age_checked[partition] = next_offset
        dirty = self.dirty.setdefault(partition, OrderedDict())
        limit = next_offset - 1 - self.policy.max_age
        stale = [r for r, _ in itertools.takewhile(lambda e: e[1] < limit, dirty.items())]  # offset order
        return self._checkpoint_runs(partition, store, stale, next_offset - 1, "age")

    def _checkpoint_runs(
        self, partition: int, store: ProjectionStore, runs: list[str], covers: int, trigger: str
    ) -> dict[tuple[str, int], CheckpointWrite]:
        """Checkpoint ``runs`` as stored, covering the log up to ``covers``, outside a poll
        batch (for ``trigger``): stored, no longer dirty, and returned for publishing."""
        dirty = self.dirty.setdefault(partition, OrderedDict())
        out = {}
        for run in runs:
            doc = store.load_doc(run)
            if doc is None:
                continue
            revision, cp = self._checkpoint(partition, doc, covers, [trigger], None)
            out[(run, revision)] = cp
            dirty.pop(run, None)
        if out:
            store.put_checkpoints(out)
            self._keep_staged(partition)
        return out

    def _keep_staged(self, partition: int) -> None:
        """What the partition's checkpoints staged is stored now: kept as the newest."""
        staged = self._staged.pop(partition, {})
        values: dict[str, dict[str, bytes]] = {}
        for (run, name), value in staged.items():
            values.setdefault(run, {})[name] = value
        for k in [k for k in self._published if k[0] == partition]:
            self._newest.keep(partition, k[1], self._published.pop(k), values.get(k[1], {}), k in self._based)
            self._based.discard(k)

    def close(self) -> None:
        self.producer.close()


class Snapshotter:
    """``run()`` consumes the events topic with its own group into its own store and
    writes checkpoints. Same loop and pure core as the projector; unlike the projector it
    lingers (``linger_s``) once a small batch has drained the log, except while catching up."""

    def __init__(
        self,
        log_: EventLog,
        state_dir: str,
        *,
        policy: CheckpointPolicy | None = None,
        batch_size: int = 2000,
        group_id: str = GROUP,
        key: SigningKey = None,
        retention: RetentionPolicy | None = None,
        retention_every_s: float = 60.0,
        linger_s: float = LINGER_S,
    ) -> None:
        if retention is not None and not isinstance(log_, SealedLog):
            raise KeyStoreError(
                "RUNSTATE_RETENTION erases runs, which needs sealed content: set RUNSTATE_MASTER_KEY "
                "(or RUNSTATE_MASTER_KEY_FILE)"
            )
        self.writer = CheckpointWriter(log_, policy or CheckpointPolicy(), key, retention, retention_every_s)
        self.projector = Projector(
            log_,
            str(snapshotter_dir(state_dir)),
            group_id=group_id,
            batch_size=batch_size,
            publish_dead_letters=False,
            hooks=self.writer,
            destroy_erased_keys=True,
            linger_s=linger_s,
        )
        self.writer.owned = lambda: set(self.projector.parts)

    def run(self, *, until_caught_up: bool = False, **kw: object) -> ProjectorStats:
        self.writer.catching_up = until_caught_up
        try:
            return self.projector.run(until_caught_up=until_caught_up, **kw)  # type: ignore[arg-type]
        finally:
            self.writer.close()
