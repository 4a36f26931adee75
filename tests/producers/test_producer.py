"""RunProducer.build: one validation of the completed patch, the same verdicts as a draft's.

``build`` completes a draft (patch id, author, time, run id) and validates the result once,
as a :class:`Patch`. These tests hold it to what validating the draft as a
:class:`PatchDraft` first and then completing it said: the same patches accepted, the same
errors (type, field and message) for the rest.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import CLIENT_EXAMPLE

from runstate.eventlog.embedded import EmbeddedLog
from runstate.producers.run_producer import RunProducer
from runstate.schemas.errors import ContractError, RunstateError
from runstate.schemas.patch import Author, Patch, PatchDraft, check_draft_shape, parse_draft, validated

AUTHOR = Author(agent_id="tester", agent_version="1")
NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def two_steps(run_id: str, data: Any) -> Patch:
    """The reference: validate the draft, then the completed patch (what build did before),
    the draft's shape checked first (what parse_draft did before it checked only failures)."""
    check_draft_shape(data)
    d = validated(PatchDraft, data)
    if d.run_id is not None and d.run_id != run_id:
        raise ContractError("run mismatch", field="run_id")
    try:
        return Patch(
            patch_id=d.patch_id or "p_fixed",
            run_id=run_id,
            expected_revision=d.expected_revision,
            events=d.events,
            author=d.author or AUTHOR,
            created_at=d.created_at or NOW,
            rebase=d.rebase,
        )
    except Exception as e:
        raise ContractError(str(e)) from e


def example(**top: Any) -> dict[str, Any]:
    d = json.loads(CLIENT_EXAMPLE)
    d.update(top)
    return d


def nested(path: list[Any], value: Any, remove: bool = False) -> dict[str, Any]:
    d = copy.deepcopy(example())
    at: Any = d
    for k in path[:-1]:
        at = at[k]
    if remove:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return d


GOOD: list[dict[str, Any]] = [
    example(),
    example(patch_id="p_given"),
    example(run_id="r1"),
    example(author={"agent_id": "someone", "agent_version": "7"}),
    example(created_at="2026-08-11T16:22:10+08:00", rebase=True),
    example(patch_id=None, author=None, created_at=None, run_id=None),
    {"expected_revision": 0, "events": [{"type": "RunStarted", "goal": {"statement": "g"}}]},
]

BAD: list[Any] = [
    [],
    "a string",
    example(expected_revision=-1),
    example(expected_revision="eighteen"),
    example(expected_revision=2**63),
    example(events=[]),
    example(events="not a list"),
    example(events=[{"type": "NoteAdded", "text": "x"}]),
    example(events=[{"no": "type"}]),
    example(surprise=1),
    example(patch_id=""),
    example(patch_id="a\x00b"),
    example(created_at="2026-08-11T16:22:10"),  # naive: not an aware datetime
    example(author={"agent_id": "x"}),
    example(author={"agent_id": "x", "agent_version": "1", "role": "admin"}),
    example(run_id="another_run"),
    nested(["events", 0, "fact", "confidence"], 0.9),
    nested(["events", 0, "fact", "statement"], None, remove=True),
    nested(["events", 1, "task_id"], 17),
    nested(["events", 0, "type"], 5),
    # an unknown type among other errors: the unknown type is what is named
    example(expected_revision=-1, events=[{"type": "FactConfirmed", "fact": {}}, {"type": "NoteAdded"}]),
    example(run_id="another_run", events=[{"type": "NoteAdded"}]),
    example(surprise=1, events=[{"type": "NoteAdded"}]),
]


@pytest.fixture
def producer(tmp_path: Path) -> RunProducer:
    return RunProducer(EmbeddedLog(tmp_path / "log.db"), AUTHOR, clock=lambda: NOW)


def outcome(f: Callable[[], Patch]) -> tuple[str, Any, str | None]:
    try:
        p = f()
    except RunstateError as e:
        return type(e).__name__, getattr(e, "field", None), None
    # A patch id the draft leaves out is drawn at random: compared apart.
    return "ok", p.model_dump(exclude={"patch_id"}), p.patch_id


