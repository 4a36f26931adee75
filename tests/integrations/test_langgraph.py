"""runstate as LangGraph's checkpointer: LangGraph's own conformance suite
(``langgraph-checkpoint-conformance``) against both savers on the embedded log, through a
real ``runstate serve``, and on the real Kafka broker; a real graph interrupted for approval
and resumed from a new process; the mistakes a user can make."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from servekit import ServeProcess, serving

from helpers import ROOT, embedded_env

from runstate.agent import PatchRejected
from runstate.integrations.langgraph import AsyncRunstateSaver, JsonSerializer, RunstateSaver
from runstate.schemas.errors import PatchTooLarge

EXAMPLE = ROOT / "examples" / "langgraph_approval.py"
#: The checks of langgraph-checkpoint-conformance 0.0.2: its base capabilities' and its
#: extended ones' (copy_thread, delete_for_runs, prune).
BASE_CHECKS, EXTENDED_CHECKS = 58, 23


def _validate(name: str, make: Any) -> Any:
    """LangGraph's suite on the savers ``make()`` (an async context manager) gives; its report."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[Any]:
        async with make() as saver:
            yield saver

    report = asyncio.run(validate(factory))
    report.print_report()
    return report


def _assert_every_check_passes(report: Any) -> None:
    """Every capability of the suite, base and extended, detected and passed, check by check."""
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

    results = [report.results[c.value] for c in ALL_CAPABILITIES]
    failures = [f for r in results for f in r.failures]
    assert not failures, failures
    assert all(r.detected for r in results), {c.value: r.detected for c, r in zip(ALL_CAPABILITIES, results)}
    assert report.passed_all_base() and report.passed_all()
    assert sum(r.tests_passed for r in results) == BASE_CHECKS + EXTENDED_CHECKS


def test_langgraph_conformance_async_saver_on_the_embedded_log(tmp_path: Path) -> None:
    n = iter(range(100))

    def make() -> Any:
        return AsyncRunstateSaver.from_conn_string(tmp_path / f"s{next(n)}")

    _assert_every_check_passes(_validate("AsyncRunstateSaver (embedded)", make))


def _sync_savers(where: Path) -> Any:
    """A maker of sync savers, each on a directory of its own under ``where``, as the suite's factory wants them."""
    from contextlib import asynccontextmanager

    n = iter(range(100))

    @asynccontextmanager
    async def make() -> AsyncIterator[RunstateSaver]:
        with RunstateSaver.from_conn_string(where / f"s{next(n)}") as saver:
            yield saver

    return make


def test_langgraph_conformance_sync_saver_on_the_embedded_log(tmp_path: Path) -> None:
    _assert_every_check_passes(_validate("RunstateSaver (embedded)", _sync_savers(tmp_path)))


@pytest.mark.slow
def test_langgraph_conformance_through_a_serve(tmp_path: Path) -> None:
    with serving(embedded_env(tmp_path), tmp_path) as serve:
        report = _validate("AsyncRunstateSaver (serve)", lambda: AsyncRunstateSaver.from_conn_string(serve.url))
        _assert_every_check_passes(report)


@pytest.mark.kafka
@pytest.mark.slow
def test_langgraph_conformance_on_the_kafka_broker(kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path) -> None:
    from runstate.eventlog.kafka import KafkaLog

    KafkaLog(kafka_bootstrap, topics=kafka_topics).create_topics(3)
    env = {
        "RUNSTATE_LOG": f"kafka://{kafka_bootstrap}",
        "RUNSTATE_TOPIC_PREFIX": kafka_topics.events.rsplit(".", 1)[0],
        "RUNSTATE_STATE_DIR": str(tmp_path / "state"),
    }
    serve = ServeProcess(env, tmp_path)
    try:
        serve.wait_ready(timeout_s=120)
        report = _validate("AsyncRunstateSaver (Kafka)", lambda: AsyncRunstateSaver.from_conn_string(serve.url))
        _assert_every_check_passes(report)
    finally:
        assert serve.stop() == 0, serve.log()


