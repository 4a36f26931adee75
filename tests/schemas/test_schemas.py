"""The contract: models, the Avro codec and its evolution, state migrations."""

from __future__ import annotations

import copy
import json

import pytest
from helpers import CLIENT_EXAMPLE, TESTS, V1_DOC, examples, patch, rejected_decision

from runstate.schemas import codec
from runstate.schemas.errors import ContractError, DecodeError, MigrationRequired, UnknownEventType
from runstate.schemas.events import EVENT_TYPE_NAMES
from runstate.schemas.migrations import load_state
from runstate.schemas.patch import Decision, Patch, parse_draft
from runstate.schemas.state import CURRENT_SCHEMA_VERSION


def test_client_example_patch_is_accepted_verbatim() -> None:
    draft = parse_draft(json.loads(CLIENT_EXAMPLE))
    assert draft.expected_revision == 18
    assert [e.type for e in draft.events] == ["FactConfirmed", "TaskCompleted"]
    assert draft.events[0].fact.observed_at is None  # the patch time stands in later


def test_unknown_field_is_an_error_naming_it() -> None:
    data = json.loads(CLIENT_EXAMPLE)
    data["events"][0]["fact"]["confidence"] = 0.9
    with pytest.raises(ContractError) as e:
        parse_draft(data, where="p.json")
    assert "confidence" in str(e.value) and "p.json" in str(e.value)
    assert e.value.field is not None and "confidence" in e.value.field


def test_unknown_event_type_lists_the_catalogue() -> None:
    with pytest.raises(UnknownEventType) as e:
        parse_draft({"expected_revision": 0, "events": [{"type": "NoSuchEventType", "text": "x"}]})
    assert e.value.got == "NoSuchEventType"
    assert set(e.value.known) == set(EVENT_TYPE_NAMES)
    assert "TaskCompleted" in str(e.value)


def test_catalogue_has_every_event_the_issue_names() -> None:
    required = """RunStarted GoalChanged ConstraintSet PhaseChanged FactConfirmed FactRetracted
    HypothesisProposed HypothesisRevised HypothesisRejected QuestionOpened QuestionResolved TaskCreated
    TaskStarted TaskBlocked TaskCompleted TaskFailed TaskCancelled ToolCallStarted ToolSucceeded ToolFailed
    ObservationRecorded EffectRecorded WorkspaceUpdated WaitingStarted WaitingResolved BudgetSet
    BudgetConsumed RunCompleted RunFailed RunCancelled""".split()
    assert set(required) <= set(EVENT_TYPE_NAMES)


def test_models_match_the_latest_published_avro_schema() -> None:
    """Changing the models without publishing a new schema version fails here.
    Fix: `python -m runstate.schemas.codec --publish` (never edit a published .avsc)."""
    derived = codec.derive_patch_schema()
    assert codec._fp(derived) == codec.current_writer().fingerprint


def test_decision_models_match_the_published_schema_and_round_trip() -> None:
    """The decisions topic's records: derived from Decision, published, read back equal;
    garbage is a DecodeError, not a crash of the waiter."""
    assert codec._fp(codec.derive_decision_schema()) == codec._decision_current().fingerprint
    p = patch("run_1", 0, json.loads(CLIENT_EXAMPLE)["events"][0])
    d = rejected_decision(p)
    assert codec.decode_decision(codec.encode_decision(d)) == d
    for junk in (b"", b"\xc3\x01" + b"\0" * 8, codec.encode_decision(d)[:-3]):
        with pytest.raises(DecodeError):
            codec.decode_decision(junk)


def test_codec_round_trip_keeps_offsets_and_values() -> None:
    p = patch("run_1", 18, json.loads(CLIENT_EXAMPLE)["events"][0], json.loads(CLIENT_EXAMPLE)["events"][1])
    data = codec.encode(p)
    assert data[:2] == b"\xc3\x01"
    assert codec.decode(data) == p


