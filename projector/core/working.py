"""The working form of a run: a header plus keyed collections, and a copy-on-write draft.

A :class:`RunDoc` is what the projector keeps in memory per run and what the store
persists as one header record plus one record per collection item. Items load lazily:
a doc read from the store starts with its header only and fetches an item the first time
an event touches it, so the cost of an event depends on what it touches, never on how
large the run is (a whole collection is read only by rare events such as a goal change,
and by queries). The header counts each collection's items (``sizes``), so a lookup in an
empty collection reads nothing: most of a run's collections are empty, and such a read
was a point read that missed. Deleted items stay in memory as tombstones (``None``) so that a
lookup can never resurrect from the store an item deleted by a batch not yet written.

The header is held as the msgspec struct generated from :class:`RunHeader`
(:mod:`runstate.schemas.structs`), not as the pydantic model: it is read from the store at
a run's first touch, copied with each accepted patch and written back, and the struct does
each several times faster with the same values and the same stored bytes. So are the
items (each the struct of its collection's model): the core builds one or two per
accepted patch, writes each as JSON and keeps it, and a struct does each in a third of a
model's time, is not tracked by the garbage collector, and writes the bytes
``model_dump_json`` writes. What queries and checkpoints see are the models
(:meth:`RunDoc.to_state`, :meth:`RunDoc.sorted_items`) and plain data
(:meth:`RunDoc.to_state_data`).

A :class:`Draft` overlays a doc for the duration of one patch: events read and write the
draft, a rejected patch throws it away, an accepted one commits it and reports exactly
the keys it touched (:class:`Changes`), which is what the store writes.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
import orjson

from runstate.schemas import structs
from runstate.schemas.events import GoalSpec, Model

# The working header is the msgspec struct generated from RunHeader
# (schemas/generated/structs.py), and so are the values in it; the type checker sees them as
# they are.
from runstate.schemas.generated.structs import RunHeader as Header
from runstate.schemas.state import COLLECTIONS, ITEM_KEY, RunHeader, RunState
from runstate.schemas.structs import updated

Key = tuple[str, str]  # (collection, item id)
#: Header fields the public document does not have (working bookkeeping, derived from it).
_HEADER_ONLY = frozenset({"goal", "next_seq", "running_task_ids", "sizes"})
#: An item of a run's collections in its working form: the generated struct of the
#: collection's model (schemas/generated/structs.py).
Item = msgspec.Struct
Entry = tuple[int, Item]  # (insertion sequence, item)
#: ``load_one(kind, id)`` -> entry or None; ``load_all(kind)`` -> every stored (id, entry).
LoadOne = Callable[[str, str], Entry | None]
LoadAll = Callable[[str], Iterable[tuple[str, Entry]]]


def resized(sizes: dict[str, int], kind: str, delta: int) -> dict[str, int]:
    """``sizes`` with ``kind``'s count moved by ``delta``: a new dict, in the order of
    COLLECTIONS, without the empty ones (one form, whichever path wrote the header)."""
    n = sizes.get(kind, 0) + delta
    new = dict(sizes)
    new[kind] = n
    if n and len(new) == len(sizes):
        return new  # a count that moved: the same keys in the same order (most calls)
    return {k: new[k] for k in COLLECTIONS if new.get(k)}


def _seq(entry: tuple[Any, Any]) -> Any:
    """The insertion sequence of an entry."""
    return entry[0]


#: RunState's fields in order: an assembled document's keys follow it, so that the document
#: is what the validated model dumps, key for key.
STATE_FIELDS = tuple(RunState.model_fields)
_state_values = operator.itemgetter(*STATE_FIELDS)


def assembled(header: dict[str, Any], lists: dict[str, list[Any]]) -> dict[str, Any]:
    """The public document from a header as plain JSON data and each collection's items as
    plain data in insertion order (an empty collection may be left out), in the order of
    RunState's fields. Takes ``header`` over (it is changed)."""
    goal = header["goal"]
    goal["constraints"] = lists.get("constraints", [])
    for name in _LIST_FIELDS:
        header[name] = lists.get(name, [])
    try:
        return dict(zip(STATE_FIELDS, _state_values(header)))
    except KeyError:
        # A header stored before a field existed (its default is the validated model's):
        # the one slow path, through the model.
        return RunState.model_validate({k: header[k] for k in STATE_FIELDS if k in header}).model_dump(mode="json")


#: The collections that are fields of RunState itself (constraints are the goal's).
_LIST_FIELDS = tuple(k for k in COLLECTIONS if k != "constraints")