def _example(where: Path | str, thread: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(where), thread, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _cli(where: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "runstate.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **embedded_env(where)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_graph_interrupted_for_approval_resumes_in_a_new_process(tmp_path: Path) -> None:
    """The example: a tool-calling agent stops before a refund for a person's approval; a
    second process resumes the thread from runstate and finishes. Then, in this process:
    LangGraph's history of the thread, a fork from an earlier checkpoint with
    ``update_state``, and the same thread as runstate's audit tools show it."""
    sys.path.insert(0, str(EXAMPLE.parent))
    import langgraph_approval  # type: ignore[import-not-found]
    from langchain_core.messages import AIMessage

    where = tmp_path / "rs"
    first = _example(where, "refund-1")
    assert first["waiting_for"] == [{"approve": "refund 30 on order A-1042?"}]
    second = _example(where, "refund-1", "--approve")
    assert second == {"last": "Done: refunded", "waiting_for": []}

    config: Any = {"configurable": {"thread_id": "refund-1"}}
    with RunstateSaver.from_conn_string(where) as saver:
        graph = langgraph_approval.build(saver)
        snap = graph.get_state(config)
        assert snap.values["messages"][-1].content == "Done: refunded" and not snap.next
        history = list(graph.get_state_history(config))
        assert len(history) >= 5 and history[0].config == snap.config
        # Fork: back to the checkpoint where the tools were next, with the model's call changed.
        before_tools = next(h for h in history if h.next == ("tools",))
        call = {"name": "refund", "args": {"order": "A-1042", "amount": 5}, "id": "call_refund_2"}
        forked = graph.update_state(before_tools.config, {"messages": [AIMessage(content="", tool_calls=[call])]})
        assert forked["configurable"]["checkpoint_id"] != snap.config["configurable"]["checkpoint_id"]
        fork_state = graph.get_state(forked)
        assert fork_state.values["messages"][-1].tool_calls[0]["args"]["amount"] == 5
        assert fork_state.next == ("tools",)
        assert graph.get_state(config).config == forked  # the fork is the thread's latest checkpoint

    lines = _cli(where, "history", "refund-1").splitlines()
    assert lines[0].split("\t")[2] == "accepted" and "RunStarted,GraphCheckpointSaved" in lines[0]
    assert all("\taccepted" in line for line in lines), lines
    assert sum("GraphCheckpointSaved" in line for line in lines) == len(history) + 1
    key = f"0:/{forked['configurable']['checkpoint_id']}"
    explained = _cli(where, "explain", "refund-1", f"graph_checkpoints.{key}.parent_id")
    assert before_tools.config["configurable"]["checkpoint_id"] in explained
    _cli(where, "verify")  # exit 0: the projection equals a replay of the log


def test_mistakes_are_typed_errors_and_a_deleted_thread_stays_deleted(tmp_path: Path) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        cfg = generate_config("t1")
        stored = saver.put(cfg, generate_checkpoint(), generate_metadata(), {})
        saver.put_writes(stored, [("ch", "v")], "task-1")

        big = generate_checkpoint(channel_values={"blob": "x" * 2_000_000})
        with pytest.raises(PatchTooLarge, match="RUNSTATE_MAX_PATCH_BYTES"):
            saver.put(cfg, big, generate_metadata(), {})
        with pytest.raises(ValueError, match="thread_id"):
            saver.get_tuple({"configurable": {}})
        with pytest.raises(ValueError, match="one thread at a time"):
            list(saver.list(None))

        saver.delete_thread("t1")
        assert saver.get_tuple(generate_config("t1")) is None
        # A late write (LangGraph issue 7206) must not bring the thread back.
        with pytest.raises(PatchRejected, match="run_terminal"):
            saver.put_writes(stored, [("ch", "late")], "task-2")
        with pytest.raises(PatchRejected, match="run_terminal"):  # the next checkpoint of the deleted one
            saver.put(stored, generate_checkpoint(), generate_metadata(), {})
        assert saver.get_tuple(generate_config("t1")) is None
        saver.delete_thread("never-existed")  # no error, as LangGraph's savers


def test_with_a_master_key_the_suite_passes_and_delete_thread_erases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from runstate.eventlog.keystore import MasterKey
    from runstate.schemas.errors import RunErased

    monkeypatch.setenv("RUNSTATE_MASTER_KEY", MasterKey.generate())
    _assert_every_check_passes(_validate("RunstateSaver (embedded, sealed)", _sync_savers(tmp_path)))

    marker = "secret-marker-4411-0123456789"
    # LangGraph's serializer writes the value as it is; runstate keeps its bytes in base64.
    forms = [marker.encode()] + [base64.b64encode(b"..."[:k] + marker.encode())[4:20] for k in range(3)]

    def holding() -> list[Path]:
        return [p for p in (tmp_path / "erase").rglob("*") if p.is_file() and any(f in p.read_bytes() for f in forms)]

    with RunstateSaver.from_conn_string(tmp_path / "erase") as saver:
        cfg = generate_config("t1")
        stored = saver.put(cfg, generate_checkpoint(channel_values={"msg": marker}), generate_metadata(), {})
        saver.put_writes(stored, [("ch", marker)], "task-1")
        assert holding(), "the thread's state should hold the marker before it is deleted"
        saver.delete_thread("t1")
        assert saver.get_tuple(generate_config("t1")) is None
        with pytest.raises(RunErased):
            saver.put_writes(stored, [("ch", "late")], "task-2")
        saver.delete_thread("t1")  # again: the first erasure stands
        saver.delete_thread("never-existed")
    assert holding() == []


def test_the_docs_example_runs_as_written(tmp_path: Path) -> None:
    from helpers import doc_blocks

    [block] = doc_blocks("python", "docs/langgraph.md")
    for turn in (1, 2):  # twice, as a reader trying it does: the same thread goes on
        script = block + (
            "\nassert snapshot.values == {'steps': ['looked at the failing test']}, snapshot\n"
            f"assert len(history) == 3 * {turn}, history\n"
        )  # input, the node's step, and the start
        out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    assert "RunStarted,GraphCheckpointSaved" in _cli(tmp_path / ".runstate", "history", "thread-1")


def _concat(state: list[str], writes: Any) -> list[str]:
    return state + [x for w in writes for x in w]


class _DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=1000)]


