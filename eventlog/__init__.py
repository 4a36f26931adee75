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
    schema_registry: str | None = None,
    schema_registry_config: dict[str, str] | None = None,
    schema_registry_register: bool = True,
) -> EventLog:
    """Open the log named by ``url``.

    ``kafka://HOST:PORT[,HOST:PORT...]`` is Apache Kafka; ``sqlite:///PATH``, ``file://PATH``
    or a plain path is the embedded log (created with ``partitions`` when absent and
    ``create``). ``key_purge_s``: on Kafka, how long an erased run's old key record may
    stay in the keys topic's files (set when the topic is created); ``max_patch_bytes``: on
    Kafka, the largest patch its records must carry (RUNSTATE_MAX_PATCH_BYTES: the producer
    and the events topic runstate creates take it). ``schema_registry``: on Kafka, the URL
    of a Confluent-compatible schema registry: records are written in its framing
    (:mod:`eventlog.registry`; ``schema_registry_config`` are its client's settings,
    ``schema_registry_register`` whether to register the schemas). Raises
    :class:`LogConfigError` for any other scheme, and for a registry with the embedded log.
    """
    if url.startswith("kafka://"):
        from runstate.eventlog.kafka import KafkaLog  # confluent-kafka loads only when used
        from runstate.eventlog.registry import RegistryFraming

        return KafkaLog(
            url[len("kafka://") :],
            topics=topics,
            config=kafka_config or {},
            key_purge_ms=key_purge_s * 1000,
            max_patch_bytes=max_patch_bytes,
            registry=None
            if not schema_registry
            else RegistryFraming(
                schema_registry, topics or TopicNames(), schema_registry_config, register=schema_registry_register
            ),
        )
    if schema_registry:
        raise LogConfigError(
            "RUNSTATE_SCHEMA_REGISTRY_URL is for Kafka (its framing is what Kafka's tools read); the embedded "
            f"log {url!r} keeps Avro single-object encoding: unset it, or use RUNSTATE_LOG=kafka://..."
        )
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if scheme not in ("sqlite", "file"):
            raise LogConfigError(f"unknown log URL scheme {scheme!r} in {url!r}; use kafka://HOST:PORT or a file path")
        url = rest
    from runstate.eventlog.embedded import EmbeddedLog

    return EmbeddedLog(Path(url), partitions=partitions, topics=topics, create=create)
