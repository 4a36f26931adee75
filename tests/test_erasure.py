"""Erasure by crypto-shredding: a run's content leaves every file, provably, and nothing else changes."""

from __future__ import annotations

import json

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import cli_env, embedded_env, ev, fact, publish_all, start, unservable_letters
from storekit import files_holding

from runstate import app
from runstate.cli import main
from runstate.eventlog.keystore import MasterKey
from runstate.projector.read.queries import Projection
from runstate.schemas.errors import KeyStoreError, RunErased, RunNotFound
from runstate.settings import Settings

MARKER = "MARKER-7f3c9a-personal-data"


def marked_patches(marker: str) -> list[dict[str, Any]]:
    """A run whose goal, facts, inputs and observations hold ``marker``."""
    return [
        {"expected_revision": 0, "events": [start(f"help customer {marker}")]},
        # The user channel's patch: only it may record a user input.
        {
            "expected_revision": 1,
            "author": {"agent_id": "user", "agent_version": "web"},
            "events": [
                ev("InputRecorded", input={"id": "in1", "origin": "user", "text": f"my name is {marker}"}),
                fact("f1", statement=f"the customer is {marker}"),
                ev(
                    "ObservationRecorded",
                    observation={
                        "subject": f"crm/{marker}",
                        "observed_version": "1",
                        "observed_state": f"record of {marker}",
                        "evidence": "artifact://crm/1",
                    },
                ),
            ],
        },
    ]


def test_the_search_sees_into_compressed_table_blocks_where_a_grep_does_not(tmp_path: Path) -> None:
    """The reader every erasure test searches with: a value that Snappy stores only as
    copies of earlier bytes is invisible to a grep of the .sst file, and found here."""
    from rocksdict import AccessType

    from runstate.projector.store.partition import _open, _options

    db = _open(tmp_path / "db", _options(), AccessType.read_write())
    db[b"a"] = b"MARKER-7f3c9a-" + b"z" * 40
    db[b"b"] = b"q" * 40 + b"personal-data"
    db[b"c"] = MARKER.encode()
    db.flush(True)
    db.close()
    (sst,) = (tmp_path / "db").glob("*.sst")
    assert MARKER.encode() not in sst.read_bytes()
    assert files_holding(tmp_path, MARKER.encode()) == [str(sst.relative_to(tmp_path))]


@pytest.fixture
def sealed(tmp_path: Path) -> Settings:
    return Settings(
        log=str(tmp_path / "log.db"),
        state_dir=str(tmp_path / "state"),
        master_key=MasterKey.generate(),
        checkpoint_every=1,
    )


def _sealed_on_kafka(bootstrap: str, topics: Any, tmp_path: Path, **more: Any) -> Settings:
    """Sealed runs on the test's Kafka topics (three partitions), with ``more`` settings."""
    return Settings(
        log=f"kafka://{bootstrap}",
        topic_prefix=topics.events.rsplit(".", 1)[0],
        state_dir=str(tmp_path / "state"),
        master_key=MasterKey.generate(),
        partitions=3,
        **more,
    )


def test_erased_run_leaves_every_file_and_other_runs_are_unchanged(sealed: Settings, tmp_path: Path) -> None:
    publish_all(sealed, "victim", marked_patches(MARKER))
    publish_all(sealed, "other", marked_patches("nothing-secret"))
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True, every=1)
    assert MARKER in app.get_state(sealed, "victim").goal.statement
    assert app.get_state(sealed, "victim").revision == 2
    other_before = app.get_state(sealed, "other").model_dump_json()
    # The log holds ciphertext only; the projections hold the state in the clear until erased.
    assert files_holding(tmp_path, MARKER.encode()), "the projection should hold the marker before erasure"
    assert not [f for f in files_holding(tmp_path, MARKER.encode()) if f.startswith("log.db")]

    done = app.erase(sealed, "victim", "the customer asked", "ops@example")
    assert done.first and done.erasure["by"] == "ops@example"
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True)

    assert files_holding(tmp_path, MARKER.encode()) == []
    with pytest.raises(RunErased) as e:
        app.get_state(sealed, "victim")
    assert e.value.erasure["reason"] == "the customer asked"
    assert app.get_state(sealed, "other").model_dump_json() == other_before
    assert app.run_verify(sealed).ok
    # Its past is gone too: time travel, explain and the resume plan say erased.
    for ask in (
        lambda: app.get_state(sealed, "victim", revision=1),
        lambda: app.explain_field(sealed, "victim", "goal"),
        lambda: app.resume_plan(sealed, "victim"),
    ):
        with pytest.raises(RunErased):
            ask()
    # What remains: the erasure, in history.
    assert [d.event_types for d in app.history(sealed, "victim")] == [["RunErased"]]

    # A new patch for the run is refused before it is written; a raw one is rejected.
    with pytest.raises(RunErased):
        app.publish(sealed, "victim", {"expected_revision": 2, "events": [fact("f9")]}, where="test")
    # Erasing twice: the first record stands.
    again = app.erase(sealed, "victim", "another reason", "someone-else")
    assert not again.first and again.erasure == done.erasure


