"""The projector's fast path (msgspec structs generated from the pydantic models) accepts and
rejects exactly what the models do, gives the same values, and writes the same bytes.

The reference is the model's own ``model_validate_json``, which read the stored headers
before. Documents are generated from the models' own field types: half of them valid, the
other half with a value of another type, out of range or malformed, a missing field or an
unknown one mixed in at any depth; and, deterministically, every document one change away
from a full header. Each is given to both. :func:`structs.decoder` asks msgspec first and
the model where msgspec refuses or would read differently, so the tests also hold what
msgspec accepts alone to the model's answer, and check that what the model writes takes
the fast path."""

from __future__ import annotations

import datetime as dt
import json
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from helpers import ROOT, examples
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel
from pydantic.fields import FieldInfo

from runstate.schemas import structs
from runstate.schemas.state import RunHeader, RunState

#: Values of every JSON type and the edges the contract's types have: one is put in place
#: of a generated value now and then, wherever it may land.
ODD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    1.0,
    1.5,
    -(2**63),
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    "",
    "x",
    "1",
    "true",
    "x\n",
    "\x01",
    "a" * 201,
    "running",
    "user",
    "2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00+02:00",
    "2026-01-01T00:00:00.123456Z",
    "2026-01-01T00:00:00",
    "2026-01-01",
    "2026-13-01T00:00:00Z",
    "2026-01-01T00:00:00.1234567Z",
    "2026-01-01 00:00:00Z",
    "2026-01-01t00:00:00z",
    "2026-01-01T00:00Z",
    "2026-01-01T23:59:60Z",
    "2026-01-01T00:00:00.Z",
    "2026-01-01T00:00:00,5Z",
    "2026-01-01T00:00:00+24:00",
    "2026-02-30T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59.999999-01:00",
    "2026-01-01T00:00:00.999999999Z",
    1767225600,
    [],
    ["x"],
    [1],
    {},
    {"x": 1},
    {"confirmed_facts": 1},
]

_ZONES = st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=2)), dt.timezone(dt.timedelta(hours=-5, minutes=-30))])


def _datetimes(aware: bool) -> st.SearchStrategy[str]:
    zoned = st.datetimes(timezones=_ZONES).map(lambda d: d.isoformat().replace("+00:00", "Z"))
    return zoned if aware else zoned | st.datetimes().map(dt.datetime.isoformat)


def _constrained(base: st.SearchStrategy[Any], meta: list[Any]) -> st.SearchStrategy[Any]:
    """Values near the constraints as well as inside them (both sides must agree on them)."""
    extra: list[Any] = []
    for m in meta:
        for c in m.metadata if isinstance(m, FieldInfo) else [m]:
            for attr in ("ge", "le", "gt", "lt"):
                if getattr(c, attr, None) is not None:
                    v = getattr(c, attr)
                    extra += [v - 1, v, v + 1]
            for attr in ("min_length", "max_length"):
                if getattr(c, attr, None) is not None:
                    n = getattr(c, attr)
                    extra += ["y" * max(n - 1, 0), "y" * n, "y" * (n + 1)]
    return base | st.sampled_from(extra) if extra else base


