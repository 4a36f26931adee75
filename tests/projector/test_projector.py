"""The projector on the embedded log and a real RocksDB store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from helpers import append_all, ev, fact, fold, patch, project_all, start, task
from rocksdict import Options, Rdict

from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection, state_digest
from runstate.projector.read.replay import replay, state_at, verify
from runstate.projector.store.partition import PendingBatch, ProjectionStore
from runstate.schemas.codec import encode
from runstate.schemas.errors import RevisionNotFound, RunNotFound
from runstate.schemas import structs
from runstate.schemas.patch import Patch


def project(log: EmbeddedLog, state_dir: Path, **kw: object) -> Projector:
    return project_all(log, state_dir, **{"publish_dead_letters": True, **kw})


def story(run_id: str) -> list[Patch]:
    return [
        patch(run_id, 0, start(include=["src"])),
        patch(run_id, 1, fact("f1"), task("t1", scope=["src/a"]), task("t2", scope=["docs"])),
        patch(run_id, 1, fact("f2")),  # conflict
        patch(run_id, 1, fact("f3"), rebase=True),  # rebased -> r3
        patch(run_id, 3, fact("bad", evidence=None)),  # invalid
        patch(run_id, 3, ev("TaskStarted", task_id="t1"), ev("ConstraintSet", constraint={"key": "k", "value": "1"})),
        patch(run_id, 4, ev("ConstraintSet", constraint={"key": "k", "value": "2"})),
        patch(run_id, 2, ev("GoalChanged", goal={"statement": "g2", "scope": {"include": ["src"]}})),  # control wins
        patch(run_id, 5, fact("late")),  # superseded
    ]


def test_projection_equals_pure_replay_and_keeps_every_decision(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    patches = [p for r in ("a", "b", "c") for p in story(r)] + [patch("ghost", 0, fact("x"))]
    placed = append_all(embedded_log, patches)
    pr = project(embedded_log, tmp_path / "state", batch_size=4)
    assert (pr.stats.accepted, pr.stats.rejected) == (18, 10)
    book = fold(sorted(placed, key=lambda t: (t[1], t[2])))
    with Projection(tmp_path / "state") as proj:
        for r in ("a", "b", "c"):
            expected = book.docs[r]
            assert expected is not None
            assert proj.state(r).model_dump_json() == expected.to_state().model_dump_json()
            reasons = [d.reason for d in proj.history(r)]
            assert reasons == [None, None, "revision_conflict", None, "invalid", None, None, None, "superseded"]
        # the tail a rebuild reads: accepted decisions above a revision, rejections between
        # them skipped, read from the newest backwards
        hist = proj.history("a")
        for after in range(0, proj.state("a").revision + 1):
            want = [d for d in hist if d.outcome == "accepted" and d.revision > after]
            assert proj.accepted_since("a", after) == want
            # what a rebuild reads of them: where each is, up to a revision
            for up_to in (None, after, after + 1, after + 3):
                assert proj.accepted_positions("a", after, up_to) == [
                    (d.revision, d.partition, d.offset) for d in want if up_to is None or d.revision <= up_to
                ]
        assert proj.accepted_since("ghost", 0) == []
        assert proj.accepted_positions("ghost", 0) == []
        assert proj.history("ghost")[0].reason == "unknown_run"
        with pytest.raises(RunNotFound):
            proj.state("ghost")
        assert [h.run_id for h in proj.runs()] == ["a", "b", "c"]


def test_a_run_holding_more_items_than_the_cache_allows_leaves_it_and_is_decided_from_the_store(
    tmp_path: Path, embedded_log: EmbeddedLog
) -> None:
    """The working-state cache is bounded in items per run too (``cache_items_per_run``): a
    long run never holds more than the bound after a batch (its facts would otherwise all
    stay in memory), and what left the cache is read from the store when a patch needs it:
    a fact id confirmed long before is still a duplicate, a retracted one can be confirmed
    again, and the decisions and the state are the pure replay's."""
    patches = [patch("long", 0, start())]
    patches += [patch("long", r, fact(f"f{r}")) for r in range(1, 25)]
    patches += [
        patch("long", 25, fact("f2")),  # a duplicate of a fact that left the cache
        patch("long", 25, ev("FactRetracted", fact_id="f3", reason="wrong")),
        patch("long", 26, fact("f3")),  # confirmed again after its retraction
        patch("other", 0, start()),
        patch("other", 1, fact("o1")),
    ]
    append_all(embedded_log, patches)
    pr = Projector(embedded_log, str(tmp_path / "state"), batch_size=4, cache_items_per_run=5)
    topic = embedded_log.topics.events
    pr.layout.ensure(topic, embedded_log.partitions(topic), embedded_log.identity())  # as run() does
    pr.assign(list(range(embedded_log.partitions(topic))))
    held = []
    for p_ in pr.parts:
        recs = list(embedded_log.scan(topic, p_, 0, 10**9))
        for i in range(0, len(recs), 4):
            pr.process(recs[i : i + 4])
            doc = pr.parts[p_].book.docs.get("long")
            held.append(0 if doc is None else doc.cached_items())
    pr.release(list(pr.parts))
    assert max(held) <= 5 + 4 and any(h == 0 for h in held)  # bounded, and it did leave the cache
    book = replay(r for p_ in range(embedded_log.partitions(topic)) for r in embedded_log.scan(topic, p_, 0, 10**9))
    with Projection(tmp_path / "state") as proj:
        reasons = [(d.reason, d.rule) for d in proj.history("long")]
        assert reasons[25] == ("invalid", "fact.duplicate_id") and reasons[27] == (None, None)
        for r in ("long", "other"):
            assert proj.history(r) == sorted(
                (structs.to_model(d) for (run, _), d in book.decided.items() if run == r), key=lambda d: d.offset
            )
            expected = book.docs[r]
            assert expected is not None and proj.state(r) == expected.to_state()


