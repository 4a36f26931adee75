"""Properties that must always hold (hypothesis): determinism, and projection == replay for
any interleaving of valid, invalid, stale, rebased and duplicate patches."""

from __future__ import annotations

from datetime import UTC, datetime
import tempfile
from pathlib import Path
from helpers import append_all, examples, fold
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import msgspec
import orjson
from workloads import RUNS, build, op

from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.read.context import render_context
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import replay
from runstate.projector.core.runbook import RunBook
from runstate.projector.core.working import RunDoc
from runstate.schemas.patch import Decision, Patch
from runstate.schemas.state import COLLECTIONS, RunState
from runstate.schemas import structs


#: The clock of the contexts the properties render (an observation older than 15 minutes
#: at it is flagged stale).
NOW = datetime(2026, 8, 11, 12, 0, tzinfo=UTC)


def fold_bytes(patches: list[Patch]) -> dict[str, bytes]:
    book = RunBook()
    for i, p in enumerate(patches):
        book.apply(p, 0, i)
    return {r: d.to_state().model_dump_json().encode() for r, d in book.docs.items() if d is not None}


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(op, min_size=5, max_size=80))
def test_replay_twice_gives_identical_bytes(ops: list[tuple[str, str, int, bool, int]]) -> None:
    patches = build(ops)
    assert fold_bytes(patches) == fold_bytes(patches)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=10, max_size=80), st.integers(1, 7))
def test_projection_equals_replay_for_any_interleaving(ops: list[tuple[str, str, int, bool, int]], batch: int) -> None:
    patches = build(ops)
    with tempfile.TemporaryDirectory() as d:
        log = EmbeddedLog(Path(d) / "log.db", partitions=2)
        placed = append_all(log, patches)
        # Project in two runs of the projector (a restart in the middle), small batches.
        half = len(patches) // 2
        pr = Projector(log, str(Path(d) / "s"), batch_size=batch)
        pr.assign([0, 1])
        first = sorted(placed[:half], key=lambda t: (t[1], t[2]))
        for p_ in (0, 1):
            recs = [r for r in log.scan(log.topics.events, p_, 0, 10**9)]
            head = [r for r in recs if any(r.offset == o and r.partition == pa for _, pa, o in first)]
            if head:
                pr.process(head)
        pr.release([0, 1])
        Projector(log, str(Path(d) / "s"), batch_size=batch).run(until_caught_up=True, poll_timeout_s=0.01)

        # The oracle: the same records folded in memory (no store, no restart).
        book = replay(r for p_ in (0, 1) for r in log.scan(log.topics.events, p_, 0, 10**9))
        with Projection(Path(d) / "s") as proj:
            for run, doc in book.docs.items():
                if doc is None:
                    continue
                # Items the core built without validating them hold what validation gives
                # (a datetime written as text, or an int as a string, fails it).
                for kind in COLLECTIONS:
                    for item in doc.sorted_items(kind):
                        assert type(item).model_validate(item.model_dump()) == item
                state = proj.state(run)
                assert state.model_dump_json() == doc.to_state().model_dump_json()
                # The plain document is the validated state's, key for key and in order.
                data = proj.state_data(run)
                assert data == state.model_dump(mode="json")
                assert orjson.dumps(data) == state.model_dump_json().encode()
                # ... and the JSON it is parsed from, joined from the stored records, is the
                # validated state's JSON byte for byte.
                assert proj.state_json(run) == state.model_dump_json().encode()
                # The context, rendered from the state's struct (no model built), is the
                # validated state's.
                assert proj.context(run, now=NOW) == render_context(state, now=NOW)
                # The header's item counts are the state's (a lookup trusts an empty count).
                header = proj.header(run)
                assert header is not None and header.sizes == {
                    k: len(v)
                    for k in COLLECTIONS
                    if (v := state.goal.constraints if k == "constraints" else getattr(state, k))
                }
                assert list(header.sizes) == [
                    k for k in COLLECTIONS if k in header.sizes
                ]  # one form: stored bytes agree
            # Read from the log, the core gets each patch as its struct (codec.read_patch);
            # folded as the validated models it was appended as, the same runs result.
            models = fold(placed)
            assert {r: d_ and d_.to_state().model_dump_json() for r, d_ in book.docs.items()} == {
                r: d_ and d_.to_state().model_dump_json() for r, d_ in models.docs.items()
            }
            assert {
                k: structs.updated(d_, {"content_digest": None}) for k, d_ in book.decided.items()
            } == models.decided
            for run in RUNS:
                decided = [d_ for (r, _), d_ in book.decided.items() if r == run]
                assert proj.history(run) == sorted((structs.to_model(d_) for d_ in decided), key=lambda x: x.offset)
                for d_ in decided:  # the core's struct, not validated when built: as a validated model
                    assert Decision.model_validate(
                        msgspec.to_builtins(d_, builtin_types=(datetime,))
                    ) == structs.to_model(d_)
        log.close()


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=5, max_size=80), st.data())
def test_a_run_continued_from_its_state_as_data_is_the_run_folded_from_the_start(
    ops: list[tuple[str, str, int, bool, int]], data: st.DataObject
) -> None:
    """What a rebuild from a checkpoint does in ``state_data_at``: the state at revision c as
    plain data, its working form (items validated only when touched), then the accepted
    patches after c. At every n >= c the plain document is the folded state's, key for
    key and byte for byte, and validates to that state, as the doc's own ``to_state`` does."""
    patches = build(ops)
    full = RunBook()
    states: dict[int, dict[str, object]] = {}
    accepted: dict[int, Patch] = {}
    for i, p in enumerate(patches):
        applied = full.apply(p, 0, i)
        doc = full.docs.get("r0")
        if (
            p.run_id == "r0"
            and not applied.duplicate
            and applied.decision is not None
            and applied.decision.outcome == "accepted"
            and doc is not None
        ):
            accepted[doc.header.revision] = p
            states[doc.header.revision] = doc.to_state().model_dump(mode="json")
    head = max(states)
    c = data.draw(st.integers(1, head), label="checkpoint revision")
    # Untouched, the working form gives the document back as it came.
    assert RunDoc.from_state_data(states[c]).to_state_data() == states[c]
    start = RunDoc.from_state_data(states[c])
    book = RunBook(load_doc=lambda r: start if r == "r0" else None)
    for n in range(c + 1, head + 1):
        applied = book.apply(accepted[n], 0, n)
        assert applied.decision is not None and applied.decision.outcome == "accepted"
        doc = book.docs["r0"]
        assert doc is not None
        got = doc.to_state_data()
        assert got == states[n]
        assert orjson.dumps(got) == RunState.model_validate(states[n]).model_dump_json().encode()
        assert RunState.model_validate(got) == RunState.model_validate(states[n])
        assert doc.to_state().model_dump(mode="json") == states[n]  # what state_at returns


def test_the_workload_sends_every_event_type() -> None:
    """The property tests' kinds hold every event type of the contract (a new type joins them)."""
    from workloads import KINDS, MORE_KINDS, _events

    from runstate.schemas.events import EVENT_TYPE_NAMES

    # build() starts each run; erasures are drawn apart (test_erasure's interleavings).
    sent = {e["type"] for kind in KINDS + MORE_KINDS for e in _events(kind, 3, None)} | {"RunStarted", "RunErased"}
    assert sent == set(EVENT_TYPE_NAMES), set(EVENT_TYPE_NAMES) - sent