def values(tp: Any, odd: bool) -> st.SearchStrategy[Any]:
    """JSON values for a pydantic field type: valid, or with ``odd`` sometimes not."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is AwareDatetime:
        base: st.SearchStrategy[Any] = _datetimes(aware=True)
    elif tp is dt.datetime:
        base = _datetimes(aware=False)
    elif tp is str:
        base = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
    elif tp is bool:
        base = st.booleans()
    elif tp is int:
        base = st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3)
    elif tp is float:
        base = st.floats(allow_nan=False, allow_infinity=False)
    elif tp is type(None):
        base = st.none()
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        base = documents(tp, odd)
    elif origin is Annotated:
        base = _constrained(values(args[0], odd), list(args[1:]))
    elif origin in (Union, types.UnionType):
        base = st.one_of([values(a, odd) for a in args])
    elif origin is Literal:
        base = st.sampled_from(args)
    elif origin is list:
        base = st.lists(values(args[0], odd), max_size=3)
    elif origin is dict:
        # JSON keys are strings whatever was drawn: an odd key (a list, say) would only
        # break the drawing, so keys are drawn from the valid values.
        base = st.dictionaries(values(args[0], False), values(args[1], odd), max_size=3)
    else:
        raise TypeError(tp)
    return st.integers(0, 11).flatmap(lambda i: st.sampled_from(ODD) if i == 0 else base) if odd else base


def documents(model: type[BaseModel], odd: bool | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """A model's documents: required fields always, optional ones sometimes; with ``odd``
    (None: for half the documents), an odd value now and then at any depth, a required
    field left out or a field the model does not have."""
    if odd is None:
        return st.booleans().flatmap(lambda o: documents(model, o))
    required, optional = {}, {}
    for name, info in model.model_fields.items():
        s = _constrained(values(info.annotation, odd), info.metadata) if info.metadata else values(info.annotation, odd)
        (required if info.is_required() else optional)[name] = s

    def damage(doc: dict[str, Any], how: int, which: int) -> dict[str, Any]:
        if not odd:
            return doc
        if how == 0 and required:  # a required field left out
            doc = dict(doc)
            doc.pop(sorted(required)[which % len(required)], None)
        elif how == 1:  # a field the model does not have
            doc = {**doc, "not_a_field": 1}
        return doc

    return st.builds(damage, st.fixed_dictionaries(required, optional=optional), st.integers(0, 15), st.integers(0, 99))


def _to_model(model: type[BaseModel], value: Any) -> BaseModel:
    """The pydantic model of a struct, validated by the model."""
    return model.model_validate(msgspec.to_builtins(value, builtin_types=(dt.datetime,)))


def _pydantic(model: type[BaseModel], raw: bytes) -> BaseModel | None:
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError:
        return None


def _msgspec_alone(model: type[BaseModel], raw: bytes) -> Any:
    """What msgspec's decoder gives where :func:`structs.decoder` asks it first (None where
    it refuses, or where the decoder goes to the model: a time finer than a microsecond)."""
    if structs.FINER_THAN_MICROS.search(raw):
        return None
    try:
        return msgspec.json.decode(raw, type=structs.struct_of(model), strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _decoder(model: type[BaseModel], raw: bytes) -> Any:
    try:
        return structs.decoder(model)(raw)
    except pydantic.ValidationError:
        return None


def _may_hold_a_float(model: type[BaseModel]) -> bool:
    try:
        structs.encoder(model)
    except TypeError:
        return True
    return False


def _models_in(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model`` and every model its fields hold, at any depth."""
    found: list[type[BaseModel]] = [model]

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in found:
                found.extend(m for m in _models_in(tp) if m not in found)
        else:
            for a in typing.get_args(tp):
                walk(a)

    for info in model.model_fields.values():
        walk(info.annotation)
    return found


#: The run header, which the projector reads, copies and writes as a struct, and the models
#: in it (each is a struct too).
MODELS = _models_in(RunHeader)
#: ... and every model of the whole state: the queries decode a run's state document into
#: its struct for the compact context (``document.load(..., "struct")``).
DECODED = MODELS + [m for m in _models_in(RunState) if m not in MODELS]


@pytest.mark.parametrize("model", DECODED, ids=lambda m: m.__name__)
@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_the_struct_accepts_and_rejects_what_the_model_does(model: type[BaseModel], data: st.DataObject) -> None:
    doc = data.draw(documents(model))
    raw = json.dumps(doc).encode()  # the standard library: integers past 64 bits too
    by_model, by_struct = _pydantic(model, raw), _decoder(model, raw)
    assert (by_model is None) == (by_struct is None), (raw, by_model, by_struct)
    if by_model is None:
        return
    assert structs.from_model(by_model) == by_struct  # the same values
    stored = by_model.model_dump_json().encode()
    if not _may_hold_a_float(model):  # msgspec writes some floats otherwise (structs.encoder)
        assert structs.encoder(model)(by_struct) == stored  # the same bytes
    assert _to_model(model, by_struct) == by_model
    # What msgspec accepts alone, the model accepts, with the same values; and what the
    # model writes, msgspec reads alone (a stored header takes the fast path), unless a
    # text in it looks like a time finer than a microsecond.
    fast = _msgspec_alone(model, raw)
    assert fast is None or fast == by_struct, (raw, fast, by_struct)
    if not structs.FINER_THAN_MICROS.search(stored):
        assert _msgspec_alone(model, stored) == by_struct


