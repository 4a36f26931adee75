"""Avro binary reader and writer compiled from a published schema into straight-line Python.

Why: fastavro's ``schemaless_reader``/``writer`` walk the parsed schema on every call (a
dispatch per field, union resolution, a file-like object), the largest single cost on the
producer and a large one of the projector's. Generated code for one schema reads the bytes
with no dispatch.

One source of truth: the code is generated from the published ``.avsc`` (the contract
other languages read), at first use; nothing here restates a field. Scope: the types our
schemas use — null, boolean, long, double, string, records (and references to named
records), arrays and unions. :func:`compile_schema` raises ``NotImplementedError`` for
anything else, and the codec then keeps fastavro. Readers decode only the schema they
were compiled for (no resolution: older writers go through fastavro with the reader
schema). ``tests/schemas/test_schemas.py`` checks these readers and writers against fastavro:
the same bytes for every datum, the same datum for every valid record, an error whenever
fastavro refuses a damaged record.

Two writers per schema: :func:`compile_schema`'s writes the dicts ``model_dump(mode="json")``
gives (any writer schema, as fastavro would), :func:`compile_object_writer`'s reads a
validated model's attributes directly, skipping the dump (half the cost of ``encode``); the
codec uses it only for the schema the current models derive, and a test holds its bytes to
the dict writer's for any valid patch and decision. Generated code keeps per-call work
flat: a field is read once into a local, a long under 64 and a string shorter than 64
bytes are written inline, and a union of records picks its branch by one dict or tuple
lookup rather than a chain of tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[bytearray, Any], None]

_unpack_double = struct.Struct("<d").unpack_from
_pack_double = struct.Struct("<d").pack


class AvroError(ValueError):
    """A record that does not decode with the schema (truncated, bad union index, ...)."""


def _read_long(b: bytes, p: int) -> tuple[int, int]:
    n = b[p]
    p += 1
    if n < 0x80:
        return (n >> 1) ^ -(n & 1), p
    acc = n & 0x7F
    shift = 7
    while True:
        n = b[p]
        p += 1
        acc |= (n & 0x7F) << shift
        if n < 0x80:
            acc &= 0xFFFFFFFFFFFFFFFF  # a long is 64 bits: bits past them wrap, as in fastavro's C reader
            return (acc >> 1) ^ -(acc & 1), p
        shift += 7
        if shift > 63:
            raise AvroError("varint longer than 10 bytes")


def _read_bytes(b: bytes, p: int) -> tuple[bytes, int]:
    n, p = _read_long(b, p)
    end = p + n
    if n < 0 or end > len(b):
        raise AvroError(f"bytes of length {n} run past the record")
    return bytes(b[p:end]), end


def _read_string(b: bytes, p: int) -> tuple[str, int]:
    n = b[p]
    if n < 0x80:  # a length under 64: one byte, no second call (most strings)
        n = (n >> 1) ^ -(n & 1)
        p += 1
    else:
        n, p = _read_long(b, p)
    end = p + n
    if n < 0 or end > len(b):
        raise AvroError(f"string of {n} bytes runs past the record")
    return b[p:end].decode(), end


def _read_double(b: bytes, p: int) -> tuple[float, int]:
    if p + 8 > len(b):
        raise AvroError("double runs past the record")
    return _unpack_double(b, p)[0], p + 8


def _read_boolean(b: bytes, p: int) -> tuple[bool, int]:
    return b[p] != 0, p + 1  # as fastavro: any non-zero byte is true


def _write_long(out: bytearray, n: int) -> None:
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


_PRIMITIVE_READERS = {
    "long": "_read_long",
    "int": "_read_long",
    "string": "_read_string",
    "double": "_read_double",
    "boolean": "_read_boolean",
    "bytes": "_read_bytes",
}


def _qualify(name: str, namespace: str | None) -> str:
    """A name's full name (Avro: a dotted name is full already)."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _namespace_of(full: str) -> str | None:
    return full.rsplit(".", 1)[0] if "." in full else None