def _delta_graph(saver: Any) -> Any:
    """Two parallel nodes appending to a DeltaChannel; ``a`` finishes after ``b``."""
    from langgraph.graph import START, StateGraph

    def a(_s: _DeltaState) -> dict[str, list[str]]:
        time.sleep(0.3)
        return {"items": ["a"]}

    def b(_s: _DeltaState) -> dict[str, list[str]]:
        return {"items": ["b"]}

    g = StateGraph(_DeltaState)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    return g.compile(checkpointer=saver)


def test_pending_writes_come_back_in_langgraphs_order_and_a_delta_channel_rebuilds_what_ran(tmp_path: Path) -> None:
    """get_tuple returns a step's writes sorted by (task_path, task_id, idx), LangGraph's
    writes_sort_key, as InMemorySaver does: a DeltaChannel rebuilt from them is the value
    the run produced, whichever parallel task finished first."""
    from langgraph.checkpoint.memory import InMemorySaver

    with serving(embedded_env(tmp_path), tmp_path) as serve:
        with (
            RunstateSaver.from_conn_string(tmp_path / "rs") as embedded,
            RunstateSaver.from_conn_string(serve.url) as served,
        ):
            for name, cp in (("memory", InMemorySaver()), ("embedded", embedded), ("serve", served)):
                graph = _delta_graph(cp)
                cfg = {"configurable": {"thread_id": f"delta {name}"}}
                live = graph.invoke({"items": ["in"]}, cfg)["items"]
                assert live == ["in", "a", "b"], (name, live)
                assert graph.get_state(cfg).values["items"] == live, name
                # The next step continues from the value the run produced.
                assert graph.invoke({"items": ["next"]}, cfg)["items"] == [*live, "next", "a", "b"], name


