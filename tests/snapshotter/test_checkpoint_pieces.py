"""Checkpoints as pieces (format 4): a checkpoint writes what changed since the run's
previous one, and a restore trusts a run's pieces only when they are exactly its head's.

Each fault the design must answer is made on a real embedded log and a real RocksDB: a
head without its pieces, pieces without a head, a missing piece, a piece that is not the
head's, and two snapshotters writing one topic. Every one ends in a projection equal to a
full replay (``verify``), with the damaged runs replayed rather than restored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from helpers import append_all, ev, fact, patch, start

from runstate.eventlog.base import Record
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.replay import verify
from runstate.projector.runtime.loop import Projector
from runstate.snapshotter import pieces
from runstate.snapshotter.checkpoint import is_coverage_key
from runstate.snapshotter.history import CheckpointHistory
from runstate.snapshotter.loop import Snapshotter, snapshotter_dir
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.recovery import RestoreReport, restore_partition

RUNS = ("run_a", "run_b", "run_c")


def _workload() -> list:  # type: ignore[type-arg]
    """Three runs; a tool call started and finished (an item created, then deleted)."""
    out = [patch(r, 0, start()) for r in RUNS]
    for i in range(12):
        for r in RUNS:
            evs = [fact(f"f{i}")]
            if i == 3:
                evs = [ev("ToolCallStarted", call_id="c1", tool="search")]
            if i == 6:
                evs = [ev("ToolSucceeded", call_id="c1", result_ref="artifact://r/1")]
            out.append(patch(r, i + 1, *evs))
    return out


def _snapshotted(tmp_path: Path, group: str = "runstate-snapshotter") -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _workload())
    Snapshotter(
        log, str(tmp_path / f"snap-{group}"), policy=CheckpointPolicy(every=4, bytes_ratio=None), group_id=group
    ).run(until_caught_up=True, poll_timeout_s=0.01)
    return log


def _copy(log: EmbeddedLog, path: Path, keep: Callable[[Record], bool]) -> EmbeddedLog:
    """The same events; of the checkpoints topic only what ``keep`` keeps."""
    out = EmbeddedLog(path, partitions=1)
    prod = out.producer()
    for r in log.scan(log.topics.events, 0, 0, 10**9):
        prod.append(out.topics.events, r.key.decode() if r.key else "", r.value)
    ck = log.topics.checkpoints
    for r in log.scan(ck, 0, 0, 10**9):
        if keep(r):
            prod.append(ck, (r.key or b"").decode(), r.value, partition=0)
    return out


def _restored(log: EmbeddedLog, state: Path) -> RestoreReport:
    reports: list[RestoreReport] = []
    Projector(log, str(state), restore=lambda p, s: reports.append(restore_partition(log, p, s))).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert verify(log, str(state)).ok  # equal to a full replay, whatever was restored
    [rep] = reports
    return rep


def _piece(r: Record) -> str | None:
    got = pieces.unpack(r.value) if pieces.split_key(r.key)[1] is not None else None
    return None if got is None else got[1]


def test_intact_pieces_restore_every_run_and_the_tail_starts_past_them(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == [] and rep.start_offset > 0


def test_heads_without_their_pieces_restore_nothing_and_replay(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    heads_only = _copy(log, tmp_path / "h.db", lambda r: pieces.split_key(r.key)[1] is None)
    rep = _restored(heads_only, tmp_path / "state")
    assert rep.runs == 0 and rep.start_offset == 0 and len(rep.rejected) == 3


def test_pieces_without_a_head_restore_nothing_and_replay(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    pieces_only = _copy(log, tmp_path / "p.db", lambda r: pieces.split_key(r.key)[1] is not None)
    rep = _restored(pieces_only, tmp_path / "state")
    assert rep.runs == 0 and rep.start_offset == 0


def test_a_missing_piece_drops_its_run_only(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    gone = pieces.record_key("run_b", pieces.item_piece("confirmed_facts", "f1")).encode()
    missing = _copy(log, tmp_path / "m.db", lambda r: r.key != gone)
    rep = _restored(missing, tmp_path / "state")
    assert rep.runs == 2 and rep.start_offset == 0
    assert [reason.split(" (")[0] for _, reason in rep.rejected] == ["its pieces do not match its head"]


def test_a_piece_that_is_not_the_heads_drops_its_run(tmp_path: Path) -> None:
    """A piece of the run's epoch that its head does not count (written by someone holding
    the run's key, say): the run is replayed."""
    log = _snapshotted(tmp_path)
    ck = log.topics.checkpoints
    item = [r for r in log.scan(ck, 0, 0, 10**9) if pieces.is_item(_piece(r) or "") and r.key.startswith(b"run_c\0")][
        -1
    ]
    epoch = pieces.unpack(item.value)[0]  # type: ignore[index]
    name = pieces.item_piece("confirmed_facts", "planted")
    log.producer().append(ck, pieces.record_key("run_c", name), pieces.piece_value(epoch, name, b"x" * 20), partition=0)
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 2 and rep.start_offset == 0


