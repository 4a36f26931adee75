"""Checkpoints as pieces (format 6): a checkpoint writes what changed since the run's
previous one, and a restore trusts a run's pieces only when they are exactly its head's.

Each fault the design must answer is made on a real embedded log and a real RocksDB: a
head without its pieces, pieces without a head, a missing piece, a piece that is not the
head's, and two snapshotters writing one topic. Every one ends in a projection equal to a
full replay (``verify``), with the damaged runs replayed rather than restored."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import append_all, ev, fact, patch, start

from runstate.eventlog.base import Record
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.replay import verify
from runstate.projector.store import keys
from runstate.projector.store.partition import ProjectionStore
from runstate.projector.store.statedir import Layout
from runstate.projector.runtime.loop import Projector
from runstate.schemas.errors import CheckpointInvalid
from runstate.snapshotter import pieces
from runstate.snapshotter.checkpoint import seal
from runstate.snapshotter.history import CheckpointHistory
from runstate.snapshotter.loop import Snapshotter, _Newest, snapshotter_dir
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.recovery import RestoreReport, restore_partition

RUNS = ("run_a", "run_b", "run_c")
RUNS_B = {r.encode() for r in RUNS}
DATA = Path(__file__).parent.parent / "data"


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


def _newest_head(log: EmbeddedLog, run: str) -> pieces.Head:
    raw = [r.value for r in log.scan(log.topics.checkpoints, 0, 0, 10**9) if r.key == run.encode()][-1]
    return pieces.load_head(raw, None)


def _bundles(log: EmbeddedLog, run: str) -> list[list[tuple[str, bytes]]]:
    """The entries of the bundles the run's newest head names, in order."""
    head = _newest_head(log, run)
    by_name = {
        (pieces.slot_of(suffix), pieces.bundle_name(r.value)): r.value
        for r in log.scan(log.topics.checkpoints, 0, 0, 10**9)
        if pieces.split_key(r.key)[0] == run and (suffix := pieces.split_key(r.key)[1]) is not None
    }
    return [pieces.bundle_entries(by_name[slot, (head.epoch, rev)]) for slot, rev in head.bundles]


