"""runstate as LangGraph's checkpointer: :class:`RunstateSaver` and :class:`AsyncRunstateSaver`.

A LangGraph thread is a run (its ``thread_id`` is the run id). Each checkpoint LangGraph
saves is a ``GraphCheckpointSaved`` event on the run's log, each batch of pending writes a
``GraphWritesSaved``, and deleting the thread a ``GraphThreadDeleted``: decided by the
projector like every other patch, kept in the run's state (``graph_checkpoints``), in its
checkpoints and in its audit trail (``runstate history``, ``explain``, ``verify``). Values
are what LangGraph's serializer writes, kept as they are.

``conn`` is a directory (the embedded log and its projections, the projector running in
this process) or the URL of a ``runstate serve`` (``token`` if it needs one)::

    with RunstateSaver.from_conn_string(".runstate") as saver:
        graph = builder.compile(checkpointer=saver)

Semantics LangGraph relies on: a read right after a write sees it (each write returns once
the projector decided it; writes may come before their checkpoint, as LangGraph
sends them concurrently); a write of a regular channel saved again under the same
``(task_id, idx)`` is kept as it was, a special channel's (error, interrupt, ...) replaces
it; after :meth:`~RunstateSaver.delete_thread` the thread's run is erased where content is sealed
(``RUNSTATE_MASTER_KEY``), else cancelled, so that a late write to it is refused
(:class:`~runstate.agent.PatchRejected` ``run_terminal``, or
:class:`~runstate.schemas.errors.RunErased`) rather than bringing the thread back; a new
conversation on the same id (a checkpoint without a parent) starts the thread's next
*generation*, a run of its own (:func:`generation_run_id`). A checkpoint larger than the patch limit is refused with
:class:`~runstate.schemas.errors.PatchTooLarge`, which names ``RUNSTATE_MAX_PATCH_BYTES``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import random
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.types import Interrupt
    from langchain_core.load.serializable import Serializable
except ModuleNotFoundError as e:  # runstate's own install does not bring LangGraph
    raise ModuleNotFoundError(
        f"runstate's LangGraph saver needs LangGraph ({e}): pip install 'runstate[langgraph]'", name=e.name
    ) from e

import runstate
from runstate.agent import AsyncBackend, Backend, PatchRejected, _draft, async_backend, backend
from runstate.schemas import events
from runstate.schemas.errors import RunErased, RunNotFound
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import TERMINAL_STATUSES

T = TypeVar("T")
#: A saver's work written once for both savers: yields (call name, arguments), is sent each
#: call's answer, returns the result (see ``_Graph._has_ended`` and below).
Plan = Generator[tuple[str, tuple[Any, ...]], Any, T]

#: The reason an erasure by ``delete_thread`` records.
DELETE_REASON = "LangGraph delete_thread"

__all__ = ["AsyncRunstateSaver", "JsonSerializer", "RunstateSaver", "generation_run_id", "thread_of"]

#: The author of the saver's patches unless told otherwise (a serve with tokens uses the token's).
DEFAULT_AUTHOR = Author(agent_id="langgraph", agent_version=runstate.__version__)
#: Rejections a write resolves by itself, once each: the run does not exist yet (start it),
#: or a control event moved the run on since the revision the write named (name the current one).
#: A write names revision 0 and asks for a rebase: the graph events commute with any patch.
_START, _SUPERSEDED = "unknown_run", "superseded"
#: ``copy_thread`` puts checkpoints in one patch up to this many bytes of their values (one
#: bigger than that goes alone: it was saved once, so it fits a patch).
COPY_BYTES = 256 * 1024
#: The longest run id (``schemas.events.Id``).
MAX_RUN_ID = 200
#: How many checkpoints a saver remembers the generation of (the latest ones it wrote or read).
REMEMBERED_CHECKPOINTS = 10_000
#: ``prune``'s strategies, as LangGraph names them.
PRUNE_STRATEGIES = ("keep_latest", "delete")


#: A later generation's run id: ``<thread id>~<n>``, n written without leading zeros.
_GENERATION = re.compile(r"(.*)~([1-9][0-9]*)", re.DOTALL)


def generation_run_id(thread_id: str, n: int) -> str:
    """The run that holds generation ``n`` (1, 2, ...) of a thread: the thread id itself for
    the first, ``<thread id>~<n>`` for the next ones. A thread id that already ends as a
    later generation's does (``chat~2``) takes ``~1`` for its first, so that no two
    (thread, generation) share a run: :func:`thread_of` reads any run id back."""
    if n == 1 and not _GENERATION.fullmatch(thread_id):
        return thread_id
    run_id = f"{thread_id}~{n}"
    if len(run_id) > MAX_RUN_ID:
        raise ValueError(
            f"thread id {thread_id[:40]!r}... ({len(thread_id)} characters) is too long for generation {n} "
            f"(a conversation after delete_thread): its run id {thread_id[:8]!r}...~{n} would be over "
            f"{MAX_RUN_ID} characters"
        )
    return run_id


def thread_of(run_id: str) -> tuple[str, int]:
    """(thread id, generation) of a run the saver wrote: :func:`generation_run_id`'s inverse."""
    m = _GENERATION.fullmatch(run_id)
    return (m[1], int(m[2])) if m else (run_id, 1)


