"""What a state directory's files hold, read as their formats store it (a helper module, not a test).

RocksDB compresses its table files block by block (Snappy here), so a value can sit in an
``.sst`` file without its bytes appearing there: a plain grep is blind to it. This reader
walks a block-based table as RocksDB lays it out (footer → metaindex → index → every data
and meta block) and decompresses each block; anything it does not understand is an error,
never a silent "not found".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import cramjam

_MAGIC = 0x88E241B785F4CFF7  # kBlockBasedTableMagicNumber
_FOOTER = 53
_TRAILER = 5  # compression type + checksum


class UnreadableTable(AssertionError):
    """A table file this reader cannot walk: a search through it would prove nothing."""


def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(b):
            raise UnreadableTable("truncated varint")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _block(data: bytes, offset: int, size: int) -> bytes:
    raw, kind = data[offset : offset + size], data[offset + size]
    if kind == 0:
        return raw
    if kind == 1:
        return bytes(cramjam.snappy.decompress_raw(raw))
    if kind == 4:
        return bytes(cramjam.lz4.decompress_block(raw))
    if kind == 7:
        return bytes(cramjam.zstd.decompress(raw))
    raise UnreadableTable(f"block at {offset}: compression type {kind} not understood")


def _entries(block: bytes, *, handles: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """A block's entries; ``handles``: an index block, whose values are block handles
    written without a length (every entry a restart point)."""
    restarts = struct.unpack("<I", block[-4:])[0] & 0x7FFFFFFF
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise UnreadableTable("restart array larger than the block")
    i, key, n = 0, b"", 0
    while i < end:
        shared, i = _varint(block, i)
        unshared, i = _varint(block, i)
        if handles:
            key = key[:shared] + block[i : i + unshared]
            i += unshared
            start = i
            _, i = _varint(block, i)
            _, i = _varint(block, i)
            value = block[start:i]
        else:
            length, i = _varint(block, i)
            key = key[:shared] + block[i : i + unshared]
            i += unshared
            value = block[i : i + length]
            i += length
        n += 1
        yield key, value
    if handles and n != restarts:
        raise UnreadableTable(f"index block with {n} entries and {restarts} restarts (delta-encoded values)")


def _handle(value: bytes) -> tuple[int, int]:
    offset, i = _varint(value, 0)
    size, _ = _varint(value, i)
    return offset, size


def table_blocks(path: Path) -> Iterator[bytes]:
    """Every block of a RocksDB block-based table, decompressed."""
    data = path.read_bytes()
    if len(data) < _FOOTER or struct.unpack("<Q", data[-8:])[0] != _MAGIC:
        raise UnreadableTable(f"{path}: not a block-based table")
    footer = data[-_FOOTER:]
    version = struct.unpack("<I", footer[41:45])[0]
    if version >= 6:
        meta_size = struct.unpack("<I", footer[13:17])[0]
        meta_at = len(data) - _FOOTER - meta_size - _TRAILER
        index: tuple[int, int] | None = None
    else:
        meta_at, i = _varint(footer, 1)
        meta_size, i = _varint(footer, i)
        index_at, i = _varint(footer, i)
        index_size, i = _varint(footer, i)
        index = (index_at, index_size)
    meta = _block(data, meta_at, meta_size)
    yield meta
    for name, value in _entries(meta):
        where = _handle(value)
        if name == b"rocksdb.index":
            index = where
        yield _block(data, *where)
    if index is None:
        raise UnreadableTable(f"{path}: no index block")
    blocks = 0
    for _key, value in _entries(_block(data, *index), handles=True):
        yield _block(data, *_handle(value))
        blocks += 1
    if blocks == 0:
        raise UnreadableTable(f"{path}: an index without data blocks")


def file_contents(path: Path) -> Iterator[bytes]:
    """What a file holds as its format stores it: a table's blocks decompressed, any other
    file (RocksDB's write-ahead logs are not compressed here, SQLite's pages never are) as it is."""
    if path.suffix == ".sst":
        yield from table_blocks(path)
    yield path.read_bytes()


def files_holding(root: Path, needle: bytes) -> list[str]:
    """The files under ``root`` that hold ``needle``, compressed table blocks included."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and any(needle in part for part in file_contents(p))
    )