class _SeqDeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def _sequential_delta_graph(saver: Any) -> Any:
    """One node appending to a DeltaChannel that LangGraph snapshots every third update."""
    from langgraph.graph import START, StateGraph

    g = StateGraph(_SeqDeltaState)
    g.add_node("step", lambda s: {"items": [f"step {len(s['items'])}"]})
    g.add_edge(START, "step")
    return g.compile(checkpointer=saver)


def test_prune_keeps_what_a_delta_channel_is_rebuilt_from_and_a_copy_is_the_thread(tmp_path: Path) -> None:
    """prune(keep_latest) on a thread with a DeltaChannel between snapshots keeps the newest
    checkpoint and its ancestors back to the snapshot, with their writes (a naive
    keep-latest rebuilds the channel empty, LangGraph's own warning): the state and the
    next step are what they were. copy_thread gives a thread with the same state and history."""
    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        graph = _sequential_delta_graph(saver)
        cfg = {"configurable": {"thread_id": "delta thread"}}
        for turn in range(4):
            graph.invoke({"items": [f"in {turn}"]}, cfg)
        before = graph.get_state(cfg).values["items"]
        assert len(before) == 8, before
        history = list(saver.list(cfg))
        copy_cfg = {"configurable": {"thread_id": "delta copy"}}
        saver.copy_thread("delta thread", "delta copy")
        assert [t.checkpoint["id"] for t in saver.list(copy_cfg)] == [t.checkpoint["id"] for t in history]
        assert graph.get_state(copy_cfg).values["items"] == before

        saver.prune(["delta thread"], strategy="keep_latest")
        assert graph.get_state(cfg).values["items"] == before
        kept = list(saver.list(cfg))
        assert 1 < len(kept) < len(history), (len(kept), len(history))  # back to the snapshot, not further
        assert "items" in kept[-1].checkpoint["channel_values"]  # the oldest kept holds the snapshot
        assert graph.invoke({"items": ["in 4"]}, cfg)["items"] == [*before, "in 4", "step 9"]

        # Without a DeltaChannel gap (the newest holds every channel) only the newest stays.
        saver.prune(["delta copy"], strategy="delete")
        assert list(saver.list(copy_cfg)) == []
        with pytest.raises(ValueError, match="keep_latest, delete"):
            saver.prune(["delta thread"], strategy="keep_oldest")
    assert "GraphCheckpointsRemoved" in _cli(tmp_path / "rs", "history", "delta thread")