def test_intact_bundles_restore_every_run_and_the_tail_starts_past_them(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == [] and rep.start_offset > 0


def test_a_run_standing_on_every_slot_restores_from_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bundles in slots 10 to 15 (keys ``<run>\\0s10`` ...) are found by a restore like the
    first ten: a long run's layout uses them, and a slot a restore cannot name would drop
    the run to a replay."""
    monkeypatch.setattr(pieces, "MERGE_FANOUT", 10**6)  # no merging: a bundle per checkpoint
    monkeypatch.setattr(pieces, "REBASE_RATIO", 10**6)
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(
        log, [patch("run_a", 0, start()), *(patch("run_a", i + 1, fact(f"f{i}")) for i in range(pieces.SLOTS - 2))]
    )
    Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy(every=1, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    slots = [slot for slot, _rev in _newest_head(log, "run_a").bundles]
    assert sorted(slots) == list(range(pieces.SLOTS - 1))
    assert [pieces.slot_of(pieces.slot_key("run_a", s).split("\0", 1)[1]) for s in slots] == slots
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 1 and rep.rejected == []


def test_heads_without_their_bundles_restore_nothing_and_replay(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    heads_only = _copy(log, tmp_path / "h.db", lambda r: pieces.split_key(r.key)[1] is None)
    rep = _restored(heads_only, tmp_path / "state")
    assert rep.runs == 0 and rep.start_offset == 0 and len(rep.rejected) == 3


def test_bundles_without_a_head_restore_nothing_and_replay(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    bundles_only = _copy(log, tmp_path / "p.db", lambda r: pieces.split_key(r.key)[1] is not None)
    rep = _restored(bundles_only, tmp_path / "state")
    assert rep.runs == 0 and rep.start_offset == 0


def test_a_missing_bundle_drops_its_run_only(tmp_path: Path) -> None:
    log = _snapshotted(tmp_path)
    slot = _newest_head(log, "run_b").bundles[-1][0]
    gone = pieces.slot_key("run_b", slot).encode()
    missing = _copy(log, tmp_path / "m.db", lambda r: r.key != gone)
    rep = _restored(missing, tmp_path / "state")
    assert rep.runs == 2 and rep.start_offset == 0
    assert [reason for _, reason in rep.rejected] == ["a bundle its head names is missing or is not the head's"]


def test_a_flipped_bundle_drops_its_run(tmp_path: Path) -> None:
    """A bit of a bundle the head names flipped on every copy of its slot: the run is
    replayed. A bundle someone planted in a slot the head names, beside the head's own,
    changes nothing."""
    log = _snapshotted(tmp_path)
    slot = _newest_head(log, "run_c").bundles[0][0]
    key = pieces.slot_key("run_c", slot).encode()
    log.producer().append(log.topics.checkpoints, key.decode(), pieces.bundle_value(1, 99, {"x": b"y"}), partition=0)
    assert _restored(log, tmp_path / "planted").runs == 3

    flipped = EmbeddedLog(tmp_path / "f.db", partitions=1)
    prod = flipped.producer()
    for r in log.scan(log.topics.events, 0, 0, 10**9):
        prod.append(flipped.topics.events, r.key.decode() if r.key else "", r.value)
    for r in log.scan(log.topics.checkpoints, 0, 0, 10**9):
        value = r.value[:-3] + bytes([r.value[-3] ^ 1]) + r.value[-2:] if r.key == key else r.value
        prod.append(flipped.topics.checkpoints, (r.key or b"").decode(), value, partition=0)
    rep = _restored(flipped, tmp_path / "state")
    assert rep.runs == 2 and rep.start_offset == 0


def test_a_bundle_planted_under_the_heads_own_name_is_never_restored(tmp_path: Path) -> None:
    """A head names its bundles by slot and revision, which anyone who writes the topic can
    copy. A bundle of other content under the name of one the head stands on (its slot,
    epoch and revision), written just before the head's own or just after it (before the
    head's other bundles): the run is restored from the head's, which the head's digest of
    its bundles tells apart. In its place: the run is replayed, never restored from the
    planted pieces."""
    log = _snapshotted(tmp_path)
    head = _newest_head(log, "run_c")
    assert len(head.bundles) >= 2
    slot, revision = head.bundles[0]
    planted = pieces.bundle_value(head.epoch, revision, {"i\0confirmed_facts\0f0": b"planted"})
    assert pieces.bundle_name(planted) == (head.epoch, revision)
    key = pieces.slot_key("run_c", slot)
    for where in ("before", "after"):
        out = EmbeddedLog(tmp_path / f"{where}.db", partitions=1)
        prod = out.producer()
        for r in log.scan(log.topics.events, 0, 0, 10**9):
            prod.append(out.topics.events, r.key.decode() if r.key else "", r.value)
        for r in log.scan(log.topics.checkpoints, 0, 0, 10**9):
            genuine = r.key == key.encode() and pieces.bundle_name(r.value) == (head.epoch, revision)
            if genuine and where == "before":
                prod.append(out.topics.checkpoints, key, planted, partition=0)
            prod.append(out.topics.checkpoints, (r.key or b"").decode(), r.value, partition=0)
            if genuine and where == "after":
                prod.append(out.topics.checkpoints, key, planted, partition=0)
        rep = _restored(out, tmp_path / where)
        assert rep.runs == 3 and rep.rejected == [], where

    instead = _copy(log, tmp_path / "instead.db", lambda r: r.key != key.encode())
    instead.producer().append(instead.topics.checkpoints, key, planted, partition=0)
    rep = _restored(instead, tmp_path / "instead")
    assert rep.runs == 2 and rep.start_offset == 0
    assert [reason.split(" (")[0] for _o, reason in rep.rejected] == ["its bundles are not the ones its head names"]


def test_checkpoints_of_format_5_are_restored_and_the_next_ones_are_of_format_6(tmp_path: Path) -> None:
    """A topic the previous format wrote (``tests/data/checkpoints_format5.db``: this file's
    workload, checkpointed every four revisions by runstate's format 5) restores every run
    from it, nothing rejected; a snapshotter of this format then writes format 6, and a
    restore reads both side by side."""
    shutil.copy(DATA / "checkpoints_format5.db", tmp_path / "log.db")
    log = EmbeddedLog(tmp_path / "log.db", create=False)
    heads = [pieces.head_document(r.value) for r in log.scan(log.topics.checkpoints, 0, 0, 10**9) if r.key in RUNS_B]
    assert {h["format_version"] for h in heads} == {5}
    rep = _restored(log, tmp_path / "v5")
    assert rep.runs == 3 and rep.rejected == [] and rep.start_offset > 0

    v5_end = log.end_offsets(log.topics.checkpoints)[0]
    append_all(log, [patch("run_a", 13 + i, fact(f"g{i}")) for i in range(4)])
    Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy(every=4, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert _newest_head(log, "run_a").header5 is None
    rep = _restored(log, tmp_path / "v6")
    assert rep.runs == 3 and rep.rejected == []
    # run_a's checkpoints of format 6 over the others' of format 5, on one topic
    mixed = _copy(log, tmp_path / "mixed.db", lambda r: r.offset < v5_end or pieces.split_key(r.key)[0] == "run_a")
    assert _newest_head(mixed, "run_a").header5 is None and _newest_head(mixed, "run_b").header5 is not None
    rep = _restored(mixed, tmp_path / "mixed")
    assert rep.runs == 3 and rep.rejected == []


def test_a_compressed_head_or_bundle_naming_more_than_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Zstandard frame says how much it decompresses to: past ``MAX_DECOMPRESSED`` the
    record is refused before anything is allocated (a forged frame cannot claim memory),
    and its run is replayed."""
    log = _snapshotted(tmp_path)
    monkeypatch.setattr(pieces, "MAX_DECOMPRESSED", 64)
    raw = [r.value for r in log.scan(log.topics.checkpoints, 0, 0, 10**9) if r.key == b"run_a"][-1]
    with pytest.raises(CheckpointInvalid, match="refused"):
        pieces.load_head(raw, None)
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 0 and rep.start_offset == 0


def test_a_head_carries_the_headers_changed_fields_and_a_restore_writes_its_exact_bytes(tmp_path: Path) -> None:
    """The header's piece is written in a base or a merge; the heads between carry only the
    fields that changed since (the revision, the time, ...), and a restore writes the
    header byte for byte as the projector stored it."""
    log = _snapshotted(tmp_path)
    changed = [
        pieces.load_head(r.value, None).header_changes
        for r in log.scan(log.topics.checkpoints, 0, 0, 10**9)
        if r.key == b"run_a" and pieces.is_head_record(r.value)
    ]
    assert any("revision" in c for c in changed)
    assert all("goal" not in c and "policy" not in c for c in changed)
    _restored(log, tmp_path / "restored")
    Projector(log, str(tmp_path / "replayed")).run(until_caught_up=True, poll_timeout_s=0.01)
    headers = []
    for d in ("restored", "replayed"):
        with ProjectionStore(Layout(tmp_path / d).store_path(0), read_only=True) as st:
            headers.append([st._get(keys.header_key(r)) for r in RUNS])
    assert headers[0] == headers[1] and all(headers[0])


@pytest.mark.parametrize(
    "was, now",
    [
        ({"a": 1, "t": "x", "f": 0.1}, {"a": 2, "t": "café ✓", "f": 1e-07}),
        ({"a": 1, "n": None}, {"a": 1, "n": {"deep": [1.5, "\u2028"]}}),
        ({"a": 1}, {"a": 1}),
    ],
)
def test_header_changes_give_the_headers_bytes_back(was: dict, now: dict) -> None:  # type: ignore[type-arg]
    import orjson

    piece, header = orjson.dumps(was), orjson.dumps(now)
    changes = pieces.header_changes(header, piece)
    assert changes is not None and set(changes) <= set(now)
    head = pieces.Head("r", 1, 0, 0, 0, 1, "", [], "safe", None, changes, [], [], "", None, {})
    assert pieces.header_of(head, piece) == header
    assert pieces.header_changes(orjson.dumps({**now, "new": 1}), piece) is None  # other fields: the piece again
    assert pieces.header_changes(header, None) is None


def test_a_sealed_head_over_a_malformed_bundle_drops_its_run(tmp_path: Path) -> None:
    """Without a checkpoint key anyone who can write the topic can seal a head: one that
    names a bundle of malformed entries (an item piece with no kind, a body that is not
    bytes) gets its run replayed with the reason, never junk keys in the store."""
    log = _snapshotted(tmp_path)
    head = _newest_head(log, "run_a")
    for bad, why in (
        ({"i\0nokind": b"x"}, "an item piece without a kind and an id"),
        ({"i\0facts\0f1": "not bytes"}, "not a bundle's entries: not a bundle: Expected `bytes`, got `str`"),
    ):
        bundle = pieces.bundle_value(head.epoch, head.revision, bad)  # type: ignore[arg-type]
        doc = {k: v for k, v in head.doc.items() if k not in ("digest", "signature")}
        doc.update(
            pieces=1,
            bundles=[[15, head.revision]],
            bundles_digest=pieces.bundles_digest([pieces.bundle_digest(bundle)]),
        )
        forged = _copy(log, tmp_path / f"forged-{len(str(bad))}.db", lambda r: True)
        prod = forged.producer()
        prod.append(forged.topics.checkpoints, pieces.slot_key("run_a", 15), bundle, partition=0)
        prod.append(forged.topics.checkpoints, "run_a", pieces.head_value(seal(doc, None)), partition=0)
        rep = _restored(forged, tmp_path / f"state-{len(str(bad))}")
        assert rep.runs == 2 and rep.start_offset == 0
        [(_offset, reason)] = rep.rejected
        assert reason.startswith(why)


def test_a_snapshotter_killed_between_a_bundle_and_its_head_leaves_the_older_checkpoint_whole(tmp_path: Path) -> None:
    """A checkpoint's bundle goes to a slot its run's newest head does not name: a SIGKILL
    after the bundle is on the topic and before its head leaves the older head with every
    bundle it names, and the run is restored from it (the coverage record, published after
    the head, is not there either)."""
    log = _snapshotted(tmp_path)
    recs = list(log.scan(log.topics.checkpoints, 0, 0, 10**9))
    last_head = max(i for i, r in enumerate(recs) if r.key == b"run_a")
    assert pieces.split_key(recs[last_head - 1].key) == ("run_a", recs[last_head - 1].key.decode().split("\0")[1])
    cut = {r.offset for r in recs[last_head:]}
    crashed = _copy(log, tmp_path / "c.db", lambda r: r.offset not in cut)
    rep = _restored(crashed, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == []


def test_two_snapshotters_on_one_topic_each_base_in_its_own_epoch(tmp_path: Path) -> None:
    """A second snapshotter (a partition taken over, its own store) writes every run's
    bundles again in an epoch of its own; what the first left in other slots is never
    restored."""
    log = _snapshotted(tmp_path)
    Snapshotter(log, str(tmp_path / "other"), policy=CheckpointPolicy(every=4, bytes_ratio=None), group_id="other").run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == []


@pytest.mark.parametrize("budget", [0, 2_000, 32 << 20])
def test_checkpoints_over_many_batches_stand_on_what_the_store_holds_whatever_the_writer_keeps(
    tmp_path: Path, budget: int
) -> None:
    """The writer keeps what its stored checkpoints stand on in memory (the runs' newest
    pieces, up to a byte budget) instead of reading it back per piece: decided in batches
    of three records, with nothing kept, a few runs kept in turn, or every run kept, each
    run's newest head digests exactly the pieces a restore finds, and the history gives the
    projector's state at every revision."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, _workload())
    snap = Snapshotter(log, str(tmp_path / "snap"), policy=CheckpointPolicy(every=2, bytes_ratio=None), batch_size=3)
    snap.writer._newest.budget = budget
    snap.run(until_caught_up=True, poll_timeout_s=0.01)
    rep = _restored(log, tmp_path / "state")
    assert rep.runs == 3 and rep.rejected == []
    with CheckpointHistory(snapshotter_dir(tmp_path / "snap")) as hist:
        for run in RUNS:
            cps = hist.of(run)
            assert len(cps) >= 6
            for cp in cps:
                assert len(cp.state.confirmed_facts) == cp.revision - 1 - sum(1 for i in (3, 6) if i < cp.revision - 1)
                assert [c.call_id for c in cp.state.pending_tool_calls] == (["c1"] if 5 <= cp.revision <= 7 else [])


def test_a_checkpoint_writes_what_changed_and_history_rebuilds_every_revision(tmp_path: Path) -> None:
    """After a run's first checkpoint, one writes a bundle of what changed (and of the newer
    bundles it absorbs), not the run; the local history still gives the whole checkpoint at
    every revision, equal to the state the projector had there."""
    log = _snapshotted(tmp_path)
    ck = log.topics.checkpoints
    sizes = [
        len(pieces.bundle_entries(r.value))
        for r in log.scan(ck, 0, 0, 10**9)
        if pieces.split_key(r.key)[0] == "run_a" and pieces.split_key(r.key)[1] is not None
    ]
    assert len(sizes) >= 4 and sizes[-1] < max(sizes), sizes  # a checkpoint of few changes after a bigger one
    with CheckpointHistory(snapshotter_dir(tmp_path / "snap-runstate-snapshotter")) as hist:
        cps = hist.of("run_a")
        assert len(cps) >= 4
        for cp in cps:
            assert hist.nearest("run_a", cp.revision) == cp
            assert len(cp.state.confirmed_facts) == cp.revision - 1 - sum(1 for i in (3, 6) if i < cp.revision - 1)


def test_a_run_stands_on_few_bundles_and_is_based_again_when_they_hold_mostly_superseded_pieces() -> None:
    """The layout's rule: a checkpoint's bundle absorbs the newest bundles while
    MERGE_FANOUT - 1 of them are of its size class or smaller (cascading); a base again when more than
    SLOTS - 1 would remain, or the bundles outweigh REBASE_RATIO times the live pieces."""
    B = pieces.Bundle
    base = B(0, 0, "", 100_000, None)
    n = pieces.MERGE_FANOUT - 1
    small = [B(i, 0, "", 150, [f"n{i}"]) for i in range(1, n + 1)]
    assert pieces.absorbed([base], 100, 100_000) == 0
    assert pieces.absorbed([base, *small[:-1]], 100, 100_000) == 0
    assert pieces.absorbed([base, *small], 100, 100_000) == n  # a class's worth of its class
    mid = [B(i, 0, "", 2000, [f"m{i}"]) for i in range(n + 1, 2 * n + 1)]
    assert pieces.absorbed([base, *mid, *small], 100, 100_000) == 2 * n  # 1,150 bytes then: a class up, and on
    assert pieces.absorbed([base, B(1, 0, "", 150_000, ["a"])], 100, 100_000) is None  # mostly superseded
    many = [base, *(B(i, 0, "", pieces.TIER_BYTES * pieces.MERGE_FANOUT**i, ["x"]) for i in range(1, pieces.SLOTS - 1))]
    assert pieces.absorbed(many[:-1], 1, 10**40) == 0
    assert pieces.absorbed(many, 1, 10**40) is None  # one more would take the last free slot
    assert pieces.free_slot([B(0, 0, "", 1, None), B(2, 0, "", 1, ["a"])]) == 1
    # Checkpoints of two sizes in turn (a boundary's, a periodic one's) still merge: the
    # smaller classes count towards a class, else no class ever holds seven in a row and
    # the run is based again (all its live pieces rewritten) every fifteen checkpoints.
    mixed = [B(i, 0, "", 2000 if i % 2 else 150, [f"x{i}"]) for i in range(1, n + 1)]
    assert pieces.absorbed([base, *mixed], 2000, 100_000) == n


def test_segments_of_patch_ids_merge_sixteen_of_a_size_and_a_long_run_keeps_few() -> None:
    n = pieces.SEGMENT_FANOUT
    assert n == 16
    small = {f"s{i:02d}": 1 + i % 3 for i in range(n)}  # tier 0: under 16 ids each
    assert pieces.merged_segments(dict(list(small.items())[:-1])) == []
    assert pieces.merged_segments(small) == [sorted(small)]
    # Merging can cascade: sixteen of tier 0 make one of tier 1, the sixteenth of its tier.
    bigger = {f"b{i:02d}": 16 + i for i in range(n - 1)}
    assert pieces.merged_segments({**bigger, **small}) == [sorted(small)[:n], [*sorted(bigger), sorted(small)[-1]]]

    # A run checkpointed at every one of its 200 patches holds a handful of segments in a
    # few bundles, the topic holds a bounded number of its records once compacted, and a
    # restore from them answers every patch id as decided (equal to a full replay).
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = EmbeddedLog(Path(tmp) / "log.db", partitions=1)
        append_all(log, [patch("long", 0, start())] + [patch("long", i, fact(f"f{i % 5}")) for i in range(1, 200)])
        Snapshotter(log, str(Path(tmp) / "snap"), policy=CheckpointPolicy(every=1, bytes_ratio=None)).run(
            until_caught_up=True, poll_timeout_s=0.01
        )
        bundles = _bundles(log, "long")
        assert 1 <= len(bundles) <= pieces.SLOTS - 1
        live: dict[str, bytes] = {}
        for entries in bundles:
            live.update(entries)
        segments = [n for n, b in live.items() if b and pieces.is_ids(n)]
        assert 1 <= len(segments) <= 3 * (pieces.SEGMENT_FANOUT - 1), segments
        keys = {r.key for r in log.scan(log.topics.checkpoints, 0, 0, 10**9)}
        assert len(keys) <= pieces.SLOTS + 2, keys  # the head, its slots, the coverage record
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


def test_the_writers_memory_of_stored_checkpoints_counts_a_piece_written_again_once() -> None:
    """A long run writes the same pieces again and again: what the writer keeps of it is
    the pieces' newest values, weighed as such, so that a hot run is not evicted for its
    history; past the budget the least recently checkpointed run leaves."""
    newest = _Newest(budget=300)
    state = pieces.Published(1, pieces.Tally(), 0, [])
    for i in range(50):
        newest.keep(0, "long", state, {"header": b"h" * 100, f"item{i % 2}": b"i" * 50}, base=i == 0)
    kept = newest.get(0, "long")
    assert kept is not None and kept.whole and newest.size == kept.size == 200
    newest.keep(0, "other", state, {"header": b"o" * 150}, base=True)
    assert newest.get(0, "long") is None and newest.size == 150  # 350 passes 300: the older run left
    newest.keep(1, "other", state, {"header": b"p" * 50}, base=True)
    newest.drop(0, "other")
    assert newest.get(0, "other") is None and newest.get(1, "other") is not None and newest.size == 50
    newest.drop(1)
    assert newest.get(1, "other") is None and newest.size == 0