def _ended(e: Exception) -> bool:
    """Whether a write was refused because its run has ended (so a newer generation may take it)."""
    return isinstance(e, RunErased) or (
        isinstance(e, PatchRejected) and e.decision.reason in ("run_terminal", "run_erased")
    )


def _named(spec: events.GraphCheckpointSpec, metadata: CheckpointMetadata) -> tuple[str, str] | None:
    """The checkpoint a put names, whose generation it belongs to: its parent; for a
    subgraph's first checkpoint (no parent), its root graph's checkpoint (LangGraph's
    ``parents`` metadata); None for a conversation's first checkpoint."""
    if spec.parent_id is not None:
        return spec.ns, spec.parent_id
    root = (metadata.get("parents") or {}).get("") if spec.ns else None
    return ("", str(root)) if root else None


def _blob(typed: tuple[str, bytes]) -> events.Blob:
    return events.Blob(type=typed[0], data=base64.b64encode(typed[1]).decode("ascii"))


def _unblob(b: dict[str, str]) -> tuple[str, bytes]:
    return b["type"], base64.b64decode(b["data"])


def _as_text(version: Any) -> Any:
    """A whole-number version as the text :meth:`_Graph.get_next_version` makes (ordered alike)."""
    return f"{version:032}.{0:016}" if isinstance(version, int) and not isinstance(version, bool) else version


def _primitive(v: Any) -> bool:
    """A value LangGraph's own savers keep in the checkpoint itself (not once per version)."""
    return v is None or isinstance(v, (str, int, float, bool))


def _write_order(w: dict[str, Any]) -> tuple[str, str, int]:
    """LangGraph's ``writes_sort_key``: (task_path, task_id, idx)."""
    return (w.get("task_path") or "", w["task_id"], int(w["idx"]))


