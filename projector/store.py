"""The projection store: one RocksDB per partition of the events topic.

Key layout (bytes; ``\\0`` separates parts, ids cannot contain control characters)::

    m:format                      store format version
    m:next_offset                 next log offset to apply (8 bytes, big-endian)
    h:<run>                       run header (RunHeader JSON)
    i:<run>\\0<collection>\\0<id>  one collection item: 8-byte insertion seq + item JSON
    l:<run>\\0<offset 16 hex>     decision of the patch at that offset (history, log order)
    d:<run>\\0<patch_id>          offset of the patch's decision (idempotency index)
    x:<offset 16 hex>             a dead-lettered record: reason and detail

Write contract: :meth:`ProjectionStore.write` applies one :class:`PendingBatch` (state
changes, decisions, dead letters and the new ``next_offset``) as one RocksDB WriteBatch, so
a crash leaves either all of a poll batch or none of it, never the state without its
offset. Read-only instances (:func:`open_read_only`) see the DB as of their open,
including the primary's WAL; secondary instances are not used (stale reads, DESIGN.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from projector.doc import Changes, Entry, RunDoc
from schemas.errors import StoreError
from schemas.patch import Decision
from schemas.state import COLLECTIONS, CURRENT_SCHEMA_VERSION, RunHeader

STORE_FORMAT = b"1"
_NEXT = b"m:next_offset"
_FORMAT = b"m:format"


def header_key(run: str) -> bytes:
    return b"h:" + run.encode()



def _i_prefix(run: str) -> bytes:
    return b"i:" + run.encode() + b"\0"


def item_key(run: str, kind: str, id_: str) -> bytes:
    return b"i:" + run.encode() + b"\0" + kind.encode() + b"\0" + id_.encode()



def _l(run: str, offset: int) -> bytes:
    return b"l:" + run.encode() + b"\0" + f"{offset:016x}".encode()


def _d(run: str, patch_id: str) -> bytes:
    return b"d:" + run.encode() + b"\0" + patch_id.encode()


def decision_puts(run: str, patch_id: str, offset: int, decision_json: bytes) -> dict[bytes, bytes]:
    """The keys that record one decision (history + idempotency index)."""
    return {_l(run, offset): decision_json, _d(run, patch_id): offset.to_bytes(8, "big")}


def _entry(kind: str, raw: bytes) -> Entry:
    return int.from_bytes(raw[:8], "big"), COLLECTIONS[kind].model_validate_json(raw[8:])


def _dump(model: object) -> bytes:
    return model.__pydantic_serializer__.to_json(model)  # type: ignore[attr-defined, no-any-return]


@dataclass
class DeadLetter:
    """A record the projector could not turn into a patch."""

    partition: int
    offset: int
    reason: str
    detail: str
    key: str | None
    size: int


@dataclass
class PendingBatch:
    """Everything one poll batch writes to one partition's store."""

    next_offset: int
    headers: dict[str, RunHeader] = field(default_factory=dict)
    puts: dict[bytes, bytes] = field(default_factory=dict)
    deletes: set[bytes] = field(default_factory=set)
    decisions: list[Decision] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    #: runs restored from checkpoints -> the offset their checkpoint covers
    restored: dict[str, int] = field(default_factory=dict)

    def add_changes(self, run_id: str, changes: Changes) -> None:
        self.headers[run_id] = changes.header
        for (kind, id_), (seq, item) in changes.puts.items():
            k = item_key(run_id, kind, id_)
            self.deletes.discard(k)
            self.puts[k] = seq.to_bytes(8, "big") + _dump(item)
        for kind, id_ in changes.deletes:
            k = item_key(run_id, kind, id_)
            self.puts.pop(k, None)
            self.deletes.add(k)


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    return opts


