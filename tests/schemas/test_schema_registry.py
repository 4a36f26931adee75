"""Kafka's ecosystem reads runstate's topics: records in the Confluent Schema Registry's
framing, their schemas in a real registry (Apicurio Registry, its Confluent-compatible
API), read by confluent-kafka's own ``AvroDeserializer``; a patch written by its
``AvroSerializer`` decided by runstate; a topic holding both framings replayed; the
registry's compatibility check, and a registry that is down, refused clearly."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from helpers import fact, patch, start
from javakit import run_java
from servekit import ServeProcess

from runstate.cli import main
from runstate.client import Client
from runstate.compose.kafka_local import free_port, resolve_registry_serde_jars
from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import KafkaLog
from runstate.projector.read.queries import Projection
from runstate.schemas import codec

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _env(bootstrap: str, topics: TopicNames, state: Path, registry: str | None) -> dict[str, str]:
    env = {
        "RUNSTATE_LOG": f"kafka://{bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(state),
    }
    return {**env, "RUNSTATE_SCHEMA_REGISTRY_URL": registry} if registry else env


def _cli(env: dict[str, str], *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env={**os.environ, **env}, input=input, catch_exceptions=False)


def _values(bootstrap: str, topic: str) -> list[bytes]:
    """Every record's value on ``topic``, read by a plain consumer from the start."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        parts = len(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.subscribe([topic])
        out: list[bytes] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < parts and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                eof.add(m.partition())
                continue
            out.append(m.value())
        return out
    finally:
        c.close()


def _patch_schema_text() -> str:
    w = max(codec.published("patch").values(), key=lambda w: w.version)
    return json.dumps(w.schema, indent=1)  # spaced otherwise than runstate registers it: another id


def _registry_client(url: str) -> SchemaRegistryClient:
    """confluent-kafka's client with a bound on each request (its own default waits for
    good: a request Apicurio once left unanswered held a CI run until pytest's timeout);
    a request that times out is tried again, up to its four tries."""
    return SchemaRegistryClient({"url": url, "timeout": 10})


def test_kafkas_own_deserializer_reads_every_record_runstate_writes_and_runstate_decides_its_serializers(
    kafka_bootstrap: str, kafka_topics: TopicNames, schema_registry: str, tmp_path: Path
) -> None:
    KafkaLog(kafka_bootstrap, topics=kafka_topics).create_topics(3)
    registry = _registry_client(schema_registry)
    serve = ServeProcess(_env(kafka_bootstrap, kafka_topics, tmp_path / "state", schema_registry), tmp_path)
    try:
        serve.wait_ready(timeout_s=120)
        with Client(serve.url) as rs:
            assert rs.submit("reg-1", {"expected_revision": 0, "events": [start()]}).outcome == "accepted"
            assert rs.submit("reg-1", {"expected_revision": 1, "events": [fact("f1")]}).outcome == "accepted"
            rejected = rs.submit("reg-1", {"expected_revision": 0, "events": [fact("f2")]})
            assert rejected.outcome == "rejected"
            done = rs.submit("reg-1", {"expected_revision": 2, "events": [{"type": "RunCompleted", "summary": "ok"}]})
            assert done.outcome == "accepted"

            # A patch confluent-kafka's AvroSerializer writes (its schema registered by it,
            # under the subject runstate uses): runstate's projector decides it.
            serializer = AvroSerializer(
                registry,
                _patch_schema_text(),
                conf={"auto.register.schemas": True, "subject.name.strategy": _topic_record},
            )
            foreign = patch("reg-2", 0, start(), patch_id="from-confluent-serializer")
            value = serializer(
                codec._to_avro_datum(foreign), SerializationContext(kafka_topics.events, MessageField.VALUE)
            )
            assert value[:1] == b"\x00"
            raw = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
            raw.produce(kafka_topics.events, key=b"reg-2", value=value)
            raw.flush(10)
            d = rs.wait("reg-2", "from-confluent-serializer", timeout_s=30)
            assert d.outcome == "accepted", d
            assert rs.state("reg-2").goal.statement == "fix login"
    finally:
        assert serve.stop() == 0, serve.log()

    # Every record on the events, decisions and checkpoints topics is in the registry's
    # framing, and the deserializer reads it with the schema it fetches by id.
    deserializer = AvroDeserializer(registry)
    read: dict[str, list[dict[str, Any]]] = {}
    for topic in (kafka_topics.events, kafka_topics.decisions, kafka_topics.checkpoints):
        values = _values(kafka_bootstrap, topic)
        assert values and all(v[:1] == b"\x00" for v in values), (topic, [v[:6] for v in values])
        read[topic] = [deserializer(v, SerializationContext(topic, MessageField.VALUE)) for v in values]
    patches = {p["patch_id"]: p for p in read[kafka_topics.events]}
    assert len(patches) == 5 and patches["from-confluent-serializer"]["run_id"] == "reg-2"
    assert any(e["fact"]["id"] == "f1" for p in patches.values() for e in p["events"] if "fact" in e)
    outcomes = sorted(d["outcome"] for d in read[kafka_topics.decisions])
    assert outcomes == ["accepted"] * 4 + ["rejected"]
    assert all(isinstance(r["body"], bytes) and r["body"] for r in read[kafka_topics.checkpoints])

    # Kafka's Java client with Apicurio's Avro deserializer (Confluent-compatible mode) too.
    jars = resolve_registry_serde_jars()
    v2 = schema_registry.replace("/apis/ccompat/v7", "/apis/registry/v2")
    for topic, record in (
        (kafka_topics.events, "runstate.v.Patch"),
        (kafka_topics.decisions, "runstate.v.Decision"),
        (kafka_topics.checkpoints, "runstate.v.CheckpointRecord"),
    ):
        lines = run_java(jars, "RegistryConsume", kafka_bootstrap, topic, v2, str(len(read[topic])), timeout=180)
        assert len(lines) == len(read[topic]) and all(ln.split(" ")[1] == record for ln in lines), lines
        if record != "runstate.v.CheckpointRecord":
            assert sorted(ln.split(" ")[2] for ln in lines) == sorted(r["run_id"] for r in read[topic]), lines

    for topic, record in (
        (kafka_topics.events, "runstate.v.Patch"),
        (kafka_topics.decisions, "runstate.v.Decision"),
        (kafka_topics.checkpoints, "runstate.v.CheckpointRecord"),
    ):
        subject = f"{topic}-{record}"
        assert subject in registry.get_subjects()
        assert registry.get_compatibility(subject) in ("BACKWARD", "BACKWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")