class _Compiler:
    def __init__(self, objects: bool = False) -> None:
        self.named: dict[str, dict[str, Any]] = {}
        self.lines: list[str] = []
        self.after: list[str] = []
        self.n = 0
        self.tables = 0
        #: writers of objects (attributes) rather than of dicts
        self.objects = objects
        #: the records whose reader is being generated, outermost first: a record read
        #: inside itself (a recursive schema) is read by a call, not in place
        self.reading: list[str] = []

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    @staticmethod
    def fullname(schema: dict[str, Any], namespace: str | None) -> str:
        return _qualify(str(schema["name"]), schema.get("namespace", namespace))

    def collect(self, t: Any, namespace: str | None) -> None:
        """Register every named record (definitions come before their references)."""
        if isinstance(t, list):
            for x in t:
                self.collect(x, namespace)
        elif isinstance(t, dict):
            kind = t["type"]
            if kind == "record":
                full = self.fullname(t, namespace)
                self.named[full] = t
                for f in t["fields"]:
                    self.collect(f["type"], _namespace_of(full))
            elif kind == "array":
                self.collect(t["items"], namespace)
            elif isinstance(kind, (dict, list)):
                self.collect(kind, namespace)
            elif kind not in _PRIMITIVE_READERS and kind != "null" or "logicalType" in t:
                raise NotImplementedError(f"avrofast does not compile {kind!r}")

    def resolve(self, t: Any, namespace: str | None) -> Any:
        if isinstance(t, str) and t not in _PRIMITIVE_READERS and t != "null":
            full = _qualify(t, namespace)
            if full not in self.named:
                raise NotImplementedError(f"unknown named type {t!r}")
            return full
        if isinstance(t, dict) and t["type"] == "record":
            return self.fullname(t, namespace)
        if (
            isinstance(t, dict)
            and isinstance(t["type"], str)
            and (t["type"] in _PRIMITIVE_READERS or t["type"] == "null")
        ):
            return t["type"]
        return t

    @staticmethod
    def fn(full: str, prefix: str) -> str:
        return prefix + full.replace(".", "_")

    # -- reading ------------------------------------------------------------------------

    def read(self, t: Any, target: str, ind: str, ns: str | None) -> list[str]:
        t = self.resolve(t, ns)
        if t == "null":
            return [f"{ind}{target} = None"]
        if t in ("long", "int"):
            return self.read_long(target, ind)
        if t == "string" or t == "bytes":
            n = self.var()
            value = f"b[p:p + {n}].decode()" if t == "string" else f"bytes(b[p:p + {n}])"
            return [
                *self.read_long(n, ind),
                f"{ind}if {n} < 0 or p + {n} > len(b):",
                f"{ind}    raise AvroError('{t} of ' + str({n}) + ' bytes runs past the record')",
                f"{ind}{target} = {value}",
                f"{ind}p += {n}",
            ]
        if isinstance(t, str) and t in _PRIMITIVE_READERS:
            return [f"{ind}{target}, p = {_PRIMITIVE_READERS[t]}(b, p)"]
        if isinstance(t, str):  # a named record: its fields read in place, unless it holds itself
            if t in self.reading:
                return [f"{ind}{target}, p = {self.fn(t, 'r_')}(b, p)"]
            body, names = self.record_body(t, ind)
            return [*body, f"{ind}{target} = {{{', '.join(names)}}}"]
        if isinstance(t, list):
            i = self.var()
            out = self.read_long(i, ind)
            branches = [self.resolve(x, ns) for x in t]
            if len(branches) > 2 and all(isinstance(x, str) and x in self.named for x in branches):
                # One lookup instead of an elif per branch (30 event types).
                table = self.table("tuple", ", ".join(self.fn(x, "r_") for x in branches) + ",")
                return out + [
                    f"{ind}if not 0 <= {i} < {len(branches)}:",
                    f"{ind}    raise AvroError('union index ' + str({i}) + ' out of range')",
                    f"{ind}{target}, p = {table}[{i}](b, p)",
                ]
            for k, branch in enumerate(t):
                out.append(f"{ind}{'if' if k == 0 else 'elif'} {i} == {k}:")
                out += self.read(branch, target, ind + "    ", ns)
            out += [f"{ind}else:", f"{ind}    raise AvroError('union index ' + str({i}) + ' out of range')"]
            return out
        if t["type"] == "array":
            n, item = self.var(), self.var()
            out = [
                f"{ind}{target} = []",
                f"{ind}{n}, p = _read_long(b, p)",
                f"{ind}while {n}:",
                f"{ind}    if {n} < 0:",
                f"{ind}        {n} = -{n}",
                f"{ind}        _, p = _read_long(b, p)",
                f"{ind}    for _ in range({n}):",
            ]
            out += self.read(t["items"], item, ind + "        ", ns)
            out += [f"{ind}        {target}.append({item})", f"{ind}    {n}, p = _read_long(b, p)"]
            return out
        raise NotImplementedError(f"avrofast does not compile {t!r}")

    @staticmethod
    def read_long(target: str, ind: str) -> list[str]:
        """A long read inline: the common one-byte form (a value in -64..63: most lengths,
        union indexes and counts) without a call, the others by ``_read_long``."""
        return [
            f"{ind}{target} = b[p]",
            f"{ind}if {target} < 0x80:",
            f"{ind}    {target} = ({target} >> 1) ^ -({target} & 1)",
            f"{ind}    p += 1",
            f"{ind}else:",
            f"{ind}    {target}, p = _read_long(b, p)",
        ]

    def record_body(self, full: str, ind: str) -> tuple[list[str], list[str]]:
        """Lines reading the fields of record ``full`` into locals, and its dict's items."""
        self.reading.append(full)
        ns = _namespace_of(full)
        body, names = [], []
        for f in self.named[full]["fields"]:
            v = self.var()
            body += self.read(f["type"], v, ind, ns)
            names.append(f"{f['name']!r}: {v}")
        self.reading.pop()
        return body, names

    def reader_fn(self, full: str) -> None:
        body, names = self.record_body(full, "    ")
        self.lines += [f"def {self.fn(full, 'r_')}(b, p):", *body, f"    return {{{', '.join(names)}}}, p", ""]

    # -- writing ------------------------------------------------------------------------

    def table(self, kind: str, body: str) -> str:
        """A module-level table the generated functions look up (defined after them)."""
        self.tables += 1
        name = f"_table{self.tables}"
        self.after.append(f"{name} = {kind}(({body}))" if kind == "tuple" else f"{name} = {{{body}}}")
        return name

    def write(self, t: Any, expr: str, ind: str, ns: str | None) -> list[str]:
        """Lines writing ``expr`` (a local name: it may be read more than once)."""
        t = self.resolve(t, ns)
        if t == "null":
            return [f"{ind}if {expr} is not None:", f"{ind}    raise TypeError('expected null')"]
        if t in ("long", "int"):
            # Most longs are small and non-negative: one byte, no call.
            return [
                f"{ind}if type({expr}) is int and 0 <= {expr} < 64:",
                f"{ind}    out.append({expr} << 1)",
                f"{ind}else:",
                f"{ind}    _write_checked_long(out, {expr})",
            ]
        if t == "string":
            b = self.var()
            src = expr if not self.objects else f"({expr} if type({expr}) is str else _scalar({expr}))"
            return [
                f"{ind}{b} = {src}.encode()",
                f"{ind}if len({b}) < 64:",
                f"{ind}    out.append(len({b}) << 1)",
                f"{ind}else:",
                f"{ind}    _write_long(out, len({b}))",
                f"{ind}out += {b}",
            ]
        if t == "bytes":
            return [
                f"{ind}if not isinstance({expr}, (bytes, bytearray)):",
                f"{ind}    raise TypeError('expected bytes')",
                f"{ind}_write_long(out, len({expr}))",
                f"{ind}out += {expr}",
            ]
        if t == "double":
            return [f"{ind}out += _pack_double({expr})"]
        if t == "boolean":
            return [f"{ind}out.append(1 if _check_bool({expr}) else 0)"]
        if isinstance(t, str):
            return [f"{ind}{self.fn(t, 'w_')}(out, {expr})"]
        if isinstance(t, list):
            return self.write_union(t, expr, ind, ns)
        if t["type"] == "array":
            item = self.var()
            out = [f"{ind}if {expr}:", f"{ind}    _write_long(out, len({expr}))", f"{ind}    for {item} in {expr}:"]
            out += self.write(t["items"], item, ind + "        ", ns)
            out += [f"{ind}out.append(0)"]
            return out
        raise NotImplementedError(f"avrofast does not compile {t!r}")

    def write_union(self, t: list[Any], expr: str, ind: str, ns: str | None) -> list[str]:
        branches = [self.resolve(x, ns) for x in t]
        records = {b: k for k, b in enumerate(branches) if isinstance(b, str) and b in self.named}
        out: list[str] = []
        if len(records) > 1:
            if len(records) != len(branches):
                raise NotImplementedError("a union of several records and other types")
            # Dicts: (full name, datum) pairs, as fastavro's named-branch form, which the
            # codec always writes: nothing to guess. Objects: the branch is the record whose
            # name is the object's class name. One lookup gives the index and the writer.
            by = {
                (full if not self.objects else full.rsplit(".", 1)[-1]): (k, self.fn(full, "w_"))
                for full, k in records.items()
            }
            if len(by) != len(records):
                raise NotImplementedError("a union of records of the same name in other namespaces")
            table = self.table("dict", ", ".join(f"{key!r}: ({_zigzag_byte(k)}, {fn})" for key, (k, fn) in by.items()))
            key, datum = (f"type({expr}).__name__", expr) if self.objects else (f"{expr}[0]", f"{expr}[1]")
            k, fn = self.var(), self.var()
            return [f"{ind}{k}, {fn} = {table}[{key}]", f"{ind}out.append({k})", f"{ind}{fn}(out, {datum})"]
        first = True
        for k, b in enumerate(branches):
            test = _type_test(b, expr, self.named, self.objects)
            out.append(f"{ind}{'if' if first else 'elif'} {test}:")
            out.append(f"{ind}    out.append({_zigzag_byte(k)})")
            if b != "null":
                out += self.write(b, expr, ind + "    ", ns)
            first = False
        out += [f"{ind}else:", f"{ind}    raise TypeError('no branch of the union takes ' + type({expr}).__name__)"]
        return out

    def writer_fn(self, full: str) -> None:
        rec = self.named[full]
        ns = _namespace_of(full)
        body = []
        for f in rec["fields"]:
            v = self.var()
            body.append(f"    {v} = d.{f['name']}" if self.objects else f"    {v} = d[{f['name']!r}]")
            body += self.write(f["type"], v, "    ", ns)
        self.lines += [f"def {self.fn(full, 'w_')}(out, d):", *(body or ["    pass"]), ""]


