"""Kafka's default key partitioner, so that every client puts a run on the same partition.

``murmur2_random`` in librdkafka and Java's ``BuiltInPartitioner`` for keyed records both
compute ``toPositive(murmur2(key)) % partitions`` with Kafka's murmur2 variant
(seed 0x9747b28c). The embedded log uses the same function, so a run keeps its partition
when a deployment moves from the embedded log to Kafka with the same partition count.
"""

from __future__ import annotations

from functools import lru_cache

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit integer (as Java returns it)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        j = i * 4
        k = data[j] | (data[j + 1] << 8) | (data[j + 2] << 16) | (data[j + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=1 << 16)
def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (Kafka's keyed default). Cached: a
    pure function, asked again for the same runs by every query and append (murmur2 in
    Python is a tenth of a state query)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