def _where(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread id, namespace, checkpoint id or None) of a config. Raises ValueError without a thread id."""
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if not thread_id:
        raise ValueError("runstate's checkpointer needs configurable.thread_id (a thread is a run)")
    return str(thread_id), str(conf.get("checkpoint_ns") or ""), get_checkpoint_id(config)


class _Graph:
    """What the sync and async savers share: the events they write, the tuples they read back."""

    serde: SerializerProtocol
    timeout_s: float
    #: thread id -> the generation this saver last found current (1 where not looked up)
    _generations: dict[str, int]
    #: (thread id, namespace, checkpoint id) -> the generation it was written to or read
    #: from, for the checkpoints this saver handled last: a loop's later writes name them
    _generation_of: OrderedDict[tuple[str, str, str], int]

    def _run(self, thread_id: str) -> str:
        return generation_run_id(thread_id, self._generations.get(thread_id, 1))

    def _remember(self, thread_id: str, ns: str, checkpoint_id: str, run_id: str) -> None:
        self._generation_of[(thread_id, ns, checkpoint_id)] = thread_of(run_id)[1]
        self._generation_of.move_to_end((thread_id, ns, checkpoint_id))
        if len(self._generation_of) > REMEMBERED_CHECKPOINTS:
            self._generation_of.popitem(last=False)

    def _run_of(self, thread_id: str, names: tuple[str, str] | None) -> str | None:
        """The run of the generation the checkpoint ``names`` (namespace, id) was handled
        in by this saver, or None where it was not."""
        n = self._generation_of.get((thread_id, *names)) if names else None
        return None if n is None else generation_run_id(thread_id, n)

    def _saved(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[str, events.GraphCheckpointSaved, RunnableConfig]:
        """The event that saves ``checkpoint`` as LangGraph's own savers store one: primitive
        values in the checkpoint, the others once per version, written only for the
        channels in ``new_versions`` (a channel that kept its version is read from the value
        saved with it; a value given for one that did not change is not written again)."""
        thread_id, ns, parent_id = _where(config)
        inline = {k: v for k, v in checkpoint["channel_values"].items() if _primitive(v)}
        values = [
            events.GraphValue(
                channel=k,
                version=str(version),
                value=_blob(self.serde.dumps_typed(checkpoint["channel_values"][k]))
                if k in checkpoint["channel_values"]
                else None,
            )
            for k, version in new_versions.items()
            if k not in inline
        ]
        spec = events.GraphCheckpointSpec(
            ns=ns,
            id=checkpoint["id"],
            parent_id=parent_id,
            checkpoint=_blob(self.serde.dumps_typed({**checkpoint, "channel_values": inline})),
            metadata=_blob(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
            versions=[
                events.ChannelVersion(channel=k, version=str(v)) for k, v in checkpoint["channel_versions"].items()
            ],
            values=values,
        )
        out: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }
        return thread_id, events.GraphCheckpointSaved(checkpoint=spec), out

    def _writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> tuple[str, events.GraphWritesSaved]:
        thread_id, ns, checkpoint_id = _where(config)
        if checkpoint_id is None:
            raise ValueError("put_writes needs configurable.checkpoint_id (the checkpoint the writes belong to)")
        saved = [
            events.GraphWrite(
                task_id=task_id,
                idx=WRITES_IDX_MAP.get(channel, i),
                channel=channel,
                value=_blob(self.serde.dumps_typed(value)),
                task_path=task_path,
            )
            for i, (channel, value) in enumerate(writes)
        ]
        return thread_id, events.GraphWritesSaved(ns=ns, checkpoint_id=checkpoint_id, writes=saved)

    def get_next_version(self, current: str | int | None, channel: None) -> str:  # type: ignore[override]
        """A channel's next version, as LangGraph's own savers make it: the count, then random
        digits, so that two branches of a thread (a fork from an earlier checkpoint) never
        give one channel the same version, under which its value is kept once."""
        n = 0 if current is None else current if isinstance(current, int) else int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    def _checkpoint(self, doc: dict[str, Any]) -> Checkpoint:
        """A stored checkpoint (``GraphCheckpointRead``) as LangGraph's: the values kept once
        per version put back beside the primitive ones (an "empty" one is no value). One
        saved whole, before values were kept once per version, had whole numbers for
        versions: they are read as the text :meth:`get_next_version` makes (LangGraph
        compares a thread's versions with each other, and a number with text fails)."""
        cp: Checkpoint = self.serde.loads_typed(_unblob(doc["checkpoint"]))
        if doc.get("versions") is None:
            cp["channel_versions"] = {k: _as_text(v) for k, v in cp.get("channel_versions", {}).items()}
            cp["versions_seen"] = {
                node: {k: _as_text(v) for k, v in seen.items()} for node, seen in cp.get("versions_seen", {}).items()
            }
        kept = {
            v["channel"]: self.serde.loads_typed(_unblob(v["value"]))
            for v in doc.get("values") or ()
            if v.get("value") is not None
        }
        if kept:
            cp["channel_values"] = {**cp["channel_values"], **kept}
        return cp

    def _tuple(self, thread_id: str, doc: dict[str, Any]) -> CheckpointTuple:
        ns = doc.get("ns", "")
        parent = doc.get("parent_id")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": doc["id"]}},
            checkpoint=self._checkpoint(doc),
            metadata=self.serde.loads_typed(_unblob(doc["metadata"])),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            # In LangGraph's order (its writes_sort_key), not the order the tasks finished:
            # a DeltaChannel replays them through an order-sensitive reducer.
            pending_writes=[
                (w["task_id"], w["channel"], _interrupts(w["channel"], self.serde.loads_typed(_unblob(w["value"]))))
                for w in sorted(doc.get("writes", []), key=_write_order)
            ],
        )

    @staticmethod
    def _query(
        config: RunnableConfig | None, filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None
    ) -> tuple[str, str | None, str | None, str | None, int | None]:
        """(thread, namespace or None for all, checkpoint id, before, limit to ask the store)."""
        if config is None:
            raise ValueError("runstate's checkpointer lists one thread at a time: give configurable.thread_id")
        thread_id, ns, checkpoint_id = _where(config)
        conf = config.get("configurable") or {}
        return (
            thread_id,
            ns if "checkpoint_ns" in conf else None,
            checkpoint_id,
            get_checkpoint_id(before) if before else None,
            None if filter else limit,
        )

    @staticmethod
    def _copies(source: list[dict[str, Any]]) -> list[list[events.Model]]:
        """The events that copy a thread's checkpoints (``source``, newest first, as read),
        in patches, oldest first: each checkpoint with the writes saved against it, as they
        were serialized (not read back through the serializer)."""
        out: list[list[events.Model]] = []
        batch: list[events.Model] = []
        size = 0
        copied: set[tuple[str, str, str]] = set()  # the values (ns, channel, version) sent: once each
        for doc in reversed(source):
            ns = doc.get("ns", "")
            values = [v for v in doc.get("values") or () if (ns, v["channel"], v["version"]) not in copied]
            copied.update((ns, v["channel"], v["version"]) for v in values)
            evs: list[events.Model] = [
                events.GraphCheckpointSaved(
                    checkpoint=events.GraphCheckpointSpec.model_validate(
                        {
                            "ns": ns,
                            "id": doc["id"],
                            "parent_id": doc.get("parent_id"),
                            "checkpoint": doc["checkpoint"],
                            "metadata": doc["metadata"],
                            "versions": doc.get("versions"),
                            "values": values,
                        }
                    )
                )
            ]
            if doc.get("writes"):
                evs.append(
                    events.GraphWritesSaved.model_validate(
                        {"ns": ns, "checkpoint_id": doc["id"], "writes": doc["writes"]}
                    )
                )
            n = (
                len(doc["checkpoint"]["data"])
                + len(doc["metadata"]["data"])
                + sum(len(w["value"]["data"]) for w in doc.get("writes", []))
                + sum(len(v["value"]["data"]) for v in values if v.get("value"))
            )
            if batch and size + n > COPY_BYTES:
                out.append(batch)
                batch, size = [], 0
            batch += evs
            size += n
        if batch:
            out.append(batch)
        return out

    def _pruned(self, docs: list[dict[str, Any]], strategy: str) -> list[events.GraphCheckpointRef]:
        """The checkpoints of a thread (``docs``, newest first) that ``prune`` removes.
        ``keep_latest`` keeps each namespace's newest checkpoint and, for a channel it holds
        no value of (a ``DeltaChannel`` between snapshots), every ancestor back to one that
        holds it, with their writes: LangGraph rebuilds such a channel from them."""
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(
                f"prune strategy {strategy!r}: runstate's checkpointer knows {', '.join(PRUNE_STRATEGIES)}"
            )
        if strategy == "delete":
            return [events.GraphCheckpointRef(ns=d.get("ns", ""), id=d["id"]) for d in docs]
        by_id = {(d.get("ns", ""), d["id"]): d for d in docs}
        keep: set[tuple[str, str]] = set()
        for ns in {d.get("ns", "") for d in docs}:
            latest = next(d for d in docs if d.get("ns", "") == ns)  # newest first
            keep.add((ns, latest["id"]))
            cp = self._checkpoint(latest)
            missing = set(cp.get("channel_versions", {})) - set(cp.get("channel_values", {}))
            parent = latest.get("parent_id")
            while missing and parent is not None and (ns, parent) in by_id:
                doc = by_id[(ns, parent)]
                keep.add((ns, parent))
                missing -= set(self._checkpoint(doc).get("channel_values", {}))
                parent = doc.get("parent_id")
        return [events.GraphCheckpointRef(ns=ns, id=id_) for ns, id_ in by_id if (ns, id_) not in keep]

    def _of_runs(self, docs: list[dict[str, Any]], run_ids: set[str]) -> list[events.GraphCheckpointRef]:
        """The checkpoints of a thread whose metadata names one of LangGraph's ``run_ids``."""
        return [
            events.GraphCheckpointRef(ns=d.get("ns", ""), id=d["id"])
            for d in docs
            if str(self.serde.loads_typed(_unblob(d["metadata"])).get("run_id")) in run_ids
        ]

    @staticmethod
    def _removals(refs: list[events.GraphCheckpointRef], reason: str) -> list[events.GraphCheckpointsRemoved]:
        n = events.MAX_GRAPH_REMOVALS
        return [
            events.GraphCheckpointsRemoved(checkpoints=refs[i : i + n], reason=reason) for i in range(0, len(refs), n)
        ]

    def _listed(
        self, thread_id: str, docs: list[dict[str, Any]], filter: dict[str, Any] | None, limit: int | None
    ) -> Iterator[CheckpointTuple]:
        n = 0
        for doc in docs:
            if limit is not None and n >= limit:
                return
            tup = self._tuple(thread_id, doc)
            if filter and not all(tup.metadata.get(k) == v for k, v in filter.items()):
                continue
            n += 1
            yield tup

    # What the sync and async savers do, written once: each plan yields the calls it needs
    # as (name, arguments), a backend method or "write" (the saver's own ``_submit``), and
    # is sent each answer, or has the call's rejection thrown in; each saver drives the
    # plans with its own I/O (``_drive``).

    def _has_ended(self, run_id: str) -> Plan[bool]:
        if (yield "graph_checkpoints", (run_id, "", None, None, 1)):
            return False  # an ended generation keeps no checkpoints: no need to read the state
        try:
            state = yield "state", (run_id, None)
        except RunErased:
            return True
        except RunNotFound:
            return False
        return state.status in TERMINAL_STATUSES

    def _follow(self, thread_id: str) -> Plan[str]:
        """The run of the thread's current generation: from the one this saver last used
        (another process may have deleted it and started the next), the first whose run has
        not ended (by ``delete_thread``, or any terminal status)."""
        n = self._generations.get(thread_id, 1)
        while (yield from self._has_ended(generation_run_id(thread_id, n))):
            n += 1
        self._generations[thread_id] = n
        return self._run(thread_id)

    def _to_thread(self, thread_id: str, event: events.Model, *, new: bool, names: tuple[str, str] | None) -> Plan[str]:
        """Write ``event`` to the thread and return the run it went to: the generation of the
        checkpoint it ``names`` (namespace, id) where this saver handled that one (refused
        there once the generation ended: a late write), else the current generation. Refused
        because that run has ended, it goes to the generation current now where it belongs
        there: it starts a conversation (``new``), or the checkpoint it names is that
        generation's."""
        if (run := self._run_of(thread_id, names)) is not None:
            yield "write", (run, (event,), True, new)
            return run
        run = self._run(thread_id)
        try:
            yield "write", (run, (event,), True, new)
        except (PatchRejected, RunErased) as e:
            if not _ended(e):
                raise
            now = yield from self._follow(thread_id)
            # It belongs there when it starts a conversation (names nothing) or names a checkpoint there.
            if now == run or not (
                (new and names is None) or (names is not None and (yield "graph_checkpoints", (now, *names, None, 1)))
            ):
                raise
            yield "write", (now, (event,), True, new)
            return now
        return run

    def _read(
        self, thread_id: str, ns: str | None, checkpoint_id: str | None, before: str | None, limit: int | None
    ) -> Plan[list[dict[str, Any]]]:
        """The thread's checkpoints (as the backend's ``graph_checkpoints``) in its current
        generation: an empty answer looks the generation up again (a subgraph's namespace,
        empty until it runs, does once per thread)."""
        known = thread_id in self._generations
        run = self._run(thread_id)
        docs = yield "graph_checkpoints", (run, ns, checkpoint_id, before, limit)
        if docs or (known and ns):
            return docs  # type: ignore[no-any-return]
        now = yield from self._follow(thread_id)
        return (yield "graph_checkpoints", (now, ns, checkpoint_id, before, limit)) if now != run else docs

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Plan[RunnableConfig]:
        thread_id, event, out = self._saved(config, checkpoint, metadata, new_versions)
        spec = event.checkpoint
        names = _named(spec, get_checkpoint_metadata(config, metadata))
        run = yield from self._to_thread(thread_id, event, new=spec.parent_id is None, names=names)
        self._remember(thread_id, spec.ns, spec.id, run)
        return out

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> Plan[None]:
        thread_id, event = self._writes(config, writes, task_id, task_path)
        yield from self._to_thread(thread_id, event, new=False, names=(event.ns, event.checkpoint_id))

    def _get_tuple(self, config: RunnableConfig) -> Plan[CheckpointTuple | None]:
        thread_id, ns, checkpoint_id = _where(config)
        docs = yield from self._read(thread_id, ns, checkpoint_id, None, 1)
        if not docs:
            return None
        self._remember(thread_id, ns, docs[0]["id"], self._run(thread_id))
        return self._tuple(thread_id, docs[0])

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Plan[Iterator[CheckpointTuple]]:
        """The read is done in the plan; the tuples are made as the caller iterates (one
        that stops early does not deserialize the rest)."""
        thread_id, ns, checkpoint_id, before_id, ask = self._query(config, filter, before, limit)
        docs = yield from self._read(thread_id, ns, checkpoint_id, before_id, ask)
        return self._listed(thread_id, docs, filter, limit)

    def _delete_thread(self, thread_id: str) -> Plan[None]:
        run = yield from self._follow(str(thread_id))
        if not (yield "erase", (run, DELETE_REASON)):
            yield "write", (run, (events.GraphThreadDeleted(),), False, False)

    def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> Plan[None]:
        source = yield from self._read(str(source_thread_id), None, None, None, None)
        for i, evs in enumerate(self._copies(source)):
            run = self._run(str(target_thread_id)) if i else (yield from self._follow(str(target_thread_id)))
            yield "write", (run, evs, True, i == 0)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Plan[None]:
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        for run_id in (yield "run_ids", ()):  # every generation of every thread
            docs = yield "graph_checkpoints", (run_id, None, None, None, None)
            for removal in self._removals(self._of_runs(docs, wanted), "LangGraph delete_for_runs"):
                yield "write", (run_id, (removal,), False, False)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> Plan[None]:
        for thread_id in map(str, thread_ids):
            docs = yield from self._read(thread_id, None, None, None, None)
            for removal in self._removals(self._pruned(docs, strategy), f"LangGraph prune {strategy}"):
                yield "write", (self._run(thread_id), (removal,), False, False)


