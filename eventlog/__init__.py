"""The log layer: one interface (:mod:`eventlog.base`) over the embedded SQLite log and
Apache Kafka. ``open_log(url)`` picks the backend from a URL."""

from __future__ import annotations

from pathlib import Path

from runstate.eventlog.base import Appended, EventLog, LogConsumer, LogProducer, Record, TopicNames
from runstate.eventlog.partitioner import murmur2, partition_for
from runstate.schemas.errors import LogConfigError

__all__ = [
    "Appended",
    "EventLog",
    "LogConsumer",
    "LogProducer",
    "Record",
    "TopicNames",
    "murmur2",
    "open_log",
    "partition_for",
]


def open_log(
    url: str,
    *,
    partitions: int = 4,
    topics: TopicNames | None = None,
    create: bool = True,
    kafka_config: dict[str, str] | None = None,
    key_purge_s: int = 3600,
    max_patch_bytes: int = 1024 * 1024,
) -> EventLog:
    """Open the log named by ``url``.

    ``kafka://HOST:PORT[,HOST:PORT...]`` is Apache Kafka; ``sqlite:///PATH``, ``file://PATH``
    or a plain path is the embedded log (created with ``partitions`` when absent and
    ``create``). ``key_purge_s``: on Kafka, how long an erased run's old key record may
    stay in the keys topic's files (set when the topic is created); ``max_patch_bytes``: on
    Kafka, the largest patch its records must carry (RUNSTATE_MAX_PATCH_BYTES: the producer
    and the events topic runstate creates take it). Raises :class:`LogConfigError` for any
    other scheme.
    """
    if url.startswith("kafka://"):
        from runstate.eventlog.kafka import KafkaLog  # confluent-kafka loads only when used

        return KafkaLog(
            url[len("kafka://") :],
            topics=topics,
            config=kafka_config or {},
            key_purge_ms=key_purge_s * 1000,
            max_patch_bytes=max_patch_bytes,
        )
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if scheme not in ("sqlite", "file"):
            raise LogConfigError(f"unknown log URL scheme {scheme!r} in {url!r}; use kafka://HOST:PORT or a file path")
        url = rest
    from runstate.eventlog.embedded import EmbeddedLog

    return EmbeddedLog(Path(url), partitions=partitions, topics=topics, create=create)