def test_a_channel_value_is_stored_once_per_version(tmp_path: Path) -> None:
    """As LangGraph's own savers do: a put writes the values of the channels in
    ``new_versions`` only (a primitive stays in the checkpoint); a checkpoint whose channel
    kept its version reads the value saved with that version; copy_thread copies the
    values, prune and delete_thread leave none no checkpoint refers to. Embedded and
    through serve."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    big = [f"line {i}: " + "x" * 990 for i in range(200)]  # about 200 kB, not a primitive

    def puts(saver: RunstateSaver, log: Path) -> None:
        cfg: Any = generate_config("t")
        cfg = saver.put(
            cfg,
            generate_checkpoint(channel_values={"big": big, "n": 1}, channel_versions={"big": "1", "n": "1"}),
            generate_metadata(),
            {"big": "1", "n": "1"},
        )

        def size() -> int:  # the log's file and its write-ahead log
            return sum(f.stat().st_size for f in log.parent.glob(log.name + "*"))

        before = size()
        for i in range(2, 7):
            cfg = saver.put(
                cfg,
                generate_checkpoint(channel_values={"big": big, "n": i}, channel_versions={"big": "1", "n": str(i)}),
                generate_metadata(),
                {"n": str(i)},
            )
        assert size() - before < 200_000  # five checkpoints, not one with the 200 kB value again
        listed = list(saver.list(generate_config("t")))
        assert len(listed) == 6 and all(
            t.checkpoint["channel_values"] == {"big": big, "n": 6 - i} for i, t in enumerate(listed)
        )
        saver.copy_thread("t", "t copy")
        assert [t.checkpoint for t in saver.list(generate_config("t copy"))] == [t.checkpoint for t in listed]
        saver.prune(["t"], strategy="keep_latest")
        [kept] = saver.list(generate_config("t"))
        assert kept.checkpoint["channel_values"] == {"big": big, "n": 6}
        saver.delete_thread("t copy")

    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        puts(saver, tmp_path / "rs" / "log.db")
    from runstate.projector.read.queries import Projection

    with Projection(tmp_path / "rs" / "state") as proj:
        assert [(v.channel, v.version) for v in proj.state("t").graph_values] == [("big", "1")]  # n: in its checkpoints
        assert proj.state("t copy").graph_values == []
    with serving(embedded_env(tmp_path), tmp_path) as serve:
        with RunstateSaver.from_conn_string(serve.url) as served:
            puts(served, tmp_path / "log.db")


def test_a_thread_saved_whole_with_numbered_versions_goes_on(tmp_path: Path) -> None:
    """A thread saved by a runstate from before values were kept once per version (each
    checkpoint whole, versions whole numbers: LangGraph's default) reads back as it was, and
    a graph goes on from it with today's saver (text versions; LangGraph compares a thread's
    versions with each other): the same state and history as InMemorySaver's."""
    from langgraph.checkpoint.base import BaseCheckpointSaver, get_checkpoint_metadata
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph

    from runstate.integrations.langgraph import _where
    from runstate.schemas import events

    class OldSaver(RunstateSaver):
        get_next_version = BaseCheckpointSaver.get_next_version  # type: ignore[assignment]

        def _checkpoint(self, doc: dict[str, Any]) -> Any:
            return self.serde.loads_typed((doc["checkpoint"]["type"], base64.b64decode(doc["checkpoint"]["data"])))

        def _saved(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            thread_id, ns, parent_id = _where(config)
            spec = events.GraphCheckpointSpec(
                ns=ns,
                id=checkpoint["id"],
                parent_id=parent_id,
                checkpoint=_typed_blob(self.serde.dumps_typed(checkpoint)),
                metadata=_typed_blob(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
            )
            return (
                thread_id,
                events.GraphCheckpointSaved(checkpoint=spec),
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}},
            )

    class Notes(TypedDict):
        notes: Annotated[list[str], lambda a, b: a + b]
        turns: int

    def graph(saver: Any) -> Any:
        g = StateGraph(Notes)
        g.add_node("note", lambda s: {"notes": [f"turn {s['turns']}"], "turns": s["turns"] + 1})
        g.add_edge(START, "note")
        return g.compile(checkpointer=saver)

    cfg = {"configurable": {"thread_id": "old thread"}}
    memory = graph(InMemorySaver())
    for turn in range(3):
        memory.invoke({"notes": [f"in {turn}"], "turns": turn}, cfg)
    with OldSaver.from_conn_string(tmp_path / "rs") as old:
        for turn in range(2):
            graph(old).invoke({"notes": [f"in {turn}"], "turns": turn}, cfg)
        assert isinstance(old.get_tuple(cfg).checkpoint["channel_versions"]["notes"], int)  # type: ignore[union-attr]
    with RunstateSaver.from_conn_string(tmp_path / "rs") as new:
        g = graph(new)
        g.invoke({"notes": ["in 2"], "turns": 2}, cfg)
        assert isinstance(new.get_tuple(cfg).checkpoint["channel_versions"]["notes"], str)  # type: ignore[union-attr]
        assert g.get_state(cfg).values == memory.get_state(cfg).values
        assert [s.values for s in g.get_state_history(cfg)] == [s.values for s in memory.get_state_history(cfg)]


def _typed_blob(typed: tuple[str, bytes]) -> Any:
    from runstate.schemas import events

    return events.Blob(type=typed[0], data=base64.b64encode(typed[1]).decode("ascii"))


