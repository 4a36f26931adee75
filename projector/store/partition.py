"""The projection store: one RocksDB per partition of the events topic.

Its keys and value encodings are defined in one place, :mod:`runstate.projector.store.keys`;
nothing else touches them. What the store holds per partition: run headers and items
(the working state, written per change), every decision (history + idempotency index),
dead letters, the runs restored from checkpoints, the snapshotter's checkpoint history
(opaque blobs), and the next log offset to apply.

Write contract: :meth:`ProjectionStore.write` applies one :class:`PendingBatch` (state
changes, decisions, dead letters, checkpoints and the new ``next_offset``) as one RocksDB
WriteBatch, so a crash leaves either all of a poll batch or none of it, never the state
without its offset. Read-only instances see the DB as of their open, including the
primary's WAL; secondary instances are not used (their reads lag the primary's).

Failure modes: opening raises :class:`StoreLocked` when another process has the store
open read-write and :class:`StoreError` for anything else (missing, corrupt, another
format); :meth:`write` raises :class:`StoreError` and then nothing of the batch is stored.
"""

from __future__ import annotations

import functools
import heapq
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec
import orjson
import pydantic
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from runstate.projector.core.outcomes import DeadLetter
from runstate.projector.core.working import Changes, Entry, Header, RunDoc
from runstate.projector.store import document, keys
from runstate.projector.store.checkpoint_records import CheckpointRecords
from runstate.projector.store.graph import GraphReads
from runstate.projector.store.restoring import Restoring
from runstate.projector.store.rocks import RocksStore, write_error
from runstate.projector.store.statedir import Layout
from runstate.schemas.errors import ContractError, RunErased, StoreError, StoreLocked
from runstate.schemas.generated.structs import Decision as DecisionStruct
from runstate.schemas.patch import Decision
from runstate.schemas.state import CURRENT_SCHEMA_VERSION, RunHeader, status_span


@dataclass(frozen=True)
class RestoredRun:
    """One run to restore from a checkpoint: its whole state as one change set
    (``RunDoc.as_changes``), the last log offset the state covers, and the decisions the
    checkpoint carries (for idempotent retries)."""

    run_id: str
    changes: Changes
    covers_offset: int
    decisions: list[Decision] = field(default_factory=list)
    #: every patch id decided for the run up to ``covers_offset`` (concatenated digests,
    #: see ``snapshotter.checkpoint.patch_id_digest``)
    patch_ids: bytes = b""


@dataclass(frozen=True)
class CheckpointWrite:
    """One checkpoint as the snapshotter's store keeps it (every value opaque here): its
    head, the pieces it published (name -> value), the run's digest after it, and the
    records to publish (the outbox, until :meth:`ProjectionStore.clear_outbox`)."""

    head: bytes
    pieces: dict[str, bytes]
    tally: bytes
    records: bytes


@dataclass
class PendingBatch:
    """Everything one poll batch writes to one partition's store."""

    next_offset: int
    headers: dict[str, Header] = field(default_factory=dict)
    puts: dict[bytes, bytes] = field(default_factory=dict)
    deletes: set[bytes] = field(default_factory=set)
    decisions: list[Decision] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    #: runs restored from checkpoints -> the offset their checkpoint covers
    restored: dict[str, int] = field(default_factory=dict)
    #: (run_id, revision) -> a checkpoint (the snapshotter's local history); each also
    #: goes into the outbox until :meth:`ProjectionStore.clear_outbox`
    checkpoints: dict[tuple[str, int], CheckpointWrite] = field(default_factory=dict)
    #: runs restored from checkpoints -> the patch ids decided before (digests)
    restored_ids: dict[str, bytes] = field(default_factory=dict)
    #: runs erased in this batch: everything stored of them is deleted before the batch's
    #: other writes (their tombstone header, the erasure's decision)
    erased: set[str] = field(default_factory=set)
    #: the size of the record a hook's ``on_accepted`` is called for (the snapshotter weighs
    #: a run's records since its last checkpoint)
    record_bytes: int = 0
    #: what that patch changed (the snapshotter's checkpoints write what changed)
    changes: Changes | None = None

    def add_changes(self, run_id: str, changes: Changes) -> None:
        """Stage what one accepted patch (or a restore) changed in a run. An erasure (``wipe``)
        also drops what the batch staged of the run before it, but the erasure's own
        decision (the last one staged)."""
        if changes.wipe:
            self._wipe(run_id)
        self.headers[run_id] = changes.header
        for (kind, id_), entry in changes.puts.items():
            k = keys.item_key(run_id, kind, id_)
            self.deletes.discard(k)
            self.puts[k] = keys.encode_item(entry)
        for kind, id_ in changes.deletes:
            k = keys.item_key(run_id, kind, id_)
            self.puts.pop(k, None)
            self.deletes.add(k)

    def _wipe(self, run_id: str) -> None:
        self.erased.add(run_id)
        prefix = keys.run_items_prefix(run_id)
        self.puts = {k: v for k, v in self.puts.items() if not k.startswith(prefix)}
        self.deletes = {k for k in self.deletes if not k.startswith(prefix)}
        last = self.decisions[-1:] if self.decisions and self.decisions[-1].run_id == run_id else []
        self.decisions = [d for d in self.decisions if d.run_id != run_id] + last
        self.dead = [dl for dl in self.dead if dl.key != run_id]
        self.checkpoints = {k: v for k, v in self.checkpoints.items() if k[0] != run_id}


