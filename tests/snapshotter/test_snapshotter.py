"""Checkpoints: format and validation, triggers, verdict, checkpoint + tail == replay,
recovery of a lost projection, corrupted checkpoints."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import ROOT, V1_DOC, append_all, ev, examples, fact, patch, start, task
from hypothesis import given, settings
from hypothesis import strategies as st
from workloads import build, op

from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.core.runbook import RunBook
from runstate.projector.core.working import RunDoc
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import state_at, state_data_at, verify
from runstate.schemas.patch import Patch
from runstate.schemas.state import CURRENT_SCHEMA_VERSION, state_digest
from runstate.projector.store.keys import patch_id_digest, split_patch_ids
from runstate.snapshotter.checkpoint import (
    CheckpointInvalid,
    decode_patch_ids,
    make_checkpoint,
    seal,
    state_data_of,
    validate,
    verdict_of,
)
from runstate.snapshotter.checkpoint import encode as encode_cp
from runstate.schemas import structs
from runstate.snapshotter import pieces
from runstate.snapshotter.history import CheckpointHistory, StateDataCache
from runstate.projector.store.partition import ProjectionStore
from runstate.projector.store.statedir import Layout
from runstate.snapshotter.policy import CheckpointPolicy
from runstate.snapshotter.loop import Snapshotter, snapshotter_dir
from runstate.snapshotter.recovery import restore_partition


def fold(patches: list[Patch], book: RunBook | None = None) -> RunBook:
    book = book or RunBook()
    for i, p in enumerate(patches):
        book.apply(p, 0, i)
    return book


# --- checkpoint + tail == full replay ---------------------------------------------------


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(op, min_size=5, max_size=80), st.data())
def test_checkpoint_plus_tail_equals_full_replay(ops: list[Any], data: st.DataObject) -> None:
    """Restore every run from a checkpoint at a random cut, decide the tail: same states
    and same decisions as a full replay, and every resend of a patch decided before the
    cut is a duplicate (the checkpoint carries every decided patch id, and the last
    RECENT_DECISIONS decisions themselves)."""
    patches = build(ops)
    cut = data.draw(st.integers(0, len(patches)))
    full = fold(patches)
    head = fold(patches[:cut])
    restored: dict[str, RunDoc] = {}
    recent: dict[str, list[Any]] = {}
    seen: dict[str, set[bytes]] = {}
    for run, doc in head.docs.items():
        if doc is None:
            continue
        decided = sorted((d for (r, _), d in head.decided.items() if r == run), key=lambda d: d.offset)
        cp = validate(
            encode_cp(
                make_checkpoint(
                    doc.to_state(),
                    partition=0,
                    covers_offset=cut - 1,
                    triggers=["test"],
                    recent=decided,
                    patch_ids=[d.patch_id for d in decided],
                )
            )
        )
        restored[run] = RunDoc.from_state(cp.state)
        recent[run] = cp.recent_decisions
        seen[run] = set(split_patch_ids(decode_patch_ids(cp.patch_ids)))
    book = RunBook(
        load_doc=lambda r: restored.get(r),
        load_decision=lambda r, p: next((structs.from_model(d) for d in recent.get(r, []) if d.patch_id == p), None),
        decided_before_restore=lambda r, p: patch_id_digest(p) in seen.get(r, set()),
    )
    for i, p in enumerate(patches[cut:], start=cut):
        applied = book.apply(p, 0, i)
        before_cut = (p.run_id, p.patch_id) in head.decided
        if before_cut and p.run_id in restored:
            assert applied.duplicate, "a patch decided before the checkpoint was decided again"
        elif not before_cut and not applied.duplicate:
            assert applied.decision == full.decided[(p.run_id, p.patch_id)]
    for run, doc in full.docs.items():
        if doc is None:
            continue
        mine = book.doc(run)
        assert mine is not None
        assert mine.to_state().model_dump_json() == doc.to_state().model_dump_json()


# --- verdict ------------------------------------------------------------------------------


def side_effect_ops() -> st.SearchStrategy[list[tuple[str, int]]]:
    return st.lists(
        st.tuples(
            st.sampled_from(["start_eff", "commit_eff", "fail_eff", "call", "call_fx", "done"]), st.integers(0, 3)
        ),
        max_size=25,
    )


@settings(max_examples=examples(80), deadline=None)
@given(side_effect_ops())
def test_verdict_needs_reconciliation_exactly_when_an_effect_is_unresolved(steps: list[tuple[str, int]]) -> None:
    """Oracle: walk the accepted events independently of the reducer."""
    book = RunBook()
    book.apply(patch("r", 0, start()), 0, 0)
    effects: dict[str, str] = {}
    calls: dict[str, bool] = {}
    for i, (kind, n) in enumerate(steps, start=1):
        events = {
            "start_eff": [ev("EffectRecorded", effect={"id": f"e{n}", "status": "started"})],
            "commit_eff": [ev("EffectRecorded", effect={"id": f"e{n}", "status": "committed"})],
            "fail_eff": [ev("EffectRecorded", effect={"id": f"e{n}", "status": "failed"})],
            "call": [ev("ToolCallStarted", call_id=f"c{n}", tool="read")],
            "call_fx": [ev("ToolCallStarted", call_id=f"c{n}", tool="write", side_effect=True)],
            "done": [ev("ToolSucceeded", call_id=f"c{n}")],
        }[kind]
        doc = book.docs["r"]
        assert doc is not None
        d = book.apply(patch("r", doc.header.revision, *events), 0, i).decision
        if d.outcome != "accepted":
            continue
        e = events[0]
        if e["type"] == "EffectRecorded":
            effects[e["effect"]["id"]] = e["effect"]["status"]
        elif e["type"] == "ToolCallStarted":
            calls[e["call_id"]] = e.get("side_effect", False)
        else:
            calls.pop(e["call_id"], None)
    doc = book.docs["r"]
    assert doc is not None
    verdict, rec = verdict_of(doc.to_state())
    unresolved = "started" in effects.values() or any(calls.values())
    assert verdict == ("needs_reconciliation" if unresolved else "safe")
    assert sorted(x.id for x in rec.effects) == sorted(k for k, v in effects.items() if v == "started")


# --- validation -----------------------------------------------------------------------------


def a_checkpoint() -> bytes:
    book = fold([patch("r", 0, start()), patch("r", 1, fact("f1"), ev("BudgetSet", tokens_remaining=5))])
    doc = book.docs["r"]
    assert doc is not None
    return encode_cp(make_checkpoint(doc.to_state(), partition=0, covers_offset=1, triggers=["t"], recent=[]))


@pytest.mark.parametrize(
    "mutate, reseal, reason",
    [
        (lambda d: d["state"]["confirmed_facts"][0].__setitem__("statement", "edited"), False, "digest does not match"),
        (lambda d: d.__setitem__("reducer_version", 0), True, "reducer_version"),
        (lambda d: d.__setitem__("format_version", 99), True, "format_version"),
        (lambda d: d["state"].__setitem__("schema_version", 99), True, "MIGRATION_REQUIRED"),
        (lambda d: d["state"].__setitem__("revision", 7), True, "does not belong"),
    ],
)
def test_untrustworthy_checkpoints_are_rejected(mutate: Any, reseal: bool, reason: str) -> None:
    """Refused for what they say (resealed: the digest is right), or for being edited."""
    doc = orjson.loads(a_checkpoint())
    mutate(doc)
    raw = seal(doc, None) if reseal else orjson.dumps(doc)
    with pytest.raises(CheckpointInvalid, match=reason):
        validate(raw)
    with pytest.raises(CheckpointInvalid, match=reason):  # the plain-data path checks the same
        state_data_of(raw)
    with pytest.raises(CheckpointInvalid, match="not JSON"):
        validate(b"\x00\x01")


def test_checkpoint_with_an_older_state_schema_is_migrated() -> None:

    doc = orjson.loads(a_checkpoint())
    v1 = {**V1_DOC, "run_id": "r", "revision": 2}
    doc["state"] = v1
    doc["revision"] = 2
    cp = validate(seal(doc, None))
    assert (
        cp.state.schema_version == CURRENT_SCHEMA_VERSION
        and cp.state.open_questions[0].text == V1_DOC["open_questions"][0]
    )


@pytest.mark.parametrize(
    "drop",
    [
        lambda st: [st.pop(name) for name in ("revoked_agents", "artifacts", "inputs")],  # the document's
        lambda st: st["policy"].pop("external_evidence_schemes"),  # a model's it holds
        lambda st: st["confirmed_facts"][0].pop("scope"),  # an item's
    ],
)
def test_a_checkpoint_written_before_fields_existed_reads_as_data_with_their_defaults(drop: Any) -> None:
    """Fields were added to the current schema version with defaults (a run's revoked agents,
    artifacts and inputs; its policy's trusted evidence schemes), and may be again, at any
    level. A checkpoint written before them is valid; as plain data it reads as the
    validated state does: the defaults filled in, in the model's key order, and a run
    continued from it has them too."""
    doc = orjson.loads(a_checkpoint())
    drop(doc["state"])
    raw = seal(doc, None)
    want = validate(raw).state.model_dump(mode="json")
    got = state_data_of(raw)
    assert got == want and orjson.dumps(got) == orjson.dumps(want)  # the same keys, in the same order
    book = RunBook(load_doc=lambda r: RunDoc.from_state_data(state_data_of(raw)) if r == "r" else None)
    book.apply(patch("r", 2, fact("f9")), 0, 9)
    continued = book.docs["r"]
    assert continued is not None and continued.to_state_data() == continued.to_state().model_dump(mode="json")


# --- triggers ---------------------------------------------------------------------------


def test_triggers_at_safe_boundaries() -> None:
    policy = CheckpointPolicy(every=4)
    history = [
        (patch("r", 0, start()), ["run_started"]),
        (patch("r", 1, task("t1"), task("t2"), ev("TaskStarted", task_id="t1"), ev("TaskStarted", task_id="t2")), []),
        (patch("r", 2, ev("TaskCompleted", task_id="t1", evidence="artifact://done/1")), []),  # t2 still running
        (patch("r", 3, ev("TaskCompleted", task_id="t2", evidence="artifact://done/1")), ["every_4", "tasks_done"]),
        (patch("r", 4, ev("ToolCallStarted", call_id="c", tool="pay", costly=True)), ["before_side_effect"]),
        (
            patch(
                "r", 5, ev("ToolSucceeded", call_id="c"), ev("WorkspaceUpdated", workspace_ref={"workspace_id": "w"})
            ),
            ["workspace"],
        ),
        (patch("r", 6, ev("WaitingStarted", waiting={"wait_id": "w", "kind": "user", "reason": "?"})), ["waiting"]),
        (patch("r", 7, ev("LeaseReleased", worker_id="worker-3")), ["every_4", "lease_released"]),
        (patch("r", 8, ev("RunCancelled", reason="stop")), ["terminal"]),
    ]
    book = RunBook()
    for i, (p, want) in enumerate(history):
        d = book.apply(p, 0, i).decision
        assert d.outcome == "accepted", d
        doc = book.docs["r"]
        assert doc is not None
        assert policy.triggers(p, d.revision, doc) == want, (i, p.events)


# --- the snapshotter process and recovery (embedded log, real RocksDB) -------------------


def workload(runs: int = 6, per_run: int = 30) -> list[Patch]:
    """Chains for ``runs`` runs; run_0 has a side-effecting call in flight."""
    out = [patch(f"run_{r}", 0, start()) for r in range(runs)]
    for i in range(per_run):
        for r in range(runs):
            evs = (
                [fact(f"f{i}")]
                if i % 3
                else [
                    ev("BudgetConsumed", tokens=1),
                    ev("ObservationRecorded", observation={"subject": "file://x", "observed_state": str(i)}),
                ]
            )
            if i == 10 and r == 0:
                evs = [ev("ToolCallStarted", call_id="deploy", tool="deploy", side_effect=True)]
            out.append(patch(f"run_{r}", i + 1, *evs))
    return out


@contextmanager
def _following(snap: Snapshotter) -> Iterator[Callable[[int, float], None]]:
    """``snap`` following the log in a thread (as serve runs it) for the block, stopped and
    joined after it; yields ``until(n, within_s)``, which waits until it decided ``n`` records."""
    stop = threading.Event()
    runner = threading.Thread(target=lambda: snap.run(stop=stop, poll_timeout_s=0.01))
    runner.start()

    def until(n: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while snap.projector.stats.records < n and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        yield until
    finally:
        stop.set()
        runner.join(20)


def test_a_trickle_of_patches_is_checkpointed_in_few_batches_at_every_boundary(tmp_path: Path) -> None:
    """Patches arriving one at a time are decided by the snapshotter in batches of many (it
    lingers after a small batch: nobody waits on it), and every checkpoint a snapshotter
    reading them all at once makes is made, at the same revision for the same triggers."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    patches = workload(runs=4, per_run=20)
    policy = CheckpointPolicy(every=4, bytes_ratio=None)
    trickled = Snapshotter(log, str(tmp_path / "trickled"), policy=policy, group_id="trickled")
    with _following(trickled) as until:
        for p in patches:
            append_all(log, [p])
            time.sleep(0.01)
        until(len(patches), 30)
    assert trickled.projector.stats.records == len(patches)
    assert trickled.projector.stats.batches <= len(patches) // 4, trickled.projector.stats
    Snapshotter(log, str(tmp_path / "at_once"), policy=policy, group_id="at_once").run(
        until_caught_up=True, poll_timeout_s=0.01
    )

    def made(where: str) -> dict[str, list[tuple[int, list[str]]]]:
        with CheckpointHistory(snapshotter_dir(tmp_path / where)) as hist:
            return {
                f"run_{r}": [(c.revision, c.triggers) for c in hist.of(f"run_{r}") if c.triggers != ["quiet"]]
                for r in range(4)
            }

    assert made("trickled") == made("at_once")


def test_a_backlog_is_drained_without_lingering_between_its_batches(tmp_path: Path) -> None:
    """A poll returns less than the batch size while records wait (the embedded log gives
    each partition its share; Kafka what it has fetched): the snapshotter lingers only
    after a batch of a few records, so a backlog is not read at one share per linger."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=4)
    run = "run_0"
    p0 = log.partitions(log.topics.events)
    append_all(log, [patch(run, 0, start()), *(patch(run, i, fact(f"f{i}")) for i in range(1, 1200))])
    snap = Snapshotter(log, str(tmp_path / "s"), policy=CheckpointPolicy(), batch_size=400, linger_s=30.0)
    with _following(snap) as until:
        until(1200, 20)
    assert p0 == 4 and snap.projector.stats.records == 1200, snap.projector.stats


def test_a_stop_while_the_snapshotter_lingers_decides_what_gathered_first(tmp_path: Path) -> None:
    """What arrives while the snapshotter waits for records to gather is decided before a
    stop returns, as it would have been without the wait: an erasure appended just before
    serve stops leaves no content in the snapshotter's store."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("run_0", 0, start())])
    snap = Snapshotter(log, str(tmp_path / "s"), linger_s=30.0)
    with _following(snap) as until:
        until(1, 10)
        time.sleep(0.2)  # the log drained: it waits now
        append_all(log, [patch("run_0", 1, fact("f1"))])
    assert snap.projector.stats.records == 2, snap.projector.stats


def test_lost_projection_recovers_from_checkpoints_plus_tail(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    patches = workload()
    # A control patch that a checkpoint covers ("workspace" trigger); resent after the restore.
    covered = patch(
        "run_5",
        31,
        ev("WorkspaceUpdated", workspace_ref={"workspace_id": "w1"}),
        ev("GoalChanged", goal={"statement": "narrower"}),
    )
    append_all(log, [*patches, covered])
    state = tmp_path / "state"
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=7, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    with Projection(state) as proj:
        before = {h.run_id: state_digest(proj.state(h.run_id)) for h in proj.runs()}
    total = sum(log.end_offsets(log.topics.events).values())

    # Lose the projector's stores (keep the snapshotter's): a new machine for these partitions.
    for p in (0, 1):
        shutil.rmtree(state / f"p{p:03d}")
    append_all(log, [covered])  # an agent's retry of a patch decided before the checkpoint
    reports = []
    pr = Projector(log, str(state), restore=lambda p, s: reports.append(restore_partition(log, p, s)))
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    assert sum(r.runs for r in reports) == 6
    assert pr.stats.records < total / 3, "recovery must read the tail, not the whole log"
    assert pr.stats.duplicates == 1  # the retry got its earlier decision, carried by the checkpoint
    with Projection(state) as proj:
        assert {h.run_id: state_digest(proj.state(h.run_id)) for h in proj.runs()} == before
        hist = proj.history("run_5")
        assert [d.patch_id for d in hist].count(covered.patch_id) == 1
    assert verify(log, str(state)).ok

    # More patches after the restore are applied normally and still verify.
    append_all(log, [patch("run_1", 31, fact("after"))])
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    assert verify(log, str(state)).ok
    log.close()


def test_a_damaged_bundle_or_head_is_never_restored_the_run_is_replayed(tmp_path: Path) -> None:
    """A bundle flipped in place (run_0) and a head that is not one (run_1): neither run is
    restored from its checkpoint, the tail starts at 0, and the projection equals a replay."""
    from runstate.snapshotter import pieces

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, workload(runs=2, per_run=20))
    state = tmp_path / "state"
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=5)).run(until_caught_up=True, poll_timeout_s=0.01)
    ck = log.topics.checkpoints
    head = [pieces.load_head(r.value, None) for r in log.scan(ck, 0, 0, 10**9) if r.key == b"run_0"][-1]
    slot = pieces.slot_key("run_0", head.bundles[-1][0]).encode()
    damaged = EmbeddedLog(tmp_path / "damaged.db", partitions=1)  # the same log, that bundle flipped in place
    prod = damaged.producer()
    for r in log.scan(log.topics.events, 0, 0, 10**9):
        prod.append(damaged.topics.events, r.key.decode() if r.key else "", r.value)
    for r in log.scan(ck, 0, 0, 10**9):
        value = r.value[:-2] + bytes([r.value[-2] ^ 1]) + r.value[-1:] if r.key == slot else r.value  # a bit flip, say
        prod.append(ck, (r.key or b"").decode(), value, partition=0)
    log.close()
    log = damaged
    log.producer().append(ck, "run_1", b"garbage")
    state = tmp_path / "restored"
    reports = []
    Projector(log, str(state), restore=lambda p, s: reports.append(restore_partition(log, p, s))).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    [rep] = reports
    reasons = sorted(reason.split(" (")[0].split(":")[0] for _, reason in rep.rejected)
    assert reasons == ["its bundles are not the ones its head names", "not JSON"], reasons
    assert rep.runs == 0 and rep.start_offset == 0
    assert verify(log, str(state)).ok
    log.close()


