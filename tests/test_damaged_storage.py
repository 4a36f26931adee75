"""Damaged storage is reported, never passed off as good data and never waited on forever.

Real files damaged on disk: a changed byte in a log record, a log file re-created empty, a
projection ahead of its log, a log whose records vanished behind its head, a corrupt
RocksDB block. Each used to be projected as genuine, silently ignored, or hang.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import append_all, fact, patch, start, embedded_env

from runstate.cli import main
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import verify
from runstate.projector.runtime.loop import Projector
from runstate.schemas.errors import LogError, LostAcknowledged, LostRecords, StoreError


def _project(log: EmbeddedLog, state: Path, **kw: object) -> Projector:
    pr = Projector(log, str(state), publish_dead_letters=False, **kw)  # type: ignore[arg-type]
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    return pr


def _run_history(n: int = 6) -> list:
    return [patch("r", 0, start()), *(patch("r", i, fact(f"f{i}")) for i in range(1, n))]


def _projected(tmp_path: Path) -> tuple[Path, EmbeddedLog, Path]:
    """A one-partition log in ``tmp_path`` holding :func:`_run_history`, projected into
    ``state``: the log's path, the log, the state directory."""
    path = tmp_path / "log.db"
    log = EmbeddedLog(path, partitions=1)
    append_all(log, _run_history())
    state = tmp_path / "state"
    _project(log, state)
    return path, log, state