def test_two_snapshotters_on_one_topic_each_base_in_its_own_epoch(tmp_path: Path) -> None:
    """A second snapshotter (a partition taken over, its own store) writes every run's
    pieces again in an epoch of its own. A piece of another epoch that no head counts (a
    late write of an instance that lost the partition) is left on the topic and never
    restored."""
    log = _snapshotted(tmp_path)
    Snapshotter(log, str(tmp_path / "other"), policy=CheckpointPolicy(every=4, bytes_ratio=None), group_id="other").run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    name = pieces.item_piece("pending_tool_calls", "zombie")
    log.producer().append(
        log.topics.checkpoints, pieces.record_key("run_a", name), pieces.piece_value(7, name, b"x" * 20), partition=0
    )
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == []


def test_a_checkpoint_writes_what_changed_and_history_rebuilds_every_revision(tmp_path: Path) -> None:
    """After a run's first checkpoint, one writes its header, its last decisions, its new
    patch ids and the items that changed, not the run; the local history still gives the
    whole checkpoint at every revision, equal to the state the projector had there."""
    log = _snapshotted(tmp_path)
    ck = log.topics.checkpoints
    per_head: list[list[str]] = [[]]
    for r in log.scan(ck, 0, 0, 10**9):
        if is_coverage_key(r.key) or not r.key.startswith(b"run_a"):
            continue
        if pieces.split_key(r.key)[1] is None:
            per_head.append([])
        else:
            per_head[-1].append(_piece(r) or "")
    later = [names for names in per_head[2:] if names]
    assert later and all(len([n for n in names if pieces.is_item(n)]) <= 4 for names in later)
    with CheckpointHistory(snapshotter_dir(tmp_path / "snap-runstate-snapshotter")) as hist:
        cps = hist.of("run_a")
        assert len(cps) >= 4
        for cp in cps:
            assert hist.nearest("run_a", cp.revision) == cp
            assert len(cp.state.confirmed_facts) == cp.revision - 1 - sum(1 for i in (3, 6) if i < cp.revision - 1)


def test_segments_of_patch_ids_merge_sixteen_of_a_size_and_a_long_run_keeps_few() -> None:
    n = pieces.SEGMENT_FANOUT
    assert n == 16
    small = {f"s{i:02d}": 1 + i % 3 for i in range(n)}  # tier 0: under 16 ids each
    assert pieces.merged_segments(dict(list(small.items())[:-1])) == []
    assert pieces.merged_segments(small) == [sorted(small)]
    # Merging can cascade: sixteen of tier 0 make one of tier 1, the sixteenth of its tier.
    bigger = {f"b{i:02d}": 16 + i for i in range(n - 1)}
    assert pieces.merged_segments({**bigger, **small}) == [sorted(small)[:n], [*sorted(bigger), sorted(small)[-1]]]

    # A run checkpointed at every one of its 200 patches holds a handful of segments, and
    # a restore from them answers every patch id as decided (equal to a full replay).
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = EmbeddedLog(Path(tmp) / "log.db", partitions=1)
        append_all(log, [patch("long", 0, start())] + [patch("long", i, fact(f"f{i % 5}")) for i in range(1, 200)])
        Snapshotter(log, str(Path(tmp) / "snap"), policy=CheckpointPolicy(every=1, bytes_ratio=None)).run(
            until_caught_up=True, poll_timeout_s=0.01
        )
        newest: dict[bytes, bytes] = {}
        for r in log.scan(log.topics.checkpoints, 0, 0, 10**9):
            newest[r.key or b""] = r.value
        live = [got[1] for v in newest.values() if (got := pieces.unpack(v)) is not None and got[2]]
        segments = [n for n in live if pieces.is_ids(n)]
        assert 1 <= len(segments) <= 3 * (pieces.SEGMENT_FANOUT - 1), segments
        rep = _restored(log, Path(tmp) / "state")
        assert rep.runs == 1 and rep.rejected == []
        log.close()


def test_a_quiet_partition_is_covered_to_its_end_and_a_restore_replays_no_tail(tmp_path: Path) -> None:
    """Runs that go quiet between boundaries (five patches, no task done, no wait) are
    checkpointed once their partition is quiet (trigger ``quiet``): the coverage reaches the
    log's end, and a restore replays nothing. Without it, their records waited for the
    ``age`` trigger, and a restore replayed them all."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    patches = [patch(r, 0, start()) for r in RUNS]
    patches += [patch(r, i + 1, fact(f"f{i}")) for i in range(4) for r in RUNS]
    append_all(log, patches)
    Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy()).run(until_caught_up=True, poll_timeout_s=0.01)
    heads = {
        r.key: pieces.head_document(r.value)
        for r in log.scan(log.topics.checkpoints, 0, 0, 10**9)
        if r.key in {x.encode() for x in RUNS}
    }
    assert {h["revision"] for h in heads.values()} == {5} and all(h["triggers"] == ["quiet"] for h in heads.values())
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == [] and rep.start_offset == len(patches)


def test_quiet_waits_for_a_quiet_partition_and_respects_the_byte_budget() -> None:
    """The policy's side: ``quiet`` is a periodic trigger (the byte budget may defer it)."""
    from runstate.settings import Settings

    policy = CheckpointPolicy()
    assert policy.quiet_s > 0 and policy.budgeted(["quiet"])
    assert Settings(checkpoint_quiet_s=30).checkpoint_policy().quiet_s == 30
