"""The log codec: every log record is an Avro single-object encoded :class:`Patch`.

Wire format (Avro specification, "single object encoding")::

    C3 01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema | Avro binary

The fingerprint names the *writer* schema; the reader decodes with Avro schema
resolution from that writer schema to the current one, then applies upcasters for
changes of meaning. Records are byte-for-byte what Apache Avro's Java
``BinaryMessageEncoder`` writes (tests/schemas/test_interop_java.py runs it).

runstate 0.1.0 wrote the fingerprint byte-reversed. Such records are still read: a
published schema is also looked up under its reversed fingerprint (:data:`LEGACY_ORDER`),
which can be told apart because no two published schemas share either form (checked when
the registry loads). Nothing writes that order any more. Every published version lives in
``schemas/avro/patch.vN.avsc`` and is never edited: a change to the models is published as a new version
(``python -m runstate.schemas.codec --publish``), and a test fails while the models and the latest
published schema differ.

The Avro schema is derived from the pydantic models (one source of truth); datetimes are
ISO-8601 strings so that the author's UTC offset survives the round trip.
"""

from __future__ import annotations

import io
import hashlib
import json
import sys
import types
import typing
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import fastavro
import msgspec
import pydantic
import pydantic_core
from fastavro.schema import fingerprint, to_parsing_canonical_form
from pydantic import BaseModel

from runstate.schemas import avrofast, structs
from runstate.schemas.errors import ContractError, DecodeError, describe_validation_error
from runstate.schemas.generated.structs import Patch as PatchStruct
from runstate.schemas.patch import Decision, Patch

AVRO_DIR = Path(__file__).parent / "avro"
NAMESPACE = "runstate.v"
MAGIC = b"\xc3\x01"
HEADER_LEN = 10

# --- schema derivation from the models ----------------------------------------------------