#: The schema version this runstate writes, as stored JSON; and how a stored state
#: document of that version begins.
_CURRENT_VERSION = str(CURRENT_SCHEMA_VERSION).encode()
_CURRENT_VERSION_JSON = b'{"schema_version":' + _CURRENT_VERSION + b","

_ERASED = status_span("erased")

#: The block cache every store of a process shares (bytes): the projector's partitions and
#: the snapshotter's, however many a process holds.
BLOCK_CACHE_BYTES = 128 << 20
#: What the memtables of every store of a process may hold together (bytes; RocksDB's write
#: buffer manager flushes the largest when they reach it). Without it each store could hold
#: two 64 MB memtables, and a restore or replay of many partitions held them all.
WRITE_BUFFERS_BYTES = 128 << 20


@functools.cache
def shared_memory() -> tuple[Cache, WriteBufferManager]:
    """The block cache and the write buffer manager every store of this process uses."""
    return Cache(BLOCK_CACHE_BYTES), WriteBufferManager(WRITE_BUFFERS_BYTES, False)


def _options(*, create: bool = True) -> Options:
    """Bloom filters (10 bits per key, ~1 % false positives): most point reads of a patch
    miss by design (the idempotency key of a new patch id, a fresh item id), and without a
    filter each miss reads a block from every level; readers need the same policy to use
    the filters the writer built."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    cache, buffers = shared_memory()
    table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(buffers)
    return opts


def _open(path: Path, opts: Options, access: AccessType) -> Rdict:
    """Open the store with ``opts`` for its (only, default) column family too. Given the
    database's options alone, rocksdict reopens an existing database with the column
    families' options read back from its OPTIONS file, and RocksDB reads no filter policy
    and an 8 MB block cache back from it: every reopened store ran without its bloom
    filters (each missing key read a data block) and with an eighth of its cache."""
    return Rdict(str(path), opts, column_families={"default": opts}, access_type=access)


#: How many times a read-only open is tried while the writer's compaction deletes the table
#: files it was listing (see :func:`_open_read_only`), and how long it waits between them.
READ_ONLY_OPEN_TRIES = 20
READ_ONLY_OPEN_PAUSE_S = 0.005


def _open_read_only(path: Path) -> Rdict:
    """A read-only open, tried again when a file it listed was gone by the time it read it:
    the writer's compaction or flush deleted it (a table file: "Corruption: Can't access ...
    No such file or directory"; a write-ahead log: "IO error: No such file or directory"), a
    race with a live writer, not damage. A file that stays missing is reported as RocksDB
    says it."""
    for _ in range(READ_ONLY_OPEN_TRIES - 1):
        try:
            return _open(path, _options(create=False), AccessType.read_only())
        except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
            if "No such file or directory" not in str(e):
                raise
        time.sleep(READ_ONLY_OPEN_PAUSE_S)
    return _open(path, _options(create=False), AccessType.read_only())


def _is_lock_error(e: Exception) -> bool:
    # rocksdict raises a plain Exception carrying RocksDB's status text; the LOCK file's
    # status is the one way to tell "in use" apart. This is the only place that looks.
    text = str(e).lower()
    return "lock" in text and ("resource temporarily unavailable" in text or "lock hold" in text or "no locks" in text)


def check_store_files(path: Path) -> None:
    """Raise :class:`StoreError` when ``path`` holds a store's files but not its ``CURRENT``
    (RocksDB's pointer to its manifest): opened, RocksDB would start an empty database there
    and the projection would go on as if the run's earlier patches had never been."""
    if (path / "CURRENT").exists() or not path.is_dir():
        return
    # Data: a table file, or a write-ahead log with something in it. A manifest alone is a
    # store whose creation was cut short (a SIGKILL before RocksDB wrote CURRENT): nothing lost.
    if any(f.suffix == ".sst" or (f.suffix == ".log" and f.stat().st_size > 0) for f in path.iterdir()):
        raise StoreError(
            f"projection store {path} lost its CURRENT file (RocksDB's pointer to its data): it cannot be "
            f"opened as it was. Delete {path} (or the whole state directory) to rebuild it from the log."
        )


class ReadOnlyStores:
    """The partition stores under a state directory's ``layout``, each opened read-only on
    first use and kept until :meth:`close` (the readers' side: queries, time travel)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._open: dict[int, ProjectionStore] = {}

    def get(self, partition: int) -> ProjectionStore | None:
        """The partition's store, or None where it has none yet. Raises :class:`StoreError`
        where its files are damaged (:func:`check_store_files`)."""
        st = self._open.get(partition)
        if st is None:
            path = self.layout.store_path(partition)
            check_store_files(path)
            if not (path / "CURRENT").exists():
                return None
            st = self._open[partition] = ProjectionStore(path, read_only=True)
        return st

    def opened(self) -> list[int]:
        """The partitions whose store is open here."""
        return sorted(self._open)

    def close(self) -> None:
        for st in self._open.values():
            st.close()
        self._open.clear()


class ProjectionStore(Restoring, CheckpointRecords, GraphReads, RocksStore):
    """One partition's projection. Read-write instances are exclusive (RocksDB's lock).

    What is the store's own lives here: the projector's batch write and the reads the
    projector and the queries make. Its other audiences each have a room of their own,
    mixed in: :class:`Restoring` (a restore from checkpoints), :class:`CheckpointRecords`
    (the snapshotter's history, pieces and outbox), :class:`GraphReads` (LangGraph's
    queries); :class:`RocksStore` holds the reads and the write they share."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        check_store_files(self.path)
        try:
            if read_only:
                if not (self.path / "CURRENT").exists():
                    raise StoreError(f"no projection store at {self.path}")
                self._db = _open_read_only(self.path)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self._db = _open(self.path, _options(), AccessType.read_write())
        except StoreError:
            raise
        except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
            if _is_lock_error(e):
                raise StoreLocked(str(self.path), str(e)) from e
            why = " ".join(str(e).split())  # RocksDB's status text, on one line
            raise StoreError(
                f"cannot open projection store {self.path}: {why}. If it is damaged, delete {self.path} "
                "(or the whole state directory) to rebuild it from the log."
            ) from e
        fmt = self._get(keys.FORMAT)
        if fmt is None and not read_only:
            self._db[keys.FORMAT] = keys.STORE_FORMAT
        elif fmt is not None and fmt != keys.STORE_FORMAT:
            raise StoreError(
                f"projection store {self.path} has format {fmt.decode()!r}, this runstate writes "
                f"{keys.STORE_FORMAT.decode()!r}: delete the state directory to rebuild it from the log"
            )
        self._wopts = WriteOptions()
        self._restored_ids: dict[str, frozenset[bytes]] = {}
        #: A read-only store's one iterator, reused by :meth:`_scan`.
        self._iter: Any = None

    # -- writing -----------------------------------------------------------------------------

    def write(self, batch: PendingBatch) -> None:
        """Apply ``batch`` atomically (state changes, decisions, dead letters, offset)."""
        wb = WriteBatch(raw_mode=True)
        for run_id in batch.erased:
            self._stage_erasure(wb, run_id)
            # Finished after the batch (finish_erasures), and on every open until then.
            wb.put(keys.erasing_key(run_id), run_id.encode())
        for run_id, header in batch.headers.items():
            wb.put(keys.header_key(run_id), keys.encode_header(header))
        for k in batch.deletes:
            wb.delete(k)
        for k, v in batch.puts.items():
            wb.put(k, v)
        for dec in batch.decisions:
            wb.put(keys.history_key(dec.run_id, dec.offset), keys.dump(dec))
            if dec.reason != "patch_id_reused":  # a reused id keeps pointing at its first decision
                wb.put(keys.dedupe_key(dec.run_id, dec.patch_id), keys.encode_int(dec.offset))
        for dl in batch.dead:
            wb.put(keys.dead_letter_key(dl.offset), orjson.dumps(dl.__dict__))
        for run_id, covers in batch.restored.items():
            wb.put(keys.restored_key(run_id), keys.encode_int(covers))
        for (run_id, revision), cp in batch.checkpoints.items():
            wb.put(keys.checkpoint_key(run_id, revision), cp.head)
            for piece, value in cp.pieces.items():
                wb.put(keys.piece_version_key(run_id, piece, revision), value)
            wb.put(keys.tally_key(run_id), cp.tally)
            wb.put(keys.outbox_key(run_id, revision), cp.records)  # published later, then cleared
        for run_id, ids in batch.restored_ids.items():
            wb.put(keys.restored_ids_key(run_id), ids)
        wb.put(keys.NEXT_OFFSET, keys.encode_int(batch.next_offset))
        self._apply(wb)

    def erasing(self) -> list[str]:
        """Runs whose erasure is stored but not finished (see :meth:`finish_erasures`)."""
        return [v.decode() for _k, v in self._prefix(keys.ERASING)]

    def finish_erasures(self, runs: Iterable[str]) -> None:
        """The last step of erasing ``runs`` here: their bytes leave the store's files
        (:meth:`_compact_erased`), then their pending marks are cleared. Until then every
        open finds them in :meth:`erasing`, so a crash between the erasure's WriteBatch and
        its compaction is finished by the next process that opens the store."""
        runs = list(runs)
        if not runs:
            return
        try:
            self._compact_erased(runs)
            wb = WriteBatch(raw_mode=True)
            for run_id in runs:
                wb.delete(keys.erasing_key(run_id))
            self._db.write(wb, self._wopts)
        except Exception as e:
            raise write_error(self.path, e) from e

    def _stage_erasure(self, wb: WriteBatch, run_id: str) -> None:
        """Delete everything stored of an erased run (its header is written again after)."""
        for start, end in keys.run_ranges(run_id):
            wb.delete_range(start, end)
        for k, v in self._prefix(keys.DEAD_LETTERS):
            if orjson.loads(v).get("key") == run_id:
                wb.delete(k)

    def _compact_erased(self, runs: Iterable[str]) -> None:
        """Take the erased runs' bytes out of the store's files now: the memtable and the
        write-ahead log are flushed (the old values' log files are then deleted), and the
        runs' key ranges compacted to the bottom level, where the deleted values are dropped."""
        self._db.flush(True)
        self._db.flush_wal(True)
        for run_id in runs:
            for start, end in keys.run_ranges(run_id):
                self._db.compact_range(start, end)
        self._db.compact_range(keys.DEAD_LETTERS, keys.DEAD_LETTERS[:-1] + b";")

    def restore(self, runs: Iterable[RestoredRun], next_offset: int = 0) -> int:
        """Write runs restored from checkpoints into this (new) store in one WriteBatch, and
        set the position to ``next_offset``. Each run is written exactly as a live patch
        writes it (same encoder), and remembered as restored up to its covered offset.
        Recovery writes a partition's runs in chunks at position 0, then the position: a
        store a crash left half restored replays from the start, skipping by key what its
        restored runs cover. Returns the number of runs written."""
        batch = PendingBatch(next_offset=next_offset)
        n = 0
        for run in runs:
            batch.add_changes(run.run_id, run.changes)
            batch.decisions.extend(run.decisions)
            batch.restored[run.run_id] = run.covers_offset
            batch.restored_ids[run.run_id] = run.patch_ids
            n += 1
        self.write(batch)
        self._restored_ids.clear()
        return n

    def put_checkpoints(self, checkpoints: dict[tuple[str, int], CheckpointWrite]) -> None:
        """Add checkpoints to the local history (and the outbox) outside a poll batch."""
        self.write(PendingBatch(next_offset=self.next_offset(), checkpoints=checkpoints))

    # -- reading -----------------------------------------------------------------------------

    def next_offset(self) -> int:
        raw = self._get(keys.NEXT_OFFSET)
        return 0 if raw is None else keys.decode_int(raw)

    def header(self, run_id: str) -> RunHeader | None:
        raw = self._get(keys.header_key(run_id))
        return None if raw is None else keys.decode_header(raw)

    def load_doc(self, run_id: str) -> RunDoc | None:
        """The run's working state, or None. Reads only the header now; items are read
        when first touched (see :mod:`runstate.projector.core.working`). Raises
        :class:`StoreError` for another schema version."""
        return self._doc(run_id, self._get(keys.header_key(run_id)))

    def load_docs(self, run_ids: list[str]) -> list[RunDoc | None]:
        """:meth:`load_doc` of each run, in order, with one batched read of their headers
        (RocksDB's MultiGet) and their validation one after the other: a projector's first
        touch of a run is a cold read, and batching a poll's first touches costs less than
        reading and validating each where its patch is decided."""
        raws = self._multi_get([keys.header_key(r) for r in run_ids])
        return [self._doc(r, raw) for r, raw in zip(run_ids, raws)]

    def load_items(self, wanted: list[tuple[str, str, str]]) -> list[Entry | None]:
        """Each ``(run_id, collection, id)``'s stored entry or None, in order, with one
        batched read (RocksDB's MultiGet): what a poll batch's patches read first (see
        ``reducer.READS``), mostly a fresh id that is not there."""
        raws = self._multi_get([keys.item_key(r, kind, id_) for r, kind, id_ in wanted])
        return [None if raw is None else keys.decode_item(w[1], raw) for w, raw in zip(wanted, raws)]

    def _doc(self, run_id: str, raw: bytes | None) -> RunDoc | None:
        if raw is None:
            return None
        try:
            header = keys.decode_working_header(raw)
        except pydantic.ValidationError as e:
            raise self._unreadable_header(run_id, raw, e) from e
        if header.schema_version != CURRENT_SCHEMA_VERSION:
            raise self._other_version(run_id, header.schema_version)

        def load_one(kind: str, id_: str) -> Entry | None:
            value = self._get(keys.item_key(run_id, kind, id_))
            return None if value is None else keys.decode_item(kind, value)

        def load_all(kind: str) -> Iterator[tuple[str, Entry]]:
            prefix = keys.items_prefix(run_id, kind)
            for key, value in self._prefix(prefix):
                yield key[len(prefix) :].decode(), keys.decode_item(kind, value)

        return RunDoc(header, load_one=load_one, load_all=load_all)

    def _other_version(self, run_id: str, version: object) -> StoreError:
        """The error for a run stored in a schema version this runstate does not write."""
        return StoreError(f"run {run_id!r} in {self.path} has schema_version {version}")

    def _unreadable_header(self, run_id: str, raw: bytes, e: Exception) -> StoreError:
        """The error for a stored header that does not decode: another schema version
        (which may lack or add fields), else a damaged record."""
        try:
            version = orjson.loads(raw).get("schema_version")
        except (orjson.JSONDecodeError, AttributeError):
            version = CURRENT_SCHEMA_VERSION
        if version != CURRENT_SCHEMA_VERSION:
            return self._other_version(run_id, version)
        return StoreError(f"the stored header of run {run_id!r} in {self.path} cannot be read: {e}")

    def read_state(self, run_id: str, form: document.Form = "model", *, erased: bool = False) -> Any:
        """The run's state document (:func:`document.join` of its stored header and items)
        in ``form`` (:func:`document.load`: the JSON as stored, parsed, validated, or as the
        state's struct), or None for a run it does not hold: one read of its header and one
        scan over its items; the JSON is not validated again (the projector validated what
        it stored; RocksDB checks each block). Raises :class:`StoreError` for another schema
        version, a header that does not decode, or a document that does not make ``form``;
        :class:`RunErased` for an erased run, unless ``erased`` (then its tombstone: audit)."""
        raw = self._get(keys.header_key(run_id))
        if raw is None:
            return None
        if not erased and _ERASED in raw:  # a header's own status (a value's quotes are escaped): a tombstone
            erasure = keys.decode_header(raw).erasure
            raise RunErased(run_id, None if erasure is None else erasure.model_dump(mode="json"))
        items: dict[bytes, list[bytes]] = {}
        prefix = keys.run_items_prefix(run_id)
        start = len(prefix)
        for key, value in self._scan(prefix):
            kind = key[start : key.index(b"\0", start)]
            values = items.get(kind)
            if values is None:
                items[kind] = [value]
            else:
                values.append(value)
        try:
            doc = document.join(raw, items)
        except (msgspec.DecodeError, orjson.JSONDecodeError, pydantic.ValidationError) as e:
            raise self._unreadable_header(run_id, raw, e) from e
        if not doc.startswith(_CURRENT_VERSION_JSON):
            raise self._unreadable_header(run_id, raw, ValueError(f"schema_version is not {CURRENT_SCHEMA_VERSION}"))
        return document.load(doc, run_id, self.path, form)

    def decision(self, run_id: str, patch_id: str) -> Decision | None:
        off = self._get(keys.dedupe_key(run_id, patch_id))
        return None if off is None else self._decision_at(run_id, off)

    def decision_at(self, run_id: str, offset: int) -> Decision | None:
        """The decision on the run's record at ``offset`` (its history), or None."""
        raw = self._get(keys.history_key(run_id, offset))
        return None if raw is None else keys.decode_decision(raw)

    def decisions(self, wanted: list[tuple[str, str]]) -> list[DecisionStruct | None]:
        """:meth:`decision` of each ``(run_id, patch_id)``, in order, in the core's form (the
        projector's look-up of resends), with one batched read of the idempotency index
        (RocksDB's MultiGet): nearly every patch id is new, and reads that miss cost less
        batched than one at a time."""
        offs = self._multi_get([keys.dedupe_key(r, p) for r, p in wanted])
        out: list[DecisionStruct | None] = []
        for (run_id, _p), off in zip(wanted, offs):
            # An offset found is a resend: rare.
            raw = None if off is None else self._get(keys.history_key(run_id, keys.decode_int(off)))
            out.append(None if raw is None else keys.decode_decision_struct(raw))
        return out

    def _decision_at(self, run_id: str, off: bytes) -> Decision | None:
        """The decision the idempotency index points at (its stored offset), or None."""
        return self.decision_at(run_id, keys.decode_int(off))

    def history(self, run_id: str) -> list[Decision]:
        """Every decided patch of the run, in log order."""
        return [keys.decode_decision(v) for _, v in self._prefix(keys.history_prefix(run_id))]

    def accepted_since(self, run_id: str, after_revision: int) -> list[Decision]:
        """The run's accepted decisions with a revision above ``after_revision``, in log
        order. Reads from the newest backwards and stops at the first accepted decision at
        or below it (accepted revisions grow with the offset), so a rebuild from a recent
        checkpoint decodes its tail, not the run's whole history."""
        return [keys.decode_decision(raw) for raw, _ in self._accepted_from_newest(run_id, after_revision)][::-1]

    def accepted_positions(
        self, run_id: str, after_revision: int, up_to_revision: int | None = None
    ) -> list[tuple[int, int, int]]:
        """``(revision, partition, offset)`` of :meth:`accepted_since`'s decisions (those
        above ``up_to_revision`` left out), in log order, without building the decisions:
        where a rebuild's patches are is all it reads of them (pydantic's validation of
        each decision was 8 % of a full replay)."""
        out = [
            (d["revision"], d["partition"], d["offset"])
            for _, d in self._accepted_from_newest(run_id, after_revision)
            if up_to_revision is None or d["revision"] <= up_to_revision
        ]
        return out[::-1]

    def _accepted_from_newest(self, run_id: str, after_revision: int) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """The run's accepted decisions above ``after_revision``, newest first: each stored
        value and its JSON parsed (the projector wrote it from a validated decision)."""
        prefix = keys.history_prefix(run_id)
        for _, v in self._prefix_reversed(prefix, prefix + b"\xff"):
            d = orjson.loads(v)
            if d["outcome"] == "accepted":
                if d["revision"] <= after_revision:
                    return
                yield v, d

    def first_decision_after(self, run_id: str, offset: int) -> int | None:
        """The log offset of the run's first decision after ``offset``, or None."""
        prefix = keys.history_prefix(run_id)
        for k, _ in self._prefix_from(prefix, keys.history_key(run_id, offset + 1)):
            return int(k[len(prefix) :], 16)
        return None

    def recent_history_json(self, run_id: str, n: int) -> list[bytes]:
        """The run's last ``n`` decisions in log order, as the store holds them (each
        decision's JSON; reads only those)."""
        prefix = keys.history_prefix(run_id)
        out: list[bytes] = []
        if n <= 0:
            return out
        for _, v in self._prefix_reversed(prefix, prefix + b"\xff"):
            out.append(v)
            if len(out) >= n:
                break
        return out[::-1]

    def item_bytes(self, run_id: str, wanted: list[tuple[str, str]]) -> list[bytes | None]:
        """The run's items ``(kind, id)`` as the store holds them (None: not there), in one
        MultiGet."""
        return self._multi_get([keys.item_key(run_id, kind, id_) for kind, id_ in wanted])

    def headers(self) -> Iterator[RunHeader]:
        for _, v in self._prefix(keys.HEADERS):
            yield keys.decode_header(v)

    def headers_json(self, status: str | None = None) -> Iterator[tuple[str, bytes]]:
        """Each run's header in run id order as ``(run_id, JSON)``, the bytes
        ``RunHeader.model_dump_json`` gives: the stored bytes as they are (the projector
        validated what it stored and wrote the model's bytes; RocksDB checks each block),
        not validated again; a header stored before a field existed goes through the model,
        which gives the field its default. ``status``: only the runs of that status. Raises
        :class:`StoreError` for another schema version or a header that is not a JSON object."""
        want = None if status is None else orjson.dumps(status)
        for key, raw in self._prefix(keys.HEADERS):
            run_id = key[len(keys.HEADERS) :].decode()
            got = self._header_json(run_id, raw, want)
            if got is not None:
                yield run_id, got

    def runs_page(
        self,
        status: str | None,
        keep: Callable[[str], bool] | None,
        after: str | None,
        limit: int | None,
        order: RunOrder = "id",
    ) -> tuple[int, list[tuple[str, bytes]]]:
        """How many runs match (``status``, ``keep(run_id)``) and one page of them, at most
        ``limit``, as :meth:`headers_json` gives them. ``order="id"``: by run id, after the
        run id ``after``; ``"recent"``: the run whose last accepted patch is newest first
        (ties by run id), after the cursor ``after`` that :func:`activity_cursor` gives for
        the previous page's last run (ContractError for one it did not give). One pass over
        the headers that holds only the page (serve's ``GET /runs`` on a million runs held
        them all); only the matching headers are read beyond their status."""
        span = None if status is None else status_span(status)
        want = None if status is None else orjson.dumps(status)
        total = 0
        page: list[tuple[str, bytes]] = []
        recent = order == "recent"
        past = None if after is None or not recent else cursor_rank(after)
        ranked: list[tuple[tuple[int, str], bytes]] = []  # a heap of the page so far, worst first
        for key, raw in self._prefix(keys.HEADERS):
            run_id = key[len(keys.HEADERS) :].decode()
            # A header's own status (the quotes of a value are escaped): no decoding to count.
            if span is not None and span not in raw:
                continue
            if keep is not None and not keep(run_id):
                continue
            total += 1
            if recent:
                got = self._header_json(run_id, raw, want)
                if got is None:
                    continue
                rank = (-activity(got), run_id)
                if past is not None and rank <= past:
                    continue
                if limit is None or len(ranked) < limit:
                    heapq.heappush(ranked, _Worst(rank, got))
                elif rank < ranked[0].rank:
                    heapq.heapreplace(ranked, _Worst(rank, got))
            elif (after is None or run_id > after) and (limit is None or len(page) < limit):
                got = self._header_json(run_id, raw, want)
                if got is not None:
                    page.append((run_id, got))
        if recent:
            page = [(w.rank[1], w.doc) for w in sorted(ranked, reverse=True)]
        return total, page

    def _header_json(self, run_id: str, raw: bytes, want: bytes | None) -> bytes | None:
        try:
            spans = document.header_spans(raw)
        except msgspec.DecodeError as e:
            raise self._unreadable_header(run_id, raw, e) from e
        if any(v is msgspec.UNSET for v in msgspec.structs.astuple(spans)):
            try:  # stored before a field existed: the model gives it its default
                header = keys.decode_header(raw)
            except pydantic.ValidationError as e:
                raise self._unreadable_header(run_id, raw, e) from e
            if header.schema_version != CURRENT_SCHEMA_VERSION:
                raise self._other_version(run_id, header.schema_version)
            if want is None or orjson.dumps(header.status) == want:
                return header.model_dump_json().encode()
            return None
        if bytes(spans.schema_version) != _CURRENT_VERSION:
            raise self._unreadable_header(run_id, raw, ValueError(f"schema_version is not {CURRENT_SCHEMA_VERSION}"))
        if want is None or bytes(spans.status) == want:
            return raw
        return None

    def patch_ids(self, run_id: str) -> list[str]:
        """Every patch id decided for the run in this store (not those before a restore)."""
        prefix = keys.dedupe_prefix(run_id)
        return [k[len(prefix) :].decode() for k, _ in self._prefix(prefix)]

    def dead_letters(self) -> list[DeadLetter]:
        return [DeadLetter(**orjson.loads(v)) for _, v in self._prefix(keys.DEAD_LETTERS)]

    def close(self) -> None:
        """Raises :class:`StoreError` when RocksDB cannot close cleanly (after a failed
        write, say); what was written before stays, its WAL is replayed on the next open."""
        self._iter = None  # an iterator holds the database open
        try:
            self._db.close()
        except Exception as e:
            raise write_error(self.path, e) from e

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How a page of runs is ordered: by run id, or the latest activity first.
RunOrder = Literal["id", "recent"]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def activity(header_json: bytes) -> int:
    """When a run last changed: its ``updated_at`` (the last accepted patch's time) in
    microseconds since the epoch, -1 where none is recorded. ``header_json``: a stored
    header's JSON, or a run's summary."""
    raw = document.header_spans(header_json).updated_at
    if raw is msgspec.UNSET or bytes(raw) == b"null":
        return -1
    return (datetime.fromisoformat(orjson.loads(bytes(raw))) - _EPOCH) // _MICROSECOND