def _topic_record(ctx: SerializationContext, record_name: str) -> str:
    """Confluent's TopicRecordNameStrategy (``<topic>-<record name>``), as runstate names its subjects."""
    return f"{ctx.topic}-{record_name}"


def test_a_topic_moved_to_the_registry_framing_replays_both_and_verify_passes(
    kafka_bootstrap: str, kafka_topics: TopicNames, schema_registry: str, tmp_path: Path
) -> None:
    """Patches written before the move (single-object encoding) and after (the registry's
    framing) on one topic: a new projection replays every one of them; without the
    registry configured, a framed record is a dead letter that says what it is."""
    plain = _env(kafka_bootstrap, kafka_topics, tmp_path / "before", None)
    framed = _env(kafka_bootstrap, kafka_topics, tmp_path / "after", schema_registry)
    assert _cli(plain, "topics", "create", "--partitions", "2").exit_code == 0
    _cli(plain, "publish", "mix", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    _cli(plain, "publish", "mix", "-", input=json.dumps({"expected_revision": 1, "events": [fact("f1")]}))
    _cli(framed, "publish", "mix", "-", input=json.dumps({"expected_revision": 2, "events": [fact("f2")]}))
    _cli(framed, "publish", "mix", "-", input=json.dumps({"expected_revision": 3, "events": [fact("f3")]}))
    firsts = sorted(v[:2] for v in _values(kafka_bootstrap, kafka_topics.events))
    assert firsts == [b"\x00\x00", b"\x00\x00", codec.MAGIC, codec.MAGIC], firsts

    r = _cli(framed, "project", "--until-caught-up")
    assert r.exit_code == 0, r.output
    with Projection(tmp_path / "after") as proj:
        state = proj.state("mix")
        assert state.revision == 4 and [f.id for f in state.confirmed_facts] == ["f1", "f2", "f3"]
    assert _cli(framed, "verify").exit_code == 0

    r = _cli(plain, "project", "--until-caught-up")
    assert r.exit_code == 0, r.output
    with Projection(tmp_path / "before") as proj:
        assert proj.state("mix").revision == 2
    out = _cli(plain, "deadletters").output
    assert "not_avro_single_object" in out and "Schema Registry" in out, out


def test_the_registry_checks_compatibility_and_an_incompatible_schema_stops_runstate(
    kafka_bootstrap: str, kafka_topics: TopicNames, schema_registry: str, tmp_path: Path
) -> None:
    from runstate.eventlog.registry import RegistryFraming
    from runstate.schemas.errors import LogConfigError

    registry = _registry_client(schema_registry)
    env = _env(kafka_bootstrap, kafka_topics, tmp_path / "state", schema_registry)
    assert _cli(env, "topics", "create", "--partitions", "1").exit_code == 0
    subject = f"{kafka_topics.events}-runstate.v.Patch"
    ours = max(codec.published("patch").values(), key=lambda w: w.version).schema
    assert ours is not None

    # A subject left at NONE is raised to BACKWARD; the next version of the patch schema (a
    # field added with a default) registers; one that drops a field's default is refused.
    registry.set_compatibility(subject, "NONE")
    RegistryFraming(schema_registry, kafka_topics).prepare()
    assert registry.get_compatibility(subject) == "BACKWARD"
    nxt = {**ours, "fields": [*ours["fields"], {"name": "tenant", "type": ["null", "string"], "default": None}]}
    registry.register_schema(subject, Schema(json.dumps(nxt), "AVRO"))
    bad = {**nxt, "fields": [*ours["fields"], {"name": "tenant2", "type": "string"}]}
    with pytest.raises(Exception, match="409|ncompatible"):
        registry.register_schema(subject, Schema(json.dumps(bad), "AVRO"))

    # A deployment whose registry holds a Patch schema runstate's cannot read data of (its
    # run_id has no default and the registered one lacks it): runstate does not start.
    other = TopicNames.with_prefix(kafka_topics.events.rsplit(".", 1)[0] + "x")
    older = {**ours, "fields": [f for f in ours["fields"] if f["name"] != "run_id"]}
    registry.register_schema(f"{other.events}-runstate.v.Patch", Schema(json.dumps(older), "AVRO"))
    with pytest.raises(LogConfigError, match="refuses runstate.v.Patch.*not compatible"):
        RegistryFraming(schema_registry, other).prepare()
    env_other = {**env, "RUNSTATE_TOPIC_PREFIX": other.events.rsplit(".", 1)[0]}
    assert _cli(env_other, "topics", "create", "--partitions", "1").exit_code == 0
    r = _cli(env_other, "project", "--until-caught-up")
    assert r.exit_code != 0 and "not compatible" in r.output, r.output

    # Look-up only (producers that may not register): a schema not there is named.
    third = TopicNames.with_prefix(kafka_topics.events.rsplit(".", 1)[0] + "y")
    with pytest.raises(LogConfigError, match="may not register"):
        RegistryFraming(schema_registry, third, register=False).prepare()


def test_a_registry_that_is_down_or_a_record_of_another_schema_is_a_clear_answer(
    kafka_bootstrap: str, kafka_topics: TopicNames, schema_registry: str, tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    env = _env(kafka_bootstrap, kafka_topics, tmp_path / "state", down)
    assert _cli({**env, "RUNSTATE_SCHEMA_REGISTRY_URL": ""}, "topics", "create", "--partitions", "1").exit_code == 0
    r = _cli(env, "project", "--until-caught-up")
    assert r.exit_code != 0 and "cannot reach the schema registry" in r.output, r.output

    # A record framed with a schema id that is not one of runstate's: a dead letter naming
    # it, and the patches around it decided.
    env = {**env, "RUNSTATE_SCHEMA_REGISTRY_URL": schema_registry}
    registry = _registry_client(schema_registry)
    sid = registry.register_schema(
        f"{kafka_topics.events}-other", Schema('{"type":"record","name":"Other","fields":[]}', "AVRO")
    )
    _cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 0, "events": [start()]}))
    raw = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    raw.produce(kafka_topics.events, key=b"r", value=b"\x00" + sid.to_bytes(4, "big"))
    raw.produce(kafka_topics.events, key=b"r", value=b"\x00\x00\x98\x96\x7f" + b"not a schema this registry holds")
    raw.flush(10)
    _cli(env, "publish", "r", "-", input=json.dumps({"expected_revision": 1, "events": [fact("f1")]}))
    r = _cli(env, "project", "--until-caught-up")
    assert r.exit_code == 0, r.output
    with Projection(tmp_path / "state") as proj:
        assert proj.state("r").revision == 2
    out = _cli(env, "deadletters").output
    assert out.count("not_avro_single_object") == 2 and f"schema id {sid}" in out and "9999999" in out, out


