"""Recovery never drops a run and never trusts a damaged checkpoint.

Each test reproduces a way a restored projection used to lose or double-apply data:
checkpoints stored but never published after a snapshotter crash, runs without a
checkpoint skipped by the tail, an old rebase-able resend applied twice after a restore,
and a checkpoint whose position, decisions or state could be edited undetected.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from typing import Any

import orjson
import pytest
from helpers import append_all, ev, examples, fact, fold, patch, start, project_all
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.runtime.loop import Projector
from runstate.projector.store.partition import ProjectionStore
from runstate.projector.store.statedir import Layout
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import verify
from runstate.schemas.errors import CheckpointInvalid
from runstate.schemas.state import state_digest
from runstate.snapshotter.checkpoint import encode as encode_cp
from runstate.snapshotter.checkpoint import is_coverage_key, make_checkpoint, seal, validate
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.recovery import restore_partition
from runstate.snapshotter.loop import CheckpointWriter, Snapshotter


def _restore(log: EmbeddedLog, state: Path, key: bytes | None = None) -> Projector:
    pr = Projector(
        log, str(state), publish_dead_letters=False, restore=lambda p, s: restore_partition(log, p, s, key=key)
    )
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    return pr


def _digests(state: Path) -> dict[str, str]:
    with Projection(state) as proj:
        return {h.run_id: state_digest(proj.state(h.run_id)) for h in proj.runs()}


def _checkpoint_keys(log: EmbeddedLog) -> list[bytes]:
    """The run keys on the checkpoints topic (not the coverage records)."""
    ck = log.topics.checkpoints
    return [
        r.key
        for p in range(log.partitions(ck))
        for r in log.scan(ck, p, 0, log.end_offsets(ck)[p])
        if r.key and not is_coverage_key(r.key)
    ]


def _checkpointed_then_one_more(tmp_path: Path, runs: int) -> EmbeddedLog:
    """``runs`` runs of two patches, each checkpointed (every revision), then a third patch
    each; the full replay of it all in ``tmp_path / "full"``."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    names = [f"run-{i:02d}" for i in range(runs)]
    append_all(log, [patch(r, 0, start()) for r in names] + [patch(r, 1, fact("f1")) for r in names])
    Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy(every=1, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    append_all(log, [patch(r, 2, fact("f2")) for r in names])
    project_all(log, tmp_path / "full")
    return log


class _Died(BaseException):
    """Stands for the process dying (not an Exception: nothing may catch it)."""


def test_checkpoints_stored_but_not_published_are_published_on_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("a", 0, start()), patch("b", 0, start())])
    state = tmp_path / "state"
    real = CheckpointWriter.after_write

    def die_before_publishing(self: CheckpointWriter, *args: object) -> None:
        raise _Died

    monkeypatch.setattr(CheckpointWriter, "after_write", die_before_publishing)
    with pytest.raises(_Died):
        Snapshotter(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    assert _checkpoint_keys(log) == []  # stored in the snapshotter's store, never published
    monkeypatch.setattr(CheckpointWriter, "after_write", real)
    Snapshotter(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)  # restart: nothing new to do
    assert {b"a", b"b"} <= set(_checkpoint_keys(log))


def test_a_run_without_a_checkpoint_is_replayed_not_dropped(tmp_path: Path) -> None:
    """Run b's records come first and b has no checkpoint in the topic (its checkpoint was
    never delivered); a has one covering a later offset. The tail must not start after a's."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    placed = append_all(
        log,
        [
            patch("b", 0, start()),
            patch("b", 1, fact("fb")),
            patch("a", 0, start()),
            patch("a", 1, fact("fa")),
            patch("a", 2, fact("fa2")),
        ],
    )
    book = fold(placed[:4])
    doc = book.docs["a"]
    assert doc is not None
    prod = log.producer()
    prod.append(
        log.topics.checkpoints,
        "a",
        encode_cp(make_checkpoint(doc.to_state(), partition=0, covers_offset=3, triggers=["test"], recent=[])),
    )
    prod.close()
    state = tmp_path / "state"
    _restore(log, state)
    assert set(_digests(state)) == {"a", "b"}
    assert verify(log, str(state)).ok


def test_first_start_with_checkpoints_of_other_runs_keeps_every_run(tmp_path: Path) -> None:
    """The snapshotter covers the first records; runs it has not reached (or whose
    checkpoints are not out yet) are replayed from the log on a projector's first start."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    append_all(log, [patch(f"r{i}", 0, start()) for i in range(6)] + [patch(f"r{i}", 1, fact("f")) for i in range(6)])
    state = tmp_path / "state"
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=1)).run(until_caught_up=True, poll_timeout_s=0.01)
    append_all(log, [patch(f"late{i}", 0, start()) for i in range(4)] + [patch("r0", 2, fact("g"))])
    _restore(log, state)
    assert set(_digests(state)) == {*(f"r{i}" for i in range(6)), *(f"late{i}" for i in range(4))}
    assert verify(log, str(state)).ok


