"""runstate against the reference implementations nobody on this project wrote: Apache
Avro's Java library reads the records runstate writes and runstate reads what it writes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import CLIENT_EXAMPLE, patch, rejected_decision
from javakit import run_java

from runstate.eventlog.base import TopicNames
from runstate.schemas import codec, sealed
from runstate.schemas.patch import Decision, Patch

EVENTS = json.loads(CLIENT_EXAMPLE)["events"]


def _published(kind: str) -> list[codec._Writer]:
    """The writers of the published files (``schemas/avro``), not extra ones tests register."""
    versions = {int(f.name.split(".v")[1].split(".")[0]) for f in codec.AVRO_DIR.glob(f"{kind}.v*.avsc")}
    return sorted((w for w in codec.published(kind).values() if w.version in versions), key=lambda w: w.version)


def _patches() -> list[tuple[Patch, codec._Writer]]:
    """A patch written with every published patch schema, with text that is not ASCII."""
    out = []
    for w in _published("patch"):
        fact = {**EVENTS[0], "fact": {**EVENTS[0]["fact"], "statement": "session token 实际使用 RS256 — ✓"}}
        out.append((patch("run_日本", 18, fact, EVENTS[1], patch_id=f"java-v{w.version}"), w))
    return out


def _decision() -> Decision:
    p = patch("run_ü", 0, EVENTS[0], patch_id="java-decision")
    return rejected_decision(p, "at 3 — später")


def _java(jars: Path, records: list[tuple[str, bytes]]) -> tuple[dict[tuple[str, int], str], list[str]]:
    lines = run_java(jars, "AvroCheck", str(codec.AVRO_DIR), stdin="".join(f"{k} {d.hex()}\n" for k, d in records))
    headers = {(k, int(v)): h for _, k, v, h in (ln.split(" ", 3) for ln in lines if ln.startswith("SCHEMA "))}
    return headers, [ln for ln in lines if not ln.startswith("SCHEMA ")]


@pytest.mark.slow
def test_java_writes_the_header_runstate_writes_for_every_published_schema(java_interop: Path) -> None:
    headers, _ = _java(java_interop, [])
    ours = {
        (k, w.version): (codec.MAGIC + w.fingerprint).hex()
        for k in ("patch", "decision", "sealed")
        for w in _published(k)
    }
    assert headers == ours


@pytest.mark.slow
def test_java_decodes_every_record_runstate_writes_and_writes_the_same_bytes(java_interop: Path) -> None:
    """Java's BinaryMessageDecoder, given every published schema, reads each record (any
    writer version, resolved to the newest); its BinaryMessageEncoder, given the writer
    schema, writes the very same bytes; runstate decodes what Java wrote."""
    records = [("patch", codec.encode(p, writer=w)) for p, w in _patches()]
    records.append(("decision", codec.encode_decision(_decision())))
    sealed_patch = _patches()[-1][0]
    key = os.urandom(32)
    plain = codec.encode(sealed_patch)
    records.append(
        ("sealed", sealed.seal(plain, sealed_patch.run_id, "k1", key, os.urandom(12), sealed.envelope_of(plain)))
    )
    _, answers = _java(java_interop, records)
    assert len(answers) == len(records)
    # A sealed record: Java reads its envelope and writes the same bytes; what Java wrote opens.
    *answers, sealed_answer = answers
    *records, (_, ours_sealed) = records
    status, _version, java_bytes, resolved = sealed_answer.split(" ", 3)
    assert status == "OK" and bytes.fromhex(java_bytes) == ours_sealed, sealed_answer
    assert json.loads(resolved)["envelope"]["patch_id"] == sealed_patch.patch_id
    assert codec.decode(sealed.unseal(sealed.split(bytes.fromhex(java_bytes)), key)) == sealed_patch
    for (kind, ours), answer, expected in zip(
        records, answers, [p for p, _ in _patches()] + [_decision()], strict=True
    ):
        status, version, java_bytes, resolved = answer.split(" ", 3)
        assert status == "OK", answer
        assert bytes.fromhex(java_bytes) == ours
        back = (
            codec.decode(bytes.fromhex(java_bytes))
            if kind == "patch"
            else codec.decode_decision(bytes.fromhex(java_bytes))
        )
        assert back == expected
        as_java_read = json.loads(resolved)
        assert as_java_read["patch_id"] == expected.patch_id and as_java_read["run_id"] == expected.run_id
        if kind == "patch":
            assert as_java_read["events"][0]["fact"]["statement"] == "session token 实际使用 RS256 — ✓"
            assert int(version) == next(w.version for p, w in _patches() if p.patch_id == expected.patch_id)


def _run_ids() -> list[str]:
    """A few hundred run ids, non-ASCII ones and odd lengths among them."""
    ids = [f"run_{i}" for i in range(250)] + [f"运行-{i}" for i in range(20)] + [f"run-ü-{i}" for i in range(20)]
    return ids + ["r", "ab", "abc", "x" * 199, "🙂" * 5, "run with spaces"]


@pytest.mark.kafka
@pytest.mark.slow
def test_kafka_s_java_producer_puts_each_run_where_runstate_does(
    java_interop: Path, kafka_bootstrap: str, kafka_topics: TopicNames, tmp_path: Path
) -> None:
    """Kafka's Java producer (default partitioner) puts every run on the partition that
    runstate's Kafka producer and its embedded log pick; a patch the Java client produced is
    decided by the projector like any other; Kafka's console consumer reads our records."""
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.eventlog.kafka import KafkaLog
    from runstate.producers.run_producer import RunProducer
    from runstate.projector.runtime.loop import Projector
    from runstate.projector.read.queries import Projection
    from runstate.schemas.patch import Author

    partitions = 7
    log = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    log.create_topics(partitions)
    ids = _run_ids()
    java = run_java(
        java_interop,
        "KafkaProduce",
        kafka_bootstrap,
        kafka_topics.deadletter,
        stdin="".join(f"{r.encode().hex()} 00\n" for r in ids),
    )
    by_java = {bytes.fromhex(k).decode(): int(p) for k, p, _ in (ln.split(" ") for ln in java)}
    assert len(by_java) == len(ids)

    prod = RunProducer(log, Author(agent_id="interop", agent_version="1"))
    by_runstate = {
        r: prod.append(prod.events(r, 0, [{"type": "RunStarted", "goal": {"statement": r}}])).partition for r in ids
    }
    prod.close()
    embedded = EmbeddedLog(tmp_path / "log.db", partitions=partitions)
    eprod = embedded.producer()
    by_embedded = {r: eprod.append(embedded.topics.events, r, b"x").partition for r in ids}
    eprod.close()
    embedded.close()
    assert by_java == by_runstate == by_embedded
    assert len(set(by_java.values())) == partitions

    # A patch the Java client produced, keyed by its run, decided like any other.
    p = patch("run_7", 1, {"type": "PhaseChanged", "phase": "diagnose"}, patch_id="from-java")
    (line,) = run_java(
        java_interop,
        "KafkaProduce",
        kafka_bootstrap,
        kafka_topics.events,
        stdin=f"{b'run_7'.hex()} {codec.encode(p).hex()}\n",
    )
    assert int(line.split(" ")[1]) == by_runstate["run_7"]
    state_dir = tmp_path / "state"
    Projector(log, str(state_dir), publish_dead_letters=False).run(until_caught_up=True, poll_timeout_s=0.05)
    proj = Projection(state_dir)
    d = proj.decision("run_7", "from-java")
    assert d is not None and (d.outcome, d.revision, d.agent_id) == ("accepted", 2, p.author.agent_id), d
    assert proj.state("run_7").phase == "diagnose"
    proj.close()

    # Kafka's console consumer reads every record we wrote, on the partition we wrote it to.
    out = subprocess.run(
        [
            "java",
            "-cp",
            f"{java_interop}/*",
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            kafka_bootstrap,
            "--topic",
            kafka_topics.events,
            "--from-beginning",
            "--max-messages",
            str(len(ids) + 1),
            "--timeout-ms",
            "60000",
            "--property",
            "print.key=true",
            "--property",
            "print.partition=true",
            "--property",
            "key.separator=|",
            "--property",
            "value.deserializer=org.apache.kafka.common.serialization.BytesDeserializer",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seen: dict[str, list[bytes]] = {}
    for ln in out.stdout.splitlines():
        part, key, value = ln.split("|", 2)
        assert int(part.removeprefix("Partition:")) == by_runstate[key]
        seen.setdefault(key, []).append(_unescape(value))
    assert set(seen) == set(ids)
    assert codec.encode(p) in seen["run_7"]
    assert all(codec.decode(v).run_id == k for k, vs in seen.items() for v in vs)
    log.close()


def _unescape(text: str) -> bytes:
    """The bytes behind Kafka's ``Bytes.toString`` (printable ASCII as is, the rest ``\\xHH``)."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text.startswith("\\x", i):
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        else:
            out += text[i].encode()
            i += 1
    return bytes(out)
