"""The key store under crashes, mistakes and rotations: no acknowledged append becomes
unreadable, a wrong or damaged check record never takes over, and a run the key store does
not know is never treated as erased."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from helpers import cli_env, fact, publish_all, start, unservable_letters

from runstate import app
from runstate.cli import main
from runstate.eventlog.embedded import EmbeddedLog
from runstate.eventlog.keystore import MASTER_RECORD, KeyStore, MasterKey
from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import KeyStoreError, RunNotFound
from runstate.settings import Settings


def two_patches(goal: str) -> list[dict[str, Any]]:
    return [{"expected_revision": 0, "events": [start(goal)]}, {"expected_revision": 1, "events": [fact("f1")]}]


def settings(tmp_path: Path, key: str, **kw: Any) -> Settings:
    return Settings(log=str(tmp_path / "log.db"), state_dir=str(tmp_path / "state"), master_key=key, partitions=4, **kw)


def _runs_to_rotate(tmp_path: Path, prefix: str, runs: int) -> tuple[str, str, Settings]:
    """``runs`` runs (``prefix`` + number) sealed under a new master key, and a second key in
    ``new.key`` to rotate to: the old key, the new one, the settings with the old."""
    old, new = MasterKey.generate(), MasterKey.generate()
    (tmp_path / "new.key").write_text(new)
    s = settings(tmp_path, old)
    for i in range(runs):
        publish_all(s, f"{prefix}{i}", two_patches(prefix))
    return old, new, s


def env_for(s: Settings, key: str) -> dict[str, str]:
    return cli_env(s, key)


def keys_rows(path: str) -> list[tuple[int, int, bytes, bytes]]:
    raw = EmbeddedLog(path, create=False)
    try:
        t = raw.topics.keys
        return [
            (p, r.offset, r.key or b"", r.value)
            for p in range(raw.partitions(t))
            for r in raw.scan(t, p, 0, raw.end_offsets(t)[p])
        ]
    finally:
        raw.close()


#: A writer process that opened the log with the old key before the rotation and goes on
#: starting runs after it: one line on stdin per run to start, one JSON line back.
LAGGARD = textwrap.dedent("""
    import json, sys
    from runstate import app
    from runstate.settings import Settings
    from runstate.schemas.errors import RunstateError
    s = Settings.model_validate({**json.loads(sys.argv[1]), "master_key": sys.argv[2]})
    producer = app.make_producer(s)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        run = line.strip()
        try:
            producer.append(producer.build(run, {"expected_revision": 0, "events": [
                {"type": "RunStarted", "goal": {"statement": "laggard " + run}}]}, where="laggard"))
            print(json.dumps({"run": run, "acked": True}), flush=True)
        except RunstateError as e:
            print(json.dumps({"run": run, "acked": False, "error": str(e)}), flush=True)