def test_record_from_older_writer_schema_is_resolved() -> None:
    """A writer schema without ``rebase`` (an older contract) decodes with the default."""
    old = copy.deepcopy(codec.derive_patch_schema())
    old["fields"] = [f for f in old["fields"] if f["name"] != "rebase"]
    old_writer = codec._Writer(0, __import__("fastavro").parse_schema(old), codec.register_writer_schema(old, 0))
    p = patch("run_1", 3, {"type": "PhaseChanged", "phase": "fix"}, rebase=True)
    datum = codec._to_avro_datum(p)
    del datum["rebase"]
    got = codec.decode(codec.encode_datum(datum, old_writer))
    assert got.rebase is False and got.events == p.events and got.run_id == "run_1"


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "not_avro_single_object"),
        (b'{"run_id": "x"}', "not_avro_single_object"),
        (b"\xc3\x01" + b"\x00" * 8 + b"abc", "unknown_writer_schema"),
    ],
)
def test_garbage_is_a_typed_decode_error(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as e:
        codec.decode(data)
    assert e.value.reason == reason


def test_truncated_record_is_corrupt() -> None:
    data = codec.encode(patch("run_1", 0, {"type": "PhaseChanged", "phase": "x"}))
    with pytest.raises(DecodeError) as e:
        codec.decode(data[:-3])
    assert e.value.reason == "corrupt_record"


def test_v1_document_loads_as_current() -> None:
    raw = copy.deepcopy(V1_DOC)
    state = load_state(raw)
    assert raw == V1_DOC  # the input is not modified
    assert state.schema_version == CURRENT_SCHEMA_VERSION
    assert state.revision == 18 and state.active_task_id == "task_3"
    assert state.open_questions[0].text == V1_DOC["open_questions"][0]
    assert state.workspace_ref is not None
    assert (state.workspace_ref.workspace_id, state.workspace_ref.current_commit) == ("ws_71", "3bc92e")
    assert state.effect_ledger_ref == "effects://run_128@rev4"  # kept, not dropped
    assert state.confirmed_facts[0].observed_at.utcoffset().total_seconds() == 8 * 3600


def test_newer_document_is_refused_unchanged() -> None:
    raw = {**copy.deepcopy(V1_DOC), "schema_version": CURRENT_SCHEMA_VERSION + 1}
    before = copy.deepcopy(raw)
    with pytest.raises(MigrationRequired) as e:
        load_state(raw)
    assert raw == before
    assert "MIGRATION_REQUIRED" in str(e.value) and e.value.found_version == CURRENT_SCHEMA_VERSION + 1


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda d: d.__setitem__("workspace_ref", "s3://bucket/x"), "workspace_ref"),
        (lambda d: d["confirmed_facts"][0].pop("observed_at"), "observed_at"),
        (lambda d: d.__setitem__("notes", ["free text"]), "unknown v3 fields"),
    ],
)
def test_v1_document_that_cannot_migrate_safely_is_refused(mutate, why: str) -> None:  # type: ignore[no-untyped-def]
    raw = copy.deepcopy(V1_DOC)
    mutate(raw)
    with pytest.raises(MigrationRequired) as e:
        load_state(raw)
    assert why in str(e.value)


def test_records_written_with_published_v1_decode_under_the_current_schema() -> None:
    """v2 added LeaseReleased to the events union; the log still holds v1 records."""
    v1 = next(w for w in codec.published().values() if w.version == 1)
    assert codec.current_writer().version >= 2
    p = patch("run_1", 4, json.loads(CLIENT_EXAMPLE)["events"][0], {"type": "WaitingResolved", "wait_id": "w"})
    data = codec.encode(p, writer=v1)
    assert data[2:10] == v1.fingerprint
    assert codec.decode(data) == p


def test_the_documents_reference_state_loads_as_written_with_its_schema_version_3() -> None:
    """The client's document gives its reference Run State with ``schema_version: 3``:
    that is version 3 here, and what runstate writes now is a later one."""
    assert CURRENT_SCHEMA_VERSION > 3
    reference = {**copy.deepcopy(V1_DOC), "schema_version": 3}
    state = load_state(reference)
    assert state.schema_version == CURRENT_SCHEMA_VERSION and state.revision == 18
    assert state.migrated_from is not None
    assert (state.migrated_from.version, state.migrated_from.path) == (3, [3, CURRENT_SCHEMA_VERSION])
    legacy = load_state(copy.deepcopy(V1_DOC))  # runstate 0.1 called the same document version 1
    assert legacy.migrated_from is not None and legacy.migrated_from.path == [1, 3, CURRENT_SCHEMA_VERSION]
    assert legacy.model_dump(exclude={"migrated_from"}) == state.model_dump(exclude={"migrated_from"})


