"""Avro binary reader and writer compiled from a published schema into straight-line Python.

Why: fastavro's ``schemaless_reader``/``writer`` walk the parsed schema on every call (a
dispatch per field, union resolution, a file-like object): for a two-event patch that was
~11 µs to read and ~15 µs to write, the largest single cost on the producer and a seventh
of the projector's. Generated code for one schema reads the bytes with no dispatch.

One source of truth: the code is generated from the published ``.avsc`` (the contract
other languages read), at first use; nothing here restates a field. Scope: the types our
schemas use — null, boolean, long, double, string, records (and references to named
records), arrays and unions. :func:`compile_schema` raises ``NotImplementedError`` for
anything else, and the codec then keeps fastavro. Readers decode only the schema they
were compiled for (no resolution: older writers go through fastavro with the reader
schema). ``tests/test_schemas.py`` checks these readers and writers against fastavro:
the same bytes for every datum, the same datum for every valid record, an error whenever
fastavro refuses a damaged record.
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


def _read_string(b: bytes, p: int) -> tuple[str, int]:
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


def _write_string(out: bytearray, s: str) -> None:
    data = s.encode()
    _write_long(out, len(data))
    out += data


_PRIMITIVE_READERS = {"long": "_read_long", "int": "_read_long", "string": "_read_string",
                      "double": "_read_double", "boolean": "_read_boolean"}  # fmt: skip


def _qualify(name: str, namespace: str | None) -> str:
    """A name's full name (Avro: a dotted name is full already)."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _namespace_of(full: str) -> str | None:
    return full.rsplit(".", 1)[0] if "." in full else None


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, dict[str, Any]] = {}
        self.lines: list[str] = []
        self.n = 0
        self.tables = 0

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
        if isinstance(t, dict) and isinstance(t["type"], str) and (t["type"] in _PRIMITIVE_READERS or t["type"] == "null"):
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
        if isinstance(t, str) and t in _PRIMITIVE_READERS:
            return [f"{ind}{target}, p = {_PRIMITIVE_READERS[t]}(b, p)"]
        if isinstance(t, str):  # a named record
            return [f"{ind}{target}, p = {self.fn(t, 'r_')}(b, p)"]
        if isinstance(t, list):
            i = self.var()
            out = [f"{ind}{i}, p = _read_long(b, p)"]
            for k, branch in enumerate(t):
                out.append(f"{ind}{'if' if k == 0 else 'elif'} {i} == {k}:")
                out += self.read(branch, target, ind + "    ", ns)
            out += [f"{ind}else:", f"{ind}    raise AvroError('union index ' + str({i}) + ' out of range')"]
            return out
        if t["type"] == "array":
            n, item = self.var(), self.var()
            out = [f"{ind}{target} = []", f"{ind}{n}, p = _read_long(b, p)", f"{ind}while {n}:",
                   f"{ind}    if {n} < 0:", f"{ind}        {n} = -{n}", f"{ind}        _, p = _read_long(b, p)",
                   f"{ind}    for _ in range({n}):"]  # fmt: skip
            out += self.read(t["items"], item, ind + "        ", ns)
            out += [f"{ind}        {target}.append({item})", f"{ind}    {n}, p = _read_long(b, p)"]
            return out
        raise NotImplementedError(f"avrofast does not compile {t!r}")

    def reader_fn(self, full: str) -> None:
        rec = self.named[full]
        ns = _namespace_of(full)
        body, names = [], []
        for f in rec["fields"]:
            v = self.var()
            body += self.read(f["type"], v, "    ", ns)
            names.append(f"{f['name']!r}: {v}")
        self.lines += [f"def {self.fn(full, 'r_')}(b, p):", *body, f"    return {{{', '.join(names)}}}, p", ""]

    # -- writing ------------------------------------------------------------------------

    def write(self, t: Any, expr: str, ind: str, ns: str | None) -> list[str]:
        t = self.resolve(t, ns)
        if t == "null":
            return [f"{ind}if {expr} is not None:", f"{ind}    raise TypeError('expected null')"]
        if t in ("long", "int"):
            return [f"{ind}_check_long({expr})", f"{ind}_write_long(out, {expr})"]
        if t == "string":
            return [f"{ind}_write_string(out, {expr})"]
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
            # A union of records takes (full name, datum) pairs, as fastavro's named-branch
            # form, which the codec always writes: nothing to guess.
            v = self.var()
            self.tables += 1
            table = f"_branches{self.tables}"
            out.append(f"{ind}{v} = {table}[{expr}[0]]")
            self.lines.insert(0, f"{table} = {records!r}")
            first = True
            for full, k in records.items():
                out.append(f"{ind}{'if' if first else 'elif'} {v} == {k}:")
                out.append(f"{ind}    out.append({_zigzag_byte(k)})")
                out += self.write(full, f"{expr}[1]", ind + "    ", ns)
                first = False
            if len(records) != len(branches):
                raise NotImplementedError("a union of several records and other types")
            return out
        first = True
        for k, b in enumerate(branches):
            test = _type_test(b, expr, self.named)
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
            body += self.write(f["type"], f"d[{f['name']!r}]", "    ", ns)
        self.lines += [f"def {self.fn(full, 'w_')}(out, d):", *(body or ["    pass"]), ""]


def _zigzag_byte(k: int) -> int:
    if k > 63:
        raise NotImplementedError("unions of more than 64 branches")
    return k << 1


def _type_test(b: Any, expr: str, named: dict[str, Any]) -> str:
    if b == "null":
        return f"{expr} is None"
    if b in ("long", "int"):
        return f"(type({expr}) is int)"
    if b == "double":
        return f"(type({expr}) is float or type({expr}) is int)"
    if b == "string":
        return f"isinstance({expr}, str)"
    if b == "boolean":
        return f"(type({expr}) is bool)"
    if isinstance(b, str) and b in named:
        return f"isinstance({expr}, dict)"
    if isinstance(b, dict) and b.get("type") == "array":
        return f"isinstance({expr}, (list, tuple))"
    raise NotImplementedError(f"union branch {b!r}")


def _check_long(v: Any) -> None:
    if type(v) is not int or not -(1 << 63) <= v < (1 << 63):
        raise TypeError(f"{v!r} is not an Avro long")


def _check_bool(v: Any) -> bool:
    if type(v) is not bool:
        raise TypeError(f"{v!r} is not an Avro boolean")
    return v


def compile_schema(schema: dict[str, Any]) -> tuple[Reader, Writer]:
    """``(read(data, pos) -> (datum, pos), write(out: bytearray, datum))`` for a record
    schema. Raises ``NotImplementedError`` for types outside the scope above."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise NotImplementedError("a record schema is required")
    c = _Compiler()
    c.collect(schema, None)
    for full in c.named:
        c.reader_fn(full)
        c.writer_fn(full)
    top = c.fullname(schema, None)
    ns: dict[str, Any] = {
        "_read_long": _read_long, "_read_string": _read_string, "_read_double": _read_double,
        "_read_boolean": _read_boolean, "_write_long": _write_long, "_write_string": _write_string,
        "_pack_double": _pack_double, "_check_long": _check_long, "_check_bool": _check_bool,
        "AvroError": AvroError,
    }  # fmt: skip
    exec(compile("\n".join(c.lines), f"<avrofast {top}>", "exec"), ns)  # noqa: S102 - code generated from our schema
    return ns[c.fn(top, "r_")], ns[c.fn(top, "w_")]
