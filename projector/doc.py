"""The working form of a run: a header plus keyed collections, and a copy-on-write draft.

A :class:`RunDoc` is what the projector keeps in memory per run and what the store
persists as one header record plus one record per collection item. A :class:`Draft`
overlays a doc for the duration of one patch: events read and write the draft, a rejected
patch throws it away, an accepted one commits it and reports exactly the keys it touched
(:class:`Changes`), which is what the store writes. Cost per event therefore depends on
what the event touches, not on how large the run is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from schemas.events import GoalSpec, Model
from schemas.state import COLLECTIONS, Goal, RunHeader, RunState

Key = tuple[str, str]  # (collection, item id)
Entry = tuple[int, Model]  # (insertion sequence, item)


class RunDoc:
    """One run's current state in working form. Owned by a single writer."""

    __slots__ = ("header", "items")

    def __init__(self, header: RunHeader, items: dict[str, dict[str, Entry]] | None = None) -> None:
        self.header = header
        self.items: dict[str, dict[str, Entry]] = items if items is not None else {k: {} for k in COLLECTIONS}

    def sorted_items(self, kind: str) -> list[Model]:
        return [item for _, item in sorted(self.items[kind].values(), key=lambda e: e[0])]

    def to_state(self) -> RunState:
        """Assemble the public document (lists in insertion order)."""
        h = self.header
        goal = Goal(
            statement=h.goal.statement,
            scope=h.goal.scope,
            acceptance=h.goal.acceptance,
            constraints=self.sorted_items("constraints"),  # type: ignore[arg-type]
        )
        data = {name: getattr(h, name) for name in RunHeader.model_fields if name not in ("goal", "next_seq")}
        data["goal"] = goal
        for kind in COLLECTIONS:
            if kind != "constraints":
                data[kind] = self.sorted_items(kind)
        return RunState.model_construct(**data)  # fields are already validated models

    @classmethod
    def from_state(cls, state: RunState) -> RunDoc:
        """The working form of an assembled state (checkpoints, migrated documents)."""
        seq = 0
        items: dict[str, dict[str, Entry]] = {k: {} for k in COLLECTIONS}
        sources: dict[str, list[Model]] = {k: getattr(state, k) for k in COLLECTIONS if k != "constraints"}
        sources["constraints"] = list(state.goal.constraints)
        for kind in COLLECTIONS:
            for item in sources[kind]:
                items[kind][item_id(kind, item)] = (seq, item)
                seq += 1
        header_data = state.model_dump(include=set(RunHeader.model_fields) - {"goal", "next_seq"})
        header = RunHeader.model_validate(
            {**header_data, "goal": GoalSpec(statement=state.goal.statement, scope=state.goal.scope,
                                             acceptance=state.goal.acceptance), "next_seq": seq}
        )
        return cls(header, items)


def item_id(kind: str, item: Model) -> str:
    """The key of an item within its collection."""
    if kind == "constraints":
        return item.key  # type: ignore[attr-defined, no-any-return]
    if kind == "environment_observations":
        return item.subject  # type: ignore[attr-defined, no-any-return]
    if kind == "pending_tool_calls":
        return item.call_id  # type: ignore[attr-defined, no-any-return]
    return item.id  # type: ignore[attr-defined, no-any-return]


@dataclass(slots=True)
class Changes:
    """What an accepted patch changed: the new header, items written, items deleted."""

    header: RunHeader
    puts: dict[Key, Entry] = field(default_factory=dict)
    deletes: set[Key] = field(default_factory=set)


class Draft:
    """A copy-on-write view of a run for one patch. The base doc is not touched until
    :meth:`commit`."""

    __slots__ = ("base", "header", "_puts", "_dels")

    def __init__(self, base: RunDoc | None, header: RunHeader | None) -> None:
        self.base = base
        self.header: RunHeader = header  # type: ignore[assignment]  # None only until RunStarted
        self._puts: dict[Key, Entry] = {}
        self._dels: set[Key] = set()

    def get(self, kind: str, id_: str) -> Model | None:
        k = (kind, id_)
        if k in self._puts:
            return self._puts[k][1]
        if k in self._dels or self.base is None:
            return None
        e = self.base.items[kind].get(id_)
        return None if e is None else e[1]

    def put(self, kind: str, id_: str, item: Model) -> None:
        k = (kind, id_)
        if k in self._puts:
            seq = self._puts[k][0]
        elif k not in self._dels and self.base is not None and id_ in self.base.items[kind]:
            seq = self.base.items[kind][id_][0]
        else:
            seq = self.header.next_seq
            self.header = self.header.model_copy(update={"next_seq": seq + 1})
        self._dels.discard(k)
        self._puts[k] = (seq, item)

    def delete(self, kind: str, id_: str) -> None:
        k = (kind, id_)
        self._puts.pop(k, None)
        if self.base is not None and id_ in self.base.items[kind]:
            self._dels.add(k)

    def values(self, kind: str) -> Iterator[Model]:
        """Current items of a collection in insertion order (reads the whole collection:
        for rare events only, such as a goal change)."""
        entries: dict[str, Entry] = {}
        if self.base is not None:
            entries.update(self.base.items[kind])
        for (k, id_), e in self._puts.items():
            if k == kind:
                entries[id_] = e
        for k, id_ in self._dels:
            if k == kind:
                entries.pop(id_, None)
        return (item for _, item in sorted(entries.values(), key=lambda e: e[0]))

    def commit(self) -> tuple[RunDoc, Changes]:
        """Apply the draft to its base (or a new doc) and return it with the changes."""
        doc = self.base if self.base is not None else RunDoc(self.header)
        doc.header = self.header
        for kind, id_ in self._dels:
            doc.items[kind].pop(id_, None)
        for (kind, id_), e in self._puts.items():
            doc.items[kind][id_] = e
        return doc, Changes(self.header, self._puts, self._dels)