@pytest.mark.parametrize("model", DECODED, ids=lambda m: m.__name__)
@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_what_msgspec_accepts_alone_the_model_accepts(model: type[BaseModel], data: st.DataObject) -> None:
    raw = json.dumps(data.draw(documents(model))).encode()
    fast = _msgspec_alone(model, raw)
    if fast is not None:
        by_model = _pydantic(model, raw)
        assert by_model is not None and structs.from_model(by_model) == fast, (raw, by_model, fast)


@pytest.mark.parametrize("model", DECODED, ids=lambda m: m.__name__)
def test_the_generated_documents_are_mostly_accepted(model: type[BaseModel]) -> None:
    """The test above compares both answers; it tests little if nearly every document is
    refused (or accepted). Both outcomes must be common."""
    accepted = 0
    n = 200  # the bounds below are for this many; fewer made them flaky

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(documents(model))
    def count(doc: dict[str, Any]) -> None:
        nonlocal accepted
        accepted += _pydantic(model, json.dumps(doc).encode()) is not None

    count()
    assert n * 0.1 < accepted < n * 0.98, accepted  # about 35-87 % (measured), per model


#: A header with every optional object present (a wait, a transition, a deadline, a
#: workspace, a migration, writers): each of its values is changed in turn below.
FULL_HEADER: dict[str, Any] = {
    "schema_version": 4,
    "run_id": "run_1",
    "revision": 7,
    "goal": {
        "statement": "ship",
        "scope": {"include": ["src/"], "exclude": ["src/gen/"]},
        "acceptance": ["tests pass"],
    },
    "phase": "build",
    "status": "waiting",
    "active_task_id": "t1",
    "last_transition": {
        "action": "complete t0",
        "result_ref": "artifact://a/1",
        "revision": 6,
        "at": "2026-01-01T00:00:00.5Z",
    },
    "waiting": {
        "wait_id": "w1",
        "kind": "approval",
        "reason": "deploy",
        "until": "2026-01-02T00:00:00+02:00",
        "since": "2026-01-01T00:00:01Z",
        "since_revision": 7,
    },
    "budgets": {"tokens_remaining": 10, "tokens_used": 5, "deadline": "2026-01-03T00:00:00Z"},
    "workspace_ref": {"workspace_id": "ws", "base_commit": "abc", "current_commit": "def", "uncommitted_changes": None},
    "agent_version": "1",
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:01.000001Z",
    "last_control_revision": 2,
    "next_seq": 3,
    "running_task_ids": ["t1"],
    "sizes": {"tasks": 2, "confirmed_facts": 1},
    "effect_ledger_ref": None,
    "policy": {
        "writers": ["a1"],
        "observation_max_age_s": 60,
        "require_observations_for_side_effects": True,
        "external_evidence_schemes": ["jira"],
    },
    "revoked_agents": ["a9"],
    "migrated_from": {"version": 3, "path": [3, 4]},
}


def _mutations(doc: Any) -> list[Any]:
    """Every document one change away from ``doc``: each value replaced by each odd value,
    each key removed, an unknown key added to each object, each list given an odd item."""
    out: list[Any] = []
    if isinstance(doc, dict):
        out.append({**doc, "not_a_field": 1})
        for k, v in doc.items():
            out.append({x: y for x, y in doc.items() if x != k})
            out += [{**doc, k: odd} for odd in ODD]
            out += [{**doc, k: m} for m in _mutations(v)]
    elif isinstance(doc, list):
        out += [[*doc, odd] for odd in ODD]
        out += [[*doc[:i], m, *doc[i + 1 :]] for i, v in enumerate(doc) for m in _mutations(v)]
    return out