def _attempts(
    run_id: str, evs: Sequence[events.Model], start: bool, new: bool, timeout_s: float
) -> Plan[Decision | None]:
    """A plan: the drafts that write ``evs`` to a thread's run, each submitted after the
    decision on the one before; returns the last decision, accepted (else raises
    :class:`PatchRejected`), or None where the run does not exist and ``start`` is off. ``new``: try starting the run
    first. Each rejection it resolves is resolved once: the run started meanwhile (send the
    event alone), a control event moved the run on (name its revision), no run yet (start it)."""

    def begun() -> list[events.Model]:
        # Built only when the run is to be started: most writes go to a started run.
        thread_id, n = thread_of(run_id)
        statement = f"LangGraph thread {thread_id}" + (f", generation {n}" if n > 1 else "")
        return [events.RunStarted(goal=events.GoalSpec(statement=statement)), *evs]

    d = (yield "submit", (run_id, _draft(0, begun(), False), timeout_s)) if new and start else None
    if d is None or d.reason == "revision_conflict":  # not new, or started already
        d = yield "submit", (run_id, _draft(0, list(evs), True), timeout_s)
    if d.reason == _SUPERSEDED:
        d = yield "submit", (run_id, _draft(d.revision, list(evs), True), timeout_s)
    elif d.reason == _START:
        if not start:
            return None
        d = yield "submit", (run_id, _draft(0, begun(), False), timeout_s)
    if d.outcome != "accepted":
        raise PatchRejected(d)
    return d  # type: ignore[no-any-return]