""")


def start_laggard(s: Settings, key: str) -> subprocess.Popen[str]:
    plain = s.model_dump(mode="json", exclude={"master_key"})
    return subprocess.Popen(
        [sys.executable, "-c", LAGGARD, json.dumps(plain), key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_writer_still_holding_the_old_key_during_a_rotation_loses_no_acknowledged_append(tmp_path: Path) -> None:
    old, new, s_old = _runs_to_rotate(tmp_path, "before-", 6)
    laggard = start_laggard(s_old, old)
    try:
        assert laggard.stdout is not None and laggard.stdin is not None
        assert json.loads(laggard.stdout.readline())["ready"]
        answers = []

        def ask(run: str) -> dict[str, Any]:
            laggard.stdin.write(run + "\n")  # type: ignore[union-attr]
            laggard.stdin.flush()  # type: ignore[union-attr]
            got: dict[str, Any] = json.loads(laggard.stdout.readline())  # type: ignore[union-attr]
            answers.append(got)
            return got

        for i in range(4):  # before the rotation: its keys land before the rotation's records
            assert ask(f"lag-before-{i}")["acked"]
        r = CliRunner().invoke(
            main, ["keys", "rotate", "--new-key-file", str(tmp_path / "new.key")], env=env_for(s_old, old)
        )
        assert r.exit_code == 0, r.output
        for i in range(12):  # after it: refused (not acknowledged), or readable with the new key
            got = ask(f"lag-after-{i}")
            assert got["acked"] or "rotated" in got["error"], got
    finally:
        laggard.kill()
        laggard.wait()
    s_new = settings(tmp_path, new)
    app.project(s_new, until_caught_up=True)
    acked = [a["run"] for a in answers if a["acked"]]
    assert len(acked) >= 4
    for run in acked:
        assert app.get_state(s_new, run).revision == 1, run
    for i in range(6):
        assert app.get_state(s_new, f"before-{i}").revision == 2
    assert [d for d in app.dead_letters(s_new)] == []
    # The old key alone is refused from now on, saying what happened.
    with pytest.raises(KeyStoreError, match="was rotated to id"):
        app.project(s_old, until_caught_up=True)
    # Both keys (the way through a rotation without a restart): read and written.
    both = settings(tmp_path, f"{new},{old}")
    publish_all(both, "with-both", two_patches("b"))
    app.project(both, until_caught_up=True)
    assert app.get_state(s_new, "with-both").revision == 2


def test_a_rotation_cut_short_and_run_again_with_another_new_key_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new1, new2 = MasterKey.generate(), MasterKey.generate(), MasterKey.generate()
    s_old = settings(tmp_path, old)
    for i in range(20):
        publish_all(s_old, f"r{i}", two_patches("x"))
    # Cut short: the process dies after a few rewraps (as a SIGKILL would: nothing after it is written).
    real = KeyStore._append
    calls = {"n": 0}

    def dying(self: KeyStore, key: str, value: dict[str, Any], partition: int) -> None:
        calls["n"] += 1
        if calls["n"] > 9:
            raise SystemExit("killed")
        real(self, key, value, partition)

    monkeypatch.setattr(KeyStore, "_append", dying)
    with pytest.raises(SystemExit):
        app.rotate_master_key(s_old, MasterKey.parse(new1))
    monkeypatch.setattr(KeyStore, "_append", real)
    status = CliRunner().invoke(main, ["keys", "status"], env=env_for(s_old, f"{old},{new1}"))
    assert status.exit_code == 0 and "rotating" in status.output, status.output
    # Run again with a freshly generated key: refused, nothing written.
    before = keys_rows(s_old.log)
    with pytest.raises(KeyStoreError, match="under way"):
        app.rotate_master_key(settings(tmp_path, f"{old},{new1}"), MasterKey.parse(new2))
    with pytest.raises(KeyStoreError):
        app.rotate_master_key(s_old, MasterKey.parse(new2))
    assert keys_rows(s_old.log) == before
    # Resumed with the key it was given: every run readable with the final key alone.
    done = app.rotate_master_key(s_old, MasterKey.parse(new1))
    assert done.resumed and done.rewrapped + done.already == 20
    final = settings(tmp_path, new1)
    app.project(final, until_caught_up=True)
    assert all(app.get_state(final, f"r{i}").revision == 2 for i in range(20))
    assert app.dead_letters(final) == []
    status = CliRunner().invoke(main, ["keys", "status"], env=env_for(final, new1))
    assert status.exit_code == 0 and "state: done" in status.output and "20 run keys wrapped by" in status.output


def test_a_rotation_whose_keys_do_not_all_open_changes_nothing_and_names_them(tmp_path: Path) -> None:
    old, new = MasterKey.generate(), MasterKey.generate()
    s = settings(tmp_path, old)
    publish_all(s, "fine", two_patches("a"))
    publish_all(s, "hurt", two_patches("b"))
    raw = EmbeddedLog(s.log, create=False)
    (p, _o, key, value) = next(r for r in keys_rows(s.log) if r[2].startswith(b"hurt\0"))
    v = orjson.loads(value)
    raw.producer().append(
        raw.topics.keys, key.decode(), orjson.dumps({**v, "wrapped": "AAAA" + v["wrapped"][4:]}), partition=p
    )
    raw.close()
    before = keys_rows(s.log)
    with pytest.raises(KeyStoreError, match=r"nothing rotated: 1 run key.*hurt/.*damaged"):
        app.rotate_master_key(s, MasterKey.parse(new))
    assert keys_rows(s.log) == before


def test_a_run_the_key_store_does_not_know_is_a_loud_dead_letter_never_erased(tmp_path: Path) -> None:
    key = MasterKey.generate()
    s = settings(tmp_path, key)
    publish_all(s, "lost", two_patches("a"))
    publish_all(s, "kept", two_patches("b"))
    # The lost run's key record is gone from the keys topic (a damaged or lost record).
    db = __import__("sqlite3").connect(s.log)
    db.execute("DELETE FROM records WHERE topic=? AND substr(key, 1, 5)=?", (EmbeddedLog(s.log).topics.keys, b"lost\0"))
    db.commit()
    db.close()
    letters = unservable_letters(s, "lost")
    assert [d.reason for d in letters] == ["key_missing", "key_missing"]
    assert app.get_state(s, "kept").revision == 2
    with pytest.raises(RunNotFound):  # no decision at all: not "run_erased"
        app.history(s, "lost")
    report = app.run_verify(s)
    assert not report.ok and "key_missing" in " ".join(report.problems)


def test_a_flipped_run_id_in_a_sealed_envelope_is_a_dead_letter_not_a_vanished_patch(tmp_path: Path) -> None:
    key = MasterKey.generate()
    s = settings(tmp_path, key)
    publish_all(s, "victim", two_patches("a"))
    log = EmbeddedLog(s.log, create=False)
    p = partition_for("victim", log.partitions(log.topics.events))
    (second,) = [r for r in log.scan(log.topics.events, p, 0, 10**9) if r.key == b"victim"][1:2]
    log.close()
    value = bytearray(second.value)
    at = bytes(value).index(b"victim")
    value[at] ^= 0x01  # 'victim' -> 'wictim'
    db = __import__("sqlite3").connect(s.log)
    from runstate.eventlog.embedded import _crc

    db.execute(
        "UPDATE records SET value=?, crc=? WHERE topic=? AND partition=? AND offset=?",
        (bytes(value), _crc(b"victim", bytes(value)), log.topics.events, p, second.offset),
    )
    db.commit()
    db.close()
    publish_all(s, "victim", [{"expected_revision": 1, "events": [fact("f2")]}])
    app.project(s, until_caught_up=True)
    letters = [d for d in app.dead_letters(s) if d.offset == second.offset]
    assert [d.reason for d in letters] == ["key_mismatch"]
    assert app.get_state(s, "victim").revision == 2  # the third patch was based on revision 1: accepted
    assert not app.run_verify(s).ok


def test_a_damaged_check_record_stops_every_process_and_a_wrong_key_never_takes_over(tmp_path: Path) -> None:
    right, wrong = MasterKey.generate(), MasterKey.generate()
    s = settings(tmp_path, right)
    publish_all(s, "r", two_patches("a"))
    raw = EmbeddedLog(s.log, create=False)
    home = partition_for(MASTER_RECORD, raw.partitions(raw.topics.keys))
    raw.producer().append(raw.topics.keys, MASTER_RECORD, b'{"master": "dam', partition=home)
    raw.close()
    before = keys_rows(s.log)
    for key in (wrong, right):
        with pytest.raises(KeyStoreError, match="damaged.*keys repair"):
            app.project(settings(tmp_path, key), until_caught_up=True)
    assert keys_rows(s.log) == before  # nothing replaced it
    r = CliRunner().invoke(main, ["keys", "repair"], env=env_for(s, wrong))
    assert r.exit_code == 1 and "not the store's" in r.output, r.output
    assert keys_rows(s.log) == before
    r = CliRunner().invoke(main, ["keys", "repair"], env=env_for(s, right))
    assert r.exit_code == 0, r.output
    app.project(s, until_caught_up=True)
    assert app.get_state(s, "r").revision == 2
    with pytest.raises(KeyStoreError, match="is not the one"):
        app.project(settings(tmp_path, wrong), until_caught_up=True)


def test_a_lost_keys_topic_is_refused_not_taken_for_a_new_store(tmp_path: Path) -> None:
    key = MasterKey.generate()
    s = settings(tmp_path, key)
    publish_all(s, "r", two_patches("a"))
    db = __import__("sqlite3").connect(s.log)
    db.execute("DELETE FROM records WHERE topic=?", (EmbeddedLog(s.log).topics.keys,))
    db.commit()
    db.close()
    with pytest.raises(KeyStoreError, match="keys were lost"):
        app.project(s, until_caught_up=True)
    assert keys_rows(s.log) == []


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX")
def test_rotation_killed_at_random_points_then_resumed_loses_nothing(tmp_path: Path) -> None:
    """The drill: ``keys rotate`` SIGKILLed at several points, resumed each time."""
    old, new, s = _runs_to_rotate(tmp_path, "r", 30)
    env = {**os.environ, **env_for(s, old)}
    for delay in (0.05, 0.15, 0.3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "runstate.cli", "keys", "rotate", "--new-key-file", str(tmp_path / "new.key")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    r = subprocess.run(
        [sys.executable, "-m", "runstate.cli", "keys", "rotate", "--new-key-file", str(tmp_path / "new.key")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    final = settings(tmp_path, new)
    app.project(final, until_caught_up=True)
    assert all(app.get_state(final, f"r{i}").revision == 2 for i in range(30))
    assert app.dead_letters(final) == []


def test_checkpoints_are_signed_with_a_key_of_the_key_store_forgeries_refused_rotation_kept(tmp_path: Path) -> None:
    """With a master key and no RUNSTATE_CHECKPOINT_KEY, checkpoints are signed with a key
    the key store holds (named in the signature): a forged checkpoint with a recomputed
    digest is refused (a head that claims to cover every record: a restore would skip them
    all), and a master key rotation leaves every checkpoint verifiable."""
    from runstate.snapshotter import pieces
    from runstate.snapshotter.checkpoint import seal

    old, new = MasterKey.generate(), MasterKey.generate()
    s = settings(tmp_path, old, checkpoint_every=1, checkpoint_bytes_ratio=0)
    publish_all(s, "r", two_patches("the true goal"))
    app.project(s, until_caught_up=True)
    app.snapshot(s, until_caught_up=True, every=1)
    assert app.run_verify(s, deep=True).ok
    rotated = settings(tmp_path, new, checkpoint_every=1, checkpoint_bytes_ratio=0)
    app.rotate_master_key(s, MasterKey.parse(new))
    report = app.run_verify(rotated, deep=True)
    assert report.ok, report.problems
    log = app.open_settings_log(rotated)
    try:
        t = log.topics.checkpoints
        (newest,) = [
            r for p in range(log.partitions(t)) for r in log.scan(t, p, 0, log.end_offsets(t)[p]) if r.key == b"r"
        ][-1:]
        doc = pieces.head_document(newest.value)
        assert ":" in doc["signature"]  # kid:hmac
        doc["covers_offset"] = 10**9
        forged = orjson.loads(seal(doc, None))
        forged["signature"] = doc["signature"]
        log.producer().append(t, "r", pieces.head_value(orjson.dumps(forged)))
    finally:
        log.close()
    report = app.run_verify(rotated, deep=True)
    assert not report.ok and any("signature" in p for p in report.problems), report.problems
    # A projector restored from the checkpoints does not take the forgery.
    import shutil

    for p in Path(rotated.state_dir).glob("p*"):
        shutil.rmtree(p)
    app.project(rotated, until_caught_up=True)
    assert app.get_state(rotated, "r").goal.statement == "the true goal"


@pytest.mark.kafka
@pytest.mark.slow
def test_on_kafka_a_rotation_killed_at_random_points_beside_a_laggard_writer_loses_nothing(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """The drill on a real broker: a writer holding only the old key keeps starting runs
    while ``keys rotate`` is SIGKILLed at several points and then finished; every run whose
    start was acknowledged reads with the new key alone, nothing is dead-lettered."""
    old, new = MasterKey.generate(), MasterKey.generate()
    (tmp_path / "new.key").write_text(new)
    prefix = kafka_topics.events.rsplit(".", 1)[0]
    s = Settings(
        log=f"kafka://{kafka_bootstrap}",
        topic_prefix=prefix,
        state_dir=str(tmp_path / "state"),
        master_key=old,
        partitions=3,
    )
    app.create_topics(s)
    for i in range(8):
        publish_all(s, f"k{i}", two_patches("x"))
    laggard = start_laggard(s, old)
    answers: list[dict[str, Any]] = []
    env = {
        **os.environ,
        "RUNSTATE_LOG": s.log,
        "RUNSTATE_TOPIC_PREFIX": prefix,
        "RUNSTATE_MASTER_KEY": old,
        "RUNSTATE_STATE_DIR": s.state_dir,
    }
    rotate = [sys.executable, "-m", "runstate.cli", "keys", "rotate", "--new-key-file", str(tmp_path / "new.key")]
    try:
        assert laggard.stdout is not None and laggard.stdin is not None
        assert json.loads(laggard.stdout.readline())["ready"]

        def ask(run: str) -> None:
            laggard.stdin.write(run + "\n")  # type: ignore[union-attr]
            laggard.stdin.flush()  # type: ignore[union-attr]
            answers.append(json.loads(laggard.stdout.readline()))  # type: ignore[union-attr]

        for n, delay in enumerate((1.0, 2.0, 3.0)):
            ask(f"lag-{n}-a")
            proc = subprocess.Popen(rotate, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                proc.wait(delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            ask(f"lag-{n}-b")
        r = subprocess.run(rotate, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        for n in range(3):
            ask(f"lag-after-{n}")
    finally:
        laggard.kill()
        laggard.wait()
    for a in answers:
        assert a["acked"] or "rotated" in a["error"], a
    s_new = s.model_copy(update={"master_key": None, "master_key_file": str(tmp_path / "new.key")})
    app.project(s_new, until_caught_up=True)
    for a in answers:
        if a["acked"]:
            assert app.get_state(s_new, a["run"]).revision == 1, a
    assert all(app.get_state(s_new, f"k{i}").revision == 2 for i in range(8))
    assert app.dead_letters(s_new) == []