def test_a_record_checkpointed_while_its_partition_is_being_assigned_is_not_taken_for_a_lost_one(
    tmp_path: Path,
) -> None:
    """A projector reads the log's ends when partitions are assigned to it, then restores
    each one. Beside it (serve's snapshotter) a patch appended meanwhile may be decided and
    checkpointed first: the restored store then stands past the end read before the
    restore, which was taken for acknowledged records the log had lost (LostRecords), and a
    serve that had just started stopped (LangGraph.js's suite, under load)."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    state = tmp_path / "state"

    def restore(p: int, store: ProjectionStore) -> Any:
        append_all(log, [patch("r1", 0, start())])
        Snapshotter(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
        report = restore_partition(log, p, store)
        assert report.runs == 1, report
        return report

    Projector(log, str(state), publish_dead_letters=False, restore=restore).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert set(_digests(state)) == {"r1"}
    assert verify(log, str(state)).ok


def test_an_old_rebased_resend_after_a_restore_is_not_applied_twice(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    spend = patch("r", 1, ev("BudgetConsumed", tokens=5), rebase=True)
    patches = [patch("r", 0, start()), spend, *(patch("r", i, fact(f"f{i}")) for i in range(2, 12))]
    append_all(log, patches)
    state = tmp_path / "state"
    project_all(log, state)
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=3)).run(until_caught_up=True, poll_timeout_s=0.01)
    before = _digests(state)
    shutil.rmtree(state / "p000")
    append_all(log, [spend])  # an agent retries its old patch (rebase asked: it would commute)
    pr = _restore(log, state)
    assert pr.stats.duplicates == 1
    with Projection(state) as proj:
        assert proj.state("r").budgets.tokens_used == 5
    assert _digests(state) == before
    assert verify(log, str(state)).ok


def _a_checkpoint(key: bytes | None = None) -> bytes:
    book = fold([(patch("r", 0, start()), 0, 0), (patch("r", 1, fact("f1")), 0, 1)])
    doc = book.docs["r"]
    assert doc is not None
    decided = sorted(book.decided.values(), key=lambda d: d.offset)
    return encode_cp(
        make_checkpoint(
            doc.to_state(),
            partition=0,
            covers_offset=1,
            triggers=["t"],
            recent=decided,
            patch_ids=[d.patch_id for d in decided],
            key=key,
        )
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.__setitem__("covers_offset", 0),
        lambda d: d["recent_decisions"][0].__setitem__("outcome", "rejected"),
        lambda d: d.__setitem__("patch_ids", ""),
        lambda d: d.__setitem__("verdict", "needs_reconciliation"),
    ],
)
def test_the_digest_covers_the_whole_checkpoint(edit: object) -> None:
    doc = orjson.loads(_a_checkpoint())
    edit(doc)  # type: ignore[operator]
    with pytest.raises(CheckpointInvalid, match="digest"):
        validate(orjson.dumps(doc))


def test_with_a_key_checkpoints_are_signed_and_forgeries_refused() -> None:
    key = b"k" * 32
    good = _a_checkpoint(key)
    assert validate(good, key=key).run_id == "r"
    unsigned = _a_checkpoint(None)
    with pytest.raises(CheckpointInvalid, match="not signed"):
        validate(unsigned, key=key)
    with pytest.raises(CheckpointInvalid, match="signature"):
        validate(_a_checkpoint(b"another key"), key=key)
    # A forged state with a recomputed digest passes the digest check, not the signature.
    doc = orjson.loads(good)
    doc["state"]["confirmed_facts"] = []
    with pytest.raises(CheckpointInvalid, match="digest"):
        validate(orjson.dumps(doc), key=key)
    forged = orjson.loads(seal(doc, key=None))
    assert validate(orjson.dumps(forged)).state.confirmed_facts == []  # without a key: integrity only
    with pytest.raises(CheckpointInvalid, match="not signed"):
        validate(orjson.dumps(forged), key=key)
    forged["signature"] = orjson.loads(good)["signature"]  # the old signature, kept
    with pytest.raises(CheckpointInvalid, match="wrong signature"):
        validate(orjson.dumps(forged), key=key)


def test_a_restore_with_a_key_refuses_unsigned_checkpoints_and_replays_instead(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r", 0, start()), *(patch("r", i, fact(f"f{i}")) for i in range(1, 8))])
    state = tmp_path / "state"
    project_all(log, state)
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=2)).run(until_caught_up=True, poll_timeout_s=0.01)
    before = _digests(state)
    shutil.rmtree(state / "p000")
    pr = _restore(log, state, key=b"the operator's key")
    assert pr.stats.records == 8  # nothing trusted: the whole partition replayed
    assert _digests(state) == before


def test_a_checkpoint_missing_from_the_topic_is_noticed_and_its_run_replayed_not_lost(tmp_path: Path) -> None:
    """20 runs, checkpoints and a coverage record published; then one run's checkpoint
    records vanish from the checkpoints topic (a tombstone, a misconfigured retention, a
    compaction bug). The coverage names how many runs it covers and a digest of their ids:
    recovery sees it restored one run fewer and replays the partition from its start, so the
    run is kept, with every later patch decided against it."""
    import sqlite3

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    runs = [f"run-{i:02d}" for i in range(20)]
    append_all(log, [patch(r, 0, start()) for r in runs] + [patch(r, 1, fact("f1")) for r in runs])
    Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy(every=1)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert "run-07" in {k.decode() for k in _checkpoint_keys(log)}
    db = sqlite3.connect(tmp_path / "log.db")
    db.execute("DELETE FROM records WHERE topic=? AND key=?", (log.topics.checkpoints, b"run-07"))
    db.commit()
    db.close()
    assert "run-07" not in {k.decode() for k in _checkpoint_keys(log)}
    append_all(log, [patch("run-07", 2, fact("f2")), patch("run-08", 2, fact("f2"))])
    state = tmp_path / "state"
    pr = _restore(log, state)
    assert set(_digests(state)) == set(runs)
    with Projection(state) as proj:
        assert [f.id for f in proj.state("run-07").confirmed_facts] == ["f1", "f2"]
        assert [d.reason for d in proj.history("run-07")][-1] is None  # decided against the run, not unknown_run
    assert pr is not None and verify(log, str(state)).ok


@pytest.mark.parametrize("field", ["digest", "signature"])
def test_a_digest_or_signature_with_non_ascii_characters_is_an_invalid_checkpoint(field: str) -> None:
    """Found by fuzzing (tests/fuzz_targets.py checkpoint_reader): hmac.compare_digest raised
    TypeError for such a string, which no restore catches."""
    doc = orjson.loads(_a_checkpoint(b"k" * 32))
    doc[field] = doc[field][:10] + "˙Ϝ" + doc[field][12:]
    with pytest.raises(CheckpointInvalid):
        validate(orjson.dumps(doc), b"k" * 32)
    from runstate.snapshotter.checkpoint import validate_coverage

    with pytest.raises(CheckpointInvalid):
        validate_coverage(
            orjson.dumps(
                {
                    "kind": "coverage",
                    "format_version": 2,
                    "partition": 0,
                    "covers_below": 4,
                    "digest": "9d82ce33fb˙Ϝ",
                    "signature": None,
                }
            ),
            0,
        )


def test_a_restore_writes_pieces_in_bounded_chunks_and_a_crash_midway_is_started_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition's pieces are written a chunk at a time (what a restore holds is bounded,
    not the partition's pieces). A process that dies midway leaves a store marked as being
    restored: the next projector starts the restore over (never projects a half-restored
    store), and ends equal to a full replay."""
    import runstate.snapshotter.recovery as recovery
    from runstate.projector.store.partition import ProjectionStore
    from runstate.projector.store.restoring import RestoredPieces

    monkeypatch.setattr(recovery, "RESTORE_CHUNK", 1)  # a run a chunk
    log = _checkpointed_then_one_more(tmp_path, 10)
    want = _digests(tmp_path / "full")

    written: list[int] = []
    real = ProjectionStore.restore_pieces

    def counted(self: ProjectionStore, chunk: list[RestoredPieces]) -> None:
        written.append(sum(1 + len(r.items) for r in chunk))
        real(self, chunk)

    monkeypatch.setattr(ProjectionStore, "restore_pieces", counted)
    _restore(log, tmp_path / "chunked")
    assert max(written) == 2 and sum(written) == 20 and _digests(tmp_path / "chunked") == want  # a fact, a header

    calls = 0

    def dies_after_one_chunk(self: ProjectionStore, chunk: list[RestoredPieces]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise _Died
        real(self, chunk)

    monkeypatch.setattr(ProjectionStore, "restore_pieces", dies_after_one_chunk)
    with pytest.raises(_Died):
        _restore(log, tmp_path / "crashed")
    with ProjectionStore(tmp_path / "crashed" / "p000") as half:
        assert half.restoring() and any(half.stored_pieces())  # pieces written, not whole
    monkeypatch.setattr(ProjectionStore, "restore_pieces", real)
    _restore(log, tmp_path / "crashed")
    assert _digests(tmp_path / "crashed") == want
    assert verify(log, str(tmp_path / "crashed")).ok


def test_a_restore_killed_right_after_it_finished_is_whole(tmp_path: Path) -> None:
    """A restore writes without the write-ahead log (a crash midway starts it over), so it
    must be on disk before the store says it is done: a projector SIGKILLed the moment its
    restore returned leaves a store the next projector goes on from, equal to a full replay."""
    log = _checkpointed_then_one_more(tmp_path, 20)
    state = tmp_path / "state"
    code = (
        "import os, signal\n"
        "from runstate.eventlog.embedded import EmbeddedLog\n"
        "from runstate.projector.runtime.loop import Projector\n"
        "from runstate.snapshotter.recovery import restore_partition\n"
        f"log = EmbeddedLog({str(tmp_path / 'log.db')!r}, create=False)\n"
        "def restore(p, s):\n"
        "    rep = restore_partition(log, p, s)\n"
        "    assert rep.runs == 20, rep\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"Projector(log, {str(state)!r}, restore=restore).run(until_caught_up=True, poll_timeout_s=0.01)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with ProjectionStore(Layout(str(state)).store_path(0)) as st_:
        assert not st_.restoring() and len(st_.restored()) == 20
    _restore(log, state)
    assert _digests(state) == _digests(tmp_path / "full")


@settings(max_examples=examples(20), deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=60),
    st.integers(1, 6),
    st.integers(3, 40),
    st.integers(1, 8),
    st.lists(st.integers(0, 4), max_size=12),
)
def test_a_restore_from_the_dense_coverage_equals_a_full_replay(
    order: list[int], every: int, max_age: int, batch: int, after: list[int]
) -> None:
    """Any interleaving of runs (some patches refused for a stale revision), any checkpoint
    cadence, age and batch size: the coverage record never promises past a record some
    run's newest checkpoint lacks, so a restore (checkpoints + tail, with patches appended
    after the snapshot) ends equal to a full replay and verify passes."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = EmbeddedLog(root / "log.db", partitions=2)
        revision: dict[str, int] = {}

        def next_patch(i: int, n: int) -> Any:
            run = f"run-{n}"
            rev = revision.get(run)
            if rev is None:
                revision[run] = 1
                return patch(run, 0, start(), patch_id=f"p{i}")
            if i % 7 == 3:  # a stale base: refused, yet the run's records move on
                return patch(run, max(0, rev - 1), fact(f"stale{i}"), patch_id=f"p{i}")
            revision[run] = rev + 1
            return patch(run, rev, fact(f"f{i}"), patch_id=f"p{i}")

        append_all(log, [next_patch(i, n) for i, n in enumerate(order)])
        Snapshotter(
            log,
            str(root / "snap"),
            policy=CheckpointPolicy(every=every, max_age=max_age, bytes_ratio=None),
            batch_size=batch,
        ).run(until_caught_up=True, poll_timeout_s=0.01)
        append_all(log, [next_patch(1000 + i, n) for i, n in enumerate(after)])
        project_all(log, root / "full")
        _restore(log, root / "restored")
        assert _digests(root / "restored") == _digests(root / "full")
        assert verify(log, str(root / "restored")).ok
        log.close()