def test_format_2_checkpoints_are_still_restored_an_invalid_newest_for_an_older_valid_one(tmp_path: Path) -> None:
    """A topic written by an older runstate (whole checkpoints, format 2) is read: each
    run from its newest valid checkpoint, a damaged newest skipped for an older one."""
    from runstate.projector.read.queries import Projection
    from runstate.snapshotter.checkpoint import coverage_keys, make_checkpoint, make_coverage

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, workload(runs=2, per_run=20))
    state = tmp_path / "state"
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    ck = log.topics.checkpoints
    end = log.end_offsets(log.topics.events)[0]
    with Projection(str(state)) as proj:
        for run in ("run_0", "run_1"):
            st = proj.state(run)
            ids = [d.patch_id for d in proj.history(run)]
            covers = max(d.offset for d in proj.history(run))
            cp = make_checkpoint(st, partition=0, covers_offset=covers, triggers=["every_5"], recent=[], patch_ids=ids)
            log.producer().append(ck, run, cp.model_dump_json().encode())
    newest = orjson.loads(cp.model_dump_json())
    newest["state"]["budgets"]["tokens_used"] += 1000  # a bit flip in transit, say
    log.producer().append(ck, "run_1", orjson.dumps(newest))
    log.producer().append(ck, coverage_keys(1)[0], make_coverage(0, end, None, ["run_0", "run_1"], dense=True))
    shutil.rmtree(state / "p000")
    reports = []
    Projector(log, str(state), restore=lambda p, s: reports.append(restore_partition(log, p, s))).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    [rep] = reports
    assert [reason.split(" (")[0] for _, reason in rep.rejected] == ["digest does not match the checkpoint"]
    assert rep.runs == 2 and 0 < rep.start_offset <= end
    assert verify(log, str(state)).ok
    log.close()