def test_a_changed_byte_in_a_record_is_a_checksum_dead_letter_and_verify_says_so(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    placed = append_all(log, _run_history())
    _, _, offset = placed[3]
    db = sqlite3.connect(tmp_path / "log.db")
    [(value,)] = db.execute(
        "SELECT value FROM records WHERE topic='runstate.events' AND offset=?", (offset,)
    ).fetchall()
    i = bytes(value).index(b"statement f3") + len("statement ")
    changed = bytes(value[:i]) + b"g" + bytes(value[i + 1 :])  # still valid Avro: 'statement g3'
    db.execute("UPDATE records SET value=? WHERE topic='runstate.events' AND offset=?", (changed, offset))
    db.commit()
    db.close()
    state = tmp_path / "state"
    _project(log, state)
    with Projection(state) as proj:
        assert [(d.offset, d.reason) for d in proj.dead_letters()] == [(offset, "checksum")]
        assert "g3" not in proj.state("r").model_dump_json()
    report = verify(log, str(state))
    assert not report.ok and report.damaged == [(0, offset)]
    r = CliRunner().invoke(main, ["--log", str(tmp_path / "log.db"), "--state-dir", str(state), "verify", "--quiet"])
    assert r.exit_code == 1 and f"p0@{offset}" in r.output and "checksum" in r.output


def test_a_log_recreated_empty_is_refused_naming_both_logs(tmp_path: Path) -> None:
    path, log, state = _projected(tmp_path)
    old_id = log.identity()
    log.close()
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.truncate(f"{path}{suffix}", 0)
    fresh = EmbeddedLog(path, partitions=1)  # re-created empty, with a new identity
    assert fresh.identity() != old_id
    append_all(fresh, [patch("r2", 0, start())])
    with pytest.raises(StoreError) as e:
        _project(fresh, state)
    assert old_id in str(e.value) and fresh.identity() in str(e.value)


def test_a_projection_ahead_of_its_log_is_an_error_not_negative_lag(tmp_path: Path) -> None:
    path, log, state = _projected(tmp_path)
    db = sqlite3.connect(path)  # the log lost its last records (say, a damaged WAL)
    db.execute("DELETE FROM records WHERE topic='runstate.events' AND offset >= 3")
    db.execute("UPDATE heads SET next_offset=3 WHERE topic='runstate.events'")
    db.commit()
    db.close()
    with pytest.raises(LostAcknowledged, match="lost 3 acknowledged record"):
        EmbeddedLog(path, create=False)
    Path(f"{path}.acked").unlink()  # without the log's own mark, the projection still notices
    with pytest.raises(LostRecords, match=r"lost offsets 3\.\.5 of partition 0, which the projection"):
        _project(log, state)


def test_project_until_caught_up_does_not_hang_on_records_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = EmbeddedLog(path, partitions=1)
    append_all(log, _run_history())
    db = sqlite3.connect(path)  # the head says 6 records; 2..5 cannot be read (a damaged index)
    db.execute("DELETE FROM records WHERE topic='runstate.events' AND offset >= 2")
    db.commit()
    db.close()
    with pytest.raises(LogError, match="cannot read offset 2"):
        _project(log, tmp_path / "state", stall_timeout_s=1.0)


def test_a_corrupt_store_block_is_an_error_not_a_shorter_answer(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history(30))
    state = tmp_path / "state"
    _project(log, state)
    store = state / "p000"
    ssts = sorted(store.glob("*.sst"))
    if not ssts:  # still in the memtable/WAL: reopen once so that it is flushed to a table
        from rocksdict import Rdict

        Rdict(str(store)).close()
        ssts = sorted(store.glob("*.sst"))
    assert ssts, "expected an SST file to damage"
    data = bytearray(ssts[0].read_bytes())
    for at in (len(data) // 5, 2 * len(data) // 5, 3 * len(data) // 5):  # data blocks, wherever they fall
        for i in range(at, at + 64):
            data[i] ^= 0xFF
    ssts[0].write_bytes(bytes(data))
    env = ["--log", str(tmp_path / "log.db"), "--state-dir", str(state)]
    r = CliRunner().invoke(main, [*env, "history", "r"])
    assert r.exit_code == 1 and "corrupt" in r.output.lower(), r.output
    r = CliRunner().invoke(main, [*env, "verify", "--quiet"])
    assert r.exit_code == 1 and "corrupt" in r.output.lower(), r.output


def test_a_corrupt_store_stops_the_projector_which_lets_go_and_the_patches_wait(tmp_path: Path) -> None:
    """A damaged projection store is the store's fault, not the records': the projector
    stops with StoreError (nothing dead-lettered, nothing rejected as a run it cannot see),
    lets go of its consumer group on the way out (it kept it when the store failed as the
    partition was assigned: the next projector in the process was refused), and with the
    store repaired the same patches are decided as if nothing had happened."""
    import shutil

    from rocksdict import Rdict

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    runs = [f"r{i}" for i in range(40)]
    append_all(log, [patch(r, 0, start()) for r in runs] + [patch(r, 1, fact("f1")) for r in runs])
    state = tmp_path / "state"
    _project(log, state)
    store = state / "p000"
    Rdict(str(store)).close()  # flush the memtable to a table
    good = tmp_path / "good"
    shutil.copytree(store, good)
    [sst] = sorted(store.glob("*.sst"))
    data = bytearray(sst.read_bytes())
    for i in range(len(data) // 10, 7 * len(data) // 10):  # the data blocks, keep the index and footer
        data[i] ^= 0xFF
    sst.write_bytes(bytes(data))
    append_all(log, [patch(r, 2, fact("f2")) for r in runs])
    with pytest.raises(StoreError, match="corrupt|cannot be read"):
        _project(log, state)
    shutil.rmtree(store)
    shutil.copytree(good, store)
    pr = _project(log, state)
    assert (pr.stats.accepted, pr.stats.rejected, pr.stats.dead_letters) == (len(runs), 0, 0)
    with Projection(state) as proj:
        assert all(proj.state(r).revision == 3 for r in runs)
        assert proj.dead_letters() == []
    log.close()


def test_verify_deep_checks_the_log_file_and_every_checkpoint(tmp_path: Path) -> None:
    from runstate.snapshotter.loop import Snapshotter

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history(8))
    state = tmp_path / "state"
    _project(log, state)
    Snapshotter(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    env = ["--log", str(tmp_path / "log.db"), "--state-dir", str(state)]
    assert CliRunner().invoke(main, [*env, "verify", "--deep", "--quiet"]).exit_code == 0
    log.producer().append(log.topics.checkpoints, "r", b'{"format_version": 2, "run_id": "r"}')
    plain = CliRunner().invoke(main, [*env, "verify", "--quiet"])
    assert plain.exit_code == 0  # the projection still equals a replay
    deep = CliRunner().invoke(main, [*env, "verify", "--deep", "--quiet"])
    assert deep.exit_code == 1 and "PROBLEM checkpoint runstate.checkpoints[0]@" in deep.output, deep.output


def _cli(tmp_path: Path, *args: str, state: str = "state") -> object:
    return CliRunner().invoke(main, ["--log", str(tmp_path / "log.db"), "--state-dir", str(tmp_path / state), *args])


def test_a_log_truncated_to_nothing_is_an_error_for_every_reader_never_a_new_log(tmp_path: Path) -> None:
    """``log.db`` cut to 0 bytes: a command that reads (project, snapshot, verify, status)
    refuses it and leaves it as it is; only a write (publish, topics create) makes a log."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history())
    log.close()
    (tmp_path / "log.db").write_bytes(b"")
    for extra in ("log.db-wal", "log.db-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    for args in (["project", "--until-caught-up"], ["snapshot", "--until-caught-up"], ["verify"], ["status"]):
        r = _cli(tmp_path, *args, state="fresh-state")
        assert r.exit_code != 0 and "is empty" in r.output, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    assert (tmp_path / "log.db").stat().st_size == 0


def test_a_missing_or_foreign_log_file_is_an_error_for_readers(tmp_path: Path) -> None:
    r = _cli(tmp_path, "project", "--until-caught-up")
    assert r.exit_code != 0 and "does not exist" in r.output, r.output
    assert not (tmp_path / "log.db").exists()
    db = sqlite3.connect(tmp_path / "log.db")
    db.execute("CREATE TABLE notes (x TEXT)")
    db.commit()
    db.close()
    r = _cli(tmp_path, "project", "--until-caught-up")
    assert r.exit_code != 0 and "not a runstate log" in r.output, r.output
    assert {row[0] for row in sqlite3.connect(tmp_path / "log.db").execute("SELECT name FROM sqlite_master")} == {
        "notes"
    }


def test_a_store_that_lost_its_current_file_is_an_error_never_a_fresh_start(tmp_path: Path) -> None:
    """RocksDB's CURRENT file deleted from a partition store: reads and the projector say so,
    and the store is left as it is (RocksDB made a new, empty database there, and the next
    projection ran on it as if the run's first patches had never been)."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history(10))
    log.close()
    assert _cli(tmp_path, "project", "--until-caught-up").exit_code == 0
    store = tmp_path / "state" / "p000"
    (store / "CURRENT").unlink()
    before = sorted(p.name for p in store.iterdir())
    for args in (["state", "r"], ["project", "--until-caught-up"], ["project", "--until-caught-up"], ["verify"]):
        r = _cli(tmp_path, *args)
        assert r.exit_code == 1 and "CURRENT" in r.output and "rebuild" in r.output, (args, r.output)
    assert sorted(p.name for p in store.iterdir()) == before


def test_a_record_of_the_wrong_sqlite_type_is_a_dead_letter_and_verify_sees_undecided_records(tmp_path: Path) -> None:
    """A value written into the embedded log by hand as text (not bytes): the projector
    dead-letters it like any damaged record and goes on; and while a partition's records are
    not all decided (the projector stopped on one), verify fails naming them."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    placed = append_all(log, _run_history(5))
    log.close()
    db = sqlite3.connect(tmp_path / "log.db")
    db.execute(
        "UPDATE records SET value='not bytes', key=42 WHERE topic='runstate.events' AND offset=?", (placed[2][2],)
    )
    db.commit()
    db.close()
    # Before any projection ran: nothing is decided, and verify says so.
    (tmp_path / "state").mkdir()
    log = EmbeddedLog(tmp_path / "log.db", create=False)
    from runstate.projector.store.statedir import Layout

    Layout(tmp_path / "state").ensure(log.topics.events, 1, log.identity())
    report = verify(log, str(tmp_path / "state"))
    assert not report.ok and report.undecided == {0: (0, 5)}
    r = _cli(tmp_path, "verify")
    assert r.exit_code == 1 and "not decided" in r.output, r.output
    _project(log, tmp_path / "state")
    with Projection(tmp_path / "state") as proj:
        assert [(d.offset, d.reason) for d in proj.dead_letters()] == [(placed[2][2], "checksum")]
        assert proj.state("r").revision == 2  # patches after the bad one are decided (revision conflicts)
    report = verify(log, str(tmp_path / "state"))
    assert report.undecided == {} and report.damaged == [(0, placed[2][2])]
    log.close()


def test_status_on_a_recreated_log_names_both_logs_instead_of_negative_lag(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history(8))
    log.close()
    assert _cli(tmp_path, "project", "--until-caught-up").exit_code == 0
    for f in tmp_path.glob("log.db*"):
        f.unlink()
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)  # another log under the same name
    append_all(log, _run_history(2))
    log.close()
    r = _cli(tmp_path, "status")
    assert r.exit_code == 1 and "holds projections of log" in r.output and "total lag" not in r.output, r.output


def test_status_while_a_projector_goes_on_is_lag_not_lost_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runstate status`` read the log's ends, then the projection's positions: a projector
    running meanwhile (as it does beside a status check) could decide records appended
    between the two reads, and its position past the ends read before was reported as
    acknowledged records the log had lost."""
    path, log, state = _projected(tmp_path)
    real = EmbeddedLog.committed
    later = [patch("r", 6, fact("f6")), patch("r", 7, fact("f7"))]

    def committed(self: EmbeddedLog, group_id: str, topic: str) -> dict[int, int]:
        if later:  # between status's reads: a writer appends and the projector decides
            append_all(log, [later.pop(0), later.pop(0)])
            _project(log, state)
        return real(self, group_id, topic)

    monkeypatch.setattr(EmbeddedLog, "committed", committed)
    r = _cli(tmp_path, "status")
    assert r.exit_code == 0 and "lost" not in r.output, r.output
    log.close()


def test_a_truncated_table_file_is_a_typed_error_naming_how_to_rebuild(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _run_history(10))
    _project(log, tmp_path / "state")
    log.close()
    [sst] = list((tmp_path / "state" / "p000").glob("*.sst")) or [None]
    assert sst is not None
    with open(sst, "r+b") as f:
        f.truncate(100)
    with pytest.raises(StoreError, match="rebuild it from the log"), Projection(tmp_path / "state") as proj:
        proj.state("r")
    r = _cli(tmp_path, "state", "r")
    assert r.exit_code == 1 and "rebuild it from the log" in r.output and r.output.count("\n") <= 2, r.output


def _appended_then_wal_damaged(work: Path, patches: int, *, projected: bool) -> None:
    """A process appends a run's patches to ``work/log.db`` (and projects them), then is
    SIGKILLed with the WAL left as it is; then one byte in the middle of the WAL is flipped."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import fact, start\n"
        "from runstate import app\n"
        "from runstate.settings import Settings\n"
        "s = Settings(log='log.db', state_dir='state', partitions=1)\n"
        "app.publish(s, 'r', {'expected_revision': 0, 'events': [start('x')]}, where='t')\n"
        "import sqlite3\n"
        "held = sqlite3.connect('log.db')  # open at the kill, so no close folds the WAL into the file\n"
        "held.execute('select count(*) from sqlite_master').fetchone()\n"
        f"for i in range({patches}):\n"
        "    app.publish(s, 'r', {'expected_revision': i + 1, 'events': [fact(f'f{i}')]}, where='t')\n"
        + ("app.project(s, until_caught_up=True)\n" if projected else "")
        + "os.kill(os.getpid(), signal.SIGKILL)  # the WAL is left as it is, not folded into the file\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=work, timeout=120)
    wal = work / "log.db-wal"
    raw = bytearray(wal.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    wal.write_bytes(raw)


def test_acknowledged_records_lost_from_the_wal_are_an_error_naming_the_lost_offsets(tmp_path: Path) -> None:
    """One flipped byte in the embedded log's write-ahead log: SQLite stops reading it at the
    bad frame, and acknowledged appends vanish. Where the projection saw them, `status`,
    `project` and `verify` name the lost offsets instead of reporting negative lag."""
    _appended_then_wal_damaged(tmp_path, 39, projected=True)
    env = embedded_env(tmp_path)
    from click.testing import CliRunner

    from runstate.cli import main

    for args in (["status"], ["project", "--until-caught-up", "--quiet"], ["verify", "--quiet"]):
        r = CliRunner().invoke(main, args, env=env)
        assert r.exit_code == 1, (args, r.output)
        assert re.search(r"lost \d+ acknowledged record", r.output), (args, r.output)
    # Without the log's own mark (deleted, as its message says, to go on), the projection
    # still names the offsets it had seen.
    (tmp_path / "log.db.acked").unlink()
    for args in (["status"], ["project", "--until-caught-up", "--quiet"], ["verify", "--quiet"]):
        r = CliRunner().invoke(main, args, env=env)
        assert r.exit_code == 1, (args, r.output)
        m = re.search(r"lost offsets (\d+)\.\.39 of partition 0", r.output)
        assert m is not None, (args, r.output)


def test_acknowledged_records_lost_from_the_wal_before_any_reader_saw_them_are_refused(tmp_path: Path) -> None:
    """The same damage where no reader saw the records: the log itself knows how far it
    acknowledged (``log.db.acked``) and refuses to open short of it; every command says so."""
    _appended_then_wal_damaged(tmp_path, 20, projected=False)
    env = embedded_env(tmp_path)
    for args in (["status"], ["project", "--until-caught-up", "--quiet"], ["verify", "--quiet"], ["publish", "r", "-"]):
        r = CliRunner().invoke(main, args, env=env, input='{"expected_revision": 21, "events": []}')
        assert r.exit_code == 1 and "Traceback" not in r.output, (args, r.output)
        assert re.search(r"lost \d+ acknowledged record", r.output), (args, r.output)


def test_a_full_disk_while_the_group_lock_is_written_is_a_one_line_error(tmp_path: Path) -> None:
    """The projector's group lock file names its holder; where the disk is full (here the
    lock is /dev/full, whose writes fail with ENOSPC) `project` and `snapshot` say so in
    one line and take no position, instead of a traceback."""
    log = tmp_path / "log.db"
    append_all(EmbeddedLog(str(log)), [patch("r", 0, start())])
    os.symlink("/dev/full", f"{log}.runstate-projector.lock")
    os.symlink("/dev/full", f"{log}.runstate-snapshotter.lock")
    env = ["--log", str(log), "--state-dir", str(tmp_path / "state")]
    for command in (["project", "--until-caught-up", "--quiet"], ["snapshot", "--until-caught-up"]):
        r = CliRunner().invoke(main, [*env, *command])
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert "cannot write the lock file" in r.output and "No space left on device" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output


def test_processes_creating_the_embedded_log_at_once_all_open_it(tmp_path: Path) -> None:
    """Sixteen first opens of one new file at the same moment: each opens it (the schema and
    its columns are made in one write transaction, never twice)."""
    import subprocess
    import sys

    for round_ in range(2):
        path = tmp_path / f"log{round_}.db"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from runstate.eventlog.embedded import EmbeddedLog; EmbeddedLog(sys.argv[1]).close()",
                    str(path),
                ],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(16)
        ]
        errors = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
        assert [e for e in errors if e[0] != 0] == []


def test_a_read_only_open_while_the_writer_compacts_is_not_damage(tmp_path: Path) -> None:
    """A reader opening a store read-only (a query, the CLI, a second saver) while its
    writer compacts (an erasure compacts at once) can list a table file that the compaction
    has just deleted: RocksDB says "Corruption: Can't access ... No such file". That is a
    race, not damage: the open is tried again, never reported as a damaged store."""
    import threading

    from runstate.projector.store.partition import ProjectionStore

    writer = ProjectionStore(tmp_path / "p000")
    stop = threading.Event()

    def compact() -> None:
        i = 0
        while not stop.is_set():
            for j in range(200):
                writer._db[f"k{i}-{j}".encode()] = os.urandom(100)
            writer._db.flush(True)
            writer._db.compact_range(None, None)
            i += 1

    t = threading.Thread(target=compact)
    t.start()
    try:
        for _ in range(1500):
            ProjectionStore(tmp_path / "p000", read_only=True).close()
    finally:
        stop.set()
        t.join()
        writer.close()
