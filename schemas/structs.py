"""msgspec structs generated from the contract's pydantic models: the projector's hot path.

The pydantic models (:mod:`runstate.schemas.events`, :mod:`runstate.schemas.state`) are the
contract and the one source of truth. :func:`struct_of` derives from a model a
``msgspec.Struct`` with the same fields in the same order, the same types, the same
constraints (lengths, patterns, bounds, time zones), the same defaults, frozen and closed
(unknown fields are errors) like the model. Nothing here is written by hand field by field:
a field added to a model is in its struct at the next import, and what this module cannot
carry over exactly (a type or constraint it does not know, a model's own validators or
serializers, aliases, other model settings) raises at import rather than being let through.

Why: the projector reads a run's header from the store at its first touch, copies it with
each accepted patch and writes it back, and msgspec does each of these several times faster
than pydantic (the docs' performance page). The structs are not tracked by the garbage
collector either (they cannot be part of a cycle).

The store's format does not change: :func:`encoder` writes what pydantic's
``model_dump_json`` writes for the same values (byte for byte), and :func:`decoder` accepts
and rejects what the model's ``model_validate_json`` accepts and rejects, with the same
values (``tests/schemas/test_structs.py`` holds both, on documents generated from the models' own
field types). Pydantic stays at the edges: queries, checkpoints, the API.

The items of a run's working state are structs too (the reducer builds a fact and its
provenance per accepted patch, the store writes and reads them): :func:`to_model` makes
the equal models where the contract's types are handed out (``RunDoc.to_state``), and
:func:`json_writer` writes a struct as its model's ``model_dump_json`` does.

The projector also reads each patch from the log as the struct of :class:`Patch`
(``codec.read_patch``): the events union, which pydantic tells apart by ``type``, is
msgspec's tagged union of the event structs, each of which has its tag as an attribute.
Validated so, a patch costs about half what pydantic's validation does.
"""

from __future__ import annotations

import datetime as _dt
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

import annotated_types as at
import msgspec
from pydantic import AwareDatetime, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: A float is read as pydantic reads it, but msgspec and pydantic write some floats
#: differently (``1e16`` against ``1e+16``): :func:`encoder` refuses a model that holds one.
_SCALARS = (str, int, float, bool, type(None))


#: annotated-types constraint -> its attribute, which is also msgspec.Meta's keyword.
_BOUNDS: tuple[tuple[type, str], ...] = (
    (at.Ge, "ge"),
    (at.Le, "le"),
    (at.Gt, "gt"),
    (at.Lt, "lt"),
    (at.MinLen, "min_length"),
    (at.MaxLen, "max_length"),
)


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    """msgspec.Meta's keywords for pydantic's field metadata."""
    kw: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, FieldInfo):  # Annotated[..., Field(...)] nested in a type
            kw.update(_constraints(m.metadata))
            continue
        bound = next((name for cls, name in _BOUNDS if isinstance(m, cls)), None)
        if bound is not None:
            kw[bound] = getattr(m, bound)
        elif getattr(m, "pattern", None) is not None and type(m).__name__ == "_PydanticGeneralMetadata":
            kw["pattern"] = _python_pattern(m.pattern)
        else:
            raise TypeError(f"no msgspec equivalent for the constraint {m!r}")
    return kw


def _meta(metadata: list[Any]) -> msgspec.Meta | None:
    """The msgspec constraints equal to pydantic's field metadata (None: none)."""
    kw = _constraints(metadata)
    return msgspec.Meta(**kw) if kw else None


def _python_pattern(pattern: str) -> str:
    """A pydantic pattern (Rust's regex, searched) as Python's ``re`` (msgspec's) reads it
    the same: Rust's ``$`` is the end of the text, Python's also matches before a newline
    that ends it (``"x\\n"`` would pass ``^[^\\x00-\\x1f]+$``), so a final ``$`` becomes ``\\Z``.
    A ``$`` elsewhere is refused rather than guessed at."""
    anchored = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[:-1] if anchored else pattern
    if re.search(r"(?<!\\)\$", body):
        raise TypeError(f"no msgspec equivalent for the pattern {pattern!r} (a '$' before its end)")
    return body + "\\Z" if anchored else pattern