@pytest.mark.parametrize("data", GOOD + BAD, ids=range(len(GOOD + BAD)))
def test_build_decides_as_the_draft_and_then_the_patch_did(producer: RunProducer, data: Any) -> None:
    new = outcome(lambda: producer.build("r1", copy.deepcopy(data)))
    ref = outcome(lambda: two_steps("r1", copy.deepcopy(data)))
    assert new[:2] == ref[:2]
    given = data.get("patch_id") if isinstance(data, dict) else None
    if new[0] == "ok" and given is not None:
        assert new[2] == ref[2] == given
    assert (new[0] == "ok") == (data in GOOD)


def test_an_error_names_the_field_and_the_file(producer: RunProducer) -> None:
    bad = nested(["events", 0, "fact", "confidence"], 0.9)
    with pytest.raises(ContractError) as e:
        producer.build("r1", bad, where="p.json")
    try:
        parse_draft(bad, where="p.json")
    except ContractError as ref:
        assert str(e.value) == str(ref) and e.value.field == ref.field
    assert "confidence" in str(e.value) and "p.json" in str(e.value)


def test_a_draft_model_is_built_as_its_dict_is(producer: RunProducer) -> None:
    draft = PatchDraft.model_validate(example(patch_id="p_given"))
    assert producer.build("r1", draft) == producer.build("r1", example(patch_id="p_given"))


def test_the_producer_completes_what_the_draft_leaves_out(producer: RunProducer) -> None:
    p = producer.build("r1", example())
    assert (p.run_id, p.author, p.created_at, p.rebase) == ("r1", AUTHOR, NOW, False)
    assert len(p.patch_id) == 32 and producer.build("r1", example()).patch_id != p.patch_id


@pytest.mark.parametrize("data", GOOD + BAD, ids=range(len(GOOD + BAD)))
def test_parse_draft_checks_the_shape_only_of_a_failure_and_decides_the_same(data: Any) -> None:
    def reference() -> Any:
        check_draft_shape(data)
        return validated(PatchDraft, data)

    def verdict(f: Callable[[], Any]) -> tuple[str, Any]:
        try:
            return "ok", f().model_dump()
        except RunstateError as e:
            return type(e).__name__, (getattr(e, "field", None), str(e))

    assert verdict(lambda: parse_draft(copy.deepcopy(data))) == verdict(reference)


EVENT_LISTS: list[Any] = [
    d["events"] for d in GOOD + BAD if isinstance(d, dict) and isinstance(d.get("events"), list)
] + [[], [{"type": "NoteAdded"}], [None], [{"type": "BudgetConsumed", "tokens": "many"}]]


@pytest.mark.parametrize("evs", EVENT_LISTS, ids=range(len(EVENT_LISTS)))
@pytest.mark.parametrize("rev", [0, 7, -1])
def test_events_decides_as_build_of_the_same_draft(producer: RunProducer, evs: Any, rev: int) -> None:
    new = outcome(lambda: producer.events("r1", rev, copy.deepcopy(evs)))
    ref = outcome(
        lambda: producer.build("r1", {"expected_revision": rev, "events": copy.deepcopy(evs), "rebase": False})
    )
    assert new[:2] == ref[:2]


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # dumping the bad model warns, as it should
def test_events_checks_a_model_built_without_validation(producer: RunProducer) -> None:
    from runstate.schemas import events as ev

    bad = ev.BudgetConsumed.model_construct(type="BudgetConsumed", tokens="many")
    with pytest.raises(ContractError):
        producer.events("r1", 0, [bad])


def test_patch_ids_are_fresh_across_reads_threads_and_a_fork() -> None:
    """Patch ids are read from the OS in blocks: every id is 32 hex digits and new, across
    block refills and threads, and a forked child never hands out the ids its parent holds
    (it would send patches under the parent's next ids: decided as retries, or refused as
    reused)."""
    import os
    import threading

    from runstate.producers import run_producer

    seen: list[str] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        got = [run_producer._new_patch_id() for _ in range(n)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=take, args=(3 * run_producer._IDS_PER_READ,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == len(set(seen)) == 12 * run_producer._IDS_PER_READ
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in seen)

    run_producer._new_patch_id()  # the parent holds ids read ahead
    assert run_producer._ids
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(r)
        os.write(w, "".join(run_producer._new_patch_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read().decode()
    os.waitpid(pid, 0)
    child = {raw[i : i + 32] for i in range(0, len(raw), 32)}
    parent = {run_producer._new_patch_id() for _ in range(5)}
    assert len(child) == 5 and not child & parent