def activity_cursor(run_id: str, header_json: bytes) -> str:
    """The ``after`` of the page that follows a page of runs by latest activity ending at
    this run: its activity and its id, ``<microseconds>.<run id>``."""
    return f"{activity(header_json)}.{run_id}"


def activity_rank(run_id: str, header_json: bytes) -> tuple[int, str]:
    """Where a run stands in a listing by latest activity: lower first."""
    return -activity(header_json), run_id


def cursor_rank(after: str) -> tuple[int, str]:
    """The rank (:func:`activity_rank`) of the run a cursor of :func:`activity_cursor`
    names; ContractError for what is not such a cursor."""
    micros, dot, run_id = after.partition(".")
    try:
        if not dot or not run_id:
            raise ValueError(after)
        return -int(micros), run_id
    except ValueError:
        raise ContractError(
            f"after: {after!r} is not a cursor of a page by latest activity "
            "(<microseconds>.<run id>, as the previous page gave it)",
            field="after",
        ) from None


@dataclass(frozen=True, slots=True)
class _Worst:
    """A page entry ordered so that a min-heap keeps the worst-ranked at its top."""

    rank: tuple[int, str]
    doc: bytes = field(compare=False)

    def __lt__(self, other: _Worst) -> bool:
        return self.rank > other.rank