def _avro_type(tp: Any, defined: set[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _avro_type(typing.get_args(tp)[0], defined)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return ["null", _avro_type(args[0], defined)]
        if all(isinstance(a, type) and issubclass(a, BaseModel) for a in args):
            return [_avro_record(a, defined) for a in args]  # the events union
        raise TypeError(f"unsupported union {tp!r}")
    if origin is list:
        return {"type": "array", "items": _avro_type(typing.get_args(tp)[0], defined)}
    if origin is typing.Literal:
        return "string"
    if tp is str:
        return "string"
    if tp is bool:
        return "boolean"
    if tp is int:
        return "long"
    if tp is float:
        return "double"
    if isinstance(tp, type) and issubclass(tp, datetime):
        return "string"
    if tp is pydantic.AwareDatetime:
        return "string"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _avro_record(tp, defined)
    raise TypeError(f"no Avro mapping for {tp!r}")


def _avro_record(model: type[BaseModel], defined: set[str]) -> Any:
    name = f"{NAMESPACE}.{model.__name__}"
    if name in defined:
        return name
    defined.add(name)
    fields = []
    hints = typing.get_type_hints(model, include_extras=True)
    for fname, info in model.model_fields.items():
        ftype = _avro_type(hints[fname], defined)
        field: dict[str, Any] = {"name": fname, "type": ftype}
        if not info.is_required():
            default = info.get_default(call_default_factory=True)
            if isinstance(default, BaseModel):
                default = default.model_dump(mode="json")
            if default is not None and isinstance(ftype, list):
                # Avro: a union's default must match its first branch.
                field["type"] = [ftype[1], "null"]
            field["default"] = default
        fields.append(field)
    return {"type": "record", "name": name, "fields": fields}


def derive_patch_schema() -> dict[str, Any]:
    """The Avro schema of :class:`Patch` as the current models define it."""
    return _avro_record(Patch, set())  # type: ignore[no-any-return]


def derive_decision_schema() -> dict[str, Any]:
    """The Avro schema of :class:`Decision` (the decisions topic) as the models define it."""
    return _avro_record(Decision, set())  # type: ignore[no-any-return]


#: A record whose content is encrypted with its run's key (schemas/sealed.py): what audit and
#: routing need stays readable (the run, and for a patch its envelope), the rest is AES-GCM
#: ciphertext of the plain record. Written by hand: its fields are bytes, which the models
#: do not have.
SEALED_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": f"{NAMESPACE}.Sealed",
    "fields": [
        {"name": "run_id", "type": "string"},
        {"name": "kid", "type": "string"},
        {"name": "nonce", "type": "bytes"},
        {"name": "ciphertext", "type": "bytes"},
        {
            "name": "envelope",
            "default": None,
            "type": [
                "null",
                {
                    "type": "record",
                    "name": f"{NAMESPACE}.PatchEnvelope",
                    "fields": [
                        {"name": "patch_id", "type": "string"},
                        {"name": "expected_revision", "type": "long"},
                        {"name": "agent_id", "type": "string"},
                        {"name": "agent_version", "type": "string"},
                        {"name": "event_types", "type": {"type": "array", "items": "string"}},
                        {"name": "created_at", "type": "string"},
                        {"name": "rebase", "type": "boolean"},
                    ],
                },
            ],
        },
    ],
}


#: What each kind of record is derived from; ``<kind>.vN.avsc`` are its published versions.
KINDS: dict[str, Callable[[], dict[str, Any]]] = {
    "patch": derive_patch_schema,
    "decision": derive_decision_schema,
    "sealed": lambda: SEALED_SCHEMA,
}


# --- the registry of published writer schemas --------------------------------------------


class _Writer(typing.NamedTuple):
    version: int
    parsed: Any
    fingerprint: bytes
    #: the schema as published (None: fastavro only)
    schema: dict[str, Any] | None = None

    @property
    def read(self) -> avrofast.Reader | None:
        """The reader generated from this schema (schemas/avrofast.py); None: fastavro only."""
        return _compiled(self)[0]

    @property
    def write(self) -> avrofast.Writer | None:
        return _compiled(self)[1]


#: Generated codecs by fingerprint, compiled on first use: generating one takes long enough
#: to compile only the versions a process reads or writes without resolution.
_COMPILED: dict[bytes, tuple[avrofast.Reader | None, avrofast.Writer | None]] = {}


def _compiled(w: _Writer) -> tuple[avrofast.Reader | None, avrofast.Writer | None]:
    if w.schema is None:
        return (None, None)
    got = _COMPILED.get(w.fingerprint)
    if got is None:
        try:
            got = avrofast.compile_schema(w.schema)
        except NotImplementedError:
            got = (None, None)
        _COMPILED[w.fingerprint] = got
    return got


#: Generated writers of the models themselves (no dump to dicts first), by fingerprint.
_OBJECT_WRITERS: dict[bytes, avrofast.Writer | None] = {}


def _object_writer(w: _Writer, kind: str) -> avrofast.Writer | None:
    """The generated writer that reads a model's attributes, when ``w`` is the schema the
    current models derive (then every field it names is an attribute, and its bytes are
    those of the dict writer given ``model_dump(mode="json")``: tested); else None."""
    if w.fingerprint in _OBJECT_WRITERS:
        return _OBJECT_WRITERS[w.fingerprint]
    got = None
    if w.schema is not None and w.fingerprint == _derived_fingerprint(kind):
        try:
            # A datetime is written as its JSON form, by the same serializer as model_dump.
            got = avrofast.compile_object_writer(
                w.schema, records=(BaseModel,), strings=(datetime,), scalar=pydantic_core.to_jsonable_python
            )
        except NotImplementedError:
            pass
    _OBJECT_WRITERS[w.fingerprint] = got
    return got


@lru_cache(maxsize=None)
def _derived_fingerprint(kind: str) -> bytes:
    return _fp(KINDS[kind]())


def _make_writer(version: int, schema: dict[str, Any], fp: bytes) -> _Writer:
    return _Writer(version, fastavro.parse_schema(schema), fp, schema)


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    """The spec's fingerprint of ``schema``: CRC-64-AVRO of its parsing canonical form,
    least significant byte first (fastavro's hex already lists the bytes in that order)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(fastavro.parse_schema(schema)), "CRC-64-AVRO"))


_fp = schema_fingerprint


#: Whether records whose fingerprint is byte-reversed (written by runstate 0.1.0) are read.
LEGACY_ORDER = True


def published(kind: str = "patch") -> dict[bytes, _Writer]:
    """Every published writer schema of ``kind``, by its 8-byte little-endian fingerprint
    (one registry per kind: ``published()`` and ``published("patch")`` are the same dict)."""
    return _published(kind)


@lru_cache(maxsize=len(KINDS))
def _legacy(kind: str) -> dict[bytes, _Writer]:
    """The published writers of ``kind`` by their byte-reversed fingerprint (runstate 0.1.0's
    order). Raises RuntimeError if a reversed fingerprint equals a published one (then the
    two orders could not be told apart)."""
    writers = published(kind)
    out = {fp[::-1]: w for fp, w in writers.items()}
    if clash := out.keys() & writers.keys():
        raise RuntimeError(f"a reversed fingerprint equals a published one: {sorted(f.hex() for f in clash)}")
    return out


@lru_cache(maxsize=len(KINDS))
def _published(kind: str) -> dict[bytes, _Writer]:
    out: dict[bytes, _Writer] = {}
    for path in sorted(AVRO_DIR.glob(f"{kind}.v*.avsc")):
        version = int(path.stem.split(".v")[1])
        schema = json.loads(path.read_text())
        fp = _fp(schema)
        out[fp] = _make_writer(version, schema, fp)
    if not out:
        raise RuntimeError(f"no published Avro schema in {AVRO_DIR}")
    return out


_current: _Writer | None = None


def current_writer() -> _Writer:
    """The newest published writer schema (what this code writes)."""
    global _current
    if _current is None:
        _current = max(published().values(), key=lambda w: w.version)
    return _current


#: Upcasters for changes of meaning: ``UPCASTERS[v]`` turns a decoded version-``v`` record
#: (already resolved to the current Avro shape) into version ``v+1``'s meaning.
def _inputs_from_writers(datum: dict[str, Any]) -> dict[str, Any]:
    """v5 → v6: a run's policy gained ``input_authority``, whose default (only an origin's
    channel records its inputs) is stricter than what any writer could do before; a run
    started by an older record keeps the rule it was started under."""
    for event in datum.get("events") or ():
        policy = event.get("policy") if isinstance(event, dict) else None
        if isinstance(policy, dict):
            policy["input_authority"] = "writers"
    return datum


UPCASTERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {5: _inputs_from_writers}


def register_writer_schema(schema: dict[str, Any], version: int) -> bytes:
    """Register an extra writer schema (tests, tools reading foreign versions). Returns its
    fingerprint."""
    global _current, _current_encoder, _current_reader
    fp = _fp(schema)
    published()[fp] = _make_writer(version, schema, fp)
    _legacy.cache_clear()
    _current = None
    _current_encoder = None
    _current_reader = None
    return fp


# --- encode / decode ---------------------------------------------------------------------


def _to_avro_datum(patch: Patch) -> dict[str, Any]:
    d = patch.model_dump(mode="json")
    # Name the union branch, so that fastavro does not have to guess it (its slowest path).
    d["events"] = [(f"{NAMESPACE}.{e['type']}", e) for e in d["events"]]
    return d


def _frame(w: _Writer, write: avrofast.Writer, value: Any) -> bytes:
    """Magic, fingerprint, then the body ``write`` makes of ``value``."""
    out = bytearray(MAGIC)
    out += w.fingerprint
    write(out, value)
    return bytes(out)


def _write_model(w: _Writer, kind: str, model: BaseModel, to_datum: Callable[[Any], Any]) -> bytes:
    """A model's record: written from its attributes when ``w`` is the schema the models
    derive (:func:`_object_writer`), else ``to_datum(model)`` by :func:`_write_record`."""
    write = _object_writer(w, kind)
    return _write_record(w, to_datum(model)) if write is None else _frame(w, write, model)


def _write_record(w: _Writer, datum: Any) -> bytes:
    """A single-object record: magic, fingerprint, body (the generated writer when there is
    one, else fastavro; the bytes are the same)."""
    if w.write is not None:
        return _frame(w, w.write, datum)
    buf = io.BytesIO()
    buf.write(MAGIC)
    buf.write(w.fingerprint)
    fastavro.schemaless_writer(buf, w.parsed, datum)
    return buf.getvalue()


def _read_record(data: bytes, writer: _Writer, reader: _Writer | None) -> Any:
    """The body of a framed record as written by ``writer``, resolved to ``reader`` (None:
    the same schema, read by the generated reader). Raises :class:`DecodeError`
    (``corrupt_record``: undecodable or trailing bytes)."""
    read = writer.read if reader is None else None
    if read is not None:
        return _read_body(data, read)
    try:
        buf = io.BytesIO(data)
        buf.seek(HEADER_LEN)
        datum = fastavro.schemaless_reader(buf, writer.parsed, None if reader is None else reader.parsed)
        end = buf.tell()
    except Exception as e:  # garbage raises many types (IndexError, EOFError, UnicodeDecodeError...): all "corrupt"
        raise DecodeError("corrupt_record", detail=f"{type(e).__name__}: {e}") from e
    if end != len(data):
        raise DecodeError("corrupt_record", detail=f"{len(data) - end} trailing bytes")
    return datum


def _read_body(data: bytes, read: avrofast.Reader) -> Any:
    """The body of a framed record read by a generated reader (see :func:`_read_record`)."""
    try:
        datum, end = read(data, HEADER_LEN)
    except Exception as e:  # garbage raises many types (IndexError, EOFError, UnicodeDecodeError...): all "corrupt"
        raise DecodeError("corrupt_record", detail=f"{type(e).__name__}: {e}") from e
    if end != len(data):
        raise DecodeError("corrupt_record", detail=f"{len(data) - end} trailing bytes")
    return datum


#: The current schema's frame header (magic + fingerprint) and its generated reader, made
#: once: nearly every record is written with it, so finding its writer per record (the
#: registry, the compiled-codec cache) is skipped on the hot path.
_current_reader: tuple[bytes, avrofast.Reader] | None = None


def _make_current_reader() -> tuple[bytes, avrofast.Reader] | None:
    global _current_reader
    w = current_writer()
    read = w.read
    _current_reader = None if read is None else (MAGIC + w.fingerprint, read)
    return _current_reader


def prepare(*, writer: bool = False) -> None:
    """Generate the current schema's reader (with ``writer``, its writer too) now rather than
    when the first record is read or written: a projector calls it before it joins its
    group, a server before it accepts a connection, so that neither its first batch nor its
    first request waits for it (idempotent)."""
    if _current_reader is None:
        _make_current_reader()
        # msgspec builds a struct type's information on its first use (every event type's,
        # for a patch); a decoder made now builds it, and read_patch's conversion reuses it.
        msgspec.json.Decoder(PatchStruct)
    if writer and _current_encoder is None:
        _make_current_encoder()


#: :func:`encode`'s writer of the current schema, made once (every producer's hot path:
#: resolving the writer per patch was a third of the encoding's own cost).
_current_encoder: Callable[[Patch], bytes] | None = None


def _make_current_encoder() -> Callable[[Patch], bytes]:
    global _current_encoder
    w = current_writer()
    write = _object_writer(w, "patch")
    enc: Callable[[Patch], bytes] = (
        partial(_write_model, w, "patch", to_datum=_to_avro_datum) if write is None else partial(_frame, w, write)
    )
    _current_encoder = enc
    return enc


def encode(patch: Patch, writer: _Writer | None = None) -> bytes:
    """Encode a validated patch as one single-object Avro record with the current schema
    (or with ``writer``).

    Raises :class:`ContractError` for a string that UTF-8 cannot encode (a lone surrogate)."""
    try:
        if writer is None:
            return (_current_encoder or _make_current_encoder())(patch)
        return _write_model(writer, "patch", patch, _to_avro_datum)
    except UnicodeEncodeError as e:
        raise ContractError(
            f"patch {patch.patch_id} of run {patch.run_id!r} holds a string that UTF-8 cannot encode: "
            f"{e.reason} at {e.start}",
            field=None,
        ) from e


def writer_of(data: bytes) -> _Writer:
    """The published writer schema a patch record was written with. Raises
    :class:`DecodeError` (``not_avro_single_object``, ``unknown_writer_schema``)."""
    return _framed(data, "patch")


def encode_datum(datum: dict[str, Any], writer: _Writer) -> bytes:
    """Encode a raw datum with a given writer (for tests of schema evolution)."""
    return _write_record(writer, datum)


def _framed(data: bytes, kind: str) -> _Writer:
    """The published writer of a single-object record of ``kind``.
    Raises :class:`DecodeError` (``not_avro_single_object``, ``unknown_writer_schema``)."""
    if len(data) >= 5 and data[:1] == b"\x00" and data[:2] != MAGIC:
        raise DecodeError(
            "not_avro_single_object",
            detail=f"{len(data)} bytes starting as the Confluent Schema Registry's framing does (00 + schema id "
            f"{int.from_bytes(data[1:5], 'big')}): no registry configured (RUNSTATE_SCHEMA_REGISTRY_URL), or not "
            "one of runstate's schemas there",
        )
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        raise DecodeError("not_avro_single_object", detail=f"{len(data)} bytes, header {data[:2].hex() or 'empty'}")
    fp = bytes(data[2:HEADER_LEN])
    writer = published(kind).get(fp)
    if writer is None and LEGACY_ORDER:
        writer = _legacy(kind).get(fp)
    if writer is None:
        raise DecodeError("unknown_writer_schema", detail=f"fingerprint {fp.hex()} (little-endian)")
    return writer


def decode_raw(data: bytes) -> dict[str, Any]:
    """Decode a record into the current Avro shape (a dict) without validating it.

    Raises :class:`DecodeError` with reason ``not_avro_single_object``,
    ``unknown_writer_schema`` or ``corrupt_record``.
    """
    fast = _current_reader or _make_current_reader()
    if fast is not None and data[:HEADER_LEN] == fast[0]:
        return _read_body(data, fast[1])  # type: ignore[no-any-return]
    writer = _framed(data, "patch")
    current = current_writer()
    if writer.fingerprint == current.fingerprint:
        return _read_record(data, writer, None)  # type: ignore[no-any-return]
    datum = _read_record(data, writer, current)
    for v in range(writer.version, current.version):
        if v in UPCASTERS:
            datum = UPCASTERS[v](datum)
    return datum  # type: ignore[no-any-return]


def decode(data: bytes) -> Patch:
    """Decode and validate one log record. Raises :class:`DecodeError` (reason
    ``invalid_patch`` when the record decodes but is not a valid patch)."""
    return _validated(decode_raw(data))


def _validated(datum: dict[str, Any]) -> Patch:
    try:
        return Patch.model_validate(datum)
    except pydantic.ValidationError as e:
        raise DecodeError("invalid_patch", detail=describe_validation_error(e)[1]) from e


_convert = msgspec.convert
#: What the projector's core reads a patch into: the struct generated from :class:`Patch`
#: (schemas/structs.py), with the model's fields and their structs. The type checker is
#: told it is the model, as for the working header.
_finer_than_micros = structs.FINER_THAN_MICROS.search


def content_digest(value: bytes) -> str:
    """What identifies a patch's content: blake2b-128 of its log record (its encoded bytes)."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