#: The channel of a task's interrupts (LangGraph's ``INTERRUPT``).
_INTERRUPT = "__interrupt__"


def _interrupts(channel: str, value: Any) -> Any:
    """A write's value, with the interrupts LangGraph.js saved (plain ``{value, id}``
    objects in its JSON) as LangGraph's ``Interrupt``, so that Python resumes them."""
    if channel == _INTERRUPT and isinstance(value, list):
        return [
            Interrupt(value=i["value"], id=i["id"]) if isinstance(i, dict) and set(i) == {"value", "id"} else i
            for i in value
        ]
    return value


#: Python's ids of LangChain objects that LangGraph.js knows by another name.
_JS_NAMESPACES = {("langchain", "schema", "messages"): ["langchain_core", "messages"]}


class JsonSerializer(SerializerProtocol):
    """A LangGraph serializer that writes what LangGraph.js's reads, so that one thread can
    be continued from Python and from JavaScript (with the same graph in both).

    It writes JSON, as LangGraph.js's serializer does: plain values as they are, LangChain
    objects (messages) in LangChain's serialized form under the ids LangGraph.js imports,
    ``Interrupt`` as a constructor record that Python revives (LangGraph.js keeps it as a
    plain object: an interrupt raised in one language is resumed in that one). Anything
    else (a dataclass, a set, a datetime, a pydantic model of your own) raises
    ``TypeError`` naming it, rather than writing what the other side reads differently.
    It reads what either language writes (JSON, and the default serializer's msgpack)."""

    def __init__(self, reader: JsonPlusSerializer | None = None) -> None:
        self._reader = reader or JsonPlusSerializer()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if isinstance(obj, bytes | bytearray):
            return "bytes", bytes(obj)
        return "json", json.dumps(obj, default=self._default, separators=(",", ":"), ensure_ascii=False).encode()

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self._reader.loads_typed(data)

    @staticmethod
    def _default(obj: Any) -> Any:
        if isinstance(obj, Serializable):
            out = obj.to_json()
            ids = out.get("id")
            if isinstance(ids, list):
                for python, js in _JS_NAMESPACES.items():
                    if tuple(ids[: len(python)]) == python:
                        out = {**out, "id": [*js, *ids[len(python) :]]}
            return out
        if isinstance(obj, Interrupt):
            return {
                "lc": 2,
                "type": "constructor",
                "id": ["langgraph", "types", "Interrupt"],
                "kwargs": dataclasses.asdict(obj),
            }
        raise TypeError(
            f"JsonSerializer cannot write a {type(obj).__module__}.{type(obj).__qualname__}: LangGraph.js reads "
            "JSON, which has no such type (keep the graph's state to JSON values and LangChain messages, or use "
            "LangGraph's default serializer for a thread only Python reads)"
        )


