"""Settings: one typed object, from flags and ``RUNSTATE_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from runstate.eventlog.base import TopicNames
from runstate.eventlog.instancekey import InstanceKeys
from runstate.eventlog.keystore import MasterKeys
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.retention import RetentionPolicy
from runstate.producers.run_producer import DEFAULT_MAX_PATCH_BYTES


class Settings(BaseSettings):
    """Where the log and the projections are, and the knobs of each component.

    Every field reads ``RUNSTATE_<NAME>`` (e.g. ``RUNSTATE_LOG=kafka://127.0.0.1:9092``);
    flags of the CLI override the environment.
    """

    model_config = SettingsConfigDict(env_prefix="RUNSTATE_", frozen=True, extra="ignore")

    #: ``kafka://HOST:PORT`` or a path to the embedded log file.
    log: str = ".runstate/log.db"
    #: Directory of the projection stores (one RocksDB per partition).
    state_dir: str = ".runstate/state"
    #: Partitions of the topics when the embedded log / Kafka topics are created.
    partitions: int = Field(4, ge=1, le=1024)
    #: Replication factor when Kafka topics are created.
    replication: int = Field(1, ge=1, le=16)
    #: Author of patches published from this process.
    agent_id: str = Field("cli", min_length=1)
    agent_version: str = Field("unknown", min_length=1)
    #: Refuse to publish a patch whose author has no agent version of its own (exit 2):
    #: every patch then records which prompt, skills and tools proposed it.
    require_agent_version: bool = False
    #: Patches larger than this (encoded) are refused by the producer.
    max_patch_bytes: int = Field(DEFAULT_MAX_PATCH_BYTES, ge=1024, le=64 * 1024 * 1024)
    #: Records per poll batch (one RocksDB WriteBatch per partition per batch).
    batch_size: int = Field(2000, ge=1, le=100_000)
    #: Runs whose working state the projector keeps in memory, per partition.
    cache_runs: int = Field(10_000, ge=1)
    #: Items a cached run may hold in memory; a run holding more after a batch leaves the
    #: cache (it is read again from the store at its next patch).
    cache_items_per_run: int = Field(1_000, ge=1)
    #: Consumer group of the projector (also part of the embedded log's lock file name: no ``/``).
    group_id: str = Field("runstate-projector", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    #: The snapshotter checkpoints each run every this many revisions (and at safe boundaries).
    checkpoint_every: int = Field(50, ge=1, le=1_000_000)
    #: ... and re-checkpoints a run whose newest checkpoint is this many records behind.
    checkpoint_max_age: int = Field(20_000, ge=1)
    #: ... and, once a partition has been quiet this many seconds, each run with records
    #: past its newest checkpoint (so that a quiet log is covered to its end).
    checkpoint_quiet_s: float = Field(5.0, ge=0, le=86_400)
    #: A run's checkpoints weigh at most this many times its records: a trigger waits until
    #: the records since the run's last checkpoint weigh enough (0: every trigger is taken).
    checkpoint_bytes_ratio: float = Field(2.0, ge=0, le=1000)
    #: Signs checkpoints (HMAC-SHA256) and refuses unsigned or wrongly signed ones on restore
    #: and time travel. Unset: checkpoints carry a digest (integrity), not a signature.
    checkpoint_key: SecretStr | None = None
    #: Topic names are ``<prefix>.events``, ``<prefix>.checkpoints``, ``<prefix>.deadletter``, ``<prefix>.decisions``.
    topic_prefix: str = Field("runstate", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    #: Copy every decision to the ``<prefix>.decisions`` topic, so that workers anywhere can
    #: await theirs. Unset: on for Kafka, off for the embedded log (its decisions are read
    #: from the projection on the same machine).
    publish_decisions: bool | None = None
    #: ``runstate serve``: the tokens file (``runstate token add``); unset, ``serve`` binds to
    #: 127.0.0.1 only and takes the author from the patch or ``agent_id``.
    tokens_file: str | None = None
    #: ``runstate serve`` with a tokens file: ``/metrics`` needs a token too unless this is set
    #: (a scraper on a private network); the metrics name runs' activity by route and outcome.
    metrics_public: bool = False
    #: ``runstate serve``: seconds a request body may pause between two of its parts before
    #: the request is answered 408 (a client that stops sending must not hold a connection).
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    #: ``runstate serve``: seconds a request may take to send its headers, and then its whole
    #: body, however steadily it trickles (a client sending a byte a second must not hold a
    #: connection): past it the connection is closed (headers) or answered 408 (body).
    request_timeout_s: float = Field(60.0, gt=0, le=3600)
    #: ``runstate serve``: requests for runs served at once by one instance; beyond it a
    #: request is answered 429 with ``Retry-After`` at once (shed, not queued), and one
    #: caller (token, else address) holds at most three quarters of them while other
    #: callers want slots too. The most the bound is: see ``admit_target_ms``.
    max_in_flight: int = Field(128, ge=1, le=100_000)
    #: ``runstate serve``: the latency of its patches (append to decision, 90th percentile
    #: over a quarter of a second) that an instance keeps its bound on requests in flight
    #: to: above it the bound shrinks by a fifth (to 8 at least), below half of it the bound
    #: grows by one a quarter of a second, up to ``max_in_flight``. ``0``: the bound is
    #: ``max_in_flight`` always.
    admit_target_ms: float = Field(100.0, ge=0, le=60_000)
    #: Raw librdkafka settings (JSON object in the env var); ``producer.``/``consumer.``
    #: prefixed keys apply to one client kind only. They win over runstate's defaults.
    kafka_config: dict[str, str | int | bool] = {}
    #: On Kafka: records in the Confluent Schema Registry's framing (``00`` + schema id),
    #: their schemas registered at this registry's Confluent-compatible API (Apicurio:
    #: ``http://HOST:PORT/apis/ccompat/v7``), so that Kafka Connect, ksqlDB, Flink and the
    #: consoles read the topics. Unset: Avro single-object encoding. Readers take both.
    schema_registry_url: str | None = None
    #: confluent-kafka's ``SchemaRegistryClient`` settings besides the URL (JSON object in
    #: the env var): ``basic.auth.user.info``, ``ssl.ca.location``, ``ssl.certificate.location``, ...
    schema_registry_config: dict[str, str] = {}
    #: Register runstate's schemas at start (off: look them up; a deployment whose producers
    #: may not register has them registered once by one that may).
    schema_registry_register: bool = True
    #: Seals every run's content with a key of its own, wrapped by this master key (64 hex
    #: digits; ``runstate keys generate``), so that a run can be erased (``runstate erase``).
    #: During a rotation, two keys separated by a comma (either order): both are read.
    #: Unset (and no ``master_key_file``): content is stored as it is and erasure is unavailable.
    master_key: SecretStr | None = None
    #: A file holding the master key (instead of ``master_key``); one key a line.
    master_key_file: str | None = None
    #: The secret every ``serve`` instance and projector of a deployment shares (64 hex
    #: digits; ``runstate keys generate``; during a change, the new and the old separated by
    #: a comma). Decisions on the decisions topic are signed with it and waiters hear no
    #: other; instances forward requests only to a peer that proves it. Unset: decisions
    #: are not authenticated and an instance forwards nothing (it answers 503 for runs it
    #: does not own).
    instance_secret: SecretStr | None = None
    #: On Kafka: the longest an erased run's old key record stays in the keys topic's files
    #: (the topic's segment and compaction lag, set when ``runstate topics create`` makes it).
    key_purge_s: int = Field(3600, ge=1, le=30 * 86400)
    #: The snapshotter erases ended runs this long after they ended, by status, e.g.
    #: ``completed=30d,failed=90d,cancelled=30d`` (needs a master key). Unset: kept.
    retention: str | None = None
    #: Seconds between two retention checks of a partition.
    retention_check_s: float = Field(60.0, gt=0, le=86400)

    def decisions_published(self) -> bool:
        return self.log.startswith("kafka://") if self.publish_decisions is None else self.publish_decisions

    def checkpoint_key_bytes(self) -> bytes | None:
        return None if self.checkpoint_key is None else self.checkpoint_key.get_secret_value().encode()

    def master(self) -> MasterKeys | None:
        """The master keys configured (the first is this process's own; during a rotation
        the other one too), or None. Raises :class:`KeyStoreError` (one line) for a
        malformed one or an unreadable file."""
        if self.master_key is not None:
            return MasterKeys.parse(self.master_key.get_secret_value())
        if self.master_key_file is not None:
            return MasterKeys.from_file(self.master_key_file)
        return None

    def instance_keys(self) -> InstanceKeys | None:
        """The instance secrets, or None. Raises :class:`KeyStoreError` for a malformed one."""
        return None if self.instance_secret is None else InstanceKeys.parse(self.instance_secret.get_secret_value())

    def checkpoint_policy(self, every: int | None = None) -> CheckpointPolicy:
        return CheckpointPolicy(
            every=every or self.checkpoint_every,
            max_age=self.checkpoint_max_age,
            quiet_s=self.checkpoint_quiet_s,
            bytes_ratio=self.checkpoint_bytes_ratio or None,
        )

    def retention_policy(self) -> RetentionPolicy | None:
        """Raises :class:`ContractError` for a malformed ``RUNSTATE_RETENTION``."""
        return None if not self.retention else RetentionPolicy.parse(self.retention)

    def topics(self) -> TopicNames:
        return TopicNames.with_prefix(self.topic_prefix)