def test_sealed_records_are_read_as_envelopes_and_a_registry_lost_mid_run_stops_nothing(
    kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    """With sealing on, what the deserializer reads is the envelope and the ciphertext (an
    archive made by Connect holds no plain content). A registry of this test's own, killed
    while serve runs: patches go on being appended and decided (their schemas' ids are
    known since start)."""
    from runstate.compose.registry_local import LocalRegistry
    from runstate.eventlog.keystore import MasterKey

    own = LocalRegistry(tmp_path / "registry")
    url = own.start()
    KafkaLog(kafka_bootstrap, topics=kafka_topics).create_topics(2)
    env = {
        **_env(kafka_bootstrap, kafka_topics, tmp_path / "state", url),
        "RUNSTATE_MASTER_KEY": MasterKey.generate(),
    }
    serve = ServeProcess(env, tmp_path)
    try:
        serve.wait_ready(timeout_s=120)
        with Client(serve.url) as rs:
            assert rs.submit("sealed-1", {"expected_revision": 0, "events": [start()]}).outcome == "accepted"
            deserializer = AvroDeserializer(_registry_client(url))
            values = _values(kafka_bootstrap, kafka_topics.events)
            got = [deserializer(v, SerializationContext(kafka_topics.events, MessageField.VALUE)) for v in values]
            assert (
                len(got) == 1 and got[0]["run_id"] == "sealed-1" and got[0]["envelope"]["event_types"] == ["RunStarted"]
            )
            assert b"fix login" not in values[0] and isinstance(got[0]["ciphertext"], bytes)
            own.kill()
            for rev in (1, 2):
                d = rs.submit("sealed-1", {"expected_revision": rev, "events": [fact(f"f{rev}")]})
                assert d.outcome == "accepted", d
            assert [f.id for f in rs.state("sealed-1").confirmed_facts] == ["f1", "f2"]
    finally:
        own.stop()
        assert serve.stop() == 0, serve.log()
