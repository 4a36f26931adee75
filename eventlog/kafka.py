"""The Kafka backend of the log interface (confluent-kafka / librdkafka).

- Producer: ``enable.idempotence=true``, ``acks=all``, ``partitioner=murmur2_random``
  (Java's keyed default, and the embedded log's hash). Delivery errors reach the caller:
  ``append`` raises :class:`DeliveryError`, ``append_async`` calls back with it.
- Consumer: auto-commit off, offsets never auto-stored. On assignment the owner says where
  each partition starts (its position lives in its RocksDB store) and the consumer seeks
  there; ``commit`` only mirrors positions so that ``kafka-consumer-groups`` and
  ``runstate status`` show lag.
- Raw librdkafka settings pass through as a dict (``config``) and win over the defaults.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from runstate.eventlog.base import (
    LIBRDKAFKA_LOGGER,
    MIRROR_EVERY_S,
    Appended,
    DeliveryCallback,
    EventLog,
    GroupMember,
    Headers,
    LogConsumer,
    LogProducer,
    LogReader,
    OnAssign,
    OnRevoke,
    Record,
    TopicNames,
    raise_unreported,
)
from runstate.eventlog.registry import RegistryFraming
from runstate.schemas.errors import DeliveryError, LogConfigError, LogError

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "compression.type": "lz4",
    "message.timeout.ms": 120_000,
    # librdkafka leaves Nagle's algorithm on; with delayed ACKs it stalls small requests.
    "socket.nagle.disable": True,
}
#: Beyond a patch's encoded bytes, what its record may carry: the sealed envelope, the key,
#: the headers and the record batch's own framing.
RECORD_OVERHEAD = 64 * 1024
#: librdkafka's and the broker's own defaults for the largest record (message.max.bytes,
#: max.message.bytes): runstate raises them to what a patch of its limit needs, never lowers them.
_CLIENT_MAX_BYTES, _TOPIC_MAX_BYTES = 1_000_000, 1_048_588

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    # A dead instance's partitions move after it. 6 s (the broker's least) takes over sooner
    # (docs/kafka.md recommends it); the default leaves a member more room through a broker
    # restart, after which a member that lost its session rejoins and reads metadata again.
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_000,
    "max.poll.interval.ms": 300_000,
    "fetch.wait.max.ms": 50,
    "socket.nagle.disable": True,
}

#: Defaults of the classic group protocol that KIP-848's (``group.protocol=consumer``) sets
#: broker side instead (``group.consumer.session.timeout.ms``, ``...heartbeat.interval.ms``).
CLASSIC_GROUP_ONLY = ("session.timeout.ms", "heartbeat.interval.ms")

#: Longest a consumer's close waits for librdkafka to send its last commit and leave the group.
CLOSE_WAIT_S = 5.0

#: Group-coordinator errors that clear by themselves (coordinator moving or loading).
_COORDINATOR_RETRY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)

#: Partition errors that clear by themselves: a leader being elected or moving (a topic just
#: created, a broker restarting) and metadata not yet up to date with it.
_LEADER_RETRY = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        # The client's own view while a broker of a cluster is down: its metadata names no leader
        # for the partition yet, or the request to the old one fails (a projector died of these
        # when the leader of a partition was killed, in the three-broker test).
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError._NODE_UPDATE,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
#: How long :meth:`KafkaLog.end_offsets` asks again while a partition's leader is elected.
LEADER_WAIT_S = 30.0
#: How long a start-up probe tries a broker that refuses connections (one restarting).
PROBE_WINDOW_S = 3.0

T = TypeVar("T")


LIBRDKAFKA_LOG = logging.getLogger(LIBRDKAFKA_LOGGER)
log = logging.getLogger("runstate.kafka")


def _retrying(call: Callable[[], T], retry: frozenset[int], deadline: float, what: str) -> T:
    """``call()``, asked again every 0.1 s until ``deadline`` (``time.monotonic``) while it
    fails with one of the ``retry`` codes (conditions that clear by themselves). Raises
    :class:`LogError` naming ``what`` on any other error, or when the time is up."""
    while True:
        try:
            return call()
        except KafkaException as e:
            if e.args[0].code() not in retry:
                raise LogError(f"cannot read {what}: {e}") from e
            if time.monotonic() > deadline:
                raise LogError(f"cannot read {what}: still failing when the wait ran out ({e})") from e
            time.sleep(0.1)


def _headers(raw: Any) -> Headers:
    return tuple((k, v if v is not None else b"") for k, v in (raw or ()))


def _made(client: Callable[[dict[str, Any]], T], conf: dict[str, Any]) -> T:
    """A librdkafka client; a configuration it refuses (an unknown property, a bad value:
    what RUNSTATE_KAFKA_CONFIG added) is a :class:`LogConfigError` naming it."""
    try:
        return client(conf)
    except KafkaException as e:
        err = e.args[0] if e.args else e
        why = err.str() if hasattr(err, "str") else str(err)
        raise LogConfigError(f"the Kafka client refuses its configuration: {why} (check RUNSTATE_KAFKA_CONFIG)") from e


class KafkaLog(EventLog):
    """The log on an Apache Kafka cluster at ``bootstrap`` (``HOST:PORT[,HOST:PORT]``)."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicNames | None = None,
        config: dict[str, Any] | None = None,
        *,
        key_purge_ms: int = 3_600_000,
        max_patch_bytes: int = 1024 * 1024,
        registry: RegistryFraming | None = None,
    ) -> None:
        if not bootstrap:
            raise LogConfigError("kafka:// URL needs HOST:PORT")
        self.bootstrap = bootstrap
        #: the largest record the events topic and the producer must take: a patch of the
        #: limit (RUNSTATE_MAX_PATCH_BYTES) in its sealed envelope, with its key and headers
        self.max_record_bytes = max_patch_bytes + RECORD_OVERHEAD
        #: the longest an erased run's old key record stays in the keys topic's files (set
        #: on the topic when it is created)
        self.key_purge_ms = key_purge_ms
        self.topics = topics or TopicNames()
        self.config = dict(config or {})
        #: records in the Confluent Schema Registry's framing (None: Avro single-object encoding)
        self.registry = registry
        self._admin = _made(AdminClient, {"bootstrap.servers": bootstrap, **self._common()})
        self._parts: dict[str, int] = {}
        #: per topic, the fewest replicas of any partition (read with the partition count)
        self._replicas: dict[str, int] = {}
        self._meta: Consumer | None = None
        self._reached = False

    def _reachable(self, timeout_s: float = PROBE_WINDOW_S) -> None:
        """Raise :class:`LogConfigError` when no bootstrap address accepts a TCP connection
        within ``timeout_s``, instead of after the client's metadata timeout (15 s). A
        refusal is tried again until then: a broker that is restarting refuses for a moment,
        and a process started meanwhile must not die of it. Checked once."""
        if self._reached:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            why = []
            for addr in self.bootstrap.split(","):
                host, _, port = addr.strip().rpartition(":")
                try:
                    left = max(0.1, deadline - time.monotonic())
                    with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=left):
                        self._reached = True
                        return
                except (OSError, ValueError) as e:
                    why.append(f"{addr.strip()}: {getattr(e, 'strerror', None) or e}")
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise LogConfigError(
            f"cannot reach Kafka at {self.bootstrap} ({'; '.join(why)}): is the broker running "
            "and is this its address? (`runstate -v` shows the Kafka client's log)"
        )

    def _common(self) -> dict[str, Any]:
        # Settings that apply to every client (security, timeouts) pass through. librdkafka's
        # own log goes to a logger of ours (quiet unless asked: `runstate -v`), not to stderr,
        # where an unreachable broker printed hundreds of lines before the one error that matters.
        common = {k: v for k, v in self.config.items() if not k.startswith(("producer.", "consumer."))}
        return {"logger": LIBRDKAFKA_LOG, **common}

    def describe(self) -> str:
        return f"kafka://{self.bootstrap}"

    def identity(self) -> str:
        """``kafka:<cluster id>/<events topic id>``: a topic deleted and created again under
        the same name has another id."""
        self._reachable()
        try:
            cluster = self._admin.describe_cluster(request_timeout=15).result()
            topic = self.topics.events
            desc = self._admin.describe_topics(TopicCollection([topic]), request_timeout=15)[topic].result()
        except KafkaException as e:
            raise LogError(f"cannot read the identity of {topic!r} on {self.bootstrap}: {e}") from e
        return f"kafka:{cluster.cluster_id}/{desc.topic_id}"

    # -- topics ----------------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        n = self._parts.get(topic)
        if n is None:
            self._reachable()
            # A broker that answered the probe may be restarting: its transport errors clear by
            # themselves (a projector started during a broker restart died of one).
            read = partial(self._admin.list_topics, topic=topic, timeout=15)
            try:
                md = _retrying(read, _LEADER_RETRY, time.monotonic() + LEADER_WAIT_S, f"the metadata of {topic!r}")
            except LogError as e:
                raise LogConfigError(f"cannot reach Kafka at {self.bootstrap}: {e}") from e
            t = md.topics.get(topic)
            if t is None or t.error is not None or not t.partitions:
                raise LogConfigError(
                    f"topic {topic!r} does not exist on {self.bootstrap} (create it: runstate topics create)"
                )
            n = len(t.partitions)
            self._parts[topic] = n
            self._replicas[topic] = min(len(pm.replicas) for pm in t.partitions.values())
        return n

    def create_topics(self, partitions: int, replication: int = 1) -> list[str]:
        if partitions < 1 or replication < 1:
            raise LogConfigError("partitions and replication must be >= 1")
        self._reachable()
        # Replicated: an append acknowledged by all in-sync replicas (acks=all) must be on two
        # of them at least, so that it survives the loss of any one broker.
        isr = {"min.insync.replicas": "2"} if replication >= 2 else {}
        wanted = [
            # The broker's clock stamps each patch: the one time no client can claim.
            # A record as large as a patch of the limit (RUNSTATE_MAX_PATCH_BYTES) is taken.
            NewTopic(
                self.topics.events,
                partitions,
                replication,
                config={
                    **isr,
                    "message.timestamp.type": "LogAppendTime",
                    "max.message.bytes": str(max(_TOPIC_MAX_BYTES, self.max_record_bytes)),
                },
            ),
            NewTopic(
                self.topics.checkpoints,
                partitions,
                replication,
                config={**isr, "cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
            ),
            NewTopic(self.topics.deadletter, partitions, replication, config=isr),
            # Notifications for waiters: a day is far longer than anyone waits.
            NewTopic(self.topics.decisions, partitions, replication, config={**isr, "retention.ms": "86400000"}),
            # Run keys: an erased run's key record is replaced, and the log cleaner must take
            # the old one off the disks within a bound (key_purge_ms): a small dirty ratio,
            # segments rolled and compacted at least that often, and the files a cleaning
            # replaced deleted no later (Kafka keeps them a minute by default).
            NewTopic(
                self.topics.keys,
                partitions,
                replication,
                config={
                    **isr,
                    "cleanup.policy": "compact",
                    "min.compaction.lag.ms": "0",
                    "max.compaction.lag.ms": str(self.key_purge_ms),
                    "segment.ms": str(self.key_purge_ms),
                    "min.cleanable.dirty.ratio": "0.01",
                    "delete.retention.ms": str(self.key_purge_ms),
                    "file.delete.delay.ms": str(min(60_000, self.key_purge_ms)),
                },
            ),
        ]
        created = []
        for name, fut in self._admin.create_topics(wanted, request_timeout=30).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise LogConfigError(f"cannot create topic {name!r}: {e}") from e
        self._parts.clear()
        deadline = time.monotonic() + 30
        while True:  # metadata propagates asynchronously after creation
            try:
                self.check_topics()
                break
            except LogConfigError:
                if time.monotonic() > deadline:
                    raise
                self._parts.clear()
                time.sleep(0.2)
        if self.partitions(self.topics.events) != partitions and not created:
            raise LogConfigError(
                f"topic {self.topics.events!r} exists with {self.partitions(self.topics.events)} partitions, "
                f"not {partitions}"
            )
        return created

    def check_topics(self) -> None:
        ev = self.partitions(self.topics.events)
        cp = self.partitions(self.topics.checkpoints)
        self.partitions(self.topics.deadletter)
        for name, n in ((self.topics.checkpoints, cp), (self.topics.decisions, self.partitions(self.topics.decisions))):
            if n != ev:  # a run's checkpoints and decisions live on its events partition number
                raise LogConfigError(
                    f"{name!r} has {n} partitions but {self.topics.events!r} has {ev}: they must match"
                )
        # One request for both topics' configurations: at every projector start, while a
        # broker may be restarting (each admin request then is a chance for the client to fail).
        events, checkpoints = self._configs(self.topics.events, self.topics.checkpoints)
        policy = checkpoints["cleanup.policy"].value
        if "compact" not in (policy or ""):
            # A checkpoints topic that deletes would lose runs whose checkpoints expire.
            raise LogConfigError(f"{self.topics.checkpoints!r} must have cleanup.policy=compact, has {policy!r}")
        stamp = events["message.timestamp.type"].value
        if stamp != "LogAppendTime":
            # Rules that depend on time (deadlines, observation age) use the record's time: the
            # broker's, not one a client can claim.
            raise LogConfigError(
                f"{self.topics.events!r} must have message.timestamp.type=LogAppendTime (the rules "
                f"that depend on time use the log's time), has {stamp!r}: "
                f"kafka-configs --alter --entity-type topics --entity-name {self.topics.events} "
                "--add-config message.timestamp.type=LogAppendTime"
            )
        takes = int(events["max.message.bytes"].value or _TOPIC_MAX_BYTES)
        if takes < self.max_record_bytes:
            # Not refused: a topic made before runstate set it works for every patch below it.
            log.warning(
                "%r takes records up to %d bytes (max.message.bytes), less than a patch of "
                "RUNSTATE_MAX_PATCH_BYTES in its record (%d): a larger patch fails to append. "
                "kafka-configs --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d",
                self.topics.events,
                takes,
                self.max_record_bytes,
                self.topics.events,
                self.max_record_bytes,
            )
        for name, configs in ((self.topics.events, events), (self.topics.checkpoints, checkpoints)):
            replicas = self._replicas.get(name, 1)
            isr = int(configs["min.insync.replicas"].value or 1)
            if replicas >= 2 and isr < 2:
                raise LogConfigError(
                    f"{name!r} is replicated {replicas} times with min.insync.replicas={isr}: an "
                    "acknowledged append would survive on one broker only; set min.insync.replicas=2"
                )

    def _configs(self, *topics: str) -> list[Any]:
        wanted = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
        try:
            got = self._admin.describe_configs(wanted, request_timeout=15)
            return [got[r].result() for r in wanted]
        except KafkaException as e:
            raise LogConfigError(f"cannot read the configuration of {', '.join(map(repr, topics))}: {e}") from e

    # -- clients ---------------------------------------------------------------------------

    def producer(self) -> LogProducer:
        conf = {
            "bootstrap.servers": self.bootstrap,
            **PRODUCER_DEFAULTS,
            "message.max.bytes": max(_CLIENT_MAX_BYTES, self.max_record_bytes),
            **self._common(),
            **{k[len("producer.") :]: v for k, v in self.config.items() if k.startswith("producer.")},
        }
        if self.registry is not None:
            self.registry.prepare()
        return KafkaProducer(_made(Producer, conf), self.registry)

    def _consumer_conf(self, group_id: str) -> dict[str, Any]:
        given = {k[len("consumer.") :]: v for k, v in self.config.items() if k.startswith("consumer.")}
        defaults = dict(CONSUMER_DEFAULTS)
        if given.get("group.protocol") == "consumer":
            # KIP-848's protocol: the session and heartbeat are the broker's (librdkafka refuses them).
            for name in CLASSIC_GROUP_ONLY:
                defaults.pop(name, None)
        return {"bootstrap.servers": self.bootstrap, "group.id": group_id, **defaults, **self._common(), **given}

    def consumer(self, group_id: str, topic: str, *, client_id: str | None = None) -> LogConsumer:
        self.partitions(topic)
        conf = self._consumer_conf(group_id)
        if client_id is not None:
            conf["client.id"] = client_id
        incremental = (
            "cooperative" in str(conf.get("partition.assignment.strategy", ""))
            or conf.get("group.protocol") == "consumer"
        )
        if self.registry is not None:
            self.registry.prepare()
        return KafkaConsumer(_made(Consumer, conf), topic, incremental=incremental, registry=self.registry)

    def reader(self, topic: str, positions: dict[int, int]) -> LogReader:
        self.partitions(topic)
        if self.registry is not None:
            self.registry.prepare()
        c = self._reader()
        c.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
        return KafkaReader(c, self.registry)

    def group_members(self, group_id: str) -> list[GroupMember] | None:
        try:
            desc = self._admin.describe_consumer_groups([group_id], request_timeout=10)[group_id].result()
        except KafkaException as e:
            raise LogError(f"cannot describe consumer group {group_id!r}: {e}") from e
        state = getattr(desc.state, "name", str(desc.state))
        if state in ("EMPTY", "DEAD"):
            return []
        if state != "STABLE":  # PREPARING_REBALANCE / COMPLETING_REBALANCE: not settled
            return None
        out = []
        for m in desc.members:
            tps = m.assignment.topic_partitions if m.assignment is not None else []
            out.append(
                GroupMember(m.client_id, tuple(sorted(tp.partition for tp in tps if tp.topic == self.topics.events)))
            )
        return out

    def _reader(self) -> Consumer:
        # A consumer that never subscribes (assign only): it never joins a group.
        return _made(Consumer, self._consumer_conf(f"runstate-reader-{uuid.uuid4().hex[:8]}"))

    # -- reading -----------------------------------------------------------------------------

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Raises :class:`LogError` when a partition's end cannot be read. A partition
        whose leader is being elected (right after ``create_topics``: 12 times in 20 on a
        local broker; a broker restarting) is asked again for up to ``LEADER_WAIT_S``: a
        projector reads the log end when it is assigned partitions, and must not die of a
        condition that clears by itself."""
        if self._meta is None:
            self._meta = self._reader()
        deadline = time.monotonic() + LEADER_WAIT_S
        meta = self._meta
        out = {}

        def read(p: int) -> tuple[int, int]:
            try:
                return meta.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)  # type: ignore[no-any-return]
            except KafkaException as e:
                if e.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                    # This client only reads the topic's metadata when asked: a leader that died
                    # left it without one until it asks again.
                    with contextlib.suppress(KafkaException):
                        meta.list_topics(topic, timeout=5)
                raise

        for p in range(self.partitions(topic)):
            _, high = _retrying(partial(read, p), _LEADER_RETRY, deadline, f"end offsets of {topic}[{p}]")
            out[p] = int(high)
        return out

    def committed(self, group_id: str, topic: str, timeout_s: float = 15.0) -> dict[int, int]:
        """Raises :class:`LogError` when the group coordinator does not answer in time
        (transient coordinator errors, e.g. on a young broker, are retried until then)."""
        wanted = [TopicPartition(topic, p) for p in range(self.partitions(topic))]
        deadline = time.monotonic() + timeout_s
        c = _made(Consumer, self._consumer_conf(group_id))
        try:
            tps = _retrying(
                lambda: c.committed(wanted, timeout=max(1.0, deadline - time.monotonic())),
                _COORDINATOR_RETRY,
                deadline,
                f"committed offsets of group {group_id!r}",
            )
            return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
        finally:
            c.close()

    def scan(self, topic: str, partition: int, start: int, end: int, batch: int = 1000) -> Iterator[Record]:
        if start >= end:
            return
        c = self._reader()
        try:
            c.assign([TopicPartition(topic, partition, start)])
            pos = start
            idle_deadline = time.monotonic() + 30
            while pos < end:
                msgs = c.consume(num_messages=min(batch, end - pos), timeout=0.5)
                if not msgs:
                    if time.monotonic() > idle_deadline:
                        raise LogError(f"{topic}[{partition}] returned nothing at offset {pos} (end {end}) for 30s")
                    continue
                idle_deadline = time.monotonic() + 30
                for m in msgs:
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise LogError(f"reading {topic}[{partition}]: {m.error()}")
                    if m.offset() >= end:
                        return
                    pos = m.offset() + 1
                    value = m.value() or b""
                    if self.registry is not None:
                        value = self.registry.unwrap(topic, value)
                    yield Record(topic, partition, m.offset(), m.key(), value, m.timestamp()[1], _headers(m.headers()))
        finally:
            c.close()

    def read(self, topic: str, partition: int, offsets: Sequence[int]) -> list[Record]:
        if not offsets:
            return []
        wanted = set(offsets)
        end = min(max(offsets) + 1, self.end_offsets(topic)[partition])
        found = {r.offset: r for r in self.scan(topic, partition, min(offsets), end) if r.offset in wanted}
        return [found[o] for o in offsets if o in found]

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()
            self._meta = None
        if self.registry is not None:
            self.registry.close()


def _delivery_error(key: str, err: KafkaError) -> DeliveryError:
    return DeliveryError(key, f"{err.name()}: {err.str()}")


def _report(on_delivery: DeliveryCallback, key: str, err: KafkaError | None, msg: Any) -> None:
    """librdkafka's delivery report, as the log interface's (``Appended`` or the error)."""
    if err is None:
        on_delivery(Appended(msg.topic(), msg.partition(), msg.offset()), None)
    else:
        on_delivery(None, _delivery_error(key, err))


def _keep_failure(failures: list[DeliveryError], err: KafkaError | None, msg: Any) -> None:
    """librdkafka's delivery report of a record appended without a callback: a failure is
    kept for the next ``flush`` to raise; a success needs nothing."""
    if err is not None:
        key = msg.key()
        failures.append(_delivery_error(key.decode(errors="replace") if key else "", err))


class KafkaProducer(LogProducer):
    def __init__(self, producer: Producer, registry: RegistryFraming | None = None) -> None:
        self._p = producer
        self._registry = registry
        self._failures: list[DeliveryError] = []
        # One report function for every record appended without a callback: nothing is
        # built per record, and a success costs one call that returns at once.
        self._unreported = partial(_keep_failure, self._failures)

    def append_async(
        self,
        topic: str,
        key: str,
        value: bytes,
        on_delivery: DeliveryCallback | None,
        headers: Headers = (),
        *,
        partition: int | None = None,
    ) -> None:
        # The hot path of every producer: one partial of a module function rather than a
        # closure, positional arguments, no header list when there are none: what Python
        # adds per record is of the order of librdkafka's own cost.
        cb = self._unreported if on_delivery is None else partial(_report, on_delivery, key)
        k = key.encode()
        if self._registry is not None:
            value = self._registry.wrap(topic, value)
        p = self._p
        while True:
            try:
                if partition is not None:
                    p.produce(topic, value, k, partition=partition, headers=list(headers) or None, on_delivery=cb)
                elif headers:
                    p.produce(topic, value, k, headers=list(headers), on_delivery=cb)
                else:
                    p.produce(topic, value, k, on_delivery=cb)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                p.poll(0.1)
            except KafkaException as e:
                raise DeliveryError(key, str(e)) from e
        p.poll(0)

    def append(
        self, topic: str, key: str, value: bytes, headers: Headers = (), *, partition: int | None = None
    ) -> Appended:
        result: list[Appended | Exception] = []
        report = lambda a, e: result.append(e if e is not None else a)  # noqa: E731
        if partition is None:
            self.append_async(topic, key, value, report, headers)  # type: ignore[arg-type]
        else:
            if self._registry is not None:
                value = self._registry.wrap(topic, value)
            try:
                self._p.produce(
                    topic,
                    value,
                    key.encode(),
                    partition=partition,
                    headers=list(headers) or None,
                    on_delivery=partial(_report, report, key),
                )
            except KafkaException as e:
                raise DeliveryError(key, str(e)) from e
        deadline = time.monotonic() + 130
        while not result and time.monotonic() < deadline:
            self._p.poll(0.05)
        if not result:
            raise DeliveryError(key, "no delivery report within 130s")
        r = result[0]
        if isinstance(r, Exception):
            raise r
        return r

    def flush(self, timeout_s: float = 30.0) -> int:
        left = int(self._p.flush(timeout_s))
        raise_unreported(self._failures)
        return left

    def close(self, timeout_s: float = 60.0) -> None:
        left = self._p.flush(timeout_s)
        raise_unreported(self._failures)
        if left:
            raise DeliveryError("*", f"{left} records not delivered when the producer closed")


def _records(msgs: list[Any], owned: set[int] | None, registry: RegistryFraming | None) -> list[Record]:
    out = []
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal():
                raise LogError(f"fatal consumer error: {err}")
            continue  # transient (broker down, rebalance): librdkafka retries by itself
        if owned is not None and m.partition() not in owned:
            continue
        value = m.value() or b""
        if registry is not None:
            value = registry.unwrap(m.topic(), value)
        out.append(
            Record(m.topic(), m.partition(), m.offset(), m.key(), value, m.timestamp()[1], _headers(m.headers()))
        )
    return out


#: How often a consumer's poll refreshes its view of the log end (end_offsets).
ENDS_EVERY_S = 0.05


def _poll(c: Consumer, max_records: int, timeout_s: float) -> list[Any]:
    # Return as soon as anything is there (latency), then take what else is already
    # fetched without waiting (throughput): consume(n, timeout) alone would wait for n.
    msgs = c.consume(num_messages=max_records, timeout=0)
    if not msgs:
        first = c.poll(timeout_s)
        if first is None:
            return []
        msgs = [first, *c.consume(num_messages=max_records - 1, timeout=0)] if max_records > 1 else [first]
    return msgs


class KafkaReader(LogReader):
    def __init__(self, consumer: Consumer, registry: RegistryFraming | None = None) -> None:
        self._c = consumer
        self._registry = registry

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        return _records(_poll(self._c, max_records, timeout_s), None, self._registry)

    def close(self) -> None:
        self._c.close()


class KafkaConsumer(LogConsumer):
    def __init__(
        self, consumer: Consumer, topic: str, *, incremental: bool = False, registry: RegistryFraming | None = None
    ) -> None:
        self._c = consumer
        self._topic = topic
        self._registry = registry
        #: the group rebalances incrementally (cooperative assignment, or KIP-848's protocol)
        self._incremental = incremental
        self._owned: set[int] = set()
        #: the log end per partition as the last poll saw it: end_offsets reads this, never
        #: the handle, which another thread's call can wait on for as long as a rebalance
        #: callback (a partition's restore) runs in poll
        self._ends: dict[int, int | None] = {}
        self._ends_at = 0.0
        #: positions given to ``commit`` and not sent yet, and when they last were
        self._unmirrored: dict[int, int] | None = None
        self._mirrored_at = 0.0

    def subscribe(self, on_assign: OnAssign, on_revoke: OnRevoke) -> None:
        """Under the eager protocol (librdkafka's default assignment strategies) a rebalance
        revokes every partition and assigns the new set; under the cooperative one
        (``partition.assignment.strategy=cooperative-sticky``) only the partitions that
        change hands are given or taken, so a member keeps serving its own through
        another's join or death. ``on_assign`` / ``on_revoke`` get what changes, either way."""

        def assigned(consumer: Consumer, tps: list[TopicPartition]) -> None:
            starts = on_assign([tp.partition for tp in tps])
            for tp in tps:
                tp.offset = int(starts.get(tp.partition, 0))
            if self._incremental:
                consumer.incremental_assign(tps)
                self._owned = self._owned | {tp.partition for tp in tps}  # a new set: read from other threads
            else:
                consumer.assign(tps)
                self._owned = {tp.partition for tp in tps}

        def revoked(consumer: Consumer, tps: list[TopicPartition]) -> None:
            on_revoke([tp.partition for tp in tps])
            self._owned = self._owned - {tp.partition for tp in tps}  # a new set: read from other threads
            if self._incremental:
                consumer.incremental_unassign(tps)
            else:
                consumer.unassign()

        self._c.subscribe([self._topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        out = _records(_poll(self._c, max_records, timeout_s), self._owned, self._registry)
        now = time.monotonic()
        if not out:
            self._flush_mirror(now)
        if now - self._ends_at >= ENDS_EVERY_S:
            ends: dict[int, int | None] = {}
            for p in self._owned:
                # cached=True: the high watermark of the last fetch response, no broker request.
                _, high = self._c.get_watermark_offsets(TopicPartition(self._topic, p), cached=True)
                ends[p] = int(high) if high >= 0 else None
            self._ends, self._ends_at = ends, now
        return out

    def assignment(self) -> list[int]:
        return sorted(self._owned)

    def end_offsets(self) -> dict[int, int | None]:
        ends = self._ends
        return {p: ends.get(p) for p in self._owned}

    def commit(self, positions: dict[int, int]) -> None:
        """Sent at most every ``MIRROR_EVERY_S`` while busy, then on the next idle poll and
        on close, as the embedded log does: a serve's projector decides batches of a patch or
        two, and a commit per batch cost it more than the batch's own work in librdkafka."""
        self._unmirrored = dict(positions)
        now = time.monotonic()
        if now - self._mirrored_at >= MIRROR_EVERY_S:
            self._flush_mirror(now)

    def _flush_mirror(self, now: float) -> None:
        if self._unmirrored is None:
            return
        tps = [TopicPartition(self._topic, p, o) for p, o in self._unmirrored.items() if p in self._owned]
        self._unmirrored, self._mirrored_at = None, now
        if tps:
            try:
                self._c.commit(offsets=tps, asynchronous=True)
            except KafkaException:
                pass  # the mirror is for monitoring only; the next batch commits again

    def close(self) -> None:
        """Send the last position mirror and leave the group (revoking: ``on_revoke`` runs),
        waiting at most ``CLOSE_WAIT_S``. librdkafka's close waits for an offset commit
        until the coordinator answers (librdkafka#3740: for as long as the broker stays
        away); the mirror is monitoring, and the group drops a silent member after its
        session timeout, so a close that outlasts the bound is left to finish in a daemon
        thread."""
        self._flush_mirror(time.monotonic())
        failed: list[BaseException] = []

        def closing() -> None:
            try:
                self._c.close()
            except BaseException as e:  # raised in the caller's thread below
                failed.append(e)

        closer = threading.Thread(target=closing, name="rs-consumer-close", daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT_S)
        if closer.is_alive():
            log.warning(
                "the consumer of %r did not leave its group within %.0f s (the broker does not "
                "answer); the group drops it after its session timeout",
                self._topic,
                CLOSE_WAIT_S,
            )
        elif failed:
            raise failed[0]