class RunDoc:
    """One run's current state in working form. Owned by a single writer."""

    __slots__ = ("header", "items", "_load_one", "_load_all", "_complete", "_data")

    def __init__(
        self,
        header: Header,
        items: dict[str, dict[str, Entry | None]] | None = None,
        load_one: LoadOne | None = None,
        load_all: LoadAll | None = None,
    ) -> None:
        self.header = header
        # A bucket per collection as it is first touched: most runs touch one or two of
        # the ten, and a projector's first touch of a run builds a doc (ten empty dicts
        # each time were a visible part of a first touch).
        self.items: dict[str, dict[str, Entry | None]] = items if items is not None else defaultdict(dict)
        self._load_one = load_one
        self._load_all = load_all
        self._complete: set[str] = set(COLLECTIONS) if load_one is None else set()
        #: For a doc made by :meth:`from_state_data`: per collection, each item's entry as
        #: the plain data it came as (what :meth:`to_state_data` gives back untouched).
        self._data: dict[str, dict[str, tuple[int, dict[str, Any]]]] | None = None

    def entry(self, kind: str, id_: str) -> Entry | None:
        """The item's entry, loading it on first use; None if absent or deleted."""
        bucket = self.items[kind]
        if id_ in bucket:
            return bucket[id_]
        if kind in self._complete or self._load_one is None or self._counted_empty(kind):
            return None  # counted empty: nothing to read (and nothing to cache)
        e = self._load_one(kind, id_)
        bucket[id_] = e  # caches absence too
        return e

    def cached_items(self) -> int:
        """How many item entries (tombstones included) the doc holds in memory."""
        return sum(len(bucket) for bucket in self.items.values())

    def unread(self, kind: str, id_: str) -> bool:
        """Whether :meth:`entry` of the item would read the store now."""
        return (
            id_ not in self.items[kind]
            and kind not in self._complete
            and self._load_one is not None
            and not self._counted_empty(kind)
        )

    def read_ahead(self, kind: str, id_: str, e: Entry | None) -> None:
        """Keep the item's stored entry (None: absent), read ahead of :meth:`entry`; only
        while it is :meth:`unread` (what is in memory is newer than the store)."""
        self.items[kind].setdefault(id_, e)

    def _counted_empty(self, kind: str) -> bool:
        """The header counts the collection's items and there are none (a header without
        counts, from an older runstate, says nothing: then the store is read)."""
        sizes = self.header.sizes
        return sizes is not None and kind not in sizes

    def entries(self, kind: str) -> dict[str, Entry | None]:
        """The whole collection (loaded once, then kept); deleted items are ``None``."""
        bucket = self.items[kind]
        if kind not in self._complete:
            if self._load_all is not None and not self._counted_empty(kind):
                for id_, e in self._load_all(kind):
                    bucket.setdefault(id_, e)  # what is in memory is newer than the store
            self._complete.add(kind)
        return bucket

    def sorted_items(self, kind: str) -> list[Model]:
        """The collection's items in insertion order, as the contract's models."""
        bucket = self.entries(kind)
        if not bucket:
            return []
        live = [e for e in bucket.values() if e is not None]
        live.sort(key=_seq)
        memo: dict[int, Any] = {}
        return [structs.to_model(item, memo) for _, item in live]

    def _collection(self, kind: str) -> tuple[list[Entry], list[tuple[int, dict[str, Any]]]]:
        """A collection's live items, unordered: the entries in memory, and, of a
        :meth:`from_state_data` doc, those nothing touched as the data they came as."""
        data = self._data
        if data is None or kind in self._complete:
            return [e for e in self.entries(kind).values() if e is not None], []
        bucket = self.items[kind]
        return [e for e in bucket.values() if e is not None], [e for id_, e in data[kind].items() if id_ not in bucket]

    def to_state(self) -> RunState:
        """Assemble the public document (lists in insertion order)."""
        # The header's fields as plain values (its datetimes kept), validated with the items:
        # those in memory as their models (made from the structs, not validated again:
        # pydantic does not re-validate instances) and, of a from_state_data doc, those
        # nothing touched as the data they came as (validated here, once, in one call: each
        # read into a struct first and made into a model again cost twice that).
        header = _header_data(self.header)
        data = {name: header[name] for name in _HEADER_FIELDS if name not in _HEADER_ONLY}
        # One memo for the whole state: the items' shared parts (the writer of each, the
        # provenance of a patch's items) become shared models, made once.
        memo: dict[int, Any] = {}
        lists: dict[str, list[Any]] = {}
        for kind in COLLECTIONS:
            entries, untouched = self._collection(kind)
            live: list[tuple[int, Any]] = [(seq, structs.to_model(item, memo)) for seq, item in entries]
            live += untouched
            live.sort(key=_seq)
            lists[kind] = [item for _, item in live]
        data["goal"] = {**header["goal"], "constraints": lists["constraints"]}
        for kind in _LIST_FIELDS:
            data[kind] = lists[kind]
        return RunState.model_validate(data)

    def to_state_data(self) -> dict[str, Any]:
        """:meth:`to_state` as plain JSON data, equal to its ``model_dump(mode="json")``
        without building the state: the header as stored, each item in memory dumped,
        and the items of a :meth:`from_state_data` doc that nothing touched as they came."""
        lists: dict[str, list[Any]] = {}
        for kind in COLLECTIONS:
            models, untouched = self._collection(kind)
            live: list[tuple[int, Any]] = list(untouched)
            if models:
                # The structs as plain data: what the equal models' model_dump(mode="json")
                # gives (a float stays a float there too; tests/projector/test_properties.py holds it).
                dumped = msgspec.to_builtins([item for _, item in models])
                live += zip([seq for seq, _ in models], dumped)
            if live:
                live.sort(key=_seq)
                lists[kind] = [item for _, item in live]
        return assembled(orjson.loads(encode_header_json(self.header)), lists)

    def as_changes(self) -> Changes:
        """Everything of the run as one change set (to write a restored run)."""
        puts: dict[Key, Entry] = {}
        for kind in COLLECTIONS:
            for id_, e in self.entries(kind).items():
                if e is not None:
                    puts[(kind, id_)] = e
        return Changes(self.header, puts, set())

    @classmethod
    def from_state(cls, state: RunState) -> RunDoc:
        """The working form of an assembled state (checkpoints, migrated documents)."""
        seq = 0
        items: dict[str, dict[str, Entry | None]] = {k: {} for k in COLLECTIONS}
        sources: dict[str, list[Model]] = {k: getattr(state, k) for k in COLLECTIONS if k != "constraints"}
        sources["constraints"] = list(state.goal.constraints)
        for kind in COLLECTIONS:
            for model in sources[kind]:
                item: Item = structs.from_model(model)
                items[kind][item_id(kind, item)] = (seq, item)
                seq += 1
        header_data = state.model_dump(include=set(_HEADER_FIELDS) - _HEADER_ONLY)
        header = header_from_model(
            RunHeader.model_validate(
                {
                    **header_data,
                    "goal": GoalSpec(
                        statement=state.goal.statement, scope=state.goal.scope, acceptance=state.goal.acceptance
                    ),
                    "next_seq": seq,
                    "running_task_ids": sorted(t.id for t in state.tasks if t.status == "running"),
                    "sizes": {k: len(items[k]) for k in COLLECTIONS if items[k]},
                }
            )
        )
        return cls(header, items)

    @classmethod
    def from_state_data(cls, data: dict[str, Any]) -> RunDoc:
        """The working form of a state given as plain JSON data, as a checkpoint holds it
        (``RunState.model_dump(mode="json")``; see ``checkpoint.state_data_of``): the header
        decoded and validated as a stored one is, the items kept as data and validated one
        at a time as events touch them. A replay from a checkpoint then costs what its
        events touch, not the size of the run; :meth:`to_state_data` gives back the items
        nothing touched as they came. Raises ``pydantic.ValidationError`` for a header (or,
        when touched, an item) that is not the contract's."""
        goal = data["goal"]
        seq = 0
        items: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {}
        for kind in COLLECTIONS:
            key = ITEM_KEY.get(kind, "id")
            bucket = items[kind] = {}
            for item in goal["constraints"] if kind == "constraints" else data[kind]:
                bucket[item[key]] = (seq, item)
                seq += 1
        header = {name: data[name] for name in _HEADER_FIELDS if name not in _HEADER_ONLY}
        header["goal"] = {"statement": goal["statement"], "scope": goal["scope"], "acceptance": goal["acceptance"]}
        header["next_seq"] = seq
        header["running_task_ids"] = sorted(t["id"] for t in data["tasks"] if t["status"] == "running")
        header["sizes"] = {k: len(items[k]) for k in COLLECTIONS if items[k]}

        def load_one(kind: str, id_: str) -> Entry | None:
            e = items[kind].get(id_)
            return None if e is None else (e[0], structs.from_model(COLLECTIONS[kind].model_validate(e[1])))

        def load_all(kind: str) -> Iterator[tuple[str, Entry]]:
            model = COLLECTIONS[kind]
            for id_, (n, item) in items[kind].items():
                yield id_, (n, structs.from_model(model.model_validate(item)))

        doc = cls(decode_header_json(orjson.dumps(header)), load_one=load_one, load_all=load_all)
        doc._data = items
        return doc