def test_a_checkpoint_state_kept_by_time_travel_is_not_served_after_its_run_is_erased(sealed: Settings) -> None:
    """serve's time travel keeps the checkpoints' states it checked (one long-lived
    ``nearest``); once the run is erased, its checkpoints are gone or content-free
    tombstones (other head records) and nothing kept of them is answered."""
    publish_all(sealed, "victim", marked_patches(MARKER))
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True, every=1)
    nearest = app.nearest_checkpoint(sealed)
    kept = nearest("victim", 2)
    assert kept is not None and MARKER in kept["goal"]["statement"]
    assert nearest("victim", 2) == kept  # from what it kept
    app.erase(sealed, "victim", "the customer asked", "ops@example")
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True)
    for n in (1, 2):
        assert MARKER not in json.dumps(nearest("victim", n))


def test_a_projector_rebuilt_from_the_log_or_from_checkpoints_never_resurrects_an_erased_run(
    sealed: Settings, tmp_path: Path
) -> None:
    publish_all(sealed, "victim", marked_patches(MARKER))
    publish_all(sealed, "other", marked_patches("kept"))
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True, every=1)
    app.erase(sealed, "victim", "asked", "ops")
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True)
    other = app.get_state(sealed, "other").model_dump_json()
    state = Path(sealed.state_dir)
    # From checkpoints: the state directory lost, restored from the checkpoints topic.
    for p in state.glob("p*"):
        import shutil

        shutil.rmtree(p)
    app.project(sealed, until_caught_up=True)
    with pytest.raises(RunErased):
        app.get_state(sealed, "victim")
    assert app.get_state(sealed, "other").model_dump_json() == other
    # From the log alone: a second state directory, no checkpoints used.
    fresh = sealed.model_copy(update={"state_dir": str(tmp_path / "fresh")})
    import shutil

    shutil.rmtree(snapshot_dir := Path(sealed.state_dir) / "snapshotter")
    assert not snapshot_dir.exists()
    app.project(fresh, until_caught_up=True)
    with pytest.raises(RunErased):
        app.get_state(fresh, "victim")
    assert app.get_state(fresh, "other").model_dump_json() == other
    assert app.run_verify(fresh).ok
    assert files_holding(tmp_path, MARKER.encode()) == []


def test_erase_bad_input(sealed: Settings, tmp_path: Path) -> None:
    publish_all(sealed, "r", marked_patches("x"))
    env = cli_env(sealed)
    r = CliRunner().invoke(main, ["erase", "nope", "--reason", "x", "--wait", "0"], env=env)
    assert r.exit_code == 1 and "'nope'" in r.output
    r = CliRunner().invoke(main, ["erase", "r", "--reason", "asked", "--by", "ops", "--wait", "0"], env=env)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["erase", "r", "--reason", "again", "--wait", "0"], env=env)
    assert r.exit_code == 0 and "already erased" in r.output and "asked" in r.output
    # A wrong master key: refused in one line, nothing written.
    r = CliRunner().invoke(
        main, ["project", "--until-caught-up"], env={**env, "RUNSTATE_MASTER_KEY": MasterKey.generate()}
    )
    assert r.exit_code == 1 and "is not the one" in r.output and "Traceback" not in r.output
    # None at all on a sealed log: refused, never read as if plain.
    r = CliRunner().invoke(
        main, ["project", "--until-caught-up"], env={k: v for k, v in env.items() if "MASTER" not in k}
    )
    assert r.exit_code == 1 and "sealed" in r.output
    # A malformed one.
    r = CliRunner().invoke(main, ["project", "--until-caught-up"], env={**env, "RUNSTATE_MASTER_KEY": "not-a-key"})
    assert r.exit_code == 1 and "not a master key" in r.output
    # Without a master key, erasure is unavailable and says why.
    plain = Settings(log=str(tmp_path / "plain.db"), state_dir=str(tmp_path / "plain"))
    with pytest.raises(KeyStoreError, match="RUNSTATE_MASTER_KEY"):
        app.erase(plain, "r", "x", "ops")
    with pytest.raises(RunNotFound):
        app.erase(sealed, "never", "x", "ops")