def test_every_single_change_to_a_full_header_is_judged_as_the_model_judges_it() -> None:
    """Deterministic and exhaustive one step away from a valid header (about 6,000 documents):
    the edges the property test above reaches only by chance."""
    docs = [FULL_HEADER, *_mutations(FULL_HEADER)]
    outcomes = set()
    for doc in docs:
        raw = json.dumps(doc).encode()
        by_model, by_struct = _pydantic(RunHeader, raw), _decoder(RunHeader, raw)
        assert (by_model is None) == (by_struct is None), (raw, by_model, by_struct)
        fast = _msgspec_alone(RunHeader, raw)
        if by_model is not None:
            assert structs.from_model(by_model) == by_struct, raw
            assert structs.encoder(RunHeader)(by_struct) == by_model.model_dump_json().encode(), raw
        if fast is not None:
            assert by_model is not None and structs.from_model(by_model) == fast, raw
        outcomes.add((by_model is not None, fast is not None))
    assert outcomes == {(True, True), (True, False), (False, False)}, outcomes  # each kind of answer occurs
    assert _pydantic(RunHeader, json.dumps(FULL_HEADER).encode()) is not None


def test_a_struct_has_the_models_fields_in_order_with_its_defaults() -> None:
    for model in MODELS:
        cls = structs.struct_of(model)
        assert cls.__struct_fields__ == tuple(model.model_fields), model
        config = cls.__struct_config__
        assert config.frozen and config.forbid_unknown_fields and not config.omit_defaults
        # Built from nothing but its required fields, the struct is the model built so.
        required = {n: f for n, f in model.model_fields.items() if f.is_required()}
        minimal = {n: "x" for n in required}
        try:
            expected = model.model_validate(minimal)
        except pydantic.ValidationError:
            continue  # a required field is not a string: covered by the property test
        assert structs.decoder(model)(json.dumps(minimal).encode()) == structs.from_model(expected), model


def test_a_field_type_without_an_equivalent_is_refused_at_generation() -> None:
    """What the generator does not carry over (a date; a multiple; a pattern with a '$'
    before its end; a model's own validator; an alias; a setting such as stripping
    whitespace) is an error when the struct is made, not a struct that validates or writes
    differently. A float is read as the model reads it, but written differently: a model
    that may hold one has a struct and no encoder."""

    class Scored(BaseModel):
        score: float

    class HoldsScored(BaseModel):
        inner: list[Scored | None] = []

    assert msgspec.convert({"score": 1}, structs.struct_of(Scored)).score == Scored(score=1).score
    for model in (Scored, HoldsScored):
        with pytest.raises(TypeError, match="no msgspec equivalent for writing"):
            structs.encoder(model)
    structs.encoder(RunHeader)  # the header holds none

    class OnADay(BaseModel):
        day: dt.date

    class Even(BaseModel):
        n: Annotated[int, pydantic.Field(multiple_of=2)]

    class Anchored(BaseModel):
        code: Annotated[str, pydantic.Field(pattern=r"^a$|^b$")]

    class Checked(BaseModel):
        n: int

        @pydantic.field_validator("n")
        @classmethod
        def positive(cls, v: int) -> int:
            return v

    class Aliased(BaseModel):
        n: int = pydantic.Field(alias="N")

    class Stripped(BaseModel):
        model_config = pydantic.ConfigDict(str_strip_whitespace=True)
        s: str

    for model in (OnADay, Even, Anchored, Checked, Aliased, Stripped):
        with pytest.raises(TypeError, match="no msgspec equivalent"):
            structs.struct_of(model)


# --- the patch the projector's core reads (codec.read_patch) ---------------------------------

from runstate.schemas import codec  # noqa: E402
from runstate.schemas.errors import DecodeError  # noqa: E402
from runstate.schemas.patch import Patch  # noqa: E402


def _patch_fast_alone(doc: Any) -> Any:
    """What msgspec gives for a decoded patch where read_patch asks it first (None: it
    refuses, or read_patch goes to the model)."""
    if structs.FINER_THAN_MICROS.search(json.dumps(doc).encode()):
        return None
    try:
        return msgspec.convert(doc, codec.PatchStruct)
    except msgspec.ValidationError:
        return None


