"""runstate against the reference implementations nobody on this project wrote: Apache
Avro's Java library reads the records runstate writes and runstate reads what it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import CLIENT_EXAMPLE, patch
from javakit import run_java

from runstate.schemas import codec
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
    return Decision(patch_id=p.patch_id, run_id="run_ü", outcome="rejected", revision=3, expected_revision=0,
                    reason="revision_conflict", message="at 3 — später", partition=2, offset=41, agent_id="a",
                    agent_version="1", event_types=["FactConfirmed"], created_at=p.created_at,
                    content_digest="ab" * 16)  # fmt: skip


def _java(jars: Path, records: list[tuple[str, bytes]]) -> tuple[dict[tuple[str, int], str], list[str]]:
    lines = run_java(jars, "AvroCheck", str(codec.AVRO_DIR), stdin="".join(f"{k} {d.hex()}\n" for k, d in records))
    headers = {(k, int(v)): h for _, k, v, h in (ln.split(" ", 3) for ln in lines if ln.startswith("SCHEMA "))}
    return headers, [ln for ln in lines if not ln.startswith("SCHEMA ")]


@pytest.mark.slow
def test_java_writes_the_header_runstate_writes_for_every_published_schema(java_interop: Path) -> None:
    headers, _ = _java(java_interop, [])
    ours = {(k, w.version): (codec.MAGIC + w.fingerprint).hex() for k in ("patch", "decision") for w in _published(k)}
    assert headers == ours


@pytest.mark.slow
def test_java_decodes_every_record_runstate_writes_and_writes_the_same_bytes(java_interop: Path) -> None:
    """Java's BinaryMessageDecoder, given every published schema, reads each record (any
    writer version, resolved to the newest); its BinaryMessageEncoder, given the writer
    schema, writes the very same bytes; runstate decodes what Java wrote."""
    records = [("patch", codec.encode(p, writer=w)) for p, w in _patches()]
    records.append(("decision", codec.encode_decision(_decision())))
    _, answers = _java(java_interop, records)
    assert len(answers) == len(records)
    for (kind, ours), answer, expected in zip(records, answers, [p for p, _ in _patches()] + [_decision()], strict=True):
        status, version, java_bytes, resolved = answer.split(" ", 3)
        assert status == "OK", answer
        assert bytes.fromhex(java_bytes) == ours
        back = codec.decode(bytes.fromhex(java_bytes)) if kind == "patch" else codec.decode_decision(bytes.fromhex(java_bytes))
        assert back == expected
        as_java_read = json.loads(resolved)
        assert as_java_read["patch_id"] == expected.patch_id and as_java_read["run_id"] == expected.run_id
        if kind == "patch":
            assert as_java_read["events"][0]["fact"]["statement"] == "session token 实际使用 RS256 — ✓"
            assert int(version) == next(w.version for p, w in _patches() if p.patch_id == expected.patch_id)