_HEADER_FIELDS = tuple(RunHeader.model_fields)
#: A working header's JSON, as the store holds it: decoded and validated as ``RunHeader``
#: would validate it, written as its ``model_dump_json`` (``keys.decode_working_header`` and
#: ``keys.encode_header`` are these).
decode_header_json = structs.decoder(RunHeader)
encode_header_json = structs.encoder(RunHeader)


def header_from_model(header: RunHeader) -> Header:
    """The working header of a validated :class:`RunHeader`."""
    return structs.from_model(header)  # type: ignore[no-any-return]


def _header_data(header: Header) -> dict[str, Any]:
    """A working header as plain data, its datetimes kept as they are."""
    return msgspec.to_builtins(header, builtin_types=(datetime,))  # type: ignore[no-any-return]


def item_id(kind: str, item: Item) -> str:
    """The key of an item within its collection."""
    return getattr(item, ITEM_KEY.get(kind, "id"))  # type: ignore[no-any-return]


@dataclass(slots=True)
class Changes:
    """What an accepted patch changed: the new header, items written, items deleted."""

    header: Header
    puts: dict[Key, Entry] = field(default_factory=dict)
    deletes: set[Key] = field(default_factory=set)
    #: the run was erased: everything stored of it goes, but this header
    wipe: bool = False