class RunstateSaver(_Graph, BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` on runstate (synchronous; the ``a*`` methods run
    the synchronous ones in a worker thread). Make it with :meth:`from_conn_string`."""

    def __init__(self, backend: Backend, *, serde: SerializerProtocol | None = None, timeout_s: float = 30.0) -> None:
        super().__init__(serde=serde)
        self.backend = backend
        self.timeout_s = timeout_s
        self._started: set[str] = set()
        #: run -> the lock its first write holds (one per run: another run's start does not wait)
        self._starting: dict[str, threading.Lock] = {}
        self._starting_guard = threading.Lock()
        self._generations: dict[str, int] = {}
        self._generation_of: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn: str | Path,
        *,
        token: str | None = None,
        author: Author = DEFAULT_AUTHOR,
        serde: SerializerProtocol | None = None,
    ) -> Iterator[RunstateSaver]:
        """A saver on ``conn``: a directory (embedded log and projections, the projector in
        this process while the saver is open) or a ``runstate serve`` URL."""
        saver = cls(backend(conn, author, token=token), serde=serde)
        try:
            yield saver
        finally:
            saver.backend.close()

    def _submit(self, run_id: str, evs: Sequence[events.Model], start: bool, new: bool) -> Decision | None:
        """Write ``evs`` (one patch) to a run, starting the run if it does not exist (unless
        ``start`` is off: then None). ``new``: the thread is probably new (a checkpoint with no
        parent), so the start is tried first. A run's first write in this process holds
        that run's other writes to it, so that they do not race to start the run; other
        runs' writes go on. Raises :class:`PatchRejected`."""
        plan = _attempts(run_id, evs, start, new, self.timeout_s)
        if run_id in self._started:
            return self._drive(plan)
        with self._starting_guard:
            lock = self._starting.setdefault(run_id, threading.Lock())
        with lock:
            d = self._drive(plan)
            self._started.add(run_id)
            with self._starting_guard:  # started: its later writes no longer look for the lock
                self._starting.pop(run_id, None)
            return d

    def _drive(self, plan: Plan[T]) -> T:
        """Run ``plan`` to its end with this saver's blocking calls; returns what it returns."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                name, args = plan.send(answer) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                answer, error = (self._submit if name == "write" else getattr(self.backend, name))(*args), None
            except (PatchRejected, RunErased, RunNotFound) as e:
                answer, error = None, e

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._drive(self._put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._drive(self._put_writes(config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._drive(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._drive(self._list(config, filter, before, limit))

    def delete_thread(self, thread_id: str) -> None:
        """Erase the run of the thread's current generation where content is sealed (a
        master key; through serve, a token allowed to erase): nothing of it is left anywhere
        but who, when and why. Elsewhere, remove its checkpoints and writes from its Run
        State and cancel its run; the log keeps the events. A late write to it stays
        refused; a new conversation on the id starts the next generation. A missing thread
        is no error."""
        self._drive(self._delete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Save every checkpoint of the source thread (each namespace, the whole parent chain)
        and the writes saved against them on the target thread, under the same ids,
        starting its run if it has none. A source without checkpoints copies nothing."""
        self._drive(self._copy_thread(source_thread_id, target_thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose metadata names one of LangGraph's
        ``run_ids``, on every thread: each thread's checkpoints are read to find them (the
        metadata is LangGraph's serialized bytes). The log keeps them (``GraphCheckpointsRemoved``)."""
        self._drive(self._delete_for_runs(run_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Remove checkpoints of the threads: ``keep_latest`` keeps each namespace's newest
        (and what a ``DeltaChannel`` needs to be rebuilt, see ``_pruned``), ``delete`` none.
        The threads go on; the log keeps what was removed."""
        self._drive(self._prune(thread_ids, strategy))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for tup in await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit))):
            yield tup

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


class AsyncRunstateSaver(_Graph, BaseCheckpointSaver[str]):
    """:class:`RunstateSaver` for asyncio graphs (``ainvoke``, ``astream``): the same
    events, sent without a thread per call over a ``runstate serve``. Its synchronous methods
    work from other threads while its event loop runs (as LangGraph's own async savers)."""

    def __init__(
        self, backend: AsyncBackend, *, serde: SerializerProtocol | None = None, timeout_s: float = 30.0
    ) -> None:
        super().__init__(serde=serde)
        self.backend = backend
        self.timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()
        self._started: set[str] = set()
        #: run -> the lock its first write holds (one per run: another run's start does not wait)
        self._starting: dict[str, asyncio.Lock] = {}
        self._generations: dict[str, int] = {}
        self._generation_of: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn: str | Path,
        *,
        token: str | None = None,
        author: Author = DEFAULT_AUTHOR,
        serde: SerializerProtocol | None = None,
    ) -> AsyncIterator[AsyncRunstateSaver]:
        """As :meth:`RunstateSaver.from_conn_string`."""
        saver = cls(await async_backend(conn, author, token=token), serde=serde)
        try:
            yield saver
        finally:
            await saver.backend.close()

    async def _submit(self, run_id: str, evs: Sequence[events.Model], start: bool, new: bool) -> Decision | None:
        """As :meth:`RunstateSaver._submit`."""
        plan = _attempts(run_id, evs, start, new, self.timeout_s)
        if run_id in self._started:
            return await self._drive(plan)
        async with self._starting.setdefault(run_id, asyncio.Lock()):
            d = await self._drive(plan)
            self._started.add(run_id)
            self._starting.pop(run_id, None)  # started: its later writes no longer look for the lock
            return d

    async def _drive(self, plan: Plan[T]) -> T:
        """As :meth:`RunstateSaver._drive`, awaiting each call."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                name, args = plan.send(answer) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                answer, error = await (self._submit if name == "write" else getattr(self.backend, name))(*args), None
            except (PatchRejected, RunErased, RunNotFound) as e:
                answer, error = None, e

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._drive(self._put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._drive(self._put_writes(config, writes, task_id, task_path))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._drive(self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for tup in await self._drive(self._list(config, filter, before, limit)):
            yield tup

    async def adelete_thread(self, thread_id: str) -> None:
        """As :meth:`RunstateSaver.delete_thread`."""
        await self._drive(self._delete_thread(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """As :meth:`RunstateSaver.copy_thread`."""
        await self._drive(self._copy_thread(source_thread_id, target_thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """As :meth:`RunstateSaver.delete_for_runs`."""
        await self._drive(self._delete_for_runs(run_ids))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """As :meth:`RunstateSaver.prune`."""
        await self._drive(self._prune(thread_ids, strategy))

    # LangGraph calls the synchronous methods from other threads (``graph.get_state`` in a
    # sync context): they run on the saver's loop.
    def _on_loop(self, coro: Any) -> Any:
        try:
            if asyncio.get_running_loop() is self.loop:
                coro.close()
                raise RuntimeError(
                    "AsyncRunstateSaver's synchronous methods cannot run on its own event loop: "
                    "await the a* methods (or use RunstateSaver)"
                )
        except RuntimeError as e:
            if "no running event loop" not in str(e):
                raise
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._on_loop(self.aput(config, checkpoint, metadata, new_versions))  # type: ignore[no-any-return]

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._on_loop(self.aput_writes(config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._on_loop(self.aget_tuple(config))  # type: ignore[no-any-return]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._on_loop(collect())

    def delete_thread(self, thread_id: str) -> None:
        self._on_loop(self.adelete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._on_loop(self.acopy_thread(source_thread_id, target_thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._on_loop(self.adelete_for_runs(run_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._on_loop(self.aprune(thread_ids, strategy=strategy))
