"""The local checkpoint history (in the snapshotter's stores): list, latest, nearest <= N."""

from __future__ import annotations

import base64
import os
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from operator import itemgetter
from typing import Any, TypeVar

import orjson
import pydantic

from runstate.eventlog.partitioner import partition_for
from runstate.projector.store.statedir import Layout
from runstate.projector.store.partition import ProjectionStore, ReadOnlyStores
from runstate.schemas.errors import CheckpointInvalid
from runstate.projector.core.working import Entry, RunDoc, assembled
from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.store import keys
from runstate.schemas.patch import Decision
from runstate.snapshotter import pieces
from runstate.snapshotter.checkpoint import Checkpoint, SigningKey, of_state, state_data_of, validate


#: What a check of a checkpoint record gives.
T = TypeVar("T")
_first = itemgetter(0)
#: ``live(partition)``: the store a snapshotter running in this process keeps for the
#: partition now, or None (the history then opens the store read-only, as another process).
LiveStores = Callable[[int], ProjectionStore | None]


class StateDataCache:
    """Checkpoints' states as plain JSON data, once checked, by run, revision and head
    record; the least recently used dropped past ``max_bytes``. A checkpoint never changes
    once written (a new base at a revision is another head record), and one erased or
    expired is not looked up any more (the history no longer lists it), so an entry is
    never stale. Kept as JSON bytes and parsed on each hit, so that what a caller changes
    in its copy is not the next one's. Thread-safe."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int, bytes], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, bytes]) -> dict[str, Any] | None:
        with self._lock:
            raw = self._entries.get(key)
            if raw is None:
                return None
            self._entries.move_to_end(key)
        return orjson.loads(raw)  # type: ignore[no-any-return]

    def put(self, key: tuple[str, int, bytes], data: dict[str, Any]) -> None:
        raw = orjson.dumps(data)
        if len(raw) > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = raw
            self._bytes += len(raw)
            while self._bytes > self.max_bytes:
                _k, old = self._entries.popitem(last=False)
                self._bytes -= len(old)


class CheckpointHistory:
    """Read-only view of the checkpoints the snapshotter wrote under ``<state_dir>/snapshotter``."""

    def __init__(
        self,
        snapshotter_dir: str | os.PathLike[str],
        key: SigningKey = None,
        live: LiveStores | None = None,
        cache: StateDataCache | None = None,
    ) -> None:
        """``live``: the stores of a snapshotter in this process, read where it has one (no
        open per read, and what it wrote a moment ago: an erasure, say, at once).
        ``cache``: checkpoints' states already checked, shared by the histories a
        long-lived caller opens with one key (else this history's own)."""
        self.layout = Layout(snapshotter_dir)
        self.key = key
        self.live = live
        self.cache = StateDataCache() if cache is None else cache
        self._stores = ReadOnlyStores(self.layout)

    def available(self) -> bool:
        return self.layout.file.exists()

    def _store(self, run_id: str) -> ProjectionStore | None:
        if not self.available():
            return None
        p = partition_for(run_id, self.layout.read()[1])
        if self.live is not None and (st := self.live(p)) is not None:
            return st
        return self._stores.get(p)

    def of(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, oldest first (as they are: not checked)."""
        st = self._store(run_id)
        if st is None:
            return []
        out = []
        for rev, v in st.checkpoints(run_id):
            if not pieces.is_head_record(v):
                out.append(Checkpoint.model_validate_json(v))
            elif v.startswith(pieces.HEAD_MAGIC):
                out.append(self._whole(st, run_id, rev, v, False))
            # a head of format 3 (a development build's, plain JSON) cannot be rebuilt: left out
        return out

    def _whole(self, st: ProjectionStore, run_id: str, revision: int, raw: bytes, key: SigningKey | bool) -> Checkpoint:
        """A checkpoint of pieces as the whole checkpoint it stands for. ``key``: check its
        head's seal with it and its pieces against the head (False: do not check)."""
        head, live = self._live(st, run_id, revision, raw, key)
        state = self._doc(run_id, head, live).to_state()
        recent = [Decision.model_validate_json(d) for _o, _p, _r, d in head.recent]
        ids = b"".join(body for name, body in sorted(live.items()) if pieces.is_ids(name))
        return Checkpoint(
            **of_state(state),
            format_version=pieces.FORMAT_VERSION,
            reducer_version=REDUCER_VERSION,
            run_id=run_id,
            revision=head.revision,
            partition=head.partition,
            covers_offset=head.covers_offset,
            triggers=head.triggers,
            recent_decisions=recent,
            patch_ids=base64.b64encode(ids).decode(),
            digest=head.doc["digest"],
            signature=head.doc.get("signature"),
        )

    def _live(
        self, st: ProjectionStore, run_id: str, revision: int, raw: bytes, key: SigningKey | bool
    ) -> tuple[pieces.Head, dict[str, bytes]]:
        """The head at ``revision`` and the bodies of its pieces, checked against it unless
        ``key`` is False. Raises :class:`CheckpointInvalid`."""
        head = pieces.head_of(pieces.head_document(raw)) if key is False else pieces.load_head(raw, key)  # type: ignore[arg-type]
        live = pieces.live_bodies(((n, v) for n, (_r, v) in st.pieces_at(run_id, revision).items()), head.epoch)
        if key is not False:
            pieces.check_pieces(head, pieces.tally_of(head.epoch, live.items()))
        return head, live

    def _state_data(self, st: ProjectionStore, run_id: str, revision: int, raw: bytes) -> dict[str, Any]:
        """The state of the checkpoint of pieces at ``revision`` as plain JSON data, from
        the store's bytes once their digest matches the head's (no model built: they are
        what the snapshotter's store wrote from validated items, as ``state_data_of``
        trusts a sealed checkpoint). Raises :class:`CheckpointInvalid`."""
        head, live = self._live(st, run_id, revision, raw, self.key)
        try:
            if head.erased is not None:
                return self._doc(run_id, head, live).to_state_data()
            found = [(pieces.item_of(name)[0], body) for name, body in live.items() if pieces.is_item(name)]
            # every item's JSON in one parse: a body is its insertion number, then its JSON
            parsed = orjson.loads(b"[" + b",".join(body[8:] for _k, body in found) + b"]")
            lists: dict[str, list[tuple[bytes, Any]]] = defaultdict(list)
            for (kind, body), item in zip(found, parsed, strict=True):
                lists[kind].append((body[:8], item))  # big-endian: ordered as bytes
            return assembled(
                orjson.loads(pieces.header_of(head, live.get(pieces.HEADER_PIECE))),
                {k: [item for _, item in sorted(v, key=_first)] for k, v in lists.items()},
            )
        except (KeyError, ValueError) as e:
            raise CheckpointInvalid(run_id, f"its pieces cannot be read: {e}") from e

    @staticmethod
    def _doc(run_id: str, head: pieces.Head, live: dict[str, bytes]) -> RunDoc:
        """The run as a checkpoint of pieces (its head and its pieces' bodies) holds it.
        Raises :class:`CheckpointInvalid`."""
        try:
            if head.erased is not None:
                return RunDoc(keys.decode_working_header(head.erased.encode()), defaultdict(dict))
            items: dict[str, dict[str, Entry | None]] = defaultdict(dict)
            for name, value in live.items():
                if pieces.is_item(name):
                    kind, id_ = pieces.item_of(name)
                    items[kind][id_] = keys.decode_item(kind, value)
            return RunDoc(keys.decode_working_header(pieces.header_of(head, live.get(pieces.HEADER_PIECE))), items)
        except (KeyError, ValueError, pydantic.ValidationError) as e:
            raise CheckpointInvalid(run_id, f"its pieces cannot be read: {e}") from e

    def nearest(self, run_id: str, revision: int) -> Checkpoint | None:
        """The newest *valid* checkpoint at or below ``revision`` (see
        :func:`~runstate.snapshotter.checkpoint.validate`; with this history's key), or None."""
        return self._newest_valid(run_id, revision, validate)

    def nearest_state_data(self, run_id: str, revision: int) -> dict[str, Any] | None:
        """The state of :meth:`nearest`'s checkpoint as plain JSON data
        (:func:`~runstate.snapshotter.checkpoint.state_data_of`: the same checks, no models
        built), or None."""
        return self._newest_valid(run_id, revision, state_data_of)

    def _newest_valid(self, run_id: str, revision: int, check: Callable[[bytes, SigningKey], T]) -> T | None:
        """``check(raw, key)`` of the newest checkpoint at or below ``revision`` that it does
        not refuse (:class:`CheckpointInvalid`: the next older one is tried), or None."""
        st = self._store(run_id)
        if st is None:
            return None
        for rev, raw in st.checkpoints_at_or_below(run_id, revision):
            try:
                if pieces.is_head_record(raw):
                    if check is state_data_of:
                        key = (run_id, rev, raw)
                        data = self.cache.get(key)
                        if data is None:
                            data = self._state_data(st, run_id, rev, raw)
                            self.cache.put(key, data)
                        return data  # type: ignore[return-value]
                    return self._whole(st, run_id, rev, raw, self.key)  # type: ignore[return-value]
                return check(raw, self.key)
            except CheckpointInvalid:
                continue
        return None

    def latest(self, run_id: str) -> Checkpoint | None:
        cps = self.of(run_id)
        return cps[-1] if cps else None

    def close(self) -> None:
        self._stores.close()

    def __enter__(self) -> CheckpointHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