def _type(tp: Any) -> Any:
    """The msgspec type equal to a pydantic field type."""
    if tp is AwareDatetime:
        return Annotated[_dt.datetime, msgspec.Meta(tz=True)]
    if tp in _SCALARS or tp is _dt.datetime:
        return tp
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return struct_of(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        tag = next((m.discriminator for m in args[1:] if isinstance(m, FieldInfo) and m.discriminator), None)
        if tag is not None:
            return _tagged_union(args[0], tag, list(args[1:]))
        inner = _type(args[0])
        meta = _meta(list(args[1:]))
        return inner if meta is None else Annotated[inner, meta]
    if origin is Union or origin is types.UnionType:
        return Union[tuple(_type(a) for a in args)]
    if origin is Literal:
        return tp
    if origin is list:
        return list[_type(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[_type(args[0]), _type(args[1])]  # type: ignore[misc]
    raise TypeError(f"no msgspec equivalent for the type {tp!r}")


def _default(value: Any) -> Any:
    """A field default as msgspec takes it: a model default becomes a factory of the
    equal struct (a struct default must be immutable; empty lists and dicts are copied by
    msgspec itself)."""
    if isinstance(value, BaseModel):
        return msgspec.field(default_factory=lambda: from_model(value))
    return value


#: The model settings a struct carries over; any other setting (aliases, strictness,
#: whitespace stripping, ...) changes what the model accepts or writes, so it is refused.
_CONFIG = frozenset({"frozen", "extra"})


def _refuse_what_is_not_carried_over(model: type[BaseModel]) -> None:
    """Raise TypeError where the model validates or writes by more than its field types,
    constraints and defaults: its own validators or serializers, computed fields, aliases,
    other settings. A struct would silently skip them."""
    decorators = model.__pydantic_decorators__
    for kind in (
        "validators",
        "field_validators",
        "root_validators",
        "model_validators",
        "field_serializers",
        "model_serializers",
        "computed_fields",
    ):
        if getattr(decorators, kind):
            raise TypeError(f"no msgspec equivalent for {model.__name__}'s {kind.replace('_', ' ')}")
    other = set(model.model_config) - _CONFIG
    if other:
        raise TypeError(f"no msgspec equivalent for {model.__name__}'s settings {sorted(other)}")
    for name, info in model.model_fields.items():
        if info.alias is not None or info.validation_alias is not None or info.serialization_alias is not None:
            raise TypeError(f"no msgspec equivalent for the alias of {model.__name__}.{name}")
        if info.exclude:
            raise TypeError(f"no msgspec equivalent for the excluded field {model.__name__}.{name}")


def _tagged_union(union: Any, tag: Any, metadata: list[Any]) -> Any:
    """A union of models told apart by the field ``tag`` (pydantic's discriminated union)
    as msgspec's tagged union: each model's struct is tagged by the one value its ``tag``
    field allows, and reads that value as a class attribute."""
    if not isinstance(tag, str) or any(not isinstance(m, FieldInfo) or m.metadata for m in metadata):
        raise TypeError(f"no msgspec equivalent for the discriminated union {union!r} ({tag!r})")
    members = typing.get_args(union)
    if not all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
        raise TypeError(f"no msgspec equivalent for the discriminated union {union!r}: a member is no model")
    return Union[tuple(_tagged_struct_of(m, tag) for m in members)]


def _tagged_struct_of(model: type[BaseModel], tag: str) -> type[msgspec.Struct]:
    if _REFERENCE:
        return _reference_tagged(model, tag)
    cls = _generated(model, tag)
    if cls.__struct_config__.tag_field != tag:
        raise TypeError(f"the generated {model.__name__} is not tagged by {tag!r}: regenerate (see GENERATED)")
    return cls


@cache
def _reference_tagged(model: type[BaseModel], tag: str) -> type[msgspec.Struct]:
    info = model.model_fields.get(tag)
    values = (
        typing.get_args(info.annotation) if info is not None and typing.get_origin(info.annotation) is Literal else ()
    )
    if len(values) != 1 or not isinstance(values[0], str) or info is None or info.metadata:
        raise TypeError(f"no msgspec equivalent for {model.__name__}'s tag {tag!r}: not a Literal of one string")
    return _define(model, tag_field=tag, tag=values[0], namespace={tag: values[0]})


def struct_of(model: type[BaseModel]) -> type[msgspec.Struct]:
    """The msgspec struct of a pydantic model: the class generated for it in
    :mod:`runstate.schemas.generated.structs` (one class per model). Raises TypeError for a
    model that has none there (regenerate: see :data:`GENERATED`)."""
    if _REFERENCE:
        return _reference_struct_of(model)
    return _generated(model)


@cache
def _reference_struct_of(model: type[BaseModel]) -> type[msgspec.Struct]:
    """The struct derived from the model now (what the generated module must hold)."""
    cls = _define(model)
    _MODEL_OF[cls] = model
    return cls


def _generated(model: type[BaseModel], tag: str | None = None) -> type[msgspec.Struct]:
    """The generated class of a contract model; a model defined elsewhere (a test's, a
    caller's) is derived now, as the generator would."""
    if not model.__module__.startswith("runstate.schemas."):
        return _reference_struct_of(model) if tag is None else _reference_tagged(model, tag)
    from runstate.schemas.generated import structs as generated

    cls = getattr(generated, model.__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        # Not generated yet (a new model, or the module being written for the first time):
        # derived now, as the generator would; tests/schemas/test_structs.py fails until it is written.
        return _reference_struct_of(model) if tag is None else _reference_tagged(model, tag)
    _MODEL_OF[cls] = model
    return cls


#: struct class -> the model it was made from (by :func:`struct_of`)
_MODEL_OF: dict[type[msgspec.Struct], type[BaseModel]] = {}


def model_of(cls: type[msgspec.Struct]) -> type[BaseModel]:
    """The model a struct class is of: a generated class names it (``__contract__``).
    Raises KeyError for a struct that is no model's."""
    model = _MODEL_OF.get(cls)
    if model is None:
        import importlib

        path = getattr(cls, "__contract__", None)
        if path is None:
            raise KeyError(cls)
        module, _, name = path.rpartition(".")
        model = _MODEL_OF[cls] = getattr(importlib.import_module(module), name)
    return model


def to_model(value: msgspec.Struct, memo: dict[int, Any] | None = None) -> Any:
    """The model equal to a struct made by :func:`struct_of` (a struct in it, at any depth,
    becomes its model too). Its values are trusted, not validated again: for structs the
    core built from validated values (``tests/projector/test_properties.py`` holds such items equal
    to their validated round trip). A model is returned as it is. ``memo``: structs made
    into models by earlier calls, by ``id`` (a caller converting many items that share
    structs, such as the writer of every item, passes one dict to them all and keeps the
    structs alive meanwhile): each shared struct becomes one shared model, as the core's
    items shared them."""
    make = _MAKERS.get(type(value))
    if make is None:
        if isinstance(value, BaseModel):
            return value
        make = _MAKERS[type(value)] = _model_maker(type(value))
    return make(value, {} if memo is None else memo)


#: struct class -> its :func:`_model_maker` (a plain dict: looked up once per item)
_MAKERS: dict[type, Callable[[Any, dict[int, Any]], Any]] = {}


def _model_maker(cls: type[msgspec.Struct]) -> Callable[[Any, dict[int, Any]], Any]:
    """A function making the model of a ``cls`` instance: the model's ``model_construct``
    (pydantic's public way to build a model from trusted values, nothing validated) of its
    values, each nested struct as its model, with every field set as validation sets them;
    generated for ``cls``, reading each field by name (a replay's ``to_state`` makes a model
    of every item)."""
    model = model_of(cls)
    nested = {
        n
        for n, info in model.model_fields.items()
        if any(isinstance(t, type) and issubclass(t, BaseModel) for t in _types_in(info.annotation))
    }
    fields = ", ".join(f"{n}=_to_model(v.{n}, memo)" if n in nested else f"{n}=v.{n}" for n in cls.__struct_fields__)
    src = f"def make(v, memo):\n    return construct(_fields_set=names, {fields})\n"
    # One frozen set of field names shared by every instance: the models are frozen, nothing changes it.
    ns: dict[str, Any] = {
        "construct": model.model_construct,
        "names": frozenset(cls.__struct_fields__),
        "_to_model": _to_model,
    }
    exec(compile(src, f"<to_model {model.__name__}>", "exec"), ns)
    return ns["make"]  # type: ignore[no-any-return]


def _to_model(v: Any, memo: dict[int, Any]) -> Any:
    """A field's value that may hold structs (None, a struct, a list or dict of them) with
    each as its model; each struct and container converted once per ``memo``."""
    if v is None:
        return None
    got = memo.get(id(v))
    if got is not None:
        return got
    if isinstance(v, msgspec.Struct):
        got = to_model(v, memo)
    elif isinstance(v, list):
        got = [_to_model(x, memo) for x in v]
    elif isinstance(v, dict):
        got = {k: _to_model(x, memo) for k, x in v.items()}
    else:
        return v
    memo[id(v)] = got
    return got


S = TypeVar("S", bound=msgspec.Struct)


def updated(struct: S, changes: Mapping[str, Any]) -> S:
    """A copy of a struct with ``changes`` (``msgspec.structs.replace``): nothing validated,
    as the core's values are validated where they come in."""
    return msgspec.structs.replace(struct, **changes)


def _define(model: type[BaseModel], **tagged: Any) -> type[msgspec.Struct]:
    """The struct of ``model``; ``tagged``: msgspec's ``tag_field``, ``tag`` and the
    ``namespace`` that gives it the tag as an attribute (the tag field is then no field)."""
    _refuse_what_is_not_carried_over(model)
    fields: list[tuple[str, Any, Any] | tuple[str, Any]] = []
    for name, info in model.model_fields.items():
        if name == tagged.get("tag_field"):
            continue
        tp = _type(info.annotation)
        meta = _meta(info.metadata)
        if meta is not None:
            tp = Annotated[tp, meta]
        if info.default_factory is not None:
            raise TypeError(f"{model.__name__}.{name}: default factories are not carried over")
        if info.default is PydanticUndefined:
            fields.append((name, tp))
        else:
            fields.append((name, tp, _default(info.default)))
    extra = model.model_config.get("extra")
    cls = msgspec.defstruct(
        model.__name__,
        fields,
        kw_only=True,
        frozen=bool(model.model_config.get("frozen")),
        forbid_unknown_fields=extra == "forbid",
        module=__name__,
        # Not tracked by the garbage collector: a struct holds JSON values and structs of
        # its own, frozen, so it cannot be part of a reference cycle; the projector makes
        # one or two per accepted patch, each counting towards the next collection.
        gc=False,
        **tagged,
    )
    _MADE.append((cls, model))
    return cls


def from_model(value: BaseModel | msgspec.Struct) -> Any:
    """The struct equal to a validated model (its values are trusted: not validated again).
    A struct is returned as it is: a patch read by :func:`runstate.schemas.codec.read_patch`
    holds the structs of its models already."""
    if isinstance(value, msgspec.Struct):
        return value
    return _converter(type(value))(value)


def fields_of(value: BaseModel | msgspec.Struct) -> dict[str, Any]:
    """The fields of a model or of its struct, by name (a new dict; values as held)."""
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.asdict(value)
    return dict(value.__dict__)


@cache
def _converter(model: type[BaseModel]) -> Callable[[BaseModel], Any]:
    if any(
        isinstance(t, FieldInfo) and t.discriminator
        for f in model.model_fields.values()
        for t in _types_in(f.annotation)
    ):
        # Its members' structs are the tagged ones, which a model's value does not name.
        raise TypeError(f"{model.__name__} holds a discriminated union: not converted from the model")
    cls = struct_of(model)
    names = tuple(model.model_fields)
    nested = {
        n
        for n, info in model.model_fields.items()
        if any(isinstance(t, type) and issubclass(t, BaseModel) for t in _types_in(info.annotation))
    }

    def convert(value: BaseModel) -> Any:
        d = value.__dict__
        return cls(**{n: (_to_struct(d[n]) if n in nested else d[n]) for n in names})

    return convert


def _types_in(tp: Any, *, into_models: bool = False, seen: set[Any] | None = None) -> Iterator[Any]:
    """``tp`` and every type inside it, an ``Annotated``'s metadata included (not a
    ``Literal``'s values); with ``into_models``, the field types of each model in it too."""
    yield tp
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        seen = set() if seen is None else seen
        if into_models and tp not in seen:
            seen.add(tp)
            for f in tp.model_fields.values():
                yield from _types_in(f.annotation, into_models=True, seen=seen)
    elif typing.get_origin(tp) is not Literal:
        for a in typing.get_args(tp):
            yield from _types_in(a, into_models=into_models, seen=seen)


def _to_struct(v: Any) -> Any:
    """A field's value with every model in it (at any depth) as its struct."""
    if isinstance(v, BaseModel):
        return from_model(v)
    if isinstance(v, list):
        return [_to_struct(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_struct(x) for k, x in v.items()}
    return v


#: A time with more than six digits of a second: msgspec rounds it to the microsecond,
#: pydantic truncates it (``.1234567`` is ``.123457`` against ``.123456``), so a document
#: that may hold one goes to the model. It matches in any text too; that only costs time.
FINER_THAN_MICROS = re.compile(rb"\.[0-9]{7}")


@cache
def decoder(model: type[BaseModel]) -> Callable[[bytes], Any]:
    """A JSON decoder into the struct of ``model`` that accepts and rejects what
    ``model.model_validate_json`` does, with the same values: msgspec's strict decoder
    first, and only where it refuses, the model itself (pydantic takes a few forms msgspec
    does not, such as a Unix time in a string for a datetime), or where the two would read
    a value differently (a time finer than a microsecond). What pydantic writes, msgspec
    reads: the stored form takes the fast path. Raises ``pydantic.ValidationError``."""
    fast = msgspec.json.Decoder(struct_of(model), strict=True).decode
    convert = _converter(model)
    validate = model.model_validate_json
    finer_than_micros = FINER_THAN_MICROS.search

    def decode(raw: bytes) -> Any:
        if finer_than_micros(raw) is None:
            try:
                return fast(raw)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
        return convert(validate(raw))

    return decode


_encoder = msgspec.json.Encoder()


def encoder(model: type[BaseModel]) -> Callable[[Any], bytes]:
    """JSON of the struct of ``model``, as pydantic's ``model_dump_json`` writes the equal
    model. Raises TypeError, when it is made, for a model that may hold a float (the two
    write some floats differently)."""
    if float in _types_in(model, into_models=True):
        raise TypeError(f"no msgspec equivalent for writing {model.__name__}: it may hold a float")
    return _encoder.encode


def _fields_of_model(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"no JSON form for {type(value).__name__}")


_model_encoder = msgspec.json.Encoder(enc_hook=_fields_of_model)


@cache
def json_writer(model: type[BaseModel] | type[msgspec.Struct]) -> Callable[[Any], bytes]:
    """``model_dump_json`` of an instance of ``model`` (the store's values: decisions,
    items), written by msgspec from the instance's fields where that gives the same bytes:
    ``model`` and every model it may hold have structs (their fields and types are carried
    over) and may hold no float. Otherwise pydantic's own serializer. ``model`` may also be a
    struct made by :func:`struct_of`: its instances are written as the equal model's
    (through the model where that may hold a float)."""
    if issubclass(model, msgspec.Struct):
        pydantic_model = model_of(model)
        try:
            encoder(pydantic_model)
        except TypeError:
            to_json = pydantic_model.__pydantic_serializer__.to_json
            return lambda value: to_json(to_model(value))  # type: ignore[no-any-return]
        return _encoder.encode
    try:
        struct_of(model)
        encoder(model)
    except TypeError:
        return model.__pydantic_serializer__.to_json  # type: ignore[no-any-return]
    return _model_encoder.encode


# --- the generated module ----------------------------------------------------------------------

#: The models whose structs the core uses (their nested models come with them).
ROOTS: tuple[str, ...] = (
    "RunHeader",
    "RunState",
    "Decision",
    "Patch",
    "Transition",
    "Waiting",
    "Budgets",
    "PriorValue",
    "Provenance",
    "Writer",
)
#: Where the generated structs live, and how to write them again after a model changed.
GENERATED = "schemas/generated/structs.py (python -m runstate.schemas.structs --write)"
#: While the generator derives the reference structs from the models (not the generated ones).
_REFERENCE = False
#: The reference structs in the order they were made (a nested struct before its holder).
_MADE: list[tuple[type[msgspec.Struct], type[BaseModel]]] = []


def _roots() -> list[type[BaseModel]]:
    from runstate.schemas import patch, state

    return [getattr(state, n, None) or getattr(patch, n) for n in ROOTS] + list(state.COLLECTIONS.values())


def _src(tp: Any) -> str:
    """A struct field's type as source."""
    if tp is type(None):
        return "None"
    if tp in _SCALARS:
        return str(tp.__name__)
    if tp is _dt.datetime:
        return "datetime"
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp.__name__
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return f"Annotated[{_src(args[0])}, {', '.join(repr(m) for m in args[1:])}]"
    if origin is Union or origin is types.UnionType:
        return " | ".join(_src(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is list:
        return f"list[{_src(args[0])}]"
    if origin is dict:
        return f"dict[{_src(args[0])}, {_src(args[1])}]"
    raise TypeError(f"cannot write the type {tp!r} as source")


def _field_src(f: Any) -> str:
    line = f"    {f.name}: {_src(f.type)}"
    if f.default is not msgspec.NODEFAULT:
        return f"{line} = {f.default!r}"
    if f.default_factory is msgspec.NODEFAULT:
        return line
    if f.default_factory in (list, dict):
        return f"{line} = msgspec.field(default_factory={f.default_factory.__name__})"
    made = f.default_factory()
    if made != type(made)():
        raise TypeError(f"cannot write the default of {f.name}: {made!r} is not its class's default")
    return f"{line} = msgspec.field(default_factory={type(made).__name__})"


def _class_src(cls: type[msgspec.Struct], model: type[BaseModel]) -> str:
    cfg = cls.__struct_config__
    opts = f"kw_only=True, frozen={cfg.frozen}, forbid_unknown_fields={cfg.forbid_unknown_fields}, gc={cfg.gc}"
    lines = [f"    __contract__: ClassVar[str] = {model.__module__ + '.' + model.__name__!r}"]
    if cfg.tag_field is not None:
        opts += f", tag_field={cfg.tag_field!r}, tag={cfg.tag!r}"
        lines.append(f"    {cfg.tag_field}: ClassVar[Literal[{cfg.tag!r}]] = {cfg.tag!r}")
    lines += [_field_src(f) for f in msgspec.structs.fields(cls)]
    doc = f'    """The struct of :class:`{model.__module__}.{model.__name__}` (``__contract__``)."""'
    return f"class {cls.__name__}(msgspec.Struct, {opts}):\n{doc}\n\n" + "\n".join(lines) + "\n"


def _reachable(roots: list[type[msgspec.Struct]]) -> list[type[msgspec.Struct]]:
    """Every struct class the roots hold, at any depth, each after those it holds."""
    out: dict[type[msgspec.Struct], None] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            if tp in out:
                return
            for f in msgspec.structs.fields(tp):
                visit(f.type)
            out[tp] = None
            return
        for arg in typing.get_args(tp):
            visit(arg)

    for root in roots:
        visit(root)
    return list(out)


def render() -> str:
    """The source of the generated module: the structs derived from the models now."""
    global _REFERENCE
    was, _REFERENCE = _REFERENCE, True
    try:
        roots = [_reference_struct_of(model) for model in _roots()]
        made = dict(_MADE)
        classes = [(cls, made[cls]) for cls in _reachable(roots)]
    finally:
        _REFERENCE = was
    names = [c.__name__ for c, _ in classes]
    if len(names) != len(set(names)):
        raise TypeError(f"two models give structs of one name: {sorted({n for n in names if names.count(n) > 1})}")
    head = (
        "# GENERATED from the contract's pydantic models by `python -m runstate.schemas.structs --write`:\n"
        "# do not edit. tests/schemas/test_structs.py fails while this file differs from what the models generate.\n"
        '"""msgspec structs of the contract\'s models: the projector\'s internal form (see\n'
        ':mod:`runstate.schemas.structs`, which derives them and converts to and from the models)."""\n\n'
        "from __future__ import annotations\n\n"
        "from datetime import datetime\n"
        "from typing import Annotated, ClassVar, Literal\n\n"
        "import msgspec\n\n\n"
    )
    return head + "\n\n".join(_class_src(c, m) for c, m in classes)


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys

    target = Path(__file__).parent / "generated" / "structs.py"
    if sys.argv[1:] == ["--write"]:
        target.write_text(render())
        print(f"wrote {target}")
    else:
        print(render())
