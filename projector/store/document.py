"""The stored state document: how a run's stored records (its header, its items) become the
one JSON document a query reads, the bytes ``RunState.model_dump_json`` gives, and the forms
a reader may ask for. The keys and value encodings the records are stored under are
:mod:`runstate.projector.store.keys`; this module owns what they join into."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec
import orjson
import pydantic

from runstate.projector.core.working import STATE_FIELDS, assembled
from runstate.schemas import structs
from runstate.schemas.errors import StoreError
from runstate.schemas.state import COLLECTIONS, RunHeader, RunState

#: What a reader asks for: the document as stored (``json``), parsed (``data``: equal to
#: ``RunState.model_dump(mode="json")``), validated (``model``: the RunState), or decoded into
#: the state's msgspec struct (``struct``: the same checks, no pydantic model built).
Form = Literal["json", "data", "model", "struct"]


def load(doc: bytes, run_id: str, where: object = None, form: Form = "model") -> Any:
    """A run's state document in ``form``. Raises :class:`StoreError` naming the run (and
    ``where`` it was stored) when the document is not JSON (``data``) or does not validate
    (``model``, ``struct``)."""
    try:
        if form == "json":
            return doc
        if form == "data":
            return orjson.loads(doc)
        if form == "model":
            # Validated once, as a whole, from the JSON: validating the header and each
            # item first, then assembling them, cost more.
            return RunState.model_validate_json(doc)
        return _state_decoder(doc)
    except (orjson.JSONDecodeError, pydantic.ValidationError) as e:
        raise unreadable(run_id, where, e) from e


_state_decoder = structs.decoder(RunState)


def unreadable(run_id: str, where: object, e: Exception) -> StoreError:
    """The error for a run whose stored records do not make a state document."""
    at = "" if where is None else f" in {where}"
    return StoreError(f"the stored state of run {run_id!r}{at} cannot be read: {e}")


def join(header: bytes, items: Mapping[bytes, list[bytes]]) -> bytes:
    """The public document as JSON from a run's stored records: its header's stored JSON,
    and per collection (its name as bytes) its stored item values as they are (8-byte
    big-endian insertion sequence, then the item's JSON; a collection with no items may be
    left out). Its keys are in the order of RunState's fields, those of its goal too: for a
    document this runstate stored, parsed it equals the state's ``model_dump(mode="json")``
    key for key, and validated it equals the state (a property test holds both, against
    :meth:`RunDoc.to_state` of the same patches folded in memory). Spliced from the
    header's top-level values as they are stored and the items' JSON, not parsed and
    dumped again: a query parses it once, or validates it once. Sorts the lists in
    ``items``. Raises ``msgspec.DecodeError`` for a header that is not a JSON object (and,
    on the slow path of a header that lacks fields, ``orjson.JSONDecodeError`` or
    ``pydantic.ValidationError``)."""
    lists: dict[bytes, bytes] = {}
    for kind, values in items.items():
        if len(values) > 1:
            values.sort()  # by the big-endian sequence first: the order items were added
        lists[kind] = b"[" + b",".join([v[8:] for v in values]) + b"]"
    spans = header_spans(header)
    try:
        return _splice(spans, lists)
    except TypeError:
        # A header stored before a field existed lacks its value (UNSET): the slow path,
        # through the model, which gives the field its default.
        parsed = orjson.loads(header)
        return orjson.dumps(assembled(parsed, {k.decode(): orjson.loads(v) for k, v in lists.items()}))


#: The stored header's top-level values as their JSON, unparsed (msgspec.Raw), UNSET for a
#: field it lacks (stored before the field existed).
_HeaderSpans = msgspec.defstruct(
    "_HeaderSpans", [(name, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET) for name in RunHeader.model_fields]
)
#: ``header_spans(raw)``: a stored header's top-level values, each as its stored JSON
#: (``msgspec.Raw``; ``msgspec.UNSET`` for a field the header lacks). Checks only that
#: ``raw`` is one JSON object (else ``msgspec.DecodeError``).
header_spans = msgspec.json.Decoder(_HeaderSpans).decode


def _splicer() -> Callable[[Any, dict[bytes, bytes]], bytes]:
    """``_splice(spans, lists)``: the document's JSON joined in RunState's field order from
    the header's spans and each collection's JSON array (``[]`` where absent), generated
    from the field names; the goal's constraints are spliced into the goal's object, last,
    where :func:`assembled` puts them. Raises TypeError for a span that is UNSET."""
    pieces = []
    for i, name in enumerate(STATE_FIELDS):
        pieces.append(repr(("{" if i == 0 else ",").encode() + orjson.dumps(name) + b":"))
        if name in COLLECTIONS:
            pieces.append(f"lists.get({name.encode()!r}, b'[]')")
        elif name == "goal":
            pieces += ["_view(spans.goal)[:-1]", repr(b',"constraints":'), "lists.get(b'constraints', b'[]')", "b'}'"]
        else:
            pieces.append(f"spans.{name}")
    pieces.append("b'}'")
    src = "def splice(spans, lists):\n    return b''.join((" + ", ".join(pieces) + "))\n"
    ns: dict[str, Any] = {"_view": memoryview}
    exec(compile(src, "<state document splicer>", "exec"), ns)
    return ns["splice"]  # type: ignore[no-any-return]


_splice = _splicer()
