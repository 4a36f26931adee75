"""Bad input is a typed error or a rejected decision, never a crash, and never stored.

Each case here broke something before it had a test: a record key that is not UTF-8
stopped the partition on every restart, numbers the codec cannot carry made verify and the
snapshotter fail forever, strings and files that cannot be encoded gave tracebacks, and a
reused patch_id with other content was reported as the earlier patch's decision.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ev, patch, start, embedded_env, append_all, project_all

from runstate.cli import main
from runstate.eventlog.base import Record
from runstate.eventlog.embedded import EmbeddedLog
from runstate.projector.runtime.loop import Projector
from runstate.projector.read.queries import Projection
from runstate.projector.read.replay import verify
from runstate.projector.core.runbook import RunBook
from runstate.projector.core.outcomes import DeadLetter
from runstate.schemas.codec import encode
from runstate.schemas.errors import ContractError
from runstate.schemas.patch import parse_draft

MAX_LONG = 2**63 - 1


def _record(value: bytes, key: bytes | None, offset: int = 0) -> Record:
    return Record("runstate.events", 0, offset, key, value, 1)


def test_a_key_that_is_not_utf8_is_a_dead_letter_not_a_crash() -> None:
    book = RunBook()
    out = book.apply_record(_record(encode(patch("r", 0, start())), b"\xff\xfe"))
    assert isinstance(out, DeadLetter) and out.reason == "key_not_utf8"
    assert book.docs == {}


def test_a_partition_moves_on_past_a_key_that_is_not_utf8(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    # The embedded producer only takes str keys; another client can write any bytes.
    log._db.execute(
        "INSERT INTO records(topic, partition, offset, key, value, ts) VALUES (?,?,?,?,?,?)",
        ("runstate.events", 0, 0, b"\xff\xfe", encode(patch("r", 0, start())), 1),
    )
    log._db.execute("UPDATE heads SET next_offset=1 WHERE topic='runstate.events' AND partition=0")
    prod = log.producer()
    prod.append(log.topics.events, "r", encode(patch("r", 0, start())))
    prod.close()
    for _ in range(2):  # and again after a restart
        project_all(log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        assert [d.reason for d in proj.dead_letters()] == ["key_not_utf8"]
        assert proj.state("r").revision == 1


@pytest.mark.parametrize(
    "field,value",
    [
        ("expected_revision", 2**63),
        ("expected_revision", 2**70),
        ("tokens", 2**63),
        ("tokens", -(2**63) - 1),
    ],
)
def test_numbers_the_codec_cannot_carry_are_refused_when_validated(field: str, value: int) -> None:
    body = {"expected_revision": 1, "events": [{"type": "BudgetConsumed", "tokens": 5}]}
    if field == "expected_revision":
        body["expected_revision"] = value
    else:
        body["events"][0]["tokens"] = value  # type: ignore[index]
    with pytest.raises(ContractError) as e:
        parse_draft(body, where="p.json")
    assert e.value.field is not None and field in e.value.field


def test_budget_arithmetic_cannot_overflow_what_the_codec_carries(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    prod = log.producer()
    for p in [
        patch("r", 0, start()),
        patch("r", 1, ev("BudgetSet", tokens_remaining=MAX_LONG)),
        patch("r", 2, ev("BudgetConsumed", tokens=MAX_LONG)),
        patch("r", 3, ev("BudgetConsumed", tokens=MAX_LONG)),
    ]:
        prod.append(log.topics.events, p.run_id, encode(p))
    prod.close()
    project_all(log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        last = proj.history("r")[-1]
        assert (last.outcome, last.rule) == ("rejected", "budget.overflow")
        st = proj.state("r")
        assert st.budgets.tokens_used == MAX_LONG
        st.model_dump_json()  # the state stays serialisable
    assert verify(log, str(tmp_path / "s")).ok


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return embedded_env(tmp_path)


def _publish_file(env: dict[str, str], path: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["publish", "r", str(path)], env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def _appended(env: dict[str, str]) -> int:
    if not Path(env["RUNSTATE_LOG"]).exists():
        return 0
    log = EmbeddedLog(env["RUNSTATE_LOG"])
    try:
        return sum(log.end_offsets(log.topics.events).values())
    finally:
        log.close()


@pytest.mark.parametrize(
    "name,body,says",
    [
        (
            "surrogate",
            b'{"expected_revision": 0, "events": [{"type": "RunStarted", "goal": {"statement": "\\ud800"}}]}',
            "events.0.goal.statement",
        ),
        (
            "bigint",
            b'{"expected_revision": 123456789012345678901234567890, "events": [{"type": "RunStarted", '
            b'"goal": {"statement": "x"}}]}',
            "expected_revision",
        ),
        (
            "not_utf8",
            b'{"expected_revision": 0, "events": [{"type": "RunStarted", "goal": {"statement": "\xff\xfe"}}]}',
            "not UTF-8",
        ),
        ("deep", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_patch_files_exit_2_naming_file_and_field_and_append_nothing(
    tmp_path: Path, env: dict[str, str], name: str, body: bytes, says: str
) -> None:
    f = tmp_path / f"{name}.json"
    f.write_bytes(body)
    code, out = _publish_file(env, f)
    assert code == 2, out
    assert str(f) in out and says in out and "Traceback" not in out
    assert _appended(env) == 0


def test_a_reused_patch_id_with_other_content_is_rejected(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    first = patch("r", 1, ev("PhaseChanged", phase="a"), patch_id="same")
    again = patch("r", 1, ev("PhaseChanged", phase="b"), patch_id="same")
    append_all(log, [patch("r", 0, start()), first, first, again])
    project_all(log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        hist = proj.history("r")
        assert [(d.outcome, d.reason) for d in hist] == [
            ("accepted", None),
            ("accepted", None),
            ("rejected", "patch_id_reused"),
        ]
        assert hist[-1].offset == 3 and proj.state("r").phase == "a"
        assert proj.decision("r", "same") == hist[1]  # the id still answers with its own patch's decision
    assert verify(log, str(tmp_path / "s")).ok
    json.dumps([d.model_dump(mode="json") for d in hist])


def test_a_resend_built_again_is_a_duplicate_even_when_both_copies_reach_the_log(tmp_path: Path) -> None:
    """A client that resends a patch (same id, same content) before the first copy was
    decided, through serve or a producer that builds the record again, sends it with a new
    ``created_at``; both copies reach the log. The second is the same patch, answered by
    the first decision (a duplicate): not ``patch_id_reused``, which would record the id
    as decided twice. Other content under the id stays ``patch_id_reused``."""
    from datetime import timedelta

    log = EmbeddedLog(tmp_path / "log.db", partitions=1)
    first = patch("r", 1, ev("PhaseChanged", phase="a"), patch_id="same")
    resent = first.model_copy(update={"created_at": first.created_at + timedelta(seconds=3)})
    other = patch("r", 1, ev("PhaseChanged", phase="b"), patch_id="same")
    append_all(log, [patch("r", 0, start()), first, resent, other])
    project_all(log, tmp_path / "s")
    with Projection(tmp_path / "s") as proj:
        hist = proj.history("r")
        assert [(d.patch_id, d.outcome, d.reason) for d in hist] == [
            (hist[0].patch_id, "accepted", None),
            ("same", "accepted", None),
            ("same", "rejected", "patch_id_reused"),
        ]
        assert hist[-1].offset == 3 and proj.decision("r", "same") == hist[1]
        assert proj.dead_letters() == []  # the resend was decided (a duplicate), not set aside
    assert verify(log, str(tmp_path / "s")).ok


@pytest.mark.slow
def test_a_reused_patch_id_is_answered_as_reused_by_publish_wait_and_by_serve(tmp_path: Path) -> None:
    """The same patch id with other content: the producer's ``--wait`` and serve answer
    ``patch_id_reused`` (the decision the projector recorded for it), not the first patch's
    decision; serve appends it, so it is in the history. A resend of the same content is
    still answered with the first decision."""
    import threading

    from servekit import serving

    from runstate.client import Client

    same = {"patch_id": "same-id", "expected_revision": 1}
    with serving(
        {"RUNSTATE_LOG": str(tmp_path / "s.db"), "RUNSTATE_STATE_DIR": str(tmp_path / "s")}, tmp_path
    ) as serve:
        with Client(serve.url) as rs:
            assert rs.submit("r", {"expected_revision": 0, "events": [start()]}).outcome == "accepted"
            first = rs.submit("r", {**same, "events": [ev("PhaseChanged", phase="a")]})
            assert first.outcome == "accepted"
            assert rs.submit("r", {**same, "events": [ev("PhaseChanged", phase="a")]}) == first  # a resend
            reused = rs.submit("r", {**same, "events": [ev("PhaseChanged", phase="b")]})
            assert (reused.outcome, reused.reason) == ("rejected", "patch_id_reused"), reused
            assert [d.reason for d in rs.history("r")] == [None, None, "patch_id_reused"]
            assert rs.state("r").phase == "a"

    env = embedded_env(tmp_path)
    cli = CliRunner()
    assert (
        cli.invoke(
            main, ["publish", "r", "-"], env=env, input=json.dumps({"expected_revision": 0, "events": [start()]})
        ).exit_code
        == 0
    )
    log = EmbeddedLog(tmp_path / "log.db", create=False)
    stop = threading.Event()
    t = threading.Thread(
        target=Projector(log, str(tmp_path / "state")).run, kwargs={"stop": stop, "poll_timeout_s": 0.02}
    )
    t.start()
    try:
        for phase, code, (field, answer) in (
            ("a", 0, ("outcome", "accepted")),
            ("b", 3, ("reason", "patch_id_reused")),
        ):
            body = json.dumps({**same, "events": [ev("PhaseChanged", phase=phase)]})
            r = cli.invoke(main, ["publish", "r", "-", "--wait"], env=env, input=body)
            assert r.exit_code == code and json.loads(r.output)[field] == answer, r.output
    finally:
        stop.set()
        t.join()
        log.close()