def test_documents_runstate_0_1_wrote_still_load() -> None:
    """Version 2 is what runstate 0.1 wrote: it loads, items without provenance."""
    v2 = load_state(copy.deepcopy(V1_DOC)).model_dump(mode="json", exclude={"migrated_from", "policy"})
    v2["schema_version"] = 2
    for f in v2["confirmed_facts"]:
        f.pop("provenance", None)
    state = load_state(v2)
    assert state.schema_version == CURRENT_SCHEMA_VERSION
    assert state.migrated_from is not None and state.migrated_from.path == [2, CURRENT_SCHEMA_VERSION]
    assert state.confirmed_facts[0].provenance is None


def test_where_a_state_came_from_survives_its_working_form() -> None:
    from runstate.projector.core.working import RunDoc

    state = load_state(copy.deepcopy(V1_DOC))
    again = RunDoc.from_state(state).to_state()
    assert again.migrated_from == state.migrated_from and again == state


# --- the generated codec (schemas/avrofast.py) against fastavro ------------------------------

from typing import Any  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _strategy(t: Any, named: dict[str, Any], ns: str | None, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any datum of an Avro type (the types our schemas use), unions in fastavro's
    named-branch form where a union holds several records (as the codec writes them)."""
    if isinstance(t, str):
        prim = {
            "null": st.none(),
            "boolean": st.booleans(),
            "long": st.integers(-(2**63), 2**63 - 1),
            "double": st.floats(allow_nan=False),
            "string": st.text(max_size=6),
        }
        if t in prim:
            return prim[t]
        full = _full(t, ns)
        return st.deferred(lambda: _strategy(named[full], named, ns, depth + 1))
    if isinstance(t, list):
        recs = [x for x in t if isinstance(x, dict) and x["type"] == "record"]
        if len(recs) > 1:
            return st.one_of(
                [_strategy(r, named, ns, depth).map(lambda d, r=r: (_full(r["name"], ns), d)) for r in recs]
            )
        return st.one_of([_strategy(x, named, ns, depth) for x in t])
    kind = t["type"]
    if kind == "record":
        return st.fixed_dictionaries(
            {f["name"]: _strategy(f["type"], named, t.get("namespace", ns), depth) for f in t["fields"]}
        )
    if kind == "array":
        return st.lists(_strategy(t["items"], named, ns, depth), max_size=0 if depth > 2 else 2)
    return _strategy(kind, named, ns, depth)


def _full(name: str, ns: str | None) -> str:
    return name if "." in name or not ns else f"{ns}.{name}"


def _collect_named(t: Any, ns: str | None, named: dict[str, Any]) -> None:
    if isinstance(t, list):
        for x in t:
            _collect_named(x, ns, named)
    elif isinstance(t, dict):
        if t["type"] == "record":
            sub_ns = t.get("namespace", ns)
            named[_full(t["name"], sub_ns)] = t
            for f in t["fields"]:
                _collect_named(f["type"], sub_ns, named)
        elif t["type"] == "array":
            _collect_named(t["items"], ns, named)


_PATCH_SCHEMA = json.loads(
    max(codec.AVRO_DIR.glob("patch.v*.avsc"), key=lambda p: int(p.stem.split(".v")[1])).read_text()
)
_NAMED: dict[str, Any] = {}
_collect_named(_PATCH_SCHEMA, _PATCH_SCHEMA.get("namespace"), _NAMED)
PATCH_DATUMS = _strategy(_PATCH_SCHEMA, _NAMED, _PATCH_SCHEMA.get("namespace"))


def _fastavro_body(datum: Any) -> bytes:
    import io

    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.current_writer().parsed, datum)
    return buf.getvalue()


def _fastavro_read(data: bytes) -> Any:
    """The reference decode: fastavro, then the trailing-bytes check."""
    import io

    import fastavro

    buf = io.BytesIO(data)
    buf.seek(codec.HEADER_LEN)
    datum = fastavro.schemaless_reader(buf, codec.current_writer().parsed, None)
    if buf.tell() != len(data):
        raise ValueError("trailing bytes")
    return datum


def _named_branches_to_plain(datum: Any) -> Any:
    """fastavro reads a union of records back as the record alone."""
    if isinstance(datum, tuple):
        return _named_branches_to_plain(datum[1])
    if isinstance(datum, dict):
        return {k: _named_branches_to_plain(v) for k, v in datum.items()}
    if isinstance(datum, list):
        return [_named_branches_to_plain(v) for v in datum]
    return datum


def _nan_safe(datum: Any) -> Any:
    if isinstance(datum, float) and datum != datum:
        return "NaN"
    if isinstance(datum, dict):
        return {k: _nan_safe(v) for k, v in datum.items()}
    if isinstance(datum, list):
        return [_nan_safe(v) for v in datum]
    return datum


def test_the_generated_codec_is_used_for_the_current_schema() -> None:
    w = codec.current_writer()
    assert w.read is not None and w.write is not None


@settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(datum=PATCH_DATUMS)
def test_generated_writer_and_reader_match_fastavro_on_any_datum(datum: Any) -> None:
    w = codec.current_writer()
    ours = codec.encode_datum(datum, w)
    assert ours[codec.HEADER_LEN :] == _fastavro_body(datum)  # the same bytes
    back, end = w.read(ours, codec.HEADER_LEN)  # type: ignore[misc]
    assert end == len(ours)
    assert back == _fastavro_read(ours) == _named_branches_to_plain(datum)


@settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    datum=PATCH_DATUMS,
    cut=st.integers(0, 10_000),
    pos=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    how=st.sampled_from(["truncate", "flip", "append"]),
)
def test_a_damaged_record_is_refused_whenever_fastavro_refuses_it(
    datum: Any, cut: int, pos: int, byte: int, how: str
) -> None:
    """decode_raw with the generated reader against the fastavro reference on damaged
    bytes: what fastavro refuses is refused (a typed DecodeError); what both read is equal."""
    data = bytearray(codec.encode_datum(datum, codec.current_writer()))
    body = len(data) - codec.HEADER_LEN
    if how == "truncate":
        del data[codec.HEADER_LEN + cut % (body + 1) :]
    elif how == "flip" and body:
        data[codec.HEADER_LEN + pos % body] = byte
    else:
        data.append(byte)
    raw = bytes(data)
    try:
        want = _fastavro_read(raw)
    except Exception:
        with pytest.raises(DecodeError) as e:
            codec.decode_raw(raw)
        assert e.value.reason == "corrupt_record"
        return
    try:
        got = codec.decode_raw(raw)
    except DecodeError as e:
        # Stricter than fastavro only where the Avro spec is broken (a long takes at most
        # 10 bytes; fastavro reads longer varints, wrapping) or where fastavro's datum is
        # not a patch anyway.
        assert e.reason == "corrupt_record"
        if "varint longer than 10 bytes" not in str(e):
            with pytest.raises(Exception):
                from runstate.schemas.patch import Patch

                Patch.model_validate(want)
        return
    assert _nan_safe(got) == _nan_safe(want)  # a flipped double may read as NaN, which != itself


# --- the object writer: models written without model_dump, the same bytes ----------------------

import typing  # noqa: E402
from datetime import UTC, datetime, timedelta, timezone  # noqa: E402

import pydantic  # noqa: E402
from annotated_types import Ge  # noqa: E402

from runstate.schemas.events import EVENT_TYPES  # noqa: E402

_ZONES = [UTC, timezone(timedelta(hours=8)), timezone(-timedelta(hours=5, minutes=30))]


def _values(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of a model annotation that the models accept (mostly): drawn from the types
    themselves, so a field added to the models is covered without a change here."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        floor = max((m.ge for m in args[1:] if isinstance(m, Ge)), default=0)
        for m in args[1:]:
            for c in getattr(m, "metadata", []):
                if isinstance(c, Ge):
                    floor = max(floor, c.ge)
        if args[0] is int:
            return st.one_of(st.integers(floor, 70), st.integers(floor, 2**63 - 1))
        return _values(args[0], depth)
    if origin in (typing.Union, __import__("types").UnionType):
        return st.one_of([st.none() if a is type(None) else _values(a, depth) for a in args])
    if origin is list:
        return st.lists(_values(args[0], depth + 1), max_size=0 if depth > 2 else 2)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if tp is str:
        return st.text(st.characters(min_codepoint=32, exclude_categories=["Cs"]), min_size=1, max_size=70)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 2**63 - 1)
    if tp is float:
        return st.floats(0, 1)
    if tp is pydantic.AwareDatetime or tp is datetime:
        return st.datetimes(timezones=st.sampled_from(_ZONES))
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return _model(tp, depth + 1)
    raise TypeError(f"no strategy for {tp!r}")


def _model(model: type[pydantic.BaseModel], depth: int = 0) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(model, include_extras=True)
    required = {n: _values(hints[n], depth) for n, f in model.model_fields.items() if f.is_required()}
    optional = {n: _values(hints[n], depth) for n, f in model.model_fields.items() if not f.is_required()}

    def valid(fields: dict[str, Any]) -> Any:
        try:
            return model.model_validate(fields)
        except pydantic.ValidationError:
            return None  # a rule across fields: drawn again

    return st.fixed_dictionaries(required, optional=optional).map(valid).filter(lambda m: m is not None)


PATCHES = st.builds(
    Patch,
    patch_id=_values(str),
    run_id=_values(str),
    expected_revision=st.integers(0, 2**63 - 1),
    events=st.lists(st.one_of([_model(t) for t in EVENT_TYPES]), min_size=1, max_size=3),
    author=_model(Author_ := __import__("runstate.schemas.patch", fromlist=["Author"]).Author),
    created_at=_values(datetime),
    rebase=st.booleans(),
)


def test_the_object_writer_is_used_for_the_models_own_schemas() -> None:
    assert codec._object_writer(codec.current_writer(), "patch") is not None
    assert codec._object_writer(codec._decision_current(), "decision") is not None


@settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(p=PATCHES)
def test_models_written_directly_are_the_bytes_of_their_dump(p: Patch) -> None:
    """encode() writes the model's attributes; the reference dumps it to the JSON form and
    writes that dict. Any valid patch of any event types gives the same bytes, and reads
    back equal."""
    w = codec.current_writer()
    assert codec.encode(p) == codec._write_record(w, codec._to_avro_datum(p))
    assert codec.decode(codec.encode(p)) == p


@settings(max_examples=examples(100), deadline=None)
@given(d=_model(Decision))
def test_decisions_written_directly_are_the_bytes_of_their_dump(d: Decision) -> None:
    w = codec._decision_current()
    assert codec.encode_decision(d) == codec._write_record(w, d.model_dump(mode="json"))
    assert codec.decode_decision(codec.encode_decision(d)) == d


def test_an_object_writer_refuses_a_union_it_cannot_tell_apart_by_class_name() -> None:
    """Two records named X in two namespaces: a class name cannot pick the branch, so there
    is no object writer (the codec then writes dicts)."""
    from runstate.schemas import avrofast

    def rec(ns: str) -> dict[str, Any]:
        return {"type": "record", "name": "X", "namespace": ns, "fields": [{"name": "v", "type": "long"}]}

    schema = {"type": "record", "name": "Top", "fields": [{"name": "u", "type": [rec("a"), rec("b")]}]}
    with pytest.raises(NotImplementedError):
        avrofast.compile_object_writer(schema, records=(pydantic.BaseModel,), strings=(), scalar=str)
    avrofast.compile_schema(schema)  # the dict writer names the branch: no ambiguity


@pytest.mark.parametrize("length", [0, 63, 64, 300, 20_000])
def test_a_record_that_holds_itself_and_long_strings_read_as_fastavro_reads_them(length: int) -> None:
    """The generated reader reads a record's fields in place, but a record inside itself
    by a call (else generating its reader would never end); lengths from 64 bytes on take
    more than one byte, read by the general varint reader."""
    import io

    import fastavro

    from runstate.schemas import avrofast

    schema = {
        "type": "record",
        "name": "Node",
        "fields": [
            {"name": "label", "type": "string"},
            {"name": "next", "type": ["null", "Node"]},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    datum = {
        "label": "é" * length,
        "next": {"label": "x", "next": {"label": "y" * length, "next": None, "tags": []}, "tags": ["t" * length]},
        "tags": ["a", "b" * 70],
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    read, write = avrofast.compile_schema(schema)
    assert read(buf.getvalue(), 0) == (datum, len(buf.getvalue()))
    out = bytearray()
    write(out, datum)
    assert bytes(out) == buf.getvalue()
    with pytest.raises((avrofast.AvroError, IndexError)):
        read(buf.getvalue()[: len(buf.getvalue()) // 2], 0)  # cut short: a string runs past the end


def test_prepare_generates_the_current_reader_that_reading_then_uses() -> None:
    """codec.prepare (what a projector calls before joining its group) makes the current
    schema's reader, once; the first record read afterwards uses it, compiling nothing."""
    import subprocess
    import sys

    code = r"""
from runstate.schemas import avrofast, codec
print("before:", codec._current_reader is None)
codec.prepare()
made = codec._current_reader
codec.prepare()
print("made once:", made is not None and codec._current_reader is made)
compiled = []
real = avrofast.compile_schema
avrofast.compile_schema = lambda schema: compiled.append(schema) or real(schema)
from runstate.schemas.patch import Patch
patch = Patch.model_validate({"run_id": "r", "patch_id": "p", "expected_revision": 0,
                              "created_at": "2026-12-04T10:00:00Z", "author": {"agent_id": "a", "agent_version": "1"},
                              "events": [{"type": "RunStarted", "goal": {"statement": "g"}}]})
print("read:", codec.read_patch(codec.encode(patch)).run_id, "compiled:", len(compiled))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before: True", "made once: True", "read: r compiled: 0"]


def test_records_written_before_the_spec_byte_order_still_decode() -> None:
    """runstate 0.1.0 wrote the fingerprint byte-reversed (big-endian). Those records, as
    that code wrote them for every published schema, still decode to what was written;
    what runstate writes now carries the spec's little-endian order."""
    legacy = json.loads((TESTS / "data" / "avro_pre_spec_order.json").read_text())["records"]
    # every schema published before the fix (a later one never had records in that order)
    assert {(r["kind"], r["version"]) for r in legacy} == {("patch", 1), ("patch", 2), ("patch", 3), ("decision", 1)}
    for r in legacy:
        data = bytes.fromhex(r["hex"])
        if r["kind"] == "patch":
            w = next(w for w in codec.published().values() if w.version == r["version"])
            assert data[2:10] == w.fingerprint[::-1] != w.fingerprint
            assert codec.decode(data) == Patch.model_validate(r["value"])
            assert codec.encode(Patch.model_validate(r["value"]), writer=w)[2:10] == w.fingerprint
        else:
            assert codec.decode_decision(data) == Decision.model_validate(r["value"])


def test_the_fingerprint_is_the_spec_s_crc_64_avro_little_endian() -> None:
    """The Avro spec's CRC-64-AVRO of a schema's parsing canonical form, computed here from
    the spec's own algorithm, written least significant byte first."""
    from fastavro.schema import to_parsing_canonical_form

    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    for w in [*codec.published().values(), *codec.published("decision").values()]:
        fp = empty
        for byte in to_parsing_canonical_form(w.parsed).encode():
            fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
        assert w.fingerprint == fp.to_bytes(8, "little")


def test_the_state_s_header_fields_are_the_summary_s() -> None:
    """``RunState`` declares the header's fields beside its collections (its JSON keeps the
    document's order); they are ``RunSummary``'s, in its order: a field added to one is added
    to the other, or this fails."""
    from typing import get_origin

    from runstate.schemas.state import RunState, RunSummary

    collections = {n for n, f in RunState.model_fields.items() if get_origin(f.annotation) is list}
    header = [n for n in RunState.model_fields if n not in collections or n in RunSummary.model_fields]
    assert header == list(RunSummary.model_fields)