def test_a_run_with_no_valid_checkpoint_forces_replay_from_zero(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, workload(runs=2, per_run=6))
    state = tmp_path / "state"
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    log.producer().append(log.topics.checkpoints, "run_1", b"{}")  # run_1: only an invalid one
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=1000)).run(until_caught_up=True, poll_timeout_s=0.01)
    ck = log.topics.checkpoints
    # keep run_0's checkpoints, drop run_1's valid ones by rebuilding the topic in a new log
    log2 = EmbeddedLog(tmp_path / "log2.db", partitions=1)
    prod = log2.producer()
    for r in log.scan(log.topics.events, 0, 0, 10**9):
        prod.append(log2.topics.events, r.key.decode() if r.key else "", r.value)
    for r in log.scan(ck, 0, 0, 10**9):
        if (r.key or b"").split(b"\0")[0] == b"run_0" or r.value == b"{}":
            prod.append(ck, r.key.decode() if r.key else "", r.value)
    state2 = tmp_path / "state2"  # another log: its own projections (the identity check)
    reports = []
    pr = Projector(log2, str(state2), restore=lambda p, s: reports.append(restore_partition(log2, p, s)))
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    assert reports[0].start_offset == 0 and reports[0].runs == 1
    assert verify(log2, str(state2)).ok
    log.close()
    log2.close()