def test_restart_continues_from_the_stored_offset_without_reapplying(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    append_all(embedded_log, story("a")[:4])
    project(embedded_log, tmp_path / "s")
    append_all(embedded_log, story("a")[4:])
    second = project(embedded_log, tmp_path / "s")
    assert second.stats.records == 5  # only the new records
    with Projection(tmp_path / "s") as proj:
        assert len(proj.history("a")) == 9
        assert proj.state("a").revision == 6
    assert verify(embedded_log, str(tmp_path / "s")).ok


def test_undecodable_records_are_dead_lettered_and_the_rest_applied(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    prod = embedded_log.producer()
    ev_topic = embedded_log.topics.events
    prod.append(ev_topic, "a", b"not avro at all")
    good = patch("a", 0, start())
    prod.append(ev_topic, "a", encode(good)[:-2])  # truncated
    prod.append(ev_topic, "b", encode(good))  # keyed by another run
    prod.append(ev_topic, "a", encode(good))
    prod.close()
    pr = project(embedded_log, tmp_path / "s")
    assert pr.stats.dead_letters == 3 and pr.stats.accepted == 1
    with Projection(tmp_path / "s") as proj:
        assert sorted(d.reason for d in proj.dead_letters()) == [
            "corrupt_record",
            "key_mismatch",
            "not_avro_single_object",
        ]
        assert proj.state("a").revision == 1
    dlq = embedded_log.topics.deadletter
    recs = [r for p in range(4) for r in embedded_log.scan(dlq, p, 0, embedded_log.end_offsets(dlq)[p])]
    assert sorted(dict(r.headers)["reason"] for r in recs) == [
        b"corrupt_record",
        b"key_mismatch",
        b"not_avro_single_object",
    ]
    assert b"not avro at all" in [r.value for r in recs]


def test_an_event_writes_only_what_it_changed(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    """Cost per event must not grow with the run's size: the batch for one more fact on a
    run with 300 facts holds the header and that fact, nothing else."""
    patches = [patch("big", 0, start())] + [patch("big", i + 1, fact(f"f{i}")) for i in range(300)]
    append_all(embedded_log, patches)
    project(embedded_log, tmp_path / "s")
    append_all(embedded_log, [patch("big", 301, fact("one_more"), ev("BudgetConsumed", tokens=1))])
    pr = Projector(embedded_log, str(tmp_path / "s"))
    batches: list[PendingBatch] = []
    real_write = ProjectionStore.write

    def spy(self: ProjectionStore, batch: PendingBatch) -> None:
        batches.append(batch)
        real_write(self, batch)

    ProjectionStore.write = spy  # type: ignore[method-assign]
    try:
        pr.run(until_caught_up=True, poll_timeout_s=0.01)
    finally:
        ProjectionStore.write = real_write  # type: ignore[method-assign]
    [b] = batches
    assert list(b.headers) == ["big"]
    assert len(b.puts) == 1 and not b.deletes and len(b.decisions) == 1


def test_state_at_any_past_revision(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    patches = story("a")
    placed = append_all(embedded_log, patches)
    project(embedded_log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        current = proj.state("a").revision
        for rev in range(1, current + 1):
            want = None
            for k in range(1, len(placed) + 1):  # replay prefixes until the run reaches rev
                doc = fold(placed[:k]).docs.get("a")
                if doc is not None and doc.header.revision == rev:
                    want = doc.to_state()
                    break
            assert want is not None
            assert state_digest(state_at(embedded_log, proj, "a", rev)) == state_digest(want)
        with pytest.raises(RevisionNotFound):
            state_at(embedded_log, proj, "a", current + 1)


def test_verify_finds_a_tampered_projection(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    append_all(embedded_log, story("a") + story("b"))
    project(embedded_log, tmp_path / "s")
    assert verify(embedded_log, str(tmp_path / "s")).ok
    with Projection(tmp_path / "s") as proj:
        part = proj.layout.partition_of("b")
    # Tamper: delete one fact of run b straight in RocksDB.
    db = Rdict(str(tmp_path / "s" / f"p{part:03d}"), Options(raw_mode=True))
    db.delete(b"i:b\0confirmed_facts\0f1")
    db.close()
    report = verify(embedded_log, str(tmp_path / "s"))
    assert [m.run_id for m in report.mismatches] == ["b"]
    assert report.mismatches[0].detail == "state differs with equal histories"


def test_store_is_exclusive_to_one_writer(tmp_path: Path) -> None:
    from runstate.schemas.errors import StoreLocked

    a = ProjectionStore(tmp_path / "p")
    with pytest.raises(StoreLocked, match="in use"):
        ProjectionStore(tmp_path / "p")
    a.close()


def test_the_stores_of_a_process_share_one_block_cache_and_one_memtable_budget(tmp_path: Path) -> None:
    """A process's memory for RocksDB is bounded whatever the number of partitions it
    holds (the projector's stores and the snapshotter's): every store uses one block cache
    and one write buffer manager, not a cache and two 64 MB memtables each."""
    from runstate.projector.store.partition import WRITE_BUFFERS_BYTES, shared_memory

    a, b = ProjectionStore(tmp_path / "a"), ProjectionStore(tmp_path / "b")
    a.write(PendingBatch(next_offset=1, puts={b"i:r\0facts\0f%06d" % i: b"x" * 100 for i in range(5_000)}))
    a.close()
    a = ProjectionStore(tmp_path / "a")
    assert all(v is not None for v in a._db.get([b"i:r\0facts\0f%06d" % i for i in range(5_000)]))
    used = int(a._db.property_value("rocksdb.block-cache-usage"))
    assert used > 100_000 and int(b._db.property_value("rocksdb.block-cache-usage")) == used
    _cache, buffers = shared_memory()
    assert buffers.get_buffer_size() == WRITE_BUFFERS_BYTES
    before = buffers.get_usage()
    b.write(PendingBatch(next_offset=1, puts={b"i:s\0facts\0f%06d" % i: b"y" * 100 for i in range(5_000)}))
    assert buffers.get_usage() > before
    a.close()
    b.close()


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_a_reopened_store_keeps_its_bloom_filters_and_block_cache(tmp_path: Path, read_only: bool) -> None:
    """The store's table options hold on every open, not only on the one that created it:
    rocksdict reopens an existing database with the options in its OPTIONS file unless
    the column family's options are given too, and from that file RocksDB gets back no
    filter policy and an 8 MB cache. Without the filter every point read that misses (a
    new patch id, a fresh item id) reads and caches a data block, so misses fill the
    block cache as hits do; with it they read about 1 % of that."""
    from runstate.projector.store.partition import BLOCK_CACHE_BYTES

    path = tmp_path / "p"
    st = ProjectionStore(path)
    n = 20_000
    st.write(PendingBatch(next_offset=1, puts={b"i:r\0facts\0f%06d" % i: b"x" * 100 for i in range(0, 2 * n, 2)}))
    st.close()  # flushed to a table file: the reads below go to it, not to the memtable

    st = ProjectionStore(path, read_only=read_only)
    db = st._db

    def cached() -> int:
        return int(db.property_value("rocksdb.block-cache-usage"))

    assert int(db.property_value("rocksdb.block-cache-capacity")) == BLOCK_CACHE_BYTES
    before = cached()
    # 2,000 misses spread over every data block (a block holds about 30 of these keys)
    assert all(v is None for v in db.get([b"i:r\0facts\0f%06d" % i for i in range(1, 2 * n, 20)]))
    by_misses = cached() - before
    before = cached()
    assert all(v is not None for v in db.get([b"i:r\0facts\0f%06d" % i for i in range(0, 2 * n, 2)]))
    by_hits = cached() - before
    st.close()
    assert by_hits > 0
    assert by_misses * 10 < by_hits, (by_misses, by_hits)


def test_progress_figures_count_from_the_first_batch(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    append_all(embedded_log, story("a") + story("b"))
    seen: list[tuple[int, int]] = []
    pr = Projector(
        embedded_log, str(tmp_path / "s"), batch_size=3, on_progress=lambda st, lag: seen.append((st.records, lag))
    )
    pr.run(until_caught_up=True, poll_timeout_s=0.01)
    assert pr.stats.batches >= 6 and pr.stats.rate() > 0
    assert seen and seen[-1] == (18, 0)  # the last progress line says: all read, lag 0


def test_positions_are_mirrored_rarely_while_busy_and_always_on_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the embedded log the mirror (what `runstate status` shows as committed) is
    written at most every ``MIRROR_EVERY_S`` while busy, but a stop in the middle of a busy
    stretch still leaves it at the position the stores reached."""
    import threading

    from runstate.eventlog import embedded

    monkeypatch.setattr(embedded, "MIRROR_EVERY_S", 3600.0)
    log = EmbeddedLog(tmp_path / "one.db", partitions=1)
    append_all(log, story("a") + story("b"))
    stop = threading.Event()
    batches: list[int] = []

    class StopAfterTwo:
        def on_assign(self, partition: int, store: ProjectionStore) -> None: ...
        def on_accepted(self, *args: object) -> None: ...
        def after_write(self, partition: int, batch: PendingBatch, store: ProjectionStore) -> None:
            batches.append(partition)
            if len(batches) == 2:
                stop.set()

    pr = Projector(log, str(tmp_path / "s"), batch_size=3, hooks=StopAfterTwo(), publish_dead_letters=False)
    pr.run(stop=stop, poll_timeout_s=0.01)
    assert pr.stats.records == 6  # two busy batches of 3, no idle poll in between
    assert log.committed(pr.group_id, log.topics.events) == {0: 6}
    log.close()


def test_explain_lists_every_patch_that_changed_a_field(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    from runstate.projector.read.replay import explain

    append_all(embedded_log, story("a"))
    project(embedded_log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        changes = explain(embedded_log, proj, "a", "goal.constraints.k.value")
        assert [(c.revision, c.before, c.after) for c in changes] == [(4, None, "1"), (5, "1", "2")]
        assert changes[1].event_types == ["ConstraintSet"] and changes[1].agent_version == "v1"
        t2 = explain(embedded_log, proj, "a", "tasks.t2.status")
        assert [(c.revision, c.after) for c in t2] == [(2, "pending"), (6, "cancelled")]  # the goal change
        assert t2[-1].event_types == ["GoalChanged"]
        assert explain(embedded_log, proj, "a", "no.such.field") == []


def test_a_record_that_breaks_the_core_is_dead_lettered_not_fatal(
    tmp_path: Path, embedded_log: EmbeddedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reducer bug must not make one record a poison pill: the projector goes on."""
    from runstate.projector.core import reducer

    def broken(d: object, e: object, ctx: object) -> None:
        raise ZeroDivisionError("reducer bug")

    monkeypatch.setitem(reducer.REDUCERS, "PhaseChanged", broken)
    append_all(
        embedded_log, [patch("a", 0, start()), patch("a", 1, ev("PhaseChanged", phase="x")), patch("a", 1, fact("f1"))]
    )
    pr = project(embedded_log, tmp_path / "s")
    assert (pr.stats.accepted, pr.stats.dead_letters) == (2, 1)
    with Projection(tmp_path / "s") as proj:
        [dl] = proj.dead_letters()
        assert dl.reason == "internal_error" and "reducer bug" in dl.detail
        assert proj.state("a").revision == 2 and proj.state("a").phase is None
    strict = Projector(embedded_log, str(tmp_path / "s2"), on_internal_error="fail")
    with pytest.raises(ZeroDivisionError):
        strict.run(until_caught_up=True, poll_timeout_s=0.01)


def test_explain_never_assembles_the_whole_state(
    tmp_path: Path, embedded_log: EmbeddedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """explain reads the explained field per revision, not the run's state (which would cost
    revisions x state size)."""
    from runstate.projector.read.replay import explain
    from runstate.projector.core.working import RunDoc

    append_all(embedded_log, story("a"))
    project(embedded_log, tmp_path / "s")

    def whole_state(self: RunDoc) -> None:
        raise AssertionError("explain assembled the whole state")

    monkeypatch.setattr(RunDoc, "to_state", whole_state)
    with Projection(tmp_path / "s") as proj:
        changes = explain(embedded_log, proj, "a", "tasks.t2.status")
    assert [(c.revision, c.after) for c in changes] == [(2, "pending"), (6, "cancelled")]


def test_gc_policy_freezes_survivors_and_an_idle_full_collection_reclaims_frozen_cycles() -> None:
    """projector/runtime/gc_policy.py, in a process of its own (the policy is per process): a cycle that
    survived a collection is frozen (not reclaimed by ordinary collections) until the idle
    full collection, which does reclaim it."""
    import subprocess
    import sys

    code = r"""
import gc, weakref
from runstate.projector.runtime import gc_policy

class Node:
    pass

gc_policy.settle()
a, b = Node(), Node()
a.other, b.other = b, a
ref = weakref.ref(a)
gc.collect(1)  # the cycle survives a generation-1 collection: frozen by the policy
del a, b
gc.collect(1)
print("after ordinary collection:", ref() is not None)
gc_policy.FULL_EVERY_S = 0.0
found = gc_policy.collect_when_idle()
print("after idle full collection:", ref() is not None, found is not None and found >= 2)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["after ordinary collection: True", "after idle full collection: False True"]


def test_gc_policy_batch_window_turns_collection_off_and_back_on_and_an_overdue_full_collection_reclaims() -> None:
    """projector/runtime/gc_policy.py's batch window, in a process of its own: within a batch automatic
    collection is off, before the policy is on too; after it (also after one that
    raised) it is on again, a cycle dropped during the batch is frozen, and the overdue full
    collection after a batch reclaims it. A process that turned collection off keeps it off."""
    import subprocess
    import sys

    code = r"""
import gc, weakref
from runstate.projector.runtime import gc_policy

class Node:
    pass

with gc_policy.batch():
    print("before settle, in a batch:", gc.isenabled())
print("before settle, after a batch:", gc.isenabled())
gc_policy.settle()
with gc_policy.batch():
    print("in a batch:", gc.isenabled())
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
print("after a batch:", gc.isenabled())
gc.collect(1)
print("after ordinary collection:", ref() is not None)
try:
    with gc_policy.batch():
        raise KeyError("x")
except KeyError:
    pass
print("after a batch that raised:", gc.isenabled())
gc_policy.FULL_OVERDUE_S = 0.0
with gc_policy.batch():
    pass
print("after an overdue batch:", ref() is not None)
gc.disable()
with gc_policy.batch():
    pass
print("turned off by the process, after a batch:", gc.isenabled())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "before settle, in a batch: False",
        "before settle, after a batch: True",
        "in a batch: False",
        "after a batch: True",
        "after ordinary collection: True",
        "after a batch that raised: True",
        "after an overdue batch: False",
        "turned off by the process, after a batch: False",
    ]


def test_a_restore_runs_with_automatic_collection_off_and_leaves_it_on(tmp_path: Path) -> None:
    """A partition's restore keeps what it reads alive until it is written: a collection
    during it would walk all of that and free nothing (gc_policy.batch)."""
    import gc

    log = EmbeddedLog(tmp_path / "log.db", partitions=2)
    append_all(log, [patch("r", 0, start())])
    seen: list[bool] = []
    Projector(log, str(tmp_path / "state"), restore=lambda p, store: seen.append(gc.isenabled())).run(
        until_caught_up=True, poll_timeout_s=0.01
    )
    assert seen == [False, False] and gc.isenabled()
    log.close()


def test_catching_up_on_a_drained_log_looks_without_waiting() -> None:
    """``run(until_caught_up=True)`` on a log it has already read returns after one poll
    that does not wait (before, it waited a whole poll timeout to see nothing)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        log = EmbeddedLog(Path(d) / "log.db", partitions=2)
        append_all(log, [patch("r", 0, start()), patch("r", 1, fact("f1"))])
        state = str(Path(d) / "state")
        Projector(log, state).run(until_caught_up=True, poll_timeout_s=0.01)
        waits: list[float] = []
        made = log.consumer

        def consumer(*a: object, **kw: object) -> object:
            c = made(*a, **kw)  # type: ignore[arg-type]
            poll = c.poll
            c.poll = lambda n, timeout: (waits.append(timeout), poll(n, timeout))[1]  # type: ignore[method-assign]
            return c

        log.consumer = consumer  # type: ignore[method-assign]
        Projector(log, state).run(until_caught_up=True, poll_timeout_s=30.0)
        assert waits == [0.0]
        log.close()


def test_updated_is_model_copy_with_update() -> None:
    """The core's copy of a struct with changes gives what pydantic's model_copy(update=...)
    gives the model, value for value; the core copies only structs (no model's private
    attributes are written)."""
    from runstate.schemas import structs
    from runstate.schemas.state import Budgets, RunHeader

    b = Budgets(tokens_used=3, tokens_remaining=7)
    for changes in ({}, {"tokens_used": 4}, {"tokens_used": 5, "tokens_remaining": None}):
        fast, slow = structs.updated(structs.from_model(b), changes), b.model_copy(update=changes)
        assert structs.to_model(fast) == slow and structs.to_model(fast).model_dump_json() == slow.model_dump_json()
    h = RunHeader.model_validate({"run_id": "r", "revision": 2, "goal": {"statement": "g"}, "agent_version": "v1"})
    fast = structs.updated(structs.from_model(h), {"revision": 3})
    assert structs.to_model(fast) == h.model_copy(update={"revision": 3}) and h.revision == 2
    with pytest.raises(TypeError):
        structs.updated(h, {"revision": 3})  # type: ignore[type-var]


def test_a_drafts_item_counts_follow_every_put_and_delete() -> None:
    """The header counts items per collection, and a lookup in a collection it counts as
    empty does not read the store: every path that adds or removes an item must count."""
    from runstate.projector.core.working import Draft, RunDoc, header_from_model, updated
    from runstate.schemas.state import Fact, RunHeader

    stored = {("confirmed_facts", "f_old"): (0, None)}
    reads: list[tuple[str, str]] = []

    def load_one(kind: str, id_: str) -> tuple[int, object] | None:
        reads.append((kind, id_))
        return stored.get((kind, id_))  # type: ignore[return-value]

    header = header_from_model(
        RunHeader.model_validate(
            {
                "run_id": "r",
                "revision": 3,
                "goal": {"statement": "g"},
                "agent_version": "1",
                "next_seq": 1,
                "sizes": {"confirmed_facts": 1},
            }
        )
    )
    doc = RunDoc(header, load_one=load_one)  # type: ignore[arg-type]
    item = Fact.model_construct(id="x")
    d = Draft(doc, doc.header)
    assert d.get("hypotheses", "h1") is None and reads == []  # counted empty: no read
    d.put("hypotheses", "h1", item)  # new
    d.put("hypotheses", "h1", item)  # the same, again: not new
    d.put("confirmed_facts", "f_old", item)  # an update of a stored item
    assert d.header.sizes == {"confirmed_facts": 1, "hypotheses": 1}
    d.delete("hypotheses", "h1")  # new in this draft, gone again
    d.delete("hypotheses", "h1")  # and again: nothing left to delete
    assert d.header.sizes == {"confirmed_facts": 1}
    d.delete("confirmed_facts", "f_old")
    d.delete("confirmed_facts", "f_old")
    assert d.header.sizes == {}
    d.put("confirmed_facts", "f_old", item)  # re-created after its delete: new again
    assert d.header.sizes == {"confirmed_facts": 1}
    assert reads == [("confirmed_facts", "f_old")]  # the one stored item, read once
    uncounted = RunDoc(updated(header, {"sizes": None}), load_one=load_one)  # type: ignore[arg-type]
    assert uncounted.entry("hypotheses", "h9") is None and reads[-1] == ("hypotheses", "h9")  # old header: reads


def test_a_store_written_before_item_counts_still_projects_correctly(tmp_path: Path) -> None:
    """A header stored without ``sizes`` (an older runstate) stays uncounted: every lookup
    reads the store, so an existing item is still found (here: a duplicate fact id)."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r1", 0, start(), fact("f1"))])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    db = Rdict(str(tmp_path / "s" / "p000"), Options(raw_mode=True))
    import json as _json

    h = _json.loads(db[b"h:r1"])
    assert h.pop("sizes") == {"confirmed_facts": 1}
    db[b"h:r1"] = _json.dumps(h).encode()
    db.close()
    append_all(log, [patch("r1", 1, fact("f1")), patch("r1", 1, fact("f2"))])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    with Projection(tmp_path / "s") as proj:
        outcomes = [(d.outcome, d.rule) for d in proj.history("r1")]
        assert outcomes[1] == ("rejected", "fact.duplicate_id") and outcomes[2][0] == "accepted"
        assert proj.header("r1").sizes is None  # type: ignore[union-attr]
        assert [f.id for f in proj.state("r1").confirmed_facts] == ["f1", "f2"]
    log.close()


def _header_of_another_version(raw: bytes) -> bytes:
    h = orjson.loads(raw)
    h["schema_version"] = 99
    return orjson.dumps(h)


def _header_with_a_string_revision(raw: bytes) -> bytes:
    h = orjson.loads(raw)
    h["revision"] = "one"
    return orjson.dumps(h)


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (_header_of_another_version, "schema_version 99"),
        (_header_with_a_string_revision, "stored header of run 'r1'.*cannot be read"),
        (lambda raw: raw[:-7], "stored header of run 'r1'.*cannot be read"),  # not JSON
    ],
    ids=["another schema version", "a value of the wrong type", "not JSON"],
)
def test_a_run_the_store_cannot_read_stops_the_projector_and_its_record_waits(
    tmp_path: Path, damage: Callable[[bytes], bytes], error: str
) -> None:
    """Reading a run's stored state failed: its header is of a schema version this runstate
    does not write, or does not decode. That is the store's fault, not the record's: the
    projector stops with a StoreError naming the run, and the record is neither
    dead-lettered nor consumed, so it is decided once the store is repaired or rebuilt from
    the log."""
    from runstate.schemas.errors import StoreError

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r1", 0, start())])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    db = Rdict(str(tmp_path / "s" / "p000"), Options(raw_mode=True))
    db[b"h:r1"] = damage(db[b"h:r1"])
    db.close()
    append_all(log, [patch("r1", 1, fact("f1"))])
    with pytest.raises(StoreError, match=error):
        Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    with ProjectionStore(tmp_path / "s" / "p000", read_only=True) as st:
        assert st.next_offset() == 1 and st.dead_letters() == [] and len(st.history("r1")) == 1
        # The same where a run is loaded as its record is decided (no batched read first).
        from runstate.eventlog.base import Record
        from runstate.projector.core.runbook import RunBook

        rec = Record("events", 0, 1, b"r1", encode(patch("r1", 1, fact("f2"))), 0)
        with pytest.raises(StoreError, match=error):
            RunBook(st.load_doc, st.decision).apply_record(rec)
    log.close()


@pytest.mark.parametrize(
    ("damage", "error", "data_too"),
    [
        (_header_of_another_version, "schema_version 99", True),
        (lambda raw: raw[:-7], "stored header of run 'r1'.*cannot be read", True),  # not JSON
        (_header_with_a_string_revision, "stored state of run 'r1'.*cannot be read", False),
    ],
    ids=["another schema version", "not JSON", "a value of the wrong type"],
)
def test_a_query_of_a_run_the_store_cannot_read_is_a_store_error(
    tmp_path: Path, damage: Callable[[bytes], bytes], error: str, data_too: bool
) -> None:
    """A query of a run whose stored header is of another schema version or is not JSON
    raises a StoreError naming the run, whichever form it asks for; a value of the wrong
    type fails the validated state and the context (decoded as the validated state's
    struct) the same way (the plain forms validate nothing again)."""
    from runstate.schemas.errors import StoreError

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r1", 0, start(), fact("f1"))])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    db = Rdict(str(tmp_path / "s" / "p000"), Options(raw_mode=True))
    db[b"h:r1"] = damage(db[b"h:r1"])
    db.close()
    with Projection(tmp_path / "s") as proj:
        for read in (proj.state, proj.context):
            with pytest.raises(StoreError, match=error):
                read("r1")
        for read in (proj.state_data, proj.state_json) if data_too else ():
            with pytest.raises(StoreError, match=error):
                read("r1")


def test_a_query_of_a_run_with_an_item_that_is_not_json_is_a_store_error(tmp_path: Path) -> None:
    """A stored item whose JSON is cut short fails the validated state, the plain data and
    the context with a StoreError naming the run, not a parser's error; other runs still read."""
    from runstate.projector.store import keys
    from runstate.schemas.errors import StoreError

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r1", 0, start(), fact("f1")), patch("r2", 0, start(), fact("f1"))])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    db = Rdict(str(tmp_path / "s" / "p000"), Options(raw_mode=True))
    key = keys.item_key("r1", "confirmed_facts", "f1")
    db[key] = db[key][:-5]
    db.close()
    with Projection(tmp_path / "s") as proj:
        for read in (proj.state, proj.state_data, proj.context):
            with pytest.raises(StoreError, match="stored state of run 'r1'.*cannot be read"):
                read("r1")
        assert [f.id for f in proj.state("r2").confirmed_facts] == ["f1"]
        assert "[f1] statement f1" in proj.context("r2")


def test_a_header_stored_before_fields_existed_reads_with_their_defaults(tmp_path: Path) -> None:
    """A stored header without fields a later runstate added (here those whose value is
    their default) reads as the state it was: validated, as plain data (key for key, in
    order) and as JSON, through the slow path the missing values take."""
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(log, [patch("r1", 0, start(), fact("f1"), fact("f2"))])
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    with Projection(tmp_path / "s") as proj:
        state, data, context = proj.state("r1"), proj.state_data("r1"), proj.context("r1")
    db = Rdict(str(tmp_path / "s" / "p000"), Options(raw_mode=True))
    h = orjson.loads(db[b"h:r1"])
    assert (h.pop("revoked_agents"), h.pop("migrated_from"), h.pop("effect_ledger_ref")) == ([], None, None)
    db[b"h:r1"] = orjson.dumps(h)
    db.close()
    with Projection(tmp_path / "s") as proj:
        assert proj.state("r1") == state
        got = proj.state_data("r1")
        assert got == data and list(got) == list(data)
        assert orjson.loads(proj.state_json("r1")) == data
        assert proj.context("r1") == context


def test_a_page_of_runs_by_latest_activity(tmp_path: Path) -> None:
    """``order="recent"``: the runs whose last accepted patch is newest first (ties by run
    id), a page continuing after the cursor the previous page's last run gives
    (:func:`activity_cursor`); a rejected patch is no activity; a bad cursor is a
    ContractError."""
    from runstate.projector.store.partition import activity_cursor
    from runstate.schemas.errors import ContractError

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(
        log,
        [
            patch("a", 0, start(), minute=1),
            patch("b", 0, start(), minute=5),
            patch("c", 0, start(), minute=3),
            patch("d", 0, start(), minute=5),
            patch("a", 1, fact("f1"), minute=9),
            patch("c", 0, start(), minute=20),
        ],
    )  # the last one is rejected: no activity
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    with ProjectionStore(tmp_path / "s" / "p000", read_only=True) as st:
        total, page = st.runs_page(None, None, None, None, order="recent")
        assert (total, [r for r, _ in page]) == (4, ["a", "b", "d", "c"])
        total, first = st.runs_page(None, None, None, 2, order="recent")
        assert [r for r, _ in first] == ["a", "b"]
        cursor = activity_cursor(*first[-1])
        total, second = st.runs_page(None, None, cursor, 2, order="recent")
        assert (total, [r for r, _ in second]) == (4, ["d", "c"])
        assert st.runs_page(None, lambda r: r != "d", cursor, 5, order="recent")[1][0][0] == "c"
        for bad in ("b", "x.b", ""):
            with pytest.raises(ContractError, match="cursor"):
                st.runs_page(None, None, bad, 2, order="recent")


def test_listing_gives_each_header_as_the_model_writes_it(tmp_path: Path) -> None:
    """``headers_json`` lists each run's header in run id order as
    ``RunHeader.model_dump_json`` gives it (the stored bytes; a header stored before fields
    existed through the model, with their defaults), of one status when asked; a header of
    another schema version, or that is not JSON, is a StoreError naming the run."""
    from runstate.schemas.errors import StoreError

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    append_all(
        log,
        [
            patch("r2", 0, start(), fact("f1")),
            patch("r1", 0, start()),
            patch("r3", 0, start(), ev("RunCompleted", summary="done")),
        ],
    )
    Projector(log, str(tmp_path / "s")).run(until_caught_up=True, poll_timeout_s=0.01)
    log.close()
    path = tmp_path / "s" / "p000"
    db = Rdict(str(path), Options(raw_mode=True))
    h = orjson.loads(db[b"h:r2"])
    del h["revoked_agents"], h["effect_ledger_ref"]  # as stored before those fields existed
    db[b"h:r2"] = orjson.dumps(h)
    db.close()
    with ProjectionStore(path, read_only=True) as st:
        models = list(st.headers())
        assert list(st.headers_json()) == [(m.run_id, m.model_dump_json().encode()) for m in models]
        assert [r for r, _ in st.headers_json()] == ["r1", "r2", "r3"]
        assert [r for r, _ in st.headers_json("running")] == ["r1", "r2"]
        assert [r for r, _ in st.headers_json("completed")] == ["r3"]
        assert orjson.loads(dict(st.headers_json())["r2"])["revoked_agents"] == []
        # A page: the count of what matches, and only the page's headers.
        whole = dict(st.headers_json())
        assert st.runs_page(None, None, None, None) == (3, list(whole.items()))
        assert st.runs_page(None, None, "r1", 1) == (3, [("r2", whole["r2"])])
        assert st.runs_page("running", None, None, 5) == (2, [("r1", whole["r1"]), ("r2", whole["r2"])])
        assert st.runs_page(None, lambda r: r != "r2", "r1", 5) == (2, [("r3", whole["r3"])])
    for damage, error in (
        (_header_of_another_version, "run 'r1'.*schema_version 99"),
        (lambda raw: raw[:-7], "stored header of run 'r1'.*cannot be read"),
    ):
        db = Rdict(str(path), Options(raw_mode=True))
        good = db[b"h:r1"]
        db[b"h:r1"] = damage(good)
        db.close()
        with ProjectionStore(path, read_only=True) as st, pytest.raises(StoreError, match=error):
            list(st.headers_json())
        db = Rdict(str(path), Options(raw_mode=True))
        db[b"h:r1"] = good
        db.close()


def test_batched_reads_read_what_single_reads_read(tmp_path: Path, embedded_log: EmbeddedLog) -> None:
    """The batched reads of a poll batch (one MultiGet each) give each run's working state
    and each patch id's decision exactly as one read of it does, in order, None for what
    is not stored."""
    append_all(embedded_log, story("a") + story("b") + [patch("c", 0, start())])
    project(embedded_log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        part = proj.layout.partition_of("a")
        runs = [h.run_id for h in proj.runs() if proj.layout.partition_of(h.run_id) == part]
    with ProjectionStore(tmp_path / "s" / f"p{part:03d}", read_only=True) as st:
        wanted = [*runs, "nobody", *reversed(runs)]
        one = [st.load_doc(r) for r in wanted]
        many = st.load_docs(wanted)
        assert [d is None for d in many] == [d is None for d in one] == [r == "nobody" for r in wanted]
        for d1, d2 in zip(one, many):
            if d1 is not None and d2 is not None:
                assert d2.header == d1.header and d2.to_state() == d1.to_state()
        # The same for the batched read of decisions (the idempotency index).
        pairs = [(r, pid) for r in runs for pid in st.patch_ids(r)]
        asked = [*pairs, ("nobody", "p"), (runs[0], "never-sent"), *reversed(pairs)]
        assert len(pairs) >= 9
        assert [None if d is None else structs.to_model(d) for d in st.decisions(asked)] == [
            st.decision(r, pid) for r, pid in asked
        ]
        assert [d is None for d in st.decisions(asked)] == [(r, pid) not in pairs for r, pid in asked]


#: One valid event of each type the reducer hints a read for (reducer.READS).
_HINTED_EVENTS = [
    ev("ConstraintSet", constraint={"key": "k", "value": "1"}),
    fact("f9"),
    ev("FactRetracted", fact_id="f1", reason="wrong"),
    ev("HypothesisProposed", hypothesis={"id": "h9", "statement": "maybe", "confidence": 0.5, "falsifier": "a test"}),
    ev("HypothesisRevised", hypothesis_id="h1", confidence=0.2),
    ev("HypothesisRejected", hypothesis_id="h1", reason="no"),
    ev("QuestionOpened", question={"id": "q9", "text": "?"}),
    ev("QuestionResolved", question_id="q1", answer="yes"),
    task("t9"),
    ev("TaskStarted", task_id="t1"),
    ev("TaskBlocked", task_id="t1", reason="x"),
    ev("TaskCompleted", task_id="t1", evidence="artifact://x/1"),
    ev("TaskFailed", task_id="t1", reason="x"),
    ev("TaskHandedOver", task_id="t1", to_agent_id="agent-b"),
    ev("TaskCancelled", task_id="t1", reason="x"),
    ev("ToolCallStarted", call_id="c9", tool="deploy"),
    ev("ToolSucceeded", call_id="c1"),
    ev("ToolFailed", call_id="c1", error="x"),
    ev("ArtifactRecorded", artifact={"id": "artifact://diff/7", "kind": "patch", "digest": "sha256:ab"}),
    ev("InputRecorded", input={"id": "user://msg_3", "origin": "user", "text": "it is RS256"}),
    ev(
        "ObservationRecorded",
        observation={"subject": "svc", "observed_state": "up", "observed_at": "2026-01-01T00:00:00Z"},
    ),
    ev("EffectRecorded", effect={"id": "e9", "status": "started", "target": "prod"}),
    ev(
        "GraphCheckpointSaved",
        checkpoint={
            "ns": "child:1",
            "id": "1ef-9",
            "checkpoint": {"type": "msgpack", "data": ""},
            "metadata": {"type": "msgpack", "data": ""},
        },
    ),
    ev("GraphWritesSaved", ns="", checkpoint_id="1ef-1", writes=[]),
]


@pytest.mark.parametrize("event", _HINTED_EVENTS, ids=lambda e: str(e["type"]))
def test_each_read_ahead_hint_is_the_first_read_its_reducer_makes(event: dict[str, object]) -> None:
    """``reducer.READS`` moves a read ahead of the decision: it must be one the reducer
    makes, or the read-ahead is wasted (and the read it meant to save still happens).
    Every collection is counted non-empty, so each lookup reads the (recording) store."""
    from runstate.projector.core.decide import decide
    from runstate.projector.core.reducer import READS
    from runstate.projector.core.working import RunDoc, updated
    from runstate.schemas.state import COLLECTIONS

    class FirstRead(Exception):
        pass

    def load_one(kind: str, id_: str) -> None:
        raise FirstRead((kind, id_))

    base = fold([(patch("r", 0, start()), 0, 0)]).docs["r"]
    assert base is not None
    header = updated(base.header, {"sizes": {k: 1 for k in COLLECTIONS}})
    p = patch("r", 1, event)
    [e] = p.events
    assert e.type in READS, f"{e.type} has no read-ahead hint"
    with pytest.raises(FirstRead) as got:
        decide(RunDoc(header, load_one=load_one, load_all=lambda kind: iter(())), p, 0, 1)
    assert got.value.args[0] == READS[e.type](e)


def test_every_hint_is_tested() -> None:
    from runstate.projector.core.reducer import READS

    assert sorted(READS) == sorted(str(e["type"]) for e in _HINTED_EVENTS)