def _patch_model(doc: Any) -> Patch | None:
    try:
        return Patch.model_validate(doc)
    except pydantic.ValidationError:
        return None


def _same_patch(fast: Any, by_model: Patch) -> bool:
    """The struct holds the model's values: validated back into the model, it writes the
    same JSON (times with their offsets, which ``==`` on datetimes would not compare)."""
    back = Patch.model_validate(msgspec.to_builtins(fast, builtin_types=(dt.datetime,)))
    return back.model_dump_json() == by_model.model_dump_json()


@settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(doc=documents(Patch))
def test_what_msgspec_accepts_of_a_patch_the_model_accepts_with_the_same_values(doc: dict[str, Any]) -> None:
    """Patch documents of every shape the models allow (30 event types, valid or damaged
    at any depth): where the struct takes one alone, the model takes it with equal values."""
    fast = _patch_fast_alone(doc)
    if fast is not None:
        by_model = _patch_model(doc)
        assert by_model is not None and _same_patch(fast, by_model), (doc, by_model, fast)
        assert [e.type for e in fast.events] == [e.type for e in by_model.events]


#: A patch with an event of each kind of field: times, a float, optional values, lists,
#: nested models and defaults.
FULL_PATCH: dict[str, Any] = {
    "patch_id": "p1",
    "run_id": "run_1",
    "expected_revision": 3,
    "rebase": True,
    "author": {"agent_id": "a1", "agent_version": "v1"},
    "created_at": "2026-01-01T00:00:00.5+02:00",
    "events": [
        {
            "type": "RunStarted",
            "goal": {"statement": "ship", "scope": {"include": ["src/"]}, "acceptance": ["ok"]},
            "phase": "plan",
            "policy": {"writers": ["a1"], "external_evidence_schemes": ["jira"]},
        },
        {
            "type": "FactConfirmed",
            "fact": {
                "id": "f1",
                "statement": "s",
                "evidence": "artifact://x",
                "observed_at": "2026-01-01T00:00:00Z",
                "scope": "src",
            },
            "replaces_hypothesis_id": None,
        },
        {
            "type": "HypothesisProposed",
            "hypothesis": {"id": "h1", "statement": "s", "confidence": 0.5, "falsifier": "f"},
        },
        {"type": "BudgetConsumed", "tokens": 5},
        {
            "type": "WaitingStarted",
            "waiting": {"wait_id": "w1", "kind": "approval", "reason": "r", "until": "2026-01-02T00:00:00-05:30"},
        },
    ],
}


def test_every_single_change_to_a_full_patch_is_judged_as_the_model_judges_it() -> None:
    """Deterministic and exhaustive one step away from a valid patch: whatever msgspec
    takes alone, the model takes with the same values; both answers occur."""
    assert _patch_model(FULL_PATCH) is not None
    outcomes = set()
    for doc in [FULL_PATCH, *_mutations(FULL_PATCH)]:
        by_model, fast = _patch_model(doc), _patch_fast_alone(doc)
        if fast is not None:
            assert by_model is not None and _same_patch(fast, by_model), doc
        outcomes.add((by_model is not None, fast is not None))
    assert outcomes == {(True, True), (True, False), (False, False)}, outcomes


def _avro_datums() -> st.SearchStrategy[dict[str, Any]]:
    from test_schemas import PATCH_DATUMS

    return PATCH_DATUMS


@settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(datum=_avro_datums())
def test_read_patch_accepts_and_refuses_every_record_as_decode_does(datum: dict[str, Any]) -> None:
    """On log records (any datum of the published schema): read_patch refuses what decode
    refuses, with the same reason, and reads what it reads, with the same values."""
    raw = codec.encode_datum(datum, codec.current_writer())
    try:
        want = codec.decode(raw)
    except DecodeError as e:
        with pytest.raises(DecodeError) as got:
            codec.read_patch(raw)
        assert (got.value.reason, got.value.detail) == (e.reason, e.detail)
        return
    got_patch = codec.read_patch(raw)
    if isinstance(got_patch, Patch):
        assert got_patch == want
    else:
        assert _same_patch(got_patch, want)