def read_patch(data: bytes) -> PatchStruct:
    """:func:`decode` for the projector's core: the same patch, accepted and refused as
    :func:`decode` accepts and refuses it, always as the struct of :class:`Patch` (the
    core's one form). msgspec validates it (about twice as fast as pydantic); only where
    msgspec refuses a patch, or might read it differently (a time finer than a
    microsecond, anywhere in the record), does the model decide, and its values become the
    struct: pydantic takes a few forms msgspec does not (a time without a ``T``, say);
    ``tests/schemas/test_structs.py`` holds the two equal on any record. Raises
    :class:`DecodeError` as :func:`decode` does."""
    datum = decode_raw(data)
    if _finer_than_micros(data) is None:
        try:
            return _convert(datum, PatchStruct)
        except msgspec.ValidationError:
            pass
    # The model's values (its datetimes as they are) made the struct: msgspec takes them as
    # given, and the events union is tagged by ``type`` as in the model's dump.
    return _convert(_validated(datum).model_dump(), PatchStruct)  # type: ignore[no-any-return]


def _publish(kind: str) -> None:
    """Write ``<kind>.vN.avsc`` for the schema the code derives, unless it is published."""
    current = KINDS[kind]()
    existing = published(kind) if any(AVRO_DIR.glob(f"{kind}.v*.avsc")) else {}
    if _fp(current) in existing:
        print(f"{kind}: the code's schema is published as v{existing[_fp(current)].version}; nothing to publish")
        return
    version = max((w.version for w in existing.values()), default=0) + 1
    path = AVRO_DIR / f"{kind}.v{version}.avsc"
    path.write_text(json.dumps(current, indent=1) + "\n")
    print(f"published {path}")


# --- the decisions topic -------------------------------------------------------------------


@lru_cache(maxsize=1)
def _decision_current() -> _Writer:
    return max(published("decision").values(), key=lambda w: w.version)


def encode_decision(decision: Decision) -> bytes:
    """One decision (the model, or the core's struct of it) as an Avro single-object record
    (the decisions topic's value)."""
    return _write_model(
        _decision_current(), "decision", structs.to_model(decision), lambda d: d.model_dump(mode="json")
    )


def decode_decision(data: bytes) -> Decision:
    """Decode a decisions-topic record (any published writer version). Raises
    :class:`DecodeError`."""
    writer = _framed(data, "decision")
    current = _decision_current()
    datum = _read_record(data, writer, None if writer is current else current)
    try:
        return Decision.model_validate(datum)
    except pydantic.ValidationError as e:
        raise DecodeError("invalid_patch", detail=describe_validation_error(e)[1]) from e


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    if sys.argv[1:] == ["--publish"]:
        for kind in KINDS:
            _publish(kind)
    else:
        print(json.dumps(derive_patch_schema(), indent=1))