class Draft:
    """A copy-on-write view of a run for one patch. The base doc is not touched until
    :meth:`commit`. Header changes accumulate (:meth:`hset`) and are applied in one copy."""

    __slots__ = ("base", "_header", "_hset", "_puts", "_dels")

    def __init__(self, base: RunDoc | None, header: Header | None) -> None:
        self.base = base
        self._header = header
        self._hset: dict[str, Any] = {}
        self._puts: dict[Key, Entry] = {}
        self._dels: set[Key] = set()

    # -- header ------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._header is not None

    def hget(self, name: str) -> Any:
        """A header field as the draft has it now."""
        if name in self._hset:
            return self._hset[name]
        return getattr(self._header, name)

    def hset(self, **changes: Any) -> None:
        self._hset.update(changes)

    @property
    def header(self) -> Header:
        """The header with every change so far applied (one copy, only when changed)."""
        if self._hset:
            assert self._header is not None
            self._header = updated(self._header, self._hset)
            self._hset = {}
        assert self._header is not None
        return self._header

    @header.setter
    def header(self, value: Header) -> None:
        self._header = value
        self._hset = {}

    # -- items -------------------------------------------------------------------------------

    def _base_entry(self, kind: str, id_: str) -> Entry | None:
        return None if self.base is None else self.base.entry(kind, id_)

    def get(self, kind: str, id_: str) -> Item | None:
        k = (kind, id_)
        if k in self._puts:
            return self._puts[k][1]
        if k in self._dels:
            return None
        e = self._base_entry(kind, id_)
        return None if e is None else e[1]

    def put(self, kind: str, id_: str, item: Item) -> None:
        k = (kind, id_)
        if k in self._puts:
            seq = self._puts[k][0]
        else:
            e = None if k in self._dels else self._base_entry(kind, id_)
            if e is not None:
                seq = e[0]
            else:  # a new item
                seq = self.hget("next_seq")
                self.hset(next_seq=seq + 1)
                self._count(kind, 1)
        self._dels.discard(k)
        self._puts[k] = (seq, item)

    def delete(self, kind: str, id_: str) -> None:
        k = (kind, id_)
        put = self._puts.pop(k, None)
        if k in self._dels:
            return  # deleted already
        if self._base_entry(kind, id_) is not None:
            self._dels.add(k)
            self._count(kind, -1)
        elif put is not None:  # new in this draft: gone again
            self._count(kind, -1)

    def _count(self, kind: str, delta: int) -> None:
        sizes = self.hget("sizes")
        if sizes is not None:  # None: a header from before sizes were counted stays uncounted
            self.hset(sizes=resized(sizes, kind, delta))

    def values(self, kind: str) -> Iterator[Item]:
        """Current items of a collection in insertion order (reads the whole collection:
        for rare events only, such as a goal change)."""
        entries: dict[str, Entry | None] = {}
        if self.base is not None:
            entries.update(self.base.entries(kind))
        for (k, id_), e in self._puts.items():
            if k == kind:
                entries[id_] = e
        for k, id_ in self._dels:
            if k == kind:
                entries.pop(id_, None)
        live = [e for e in entries.values() if e is not None]
        return (item for _, item in sorted(live, key=lambda e: e[0]))

    def commit(self) -> tuple[RunDoc, Changes]:
        """Apply the draft to its base (or a new doc) and return it with the changes."""
        header = self.header
        doc = self.base if self.base is not None else RunDoc(header)
        doc.header = header
        for kind, id_ in self._dels:
            doc.items[kind][id_] = None  # tombstone: see the module docstring
        for (kind, id_), e in self._puts.items():
            doc.items[kind][id_] = e
        return doc, Changes(header, self._puts, self._dels)