# --- the store's values written by msgspec (structs.json_writer) ------------------------------

from runstate.projector.store import keys  # noqa: E402
from runstate.schemas.patch import Decision  # noqa: E402
from runstate.schemas.state import COLLECTIONS  # noqa: E402

STORED = [Decision, *COLLECTIONS.values()]


@pytest.mark.parametrize("model", STORED, ids=lambda m: m.__name__)
@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_a_stored_value_is_written_as_the_model_writes_it(model: type[BaseModel], data: st.DataObject) -> None:
    """A decision or an item is stored as the bytes of its ``model_dump_json``, whichever
    writer writes it (odd documents too: what validates, with any time zone, text or number
    the model takes, and the struct of each)."""
    doc = data.draw(documents(model, odd=data.draw(st.booleans())))
    try:
        value = model.model_validate(doc)
    except pydantic.ValidationError:
        return
    assert keys.dump(value) == value.model_dump_json().encode()
    # Its struct (the core's working form of items): written as the model writes it, made
    # back into the equal model (every field set, as validation sets them), and as plain
    # data what the model dumps.
    struct = structs.from_model(value)
    assert keys.dump(struct) == value.model_dump_json().encode()
    back = structs.to_model(struct)
    assert type(back) is model and back == value and back.model_fields_set == set(model.model_fields)
    assert back.model_dump_json() == value.model_dump_json()
    assert msgspec.to_builtins(struct) == value.model_dump(mode="json")


def test_msgspec_writes_the_stored_values_that_hold_no_float() -> None:
    writers = {m: structs.json_writer(m) for m in STORED}
    fast = {m for m, w in writers.items() if w != m.__pydantic_serializer__.to_json}
    assert fast == {m for m in STORED if m is not COLLECTIONS["hypotheses"]}  # a confidence is a float


def test_the_generated_structs_are_what_the_models_generate_now() -> None:
    """schemas/generated/structs.py is checked in (a reader and the type checker see the
    internal form): it must be what the models derive today. After a model changes:
    ``python -m runstate.schemas.structs --write``."""

    written = (ROOT / "schemas" / "generated" / "structs.py").read_text()
    assert written == structs.render(), "stale: " + structs.GENERATED
    from runstate.schemas.generated import structs as generated
    from runstate.schemas.patch import Patch

    assert structs.struct_of(RunHeader) is generated.RunHeader and structs.struct_of(Patch) is generated.Patch


def test_a_stale_generated_module_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that gained a field no longer renders as the checked-in module."""
    from runstate.schemas.state import Budgets

    before = structs.render()
    monkeypatch.setitem(Budgets.model_fields, "tokens_reserved", pydantic.fields.FieldInfo(annotation=int, default=0))

    def forget() -> None:
        structs._reference_struct_of.cache_clear()
        structs._reference_tagged.cache_clear()

    forget()
    try:
        assert "tokens_reserved: int = 0" in structs.render() != before
    finally:
        monkeypatch.undo()
        forget()
    assert structs.render() == before


def test_a_patch_only_pydantic_reads_becomes_the_struct_not_a_crash() -> None:
    """A record whose values msgspec refuses and pydantic takes (a time with nanoseconds, a
    time with '_' for 'T': the sealed-record fuzz target found this one) is read through the
    model and made the struct; it raised TypeError (Patch holds a discriminated union), which
    would stop the projector on that record."""
    import base64

    from runstate.eventlog.base import Record
    from runstate.projector.core.runbook import read_record
    from runstate.schemas.generated.structs import Patch as PatchStruct

    found = base64.b64decode(
        "wwFkRvPYyFtAMARwMQJpAAIAFFJ1blN0YXJ0ZWQCcwAAAAAAAAAAAAAAAAJhAjEoMjAyNi0wMS0wMV8wMDowMDowMFoA"
    )
    got = read_record(Record("runstate.events", 0, 7, b"r", found, 0, (), checksum_ok=True))
    assert isinstance(got, PatchStruct) or type(got).__name__ == "DeadLetter", got