def test_two_savers_on_one_directory_both_write_at_full_speed(tmp_path: Path) -> None:
    """The second saver (as a second process would) appends and reads the decisions of the
    first one's projector: a put is answered at once, not after a 30 s wait."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    with (
        RunstateSaver.from_conn_string(tmp_path / "rs") as first,
        RunstateSaver.from_conn_string(tmp_path / "rs") as second,
    ):
        started = time.monotonic()
        for saver, thread in ((second, "t-second"), (first, "t-first"), (second, "t-second-2")):
            stored = saver.put(generate_config(thread), generate_checkpoint(), generate_metadata(), {})
            saver.put_writes(stored, [("ch", "v")], "task-1")
            assert saver.get_tuple(generate_config(thread)) is not None
        assert time.monotonic() - started < 5


def test_the_patch_limit_is_the_setting_on_every_path_and_too_large_is_patch_too_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded saver honours RUNSTATE_MAX_PATCH_BYTES (it named the setting and ignored
    it), and through serve a checkpoint over the limit is PatchTooLarge, as embedded."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    big = generate_checkpoint(channel_values={"blob": "x" * 2_000_000})
    monkeypatch.setenv("RUNSTATE_MAX_PATCH_BYTES", str(4 * 1024 * 1024))
    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        saver.put(generate_config("big"), big, generate_metadata(), {})
        assert saver.get_tuple(generate_config("big")) is not None
    monkeypatch.delenv("RUNSTATE_MAX_PATCH_BYTES")
    with serving(embedded_env(tmp_path), tmp_path) as serve:
        with (
            RunstateSaver.from_conn_string(serve.url) as served,
            pytest.raises(PatchTooLarge, match="RUNSTATE_MAX_PATCH_BYTES"),
        ):
            served.put(generate_config("big"), big, generate_metadata(), {})


class _ChatState(TypedDict):
    said: Annotated[list[str], lambda a, b: a + b]


def _chat_graph(saver: Any) -> Any:
    """One node answering the last thing said."""
    from langgraph.graph import START, StateGraph

    g = StateGraph(_ChatState)
    g.add_node("answer", lambda s: {"said": [f"re: {s['said'][-1]}"]})
    g.add_edge(START, "answer")
    return g.compile(checkpointer=saver)


def _clear_the_chat_and_keep_the_id(saver: Any, again: Any) -> None:
    """``delete_thread`` then a new conversation on the same id ("clear the chat, keep the
    id"): the thread starts over, a late write of the deleted conversation is still refused,
    a saver that never saw the thread (``again``, another process's) finds the new
    conversation, and so on, a third time; a thread whose id ends as a later generation's
    run id does is another thread."""
    from runstate.schemas.errors import RunErased

    graph, cfg = _chat_graph(saver), {"configurable": {"thread_id": "chat 7"}}
    assert graph.invoke({"said": ["hello"]}, cfg)["said"] == ["hello", "re: hello"]
    late = saver.get_tuple(cfg).config
    saver.delete_thread("chat 7")
    assert saver.get_tuple(cfg) is None
    assert graph.invoke({"said": ["again"]}, cfg)["said"] == ["again", "re: again"]
    assert graph.get_state(cfg).values["said"] == ["again", "re: again"]
    assert len(list(saver.list(cfg))) == 3  # input, answer, and the start: this conversation's only
    with pytest.raises((PatchRejected, RunErased)):  # the deleted conversation's late write
        saver.put_writes(late, [("said", ["late"])], "task-late")
    assert _chat_graph(again).get_state(cfg).values["said"] == ["again", "re: again"]
    other = {"configurable": {"thread_id": "chat 7~2"}}
    assert graph.invoke({"said": ["other"]}, other)["said"] == ["other", "re: other"]
    again.delete_thread("chat 7")  # the other process deletes the second conversation
    assert graph.invoke({"said": ["third"]}, cfg)["said"] == ["third", "re: third"]
    assert _chat_graph(again).get_state(cfg).values["said"] == ["third", "re: third"]
    assert graph.get_state(other).values["said"] == ["other", "re: other"]


def test_a_deleted_thread_id_starts_a_new_conversation(tmp_path: Path) -> None:
    with (
        RunstateSaver.from_conn_string(tmp_path / "rs") as saver,
        RunstateSaver.from_conn_string(tmp_path / "rs") as again,
    ):
        _clear_the_chat_and_keep_the_id(saver, again)
    assert "GraphThreadDeleted" in _cli(tmp_path / "rs", "history", "chat 7")
    assert "RunStarted" in _cli(tmp_path / "rs", "history", "chat 7~3")


def test_a_deleted_thread_id_starts_a_new_conversation_with_a_master_key_and_through_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Erased for good (the master key ties an erasure to its run id): the new conversation
    is another run. Embedded, and through serve with the async saver."""
    from runstate.eventlog.keystore import MasterKey

    key = MasterKey.generate()
    monkeypatch.setenv("RUNSTATE_MASTER_KEY", key)
    with (
        RunstateSaver.from_conn_string(tmp_path / "rs") as saver,
        RunstateSaver.from_conn_string(tmp_path / "rs") as again,
    ):
        _clear_the_chat_and_keep_the_id(saver, again)
    assert "RunErased" in _cli(tmp_path / "rs", "history", "chat 7")
    with serving(embedded_env(tmp_path), tmp_path) as serve:

        async def through_serve() -> None:
            async with (
                AsyncRunstateSaver.from_conn_string(serve.url) as saver,
                AsyncRunstateSaver.from_conn_string(serve.url) as again,
            ):
                await asyncio.to_thread(_clear_the_chat_and_keep_the_id, saver, again)

        asyncio.run(through_serve())
    assert "RunErased" in _cli(tmp_path, "history", "chat 7~2")


def test_a_late_subgraph_checkpoint_of_a_deleted_conversation_is_refused(tmp_path: Path) -> None:
    """A subgraph's first checkpoint has no parent, as a new conversation's has; it names
    its root graph's checkpoint instead (metadata ``parents``). One of a deleted
    conversation arriving after the next conversation started is refused, as its late
    writes are; a subgraph of the new conversation is saved there."""
    from langgraph.graph import START, StateGraph

    from runstate.schemas.errors import RunErased

    def graph(saver: Any) -> Any:
        sub = StateGraph(_ChatState)
        sub.add_node("think", lambda s: {"said": [f"thought about {s['said'][-1]}"]})
        sub.add_edge(START, "think")
        g = StateGraph(_ChatState)
        g.add_node("child", sub.compile())
        g.add_edge(START, "child")
        return g.compile(checkpointer=saver)

    cfg = {"configurable": {"thread_id": "nested"}}
    with (
        RunstateSaver.from_conn_string(tmp_path / "rs") as saver,
        RunstateSaver.from_conn_string(tmp_path / "rs") as other,
    ):
        graph(saver).invoke({"said": ["one"]}, cfg)
        old = next(t for t in saver.list(cfg) if t.config["configurable"]["checkpoint_ns"] and t.parent_config is None)
        saver.delete_thread("nested")
        said = graph(other).invoke({"said": ["two"]}, cfg)["said"]
        assert said[0] == "two" and said[-1] == "thought about two" and "one" not in said
        assert any(t.config["configurable"]["checkpoint_ns"] for t in other.list(cfg))  # the new subgraph's
        late_cfg = {
            "configurable": {"thread_id": "nested", "checkpoint_ns": old.config["configurable"]["checkpoint_ns"]}
        }
        with pytest.raises((PatchRejected, RunErased)):  # from the saver that ran the old conversation
            saver.put(late_cfg, {**old.checkpoint, "id": f"{old.checkpoint['id']}-late"}, old.metadata, {})
        assert graph(other).get_state(cfg).values["said"] == said
        assert not [t for t in other.list(cfg) if t.checkpoint["id"].endswith("-late")]


def test_a_thread_id_too_long_for_its_next_generation_says_so(tmp_path: Path) -> None:
    from runstate.integrations.langgraph import generation_run_id, thread_of

    long = "t" * 199
    assert generation_run_id(long, 1) == long and thread_of("chat~2") == ("chat", 2)
    assert generation_run_id("chat~2", 1) == "chat~2~1" and thread_of("chat~2~1") == ("chat~2", 1)
    assert generation_run_id("a~02", 1) == "a~02" and thread_of("a~02") == ("a~02", 1)
    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        graph, cfg = _chat_graph(saver), {"configurable": {"thread_id": long}}
        graph.invoke({"said": ["hello"]}, cfg)
        saver.delete_thread(long)
        with pytest.raises(ValueError, match="too long for generation 2"):
            graph.invoke({"said": ["again"]}, cfg)


def test_the_json_serializer_writes_what_langgraph_js_reads_and_names_what_it_cannot() -> None:
    from datetime import datetime

    from langchain_core.messages import AIMessage
    from langgraph.types import Interrupt

    serde = JsonSerializer()
    kind, data = serde.dumps_typed({"messages": [AIMessage("hi", id="m1")], "n": 1, "none": None})
    assert kind == "json"
    doc = json.loads(data)
    # LangGraph.js imports messages from langchain_core.messages (Python's own id is a legacy one).
    assert doc["messages"][0]["id"] == ["langchain_core", "messages", "AIMessage"]
    back = serde.loads_typed((kind, data))
    assert isinstance(back["messages"][0], AIMessage) and back["messages"][0].content == "hi" and back["n"] == 1
    assert serde.loads_typed(serde.dumps_typed([Interrupt(value={"q": 1}, id="i1")])) == [
        Interrupt(value={"q": 1}, id="i1")
    ]
    assert serde.dumps_typed(b"raw") == ("bytes", b"raw")
    with pytest.raises(TypeError, match="datetime.datetime"):
        serde.dumps_typed({"at": datetime(2026, 1, 1)})


def test_first_writes_of_different_threads_do_not_wait_for_each_other(tmp_path: Path) -> None:
    """A thread's first write holds back the other writes of that thread (so that they do
    not race to start its run), not every other thread's: two threads' first puts, at
    once, are both under way together (one waits inside the backend for the other to
    arrive). With one lock for the whole saver the second waited for the first to end."""
    import threading

    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    with RunstateSaver.from_conn_string(tmp_path / "rs") as saver:
        real = saver.backend.submit
        beta_arrived = threading.Event()
        waited: list[bool] = []

        def submit(run_id: str, draft: Any, timeout_s: float) -> Any:
            if "beta" in run_id:
                beta_arrived.set()
            elif not waited:
                waited.append(beta_arrived.wait(5))
            return real(run_id, draft, timeout_s)

        saver.backend.submit = submit  # type: ignore[method-assign]
        puts = [
            threading.Thread(
                target=saver.put, args=(generate_config(f"t-{name}"), generate_checkpoint(), generate_metadata(), {})
            )
            for name in ("alpha", "beta")
        ]
        puts[0].start()
        time.sleep(0.2)  # alpha's first write is under way
        puts[1].start()
        for t in puts:
            t.join(30)
        assert waited == [True]


def test_first_writes_of_different_threads_do_not_wait_for_each_other_async(tmp_path: Path) -> None:
    """As above, for the asyncio saver."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    async def main() -> list[bool]:
        async with AsyncRunstateSaver.from_conn_string(tmp_path / "rs") as saver:
            real = saver.backend.submit
            beta_arrived = asyncio.Event()
            waited: list[bool] = []

            async def submit(run_id: str, draft: Any, timeout_s: float) -> Any:
                if "beta" in run_id:
                    beta_arrived.set()
                elif not waited:
                    try:
                        await asyncio.wait_for(beta_arrived.wait(), 5)
                        waited.append(True)
                    except TimeoutError:
                        waited.append(False)
                return await real(run_id, draft, timeout_s)

            saver.backend.submit = submit  # type: ignore[method-assign]
            alpha = asyncio.create_task(
                saver.aput(generate_config("t-alpha"), generate_checkpoint(), generate_metadata(), {})
            )
            await asyncio.sleep(0.2)
            await saver.aput(generate_config("t-beta"), generate_checkpoint(), generate_metadata(), {})
            await alpha
            return waited

    assert asyncio.run(main()) == [True]


@pytest.mark.parametrize("missing", ["langgraph", "langchain_core"])
def test_without_the_langgraph_extra_the_import_says_what_to_install(missing: str) -> None:
    """runstate's own install does not bring LangGraph: the saver's import names the extra."""
    code = f"import sys; sys.modules[{missing!r}] = None\nimport runstate.integrations.langgraph"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ") and "pip install 'runstate[langgraph]'" in last, last