def test_a_draft_cannot_erase(sealed: Settings) -> None:
    from runstate.schemas.errors import ContractError

    with pytest.raises(ContractError, match="operator"):
        app.publish(
            sealed,
            "r",
            {"expected_revision": 0, "events": [{"type": "RunErased", "reason": "x", "erased_by": "agent"}]},
            where="t",
        )


def test_master_key_is_never_written_and_run_keys_are_wrapped(sealed: Settings, tmp_path: Path) -> None:
    publish_all(sealed, "r", marked_patches("x"))
    raw = bytes.fromhex(sealed.master_key.get_secret_value())  # type: ignore[union-attr]
    assert files_holding(tmp_path, raw) == [] and files_holding(tmp_path, raw.hex().encode()) == []
    assert os.path.getsize(sealed.log) > 0


@pytest.mark.slow
def test_delete_through_serve_answers_410_after_and_needs_an_erasing_token(tmp_path: Path) -> None:
    import httpx
    from servekit import serving, mcp_error, mcp_session

    from runstate.service.auth import add_token

    tf = str(tmp_path / "tokens.json")
    writer, operator = add_token(tf, "agent-1"), add_token(tf, "ops", erase=True)
    channel = {"authorization": f"Bearer {add_token(tf, 'user')}"}  # the user channel's token
    env = {
        **embedded_env(tmp_path),
        "RUNSTATE_TOKENS_FILE": tf,
        "RUNSTATE_MASTER_KEY": MasterKey.generate(),
        "RUNSTATE_RETENTION": "completed=30d",
        "RUNSTATE_RETENTION_CHECK_S": "0.1",
    }
    with serving(env, tmp_path) as proc:
        http = httpx.Client(base_url=proc.url, timeout=30)
        auth = {"authorization": f"Bearer {writer}"}
        for p in marked_patches(MARKER):
            r = http.post("/runs/victim/patches?wait=10", json=p, headers=channel if "author" in p else auth)
            assert r.json().get("decision", {}).get("outcome") == "accepted", r.text
        assert MARKER in http.get("/runs/victim", headers=auth).text
        # An agent's write token may not erase; an operator's may.
        r = http.delete("/runs/victim", params={"reason": "asked"}, headers=auth)
        assert r.status_code == 403 and "--erase" in r.json()["error"]["message"]
        r = http.delete(
            "/runs/victim",
            params={"reason": "the customer asked", "wait": 10},
            headers={"authorization": f"Bearer {operator}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["first"] and body["erasure"]["by"] == "ops" and body["decision"]["event_types"] == ["RunErased"]
        for path in ("/runs/victim", "/runs/victim/context"):
            r = http.get(path, headers=auth)
            assert r.status_code == 410 and r.json()["error"]["code"] == "erased", r.text
            assert r.json()["error"]["erasure"]["reason"] == "the customer asked"
        r = http.post(
            "/runs/victim/patches?wait=5", json={"expected_revision": 2, "events": [fact("f2")]}, headers=auth
        )
        assert r.status_code == 410, r.text
        r = http.delete("/runs/victim", params={"reason": "again"}, headers={"authorization": f"Bearer {operator}"})
        assert r.status_code == 200 and not r.json()["first"] and r.json()["erasure"]["reason"] == "the customer asked"
        r = http.delete("/runs/nope", params={"reason": "x"}, headers={"authorization": f"Bearer {operator}"})
        assert r.status_code == 404
        # The model hears it too, as a tool error with the code, not "Error executing tool".
        err = mcp_session(proc.url, writer, lambda s, _i: s.call_tool("run_state", {"run_id": "victim"}))
        assert mcp_error(err)["code"] == "erased"
        # Retention reports what is due and what it erased.
        metrics = http.get("/metrics", headers=auth).text
        assert "runstate_retention_erased_runs 0.0" in metrics and "runstate_retention_due_runs{" in metrics
        # The page shows the erasure.
        r = http.get("/runs", headers=auth)
        assert [x["status"] for x in r.json() if x["run_id"] == "victim"] == ["erased"]
    assert "Traceback" not in proc.log()
    assert files_holding(tmp_path, MARKER.encode()) == []


def _live_and_replayed(ops: list[Any], erasures: list[tuple[int, str]], batch: int, d: Path) -> tuple[Any, Any]:
    from workloads import build

    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.eventlog.keystore import Keyring, KeyStore
    from runstate.eventlog.sealed import SealedLog
    from runstate.projector.runtime.loop import Projector
    from runstate.schemas.codec import encode
    from runstate.schemas.patch import Author

    patches = build(ops)
    inner = EmbeddedLog(d / "log.db", partitions=2)
    log = SealedLog(inner, Keyring(KeyStore(inner, MasterKey(os.urandom(32)))))
    producer = log.producer()
    due = {}
    for at, run in erasures:
        due.setdefault(min(at, len(patches)), []).append(run)
    for i in range(len(patches) + 1):
        for run in due.get(i, []):
            # The live projector decides what came before the erasure with the keys there.
            Projector(log, str(d / "live"), batch_size=batch).run(until_caught_up=True, poll_timeout_s=0.01)
            try:
                app.erase_run(log, run, "asked", "ops", Author(agent_id="ops", agent_version="1"), 0)
            except RunNotFound:
                pass  # no patch of it was sealed yet: nothing to erase
        if i < len(patches):
            try:
                producer.append(log.topics.events, patches[i].run_id, encode(patches[i]))
            except RunErased:
                pass  # refused before it is written
    Projector(log, str(d / "live"), batch_size=batch).run(until_caught_up=True, poll_timeout_s=0.01)
    # Replayed after the fact: every erased run's earlier patches are unreadable now.
    Projector(log, str(d / "replayed"), batch_size=batch).run(until_caught_up=True, poll_timeout_s=0.01)
    producer.close()
    with Projection(d / "live") as live, Projection(d / "replayed") as again:
        out = (
            (live.digests(), {r: live.history(r) for r in ("r0", "r1", "r2")}),
            (again.digests(), {r: again.history(r) for r in ("r0", "r1", "r2")}),
        )
    log.close()
    return out


@pytest.mark.slow
def test_any_interleaving_of_patches_and_erasures_replays_to_the_live_states() -> None:
    import tempfile

    from helpers import examples
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st
    from workloads import RUNS, op

    @hsettings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(op, min_size=5, max_size=40),
        st.lists(st.tuples(st.integers(0, 40), st.sampled_from(RUNS)), max_size=3),
        st.integers(1, 7),
    )
    def check(ops: list[Any], erasures: list[tuple[int, str]], batch: int) -> None:
        with tempfile.TemporaryDirectory() as d:
            (live_states, live_history), (states, history) = _live_and_replayed(ops, erasures, batch, Path(d))
            assert states == live_states
            # What remains of an erased run is the same too: its erasure and what came after.
            assert history == live_history

    check()


@pytest.mark.kafka
@pytest.mark.slow
def test_on_kafka_the_marker_never_reaches_the_broker_and_the_erased_key_leaves_its_files(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    import time

    import orjson
    from conftest import KAFKA_DATA

    from runstate.eventlog.kafka import KafkaLog

    # Uncompressed batches: what the broker's files hold is then the records' own bytes, so
    # that looking for a marker (or a key) in them can find it.
    settings = _sealed_on_kafka(
        kafka_bootstrap, kafka_topics, tmp_path, key_purge_s=1, kafka_config={"producer.compression.type": "none"}
    )
    app.create_topics(settings)
    publish_all(settings, "victim", marked_patches(MARKER))
    publish_all(settings, "other", marked_patches("kept"))
    app.project(settings, until_caught_up=True)
    app.snapshot(settings, until_caught_up=True, every=1)
    other = app.get_state(settings, "other").model_dump_json()
    assert MARKER in app.get_state(settings, "victim").goal.statement
    data = KAFKA_DATA[0] if KAFKA_DATA else None
    # The broker only ever held ciphertext: events, checkpoints and decisions are sealed.
    if data is not None:
        assert files_holding(data, MARKER.encode()) == []
    raw = KafkaLog(kafka_bootstrap, topics=kafka_topics)
    wrapped = [
        orjson.loads(r.value)["wrapped"]
        for p in range(3)
        for r in raw.scan(kafka_topics.keys, p, 0, raw.end_offsets(kafka_topics.keys)[p])
        if r.key and r.key.startswith(b"victim\0")
    ]
    assert wrapped
    if data is not None:
        assert files_holding(data, wrapped[0].encode()), "the wrapped key should be in the broker's files before"

    app.erase(settings, "victim", "asked", "ops")
    app.project(settings, until_caught_up=True)
    app.snapshot(settings, until_caught_up=True)
    assert files_holding(tmp_path, MARKER.encode()) == []
    with pytest.raises(RunErased):
        app.get_state(settings, "victim")
    assert app.get_state(settings, "other").model_dump_json() == other
    assert app.run_verify(settings).ok
    if data is None:
        raw.close()
        return
    # Kafka's cleaner takes the old key record off the disk once its segment rolled (a
    # later record on the partition) and the compaction lag (key_purge_s) passed.
    deadline = time.monotonic() + 90
    holding = ["?"]
    while time.monotonic() < deadline:
        time.sleep(1.5)
        publish_all(settings, f"later-{int(time.monotonic() * 1000)}", marked_patches("x")[:1])
        holding = sorted({f for w in wrapped for f in files_holding(data, w.encode())})
        if not holding:
            break
    raw.close()
    assert holding == [], f"the erased run's wrapped key is still in the broker's files {holding}"


def test_a_damaged_key_record_makes_that_run_unreadable_and_says_so_the_partition_goes_on(
    sealed: Settings, tmp_path: Path
) -> None:
    import orjson

    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.eventlog.partitioner import partition_for

    publish_all(sealed, "hurt", marked_patches("a"))
    publish_all(sealed, "fine", marked_patches("b"))
    raw = EmbeddedLog(sealed.log, create=False)
    (key,) = [
        r.key
        for p in range(raw.partitions(raw.topics.keys))
        for r in raw.scan(raw.topics.keys, p, 0, 10**9)
        if r.key and r.key.startswith(b"hurt\0")
    ]
    n = raw.partitions(raw.topics.keys)
    raw.producer().append(
        raw.topics.keys,
        key.decode(),
        orjson.dumps({"run_id": "hurt", "kid": key.split(b"\0")[1].decode(), "master": "x", "wrapped": "AAAA"}),
        partition=partition_for("hurt", n),
    )
    raw.close()
    letters = unservable_letters(sealed, "hurt")
    assert [d.reason for d in letters] == ["key_damaged", "key_damaged"]
    assert "unreadable" in letters[0].detail
    assert app.get_state(sealed, "fine").revision == 2


def test_the_master_key_rotates_and_the_old_one_is_then_refused(sealed: Settings, tmp_path: Path) -> None:
    publish_all(sealed, "r", marked_patches("x"))
    new_key = MasterKey.generate()
    (tmp_path / "new.key").write_text(new_key)
    env = cli_env(sealed)
    r = CliRunner().invoke(main, ["keys", "rotate", "--new-key-file", str(tmp_path / "new.key")], env=env)
    assert r.exit_code == 0 and "1 run key" in r.output, r.output
    rotated = sealed.model_copy(update={"master_key": None, "master_key_file": str(tmp_path / "new.key")})
    app.project(rotated, until_caught_up=True)
    assert app.get_state(rotated, "r").revision == 2
    publish_all(rotated, "r2", marked_patches("y"))
    with pytest.raises(KeyStoreError, match="was rotated to id"):
        app.project(sealed, until_caught_up=True)


def test_retention_erases_ended_runs_when_due_and_counts_what_it_did(sealed: Settings) -> None:
    from runstate.schemas.errors import ContractError

    kept = sealed.model_copy(update={"retention": "completed=1s,failed=1h", "retention_check_s": 0.05})
    publish_all(kept, "done", [*marked_patches(MARKER), {"expected_revision": 2, "events": [ev("RunCompleted")]}])
    publish_all(
        kept, "failed", [*marked_patches("f"), {"expected_revision": 2, "events": [ev("RunFailed", reason="x")]}]
    )
    publish_all(kept, "running", marked_patches("r"))
    app.project(kept, until_caught_up=True)
    import time

    time.sleep(1.2)
    stats, _ = app.snapshot(kept, until_caught_up=True)
    app.project(kept, until_caught_up=True)
    with pytest.raises(RunErased) as e:
        app.get_state(kept, "done")
    assert e.value.erasure["by"] == "retention" and "completed=1s" in e.value.erasure["reason"]
    assert app.get_state(kept, "failed").status == "failed"  # kept for an hour
    assert app.get_state(kept, "running").status == "running"
    assert files_holding(Path(sealed.state_dir), MARKER.encode()) == []
    with pytest.raises(ContractError, match="not an ended status"):
        sealed.model_copy(update={"retention": "running=1d"}).retention_policy()
    with pytest.raises(KeyStoreError, match="RUNSTATE_RETENTION"):
        plain = Settings(
            log=str(Path(sealed.state_dir).parent / "p.db"),
            state_dir=str(Path(sealed.state_dir).parent / "p"),
            retention="completed=1d",
        )
        app.publish(plain, "x", marked_patches("x")[0], where="t")
        app.snapshot(plain, until_caught_up=True)


def _killed_at(settings: Settings, where: str, call: str) -> int:
    """Run ``call`` (app.<...>) in a process that SIGKILLs itself when ``where`` (a
    ``module:Class.method``) is first called; returns its exit code."""
    import subprocess
    import sys

    module, attr = where.split(":")
    cls, method = attr.split(".")
    script = (
        "import os, signal, sys, importlib\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from runstate import app\n"
        "from runstate.settings import Settings\n"
        "import json\n"
        f"s = Settings.model_validate({{**json.loads({settings.model_dump_json()!r}), "
        f"'master_key': {settings.master_key.get_secret_value()!r}}})\n"  # type: ignore[union-attr]
        f"cls = getattr(importlib.import_module({module!r}), {cls!r})\n"
        f"setattr(cls, {method!r}, lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))\n"
        f"app.{call}\n"
    )
    return subprocess.run([sys.executable, "-c", script], timeout=120).returncode


def _keys_alive(settings: Settings, run_id: str) -> list[str]:
    from runstate.eventlog.keystore import KeyStore, MasterKeys

    raw = app._open_raw(settings, create=False)
    store = KeyStore(raw, MasterKeys.parse(settings.master_key.get_secret_value()))  # type: ignore[union-attr]
    try:
        entry = store.run(run_id, refresh=True)
        return [] if entry is None else entry.usable()
    finally:
        store.close()
        raw.close()


def test_an_erasure_killed_at_each_step_is_finished_by_the_next_process(sealed: Settings, tmp_path: Path) -> None:
    """SIGKILL between the erasure's WriteBatch and its compaction (projector, snapshotter),
    and between ``erase``'s append and its key destruction: the next process that takes the
    erasure finishes it, and no file holds the content, compressed blocks included."""
    publish_all(sealed, "victim", marked_patches(MARKER))
    publish_all(sealed, "other", marked_patches("kept"))
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True, every=1)
    assert files_holding(tmp_path, MARKER.encode())
    # `runstate erase` dies after appending the erasure, before destroying the keys.
    assert _killed_at(sealed, "runstate.eventlog.keystore:KeyStore.erase", "erase(s, 'victim', 'asked', 'ops')") == -9
    assert _keys_alive(sealed, "victim")
    # The projector and the snapshotter die with the run wiped but not compacted away.
    for call in ("project(s, until_caught_up=True)", "snapshot(s, until_caught_up=True)"):
        assert _killed_at(sealed, "runstate.projector.store.partition:ProjectionStore._compact_erased", call) == -9
    with Projection(sealed.state_dir) as proj:
        assert proj.erasing() == ["victim"]
    r = CliRunner().invoke(
        main,
        ["status"],
        env=cli_env(sealed),
    )
    assert r.exit_code == 0 and "erasures not finished: victim" in r.output, r.output
    # Restarted: each finishes what it left, then goes on.
    for i in range(3):
        publish_all(sealed, "other", [{"expected_revision": 2 + i, "events": [fact(f"g{i}")]}])
    app.project(sealed, until_caught_up=True)
    app.snapshot(sealed, until_caught_up=True)
    assert _keys_alive(sealed, "victim") == []
    with Projection(sealed.state_dir) as proj:
        assert proj.erasing() == []
    assert files_holding(tmp_path, MARKER.encode()) == []
    with pytest.raises(RunErased):
        app.get_state(sealed, "victim")
    assert app.get_state(sealed, "other").revision == 5


def test_retention_cut_short_is_finished_on_restart(sealed: Settings, tmp_path: Path) -> None:
    import time

    kept = sealed.model_copy(update={"retention": "completed=1s", "retention_check_s": 0.05})
    publish_all(kept, "done", [*marked_patches(MARKER), {"expected_revision": 2, "events": [ev("RunCompleted")]}])
    app.project(kept, until_caught_up=True)
    time.sleep(1.2)
    assert _killed_at(kept, "runstate.eventlog.keystore:KeyStore.erase", "snapshot(s, until_caught_up=True)") == -9
    assert _keys_alive(kept, "done")
    app.snapshot(kept, until_caught_up=True)
    app.project(kept, until_caught_up=True)
    assert _keys_alive(kept, "done") == []
    with pytest.raises(RunErased):
        app.get_state(kept, "done")
    assert files_holding(tmp_path, MARKER.encode()) == []


@pytest.mark.kafka
@pytest.mark.slow
def test_on_kafka_an_erasure_killed_at_each_step_is_finished(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    s = _sealed_on_kafka(kafka_bootstrap, kafka_topics, tmp_path, checkpoint_every=1)
    app.create_topics(s)
    publish_all(s, "victim", marked_patches(MARKER))
    publish_all(s, "other", marked_patches("kept"))
    app.project(s, until_caught_up=True)
    app.snapshot(s, until_caught_up=True, every=1)
    assert _killed_at(s, "runstate.eventlog.keystore:KeyStore.erase", "erase(s, 'victim', 'asked', 'ops')") == -9
    assert _keys_alive(s, "victim")
    for call in ("project(s, until_caught_up=True)", "snapshot(s, until_caught_up=True)"):
        assert _killed_at(s, "runstate.projector.store.partition:ProjectionStore._compact_erased", call) == -9
    app.project(s, until_caught_up=True)
    app.snapshot(s, until_caught_up=True)
    assert _keys_alive(s, "victim") == []
    assert files_holding(Path(s.state_dir), MARKER.encode()) == []
    with pytest.raises(RunErased):
        app.get_state(s, "victim")
    assert app.get_state(s, "other").revision == 2


def test_erase_on_the_embedded_log_with_no_projector_running_finishes_the_erasure_itself(sealed: Settings) -> None:
    """Nothing projects the log: `erase` runs the projector itself (the projections are on
    this machine), so `state` no longer shows the content and `verify` passes at once."""
    publish_all(sealed, "r", marked_patches("x"))
    app.project(sealed, until_caught_up=True)
    env = cli_env(sealed)
    r = CliRunner().invoke(main, ["erase", "r", "--reason", "asked", "--by", "ops"], env=env)
    assert r.exit_code == 0 and "dropped its state" in r.output, r.output
    state = CliRunner().invoke(main, ["state", "r"], env=env)
    assert MARKER not in state.output and "erased" in state.output, state.output
    assert MARKER not in CliRunner().invoke(main, ["context", "r"], env=env).output
    assert app.run_verify(sealed).ok
    assert app.erasures_pending(sealed) == []