def _zigzag_byte(k: int) -> int:
    if k > 63:
        raise NotImplementedError("unions of more than 64 branches")
    return k << 1


def _type_test(b: Any, expr: str, named: dict[str, Any], objects: bool = False) -> str:
    if b == "null":
        return f"{expr} is None"
    if b in ("long", "int"):
        return f"(type({expr}) is int)"
    if b == "double":
        return f"(type({expr}) is float or type({expr}) is int)"
    if b == "string":
        return f"isinstance({expr}, _strings)" if objects else f"isinstance({expr}, str)"
    if b == "boolean":
        return f"(type({expr}) is bool)"
    if b == "bytes":
        return f"isinstance({expr}, (bytes, bytearray))"
    if isinstance(b, str) and b in named:
        return f"isinstance({expr}, _records)" if objects else f"isinstance({expr}, dict)"
    if isinstance(b, dict) and b.get("type") == "array":
        return f"isinstance({expr}, (list, tuple))"
    raise NotImplementedError(f"union branch {b!r}")


def _write_checked_long(out: bytearray, v: Any) -> None:
    if type(v) is not int or not -(1 << 63) <= v < (1 << 63):
        raise TypeError(f"{v!r} is not an Avro long")
    _write_long(out, v)


def _check_bool(v: Any) -> bool:
    if type(v) is not bool:
        raise TypeError(f"{v!r} is not an Avro boolean")
    return v