class ProjectionStore:
    """One partition's projection. Read-write instances are exclusive (RocksDB's lock)."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        try:
            if read_only:
                if not (self.path / "CURRENT").exists():
                    raise StoreError(f"no projection store at {self.path}")
                self._db = Rdict(str(self.path), Options(raw_mode=True), access_type=AccessType.read_only())
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self._db = Rdict(str(self.path), _options())
        except StoreError:
            raise
        except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
            if "lock" in str(e).lower():
                raise StoreError(f"projection store {self.path} is in use by another process: {e}") from e
            raise StoreError(f"cannot open projection store {self.path}: {e}") from e
        fmt = self._db.get(_FORMAT)
        if fmt is None and not read_only:
            self._db[_FORMAT] = STORE_FORMAT
        elif fmt is not None and fmt != STORE_FORMAT:
            raise StoreError(
                f"projection store {self.path} has format {fmt.decode()!r}, this runstate writes "
                f"{STORE_FORMAT.decode()!r}: rebuild it from the log (runstate verify --rebuild)"
            )
        self._wopts = WriteOptions()

    # -- writing -----------------------------------------------------------------------------

    def write(self, batch: PendingBatch) -> None:
        """Apply ``batch`` atomically (state changes, decisions, dead letters, offset)."""
        wb = WriteBatch(raw_mode=True)
        for run_id, header in batch.headers.items():
            wb.put(header_key(run_id), _dump(header))
        for k in batch.deletes:
            wb.delete(k)
        for k, v in batch.puts.items():
            wb.put(k, v)
        for dec in batch.decisions:
            wb.put(_l(dec.run_id, dec.offset), _dump(dec))
            wb.put(_d(dec.run_id, dec.patch_id), dec.offset.to_bytes(8, "big"))
        for dl in batch.dead:
            wb.put(b"x:" + f"{dl.offset:016x}".encode(), orjson.dumps(dl.__dict__))
        for run_id, covers in batch.restored.items():
            wb.put(b"k:" + run_id.encode(), covers.to_bytes(8, "big"))
        wb.put(_NEXT, batch.next_offset.to_bytes(8, "big"))
        try:
            self._db.write(wb, self._wopts)
        except Exception as e:
            raise StoreError(f"write to {self.path} failed: {e}") from e

    # -- reading -----------------------------------------------------------------------------

    def next_offset(self) -> int:
        raw = self._db.get(_NEXT)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def header(self, run_id: str) -> RunHeader | None:
        raw = self._db.get(header_key(run_id))
        return None if raw is None else RunHeader.model_validate_json(raw)

    def load_doc(self, run_id: str) -> RunDoc | None:
        """The run's working state, or None. Reads only the header now; items are read
        when first touched (see :mod:`projector.doc`)."""
        header = self.header(run_id)
        if header is None:
            return None
        if header.schema_version != CURRENT_SCHEMA_VERSION:
            raise StoreError(f"run {run_id!r} in {self.path} has schema_version {header.schema_version}")

        def load_one(kind: str, id_: str) -> Entry | None:
            raw = self._db.get(item_key(run_id, kind, id_))
            return None if raw is None else _entry(kind, raw)

        def load_all(kind: str) -> Iterator[tuple[str, Entry]]:
            prefix = _i_prefix(run_id) + kind.encode() + b"\0"
            for key, value in self._prefix(prefix):
                yield key[len(prefix):].decode(), _entry(kind, value)

        return RunDoc(header, load_one=load_one, load_all=load_all)

    def decision(self, run_id: str, patch_id: str) -> Decision | None:
        off = self._db.get(_d(run_id, patch_id))
        if off is None:
            return None
        raw = self._db.get(_l(run_id, int.from_bytes(off, "big")))
        return None if raw is None else Decision.model_validate_json(raw)

    def history(self, run_id: str) -> list[Decision]:
        """Every decided patch of the run, in log order."""
        prefix = b"l:" + run_id.encode() + b"\0"
        return [Decision.model_validate_json(v) for _, v in self._prefix(prefix)]

    def headers(self) -> Iterator[RunHeader]:
        for _, v in self._prefix(b"h:"):
            yield RunHeader.model_validate_json(v)

    def restored(self) -> dict[str, int]:
        """Runs restored from checkpoints -> the last offset their checkpoint covered. Their
        decisions before that offset are not in this store (only the checkpoint's recent ones)."""
        return {k[2:].decode(): int.from_bytes(v, "big") for k, v in self._prefix(b"k:")}

    def recent_history(self, run_id: str, n: int) -> list[Decision]:
        """The run's last ``n`` decisions in log order (reads only those)."""
        it = self._db.iter()
        prefix = b"l:" + run_id.encode() + b"\0"
        it.seek_for_prev(prefix + b"\xff")
        out = []
        while it.valid() and len(out) < n:
            k = it.key()
            if not k.startswith(prefix):
                break
            out.append(Decision.model_validate_json(it.value()))
            it.prev()
        return out[::-1]

    def put_raw(self, items: dict[bytes, bytes]) -> None:
        """Write extra keys owned by an extension (the snapshotter's checkpoint history)."""
        wb = WriteBatch(raw_mode=True)
        for k, v in items.items():
            wb.put(k, v)
        self._db.write(wb, self._wopts)

    def scan_raw(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._prefix(prefix)

    def dead_letters(self) -> list[DeadLetter]:
        return [DeadLetter(**orjson.loads(v)) for _, v in self._prefix(b"x:")]

    def _prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            yield k, it.value()
            it.next()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