def test_time_travel_starts_from_the_nearest_checkpoint(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    patches = workload(runs=1, per_run=25)
    append_all(log, patches)
    state = tmp_path / "state"
    Projector(log, str(state)).run(until_caught_up=True, poll_timeout_s=0.01)
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=10, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    with CheckpointHistory(snapshotter_dir(state)) as hist:
        revs = [cp.revision for cp in hist.of("run_0")]
        assert {1, 10, 20} <= set(revs)
        for n in range(0, max(revs) + 3):  # the newest at or below n, found by a seek
            got = hist.nearest("run_0", n)
            below = [r for r in revs if r <= n]
            assert (got.revision if got else None) == (max(below) if below else None)

            data = hist.nearest_state_data("run_0", n)  # the same checkpoint's state, as plain data
            assert data == (got.state.model_dump(mode="json") if got else None)

        with Projection(state) as proj:
            for n in (1, 9, 10, 15, 26):
                want = None
                for k in range(len(patches) + 1):
                    d = fold(patches[:k]).docs.get("run_0")
                    if d is not None and d.header.revision == n:
                        want = d.to_state()
                        break
                assert want is not None
                got_state = state_at(log, proj, "run_0", n, nearest=hist.nearest_state_data)
                assert state_digest(got_state) == state_digest(want)
                # The plain form, from the checkpoint's data (items validated only when touched).
                assert state_data_at(log, proj, "run_0", n, nearest=hist.nearest_state_data) == want.model_dump(
                    mode="json"
                )
                assert state_data_at(log, proj, "run_0", n) == want.model_dump(mode="json")  # from the start
    log.close()


def _one_run_checkpointed(tmp_path: Path) -> tuple[EmbeddedLog, Path]:
    """One run of 25 patches, checkpointed every 10 revisions (and at its boundaries)."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, workload(runs=1, per_run=25))
    state = tmp_path / "state"
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=10, bytes_ratio=None)).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    return log, state


def test_time_travel_reads_a_live_snapshotter_store_without_opening_one(tmp_path: Path) -> None:
    """serve's history reads the store its snapshotter holds (no open per request; what it
    wrote a moment ago seen at once), and answers as a read-only open does."""
    log, state = _one_run_checkpointed(tmp_path)
    with CheckpointHistory(snapshotter_dir(state)) as opened:
        want = [opened.nearest_state_data("run_0", n) for n in range(27)]
    store = ProjectionStore(Layout(snapshotter_dir(state)).store_path(0))  # as the snapshotter opens it
    try:
        seen: list[int] = []
        with CheckpointHistory(snapshotter_dir(state), live=lambda p: seen.append(p) or store) as live:
            assert [live.nearest_state_data("run_0", n) for n in range(27)] == want
            assert live._stores.opened() == [] and seen and set(seen) == {0}  # nothing opened beside it
    finally:
        store.close()
    log.close()


def test_time_travel_keeps_the_checked_checkpoint_states_and_gives_each_caller_its_own_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's state is rebuilt from its pieces and checked once (a run's revisions
    near one checkpoint all start from it); a caller changing what it got changes nothing
    for the next; the kept states stay within their byte bound, the least recently used
    dropped first."""
    log, state = _one_run_checkpointed(tmp_path)
    with CheckpointHistory(snapshotter_dir(state)) as hist:
        revs = sorted(cp.revision for cp in hist.of("run_0"))
    # a checkpoint with two revisions after it before the next, and one before it
    c = next(r for r, after in zip(revs, revs[1:], strict=False) if after - r >= 3 and r > revs[0])
    older = revs[revs.index(c) - 1]
    rebuilt: list[int] = []
    real = CheckpointHistory._state_data
    monkeypatch.setattr(
        CheckpointHistory,
        "_state_data",
        lambda self, st, run, rev, raw: rebuilt.append(rev) or real(self, st, run, rev, raw),
    )
    with CheckpointHistory(snapshotter_dir(state)) as hist:
        first = hist.nearest_state_data("run_0", c + 2)
        assert first is not None and rebuilt == [c]
        first["goal"]["statement"] = "changed by a caller"
        for n in (c, c + 1, c + 2):
            again = hist.nearest_state_data("run_0", n)
            assert again is not None and again["goal"]["statement"] != "changed by a caller"
        assert rebuilt == [c]
        one = len(orjson.dumps(again))
    with CheckpointHistory(snapshotter_dir(state), cache=StateDataCache(max_bytes=one + one // 4)) as hist:
        for n in (older, c, older, c):
            hist.nearest_state_data("run_0", n)
        assert rebuilt == [c, older, c, older, c]  # room for one: each evicts the other
    log.close()


def test_an_idle_run_is_not_checkpointed_again_and_recovery_does_not_read_back_to_it(tmp_path: Path) -> None:
    """The coverage record is dense: below it, each run's records are all in its newest
    checkpoint. An idle run whose records are covered holds nothing back (it is never
    checkpointed again for its age, however many runs sit idle), while a busy run whose
    uncovered records grow older than ``max_age`` is checkpointed for it (``age``): the
    restore's tail starts near the log's end, not at the idle run's start."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    busy = [patch("busy", 0, start())] + [patch("busy", i + 1, fact(f"f{i}")) for i in range(200)]
    append_all(log, [patch("idle", 0, start()), *busy])
    state = tmp_path / "state"
    Snapshotter(log, str(state), policy=CheckpointPolicy(every=1000, max_age=50), batch_size=10).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    with CheckpointHistory(snapshotter_dir(state)) as hist:
        assert [(cp.revision, cp.triggers) for cp in hist.of("idle")] == [(1, ["run_started"])]
        aged = [cp for cp in hist.of("busy") if cp.triggers == ["age"]]
    assert len(aged) >= 2 and aged[-1].covers_offset >= 201 - 50 - 10
    reports = []
    Projector(log, str(tmp_path / "new"), restore=lambda p, s: reports.append(restore_partition(log, p, s))).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert reports[0].start_offset > 100  # not back at the idle run's start
    assert verify(log, str(tmp_path / "new")).ok
    log.close()


def test_checkpoints_of_long_runs_weigh_at_most_twice_their_records_and_resume_points_stay(tmp_path: Path) -> None:
    """A long run's state grows while its patches stay small, and a checkpoint writes only
    what changed since the run's previous one: at the default policy, with every boundary
    taken (a group of tasks done every ~10 patches here), its checkpoints weigh at most 2x
    its records, and with the periodic triggers unbudgeted too not much more (whole-state
    checkpoints every 50 revisions weighed ~100x). A checkpoint before a side effect is
    taken, budget or not."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_checkpoints import fill

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    events_bytes = fill(log, 4, 600)
    snap = Snapshotter(log, str(tmp_path / "s"))
    snap.run(until_caught_up=True, poll_timeout_s=0.01)
    assert 0 < snap.writer.written_bytes <= 2 * events_bytes
    unbudgeted = Snapshotter(log, str(tmp_path / "u"), policy=CheckpointPolicy(bytes_ratio=None), group_id="u")
    unbudgeted.run(until_caught_up=True, poll_timeout_s=0.01)
    assert unbudgeted.writer.written_bytes <= 3 * events_bytes
    # A resume point is taken whatever the budget says.
    append_all(log, [patch("long-000", 600, ev("ToolCallStarted", call_id="pay", tool="bank", side_effect=True))])
    snap = Snapshotter(log, str(tmp_path / "s"))
    snap.run(until_caught_up=True, poll_timeout_s=0.01)
    ck = log.topics.checkpoints
    heads = [
        pieces.head_document(r.value)
        for p in range(log.partitions(ck))
        for r in log.scan(ck, p, 0, 10**9)
        if r.key == b"long-000"
    ]
    assert heads[-1]["revision"] == 601 and "before_side_effect" in heads[-1]["triggers"]
    log.close()