def compile_schema(schema: dict[str, Any]) -> tuple[Reader, Writer]:
    """``(read(data, pos) -> (datum, pos), write(out: bytearray, datum))`` for a record
    schema. Raises ``NotImplementedError`` for types outside the scope above."""
    c = _compiler(schema, objects=False)
    for full in c.named:
        c.reader_fn(full)
        c.writer_fn(full)
    ns = _exec(c, schema, {})
    top = c.fullname(schema, None)
    return ns[c.fn(top, "r_")], ns[c.fn(top, "w_")]


def compile_object_writer(
    schema: dict[str, Any], *, records: tuple[type, ...], strings: tuple[type, ...], scalar: Callable[[Any], str]
) -> Writer:
    """A writer of objects rather than dicts, for the same schema and the same bytes: a
    record is an object whose attributes are its fields (an instance of one of
    ``records`` where a union must tell it apart), a union of records takes the record
    named as the object's class, and a string may also be one of ``strings``, written as
    ``scalar(value)`` (how the models' JSON form writes it: a datetime as ISO text).

    For writing validated models without dumping them to dicts first."""
    c = _compiler(schema, objects=True)
    for full in c.named:
        c.writer_fn(full)
    ns = _exec(c, schema, {"_records": records, "_strings": (str, *strings), "_scalar": scalar})
    return ns[c.fn(c.fullname(schema, None), "w_")]  # type: ignore[no-any-return]


def _compiler(schema: dict[str, Any], *, objects: bool) -> _Compiler:
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise NotImplementedError("a record schema is required")
    c = _Compiler(objects)
    c.collect(schema, None)
    return c


def _exec(c: _Compiler, schema: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    ns: dict[str, Any] = {
        "_read_long": _read_long,
        "_read_string": _read_string,
        "_read_double": _read_double,
        "_read_bytes": _read_bytes,
        "_read_boolean": _read_boolean,
        "_write_long": _write_long,
        "_write_checked_long": _write_checked_long,
        "_pack_double": _pack_double,
        "_check_bool": _check_bool,
        "AvroError": AvroError,
        **extra,
    }
    name = f"<avrofast {c.fullname(schema, None)}>"
    exec(compile("\n".join(c.lines + c.after), name, "exec"), ns)
    return ns
