"""The library behind the CLI: each command is one function here, which tests call directly.

This is the one layer that wires the others together (log + producer + projector +
queries), so producers and the projector stay independent of each other.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from runstate.eventlog import EventLog, open_log
from runstate.eventlog.keystore import (
    CheckpointSigner,
    Keyring,
    KeyReport,
    KeyStore,
    MasterKey,
    MasterKeys,
    MasterRecord,
    Rotation,
)
from runstate.eventlog.sealed import SealedLog
from runstate.producers.decisions import TopicDecisions
from runstate.producers.run_producer import DecisionSource, Receipt, RunProducer
from runstate.projector.runtime.loop import Projector, ProjectorHooks, ProjectorStats
from runstate.projector.read.queries import Projection, decision_at_reader, decision_reader
from runstate.projector.core.outcomes import DeadLetter
from runstate.projector.store.keys import patch_id_digest, split_patch_ids
from runstate.projector.read.replay import (
    FieldChange,
    NearestCheckpoint,
    VerifyReport,
    accepted_after,
    explain,
    state_at,
    verify,
)
from runstate.schemas.codec import content_digest
from runstate.schemas.errors import (
    ContractError,
    FieldNeverSet,
    KeyStoreError,
    LogConfigError,
    LogError,
    LostRecords,
    RunErased,
    RunNotFound,
    RunstateError,
)
from runstate.snapshotter.checkpoint import Checkpoint, SigningKey, decode_patch_ids
from runstate.snapshotter.history import CheckpointHistory, LiveStores, StateDataCache
from runstate.snapshotter.loop import Snapshotter, snapshotter_dir
from runstate.projector.store.partition import ProjectionStore
from runstate.projector.store.statedir import Layout
from runstate.snapshotter.recovery import RestoreReport, check_checkpoints, restore_partition
from runstate.schemas.patch import Author, Decision
from runstate.schemas.state import RunHeader, RunState
from runstate.settings import Settings


def open_settings_log(settings: Settings, *, create: bool = True) -> EventLog:
    """The configured log. The embedded log creates its file and topics on first use;
    Kafka topics are created explicitly (:func:`create_topics`) and checked at start-up.
    With a master key, the log seals every run's content (:class:`SealedLog`). Raises
    :class:`KeyStoreError` for a malformed or wrong master key, or none for a log whose
    content is sealed."""
    master = settings.master()  # a malformed key is refused before anything is opened
    log = _open_raw(settings, create)
    try:
        if master is None:
            if _holds_keys(log):
                raise KeyStoreError(
                    f"the content of {log.describe()} is sealed (its keys topic {log.topics.keys} "
                    "holds run keys): set RUNSTATE_MASTER_KEY or RUNSTATE_MASTER_KEY_FILE"
                )
            return log
        return SealedLog(log, Keyring(KeyStore(log, master)))
    except BaseException:
        log.close()
        raise


def checkpoint_key(settings: Settings, log: EventLog, *, writer: bool = False) -> SigningKey:
    """What signs and checks checkpoints: ``RUNSTATE_CHECKPOINT_KEY``, else (content sealed)
    a checkpoint key of the key store, else nothing: a digest only, which a ``writer``
    (the snapshotter starting) says once."""
    explicit = settings.checkpoint_key_bytes()
    if explicit is not None:
        return explicit
    if isinstance(log, SealedLog):
        return CheckpointSigner(log.keyring)
    if writer and not _warned_unsigned:
        _warned_unsigned.append(True)
        logging.getLogger("runstate").warning(
            "checkpoints are not authenticated (a digest only): set RUNSTATE_MASTER_KEY (they are then signed with "
            "a key of the key store) or RUNSTATE_CHECKPOINT_KEY"
        )
    return None


_warned_unsigned: list[bool] = []


def _open_raw(settings: Settings, create: bool = True) -> EventLog:
    """The configured log as it is (no sealing): for what manages topics, not records."""
    return open_log(
        settings.log,
        partitions=settings.partitions,
        create=create,
        topics=settings.topics(),
        kafka_config={
            k: str(v) if not isinstance(v, bool) else str(v).lower() for k, v in settings.kafka_config.items()
        },
        key_purge_s=settings.key_purge_s,
        max_patch_bytes=settings.max_patch_bytes,
        schema_registry=settings.schema_registry_url,
        schema_registry_config=settings.schema_registry_config,
        schema_registry_register=settings.schema_registry_register,
    )


def _holds_keys(log: EventLog) -> bool:
    try:
        return any(log.end_offsets(log.topics.keys).values())
    except LogConfigError:
        return False  # no keys topic: nothing was ever sealed


def check_topics(settings: Settings) -> tuple[str, int]:
    """Check the configured topics; returns where they are and the events partition count.
    Raises :class:`LogConfigError` naming what is missing or incompatible."""
    log = open_settings_log(settings, create=False)
    try:
        log.check_topics()
        return log.describe(), log.partitions(log.topics.events)
    finally:
        log.close()


def create_topics(settings: Settings, partitions: int | None = None, replication: int | None = None) -> list[str]:
    log = _open_raw(settings)
    try:
        return log.create_topics(partitions or settings.partitions, replication or settings.replication)
    finally:
        log.close()


@dataclass
class PartitionStatus:
    partition: int
    end_offset: int
    projected: int | None  # next offset in the local projection store
    committed: int | None  # the group's mirrored position in the log
    lag: int


def erasures_pending(settings: Settings) -> list[str]:
    """Runs whose erasure the local projection took but did not finish (a process died
    between its steps): the next projector to open the store finishes them."""
    if not (Path(settings.state_dir) / "layout.json").exists():
        return []
    with Projection(settings.state_dir) as proj:
        return proj.erasing()


def status(settings: Settings) -> list[PartitionStatus]:
    """Consumer lag per partition: log end vs the local projection and the group's mirror."""
    log = open_settings_log(settings, create=False)
    try:
        log.check_topics()
        positions: dict[int, int] = {}
        if (Path(settings.state_dir) / "layout.json").exists():
            # Projections of another log (re-created, or swapped) have no lag against this one.
            Layout(settings.state_dir).ensure(log.topics.events, log.partitions(log.topics.events), log.identity())
            with Projection(settings.state_dir) as proj:
                positions = proj.positions()
        try:
            committed = log.committed(settings.group_id, log.topics.events)
        except LogError:  # the mirror is for monitoring; the projected positions still tell
            committed = {}
        # Read last: a projector running meanwhile moves on, and a position read before the
        # ends can only be at or below them unless records the log acknowledged are gone.
        ends = log.end_offsets(log.topics.events)
    finally:
        log.close()
    for p, end in sorted(ends.items()):
        seen = positions.get(p, committed.get(p, 0))
        if seen > end:  # negative lag would hide acknowledged records the log lost
            raise LostRecords(p, end, seen, "the projection" if p in positions else "the consumer group's mirror")
    out = []
    for p, end in sorted(ends.items()):
        # The local projection's position is authoritative; else the group's mirror; else
        # nothing has been projected yet and the whole partition is lag.
        pos = positions.get(p, committed.get(p, 0))
        out.append(PartitionStatus(p, end, positions.get(p), committed.get(p), end - pos))
    return out


def decision_source(settings: Settings, log: EventLog) -> DecisionSource:
    """Where this process reads decisions: the decisions topic when the projector publishes
    them (from any machine; created now, so before the caller appends), and the local
    projection (decisions made before, or on the projector's own machine)."""
    local = decision_reader(settings.state_dir)
    if not settings.decisions_published():
        return local
    topic = TopicDecisions(log, keys=settings.instance_keys())

    def read(run_id: str, patch_id: str) -> Decision | None:
        return topic(run_id, patch_id) or local(run_id, patch_id)

    return read


def make_producer(settings: Settings, log: EventLog | None = None) -> RunProducer:
    log = log or open_settings_log(settings)
    return RunProducer(
        log,
        Author(agent_id=settings.agent_id, agent_version=settings.agent_version),
        decisions=decision_source(settings, log),
        decisions_at=decision_at_reader(settings.state_dir),
        max_patch_bytes=settings.max_patch_bytes,
    )


def unencodable(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string that UTF-8 cannot encode (a lone surrogate
    from a ``\\udXXX`` escape), or None."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return where or "(the whole document)"
        elif isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{where}.{i}" if where else str(i), x) for i, x in reversed(list(enumerate(v))))
    return None


def read_patch_file(source: str, stream: IO[str] | None = None) -> Any:
    """Parse a patch file (``-`` is ``stream``). Raises :class:`ContractError` naming the
    file (and the field, for a string that cannot be encoded): unreadable, not UTF-8, not
    JSON, nested too deeply."""
    where = "<stdin>" if source == "-" else source
    try:
        if source == "-" and stream is not None:
            buffer = getattr(stream, "buffer", None)
            raw = buffer.read() if buffer is not None else stream.read().encode("utf-8", "surrogateescape")
        else:
            raw = Path(source).read_bytes()
    except OSError as e:
        raise ContractError(f"cannot read patch file: {e.strerror}", where=where) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ContractError(f"not UTF-8: {e.reason} at byte {e.start}", where=where) from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}", where=where) from e
    except RecursionError as e:
        raise ContractError("not a patch: JSON nested too deeply", where=where) from e
    bad = unencodable(data)
    if bad is not None:
        raise ContractError(
            f"invalid patch: {bad}: a string that UTF-8 cannot encode (lone surrogate)", where=where, field=bad
        )
    return data


def publish(
    settings: Settings,
    run_id: str,
    data: Any,
    *,
    where: str,
    wait: bool = False,
    timeout_s: float = 10.0,
    rebase: bool | None = None,
) -> tuple[Receipt, Decision | None]:
    """Validate, append and optionally await the decision on one patch."""
    unversioned = settings.agent_version == Settings.model_fields["agent_version"].default
    names_author = isinstance(data, dict) and isinstance(data.get("author"), dict)
    if settings.require_agent_version and unversioned and not names_author:
        raise ContractError(
            "an agent version is required (RUNSTATE_REQUIRE_AGENT_VERSION): pass --agent-version "
            "or set RUNSTATE_AGENT_VERSION",
            where=where,
            field="author.agent_version",
        )
    producer = make_producer(settings)
    try:
        if rebase is not None and isinstance(data, dict):
            data = {**data, "rebase": rebase}
        patch = producer.build(run_id, data, where=where)
        if isinstance(data, dict) and data.get("patch_id") is not None and producer.decisions is not None:
            # A resend (the same file again): the first decision answers, nothing is appended.
            earlier = producer.decisions(run_id, patch.patch_id)
            if earlier is not None and producer.resend_of(patch, earlier):
                return Receipt(patch.patch_id, run_id, earlier.partition, earlier.offset), earlier
        receipt = producer.append(patch)
        digest = content_digest(producer.encode(patch))
        decision = producer.wait(run_id, patch.patch_id, timeout_s, appended=receipt, digest=digest) if wait else None
        return receipt, decision
    finally:
        producer.close()


def make_projector(
    settings: Settings,
    log: EventLog,
    *,
    on_progress: Callable[[ProjectorStats, int], None] | None = None,
    on_restore_progress: Callable[[int, int, int], None] | None = None,
    hooks: ProjectorHooks | None = None,
    client_id: str | None = None,
    tune_gc: bool = False,
) -> Projector:
    """The projector as configured: restores a partition without a local store from
    checkpoints, and on Kafka copies decisions to the decisions topic. ``tune_gc``: for a
    process that keeps projecting (projector/runtime/gc_policy.py)."""

    def restore(partition: int, store: ProjectionStore) -> RestoreReport:
        def progress(done: int, total: int) -> None:
            if on_restore_progress is not None:
                on_restore_progress(partition, done, total)

        return restore_partition(log, partition, store, progress, key=checkpoint_key(settings, log))

    return Projector(
        log,
        settings.state_dir,
        group_id=settings.group_id,
        batch_size=settings.batch_size,
        cache_runs=settings.cache_runs,
        cache_items_per_run=settings.cache_items_per_run,
        on_progress=on_progress,
        restore=restore,
        hooks=hooks,
        publish_decisions=settings.decisions_published(),
        client_id=client_id,
        tune_gc=tune_gc,
        destroy_erased_keys=True,
        decision_keys=settings.instance_keys(),
    )


def project(
    settings: Settings,
    *,
    until_caught_up: bool = False,
    on_progress: Callable[[ProjectorStats, int], None] | None = None,
    on_restore_progress: Callable[[int, int, int], None] | None = None,
) -> ProjectorStats:
    """Run the projector until caught up (optional) or until SIGTERM/SIGINT, which finish
    the batch in hand, store it and leave the consumer group before returning. A partition
    without a local store is restored from checkpoints first
    (``on_restore_progress(partition, checkpoint records read, total)``). The log must
    exist: a reader never makes one (an empty log would pass for a log with no runs)."""
    log = open_settings_log(settings, create=False)
    stop = threading.Event()
    previous = {}
    caught: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        caught.append(signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        # A projector that keeps following the log gets the GC policy; one that stops when
        # caught up has nothing to gain from it.
        projector = make_projector(
            settings, log, on_progress=on_progress, on_restore_progress=on_restore_progress, tune_gc=not until_caught_up
        )
        stats = projector.run(until_caught_up=until_caught_up, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
    if until_caught_up and caught:
        raise Interrupted(stats, caught[0])
    return stats


class Interrupted(RunstateError):
    """``project --until-caught-up`` stopped by a signal before the log was drained (what
    was read is stored); ``stats`` says how far it got."""

    def __init__(self, stats: ProjectorStats, signum: int) -> None:
        self.stats = stats
        self.signum = signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} before the log was drained "
            f"({stats.records:,} records stored; run it again to go on)"
        )


def snapshot(
    settings: Settings,
    *,
    until_caught_up: bool = False,
    every: int | None = None,
    on_progress: Callable[[ProjectorStats, int], None] | None = None,
) -> tuple[ProjectorStats, int]:
    """Run the snapshotter; returns its stats and how many checkpoints it wrote. The log
    must exist (see :func:`project`)."""
    log = open_settings_log(settings, create=False)
    try:
        snap = make_snapshotter(settings, log, every)
        snap.projector.on_progress = on_progress
        stats = snap.run(until_caught_up=until_caught_up)
        return stats, snap.writer.written
    finally:
        log.close()


def make_snapshotter(settings: Settings, log: EventLog, every: int | None = None) -> Snapshotter:
    """The snapshotter the settings describe, on ``log`` (its policy, batch, checkpoint key,
    retention): ``runstate snapshot``'s and serve's. ``every``: K instead of the setting's."""
    return Snapshotter(
        log,
        settings.state_dir,
        policy=settings.checkpoint_policy(every),
        batch_size=settings.batch_size,
        key=checkpoint_key(settings, log, writer=True),
        retention=settings.retention_policy(),
        retention_every_s=settings.retention_check_s,
    )


def nearest_checkpoint(settings: Settings, live: LiveStores | None = None) -> NearestCheckpoint:
    """The newest valid checkpoint at or below a revision, as state data (see
    :meth:`CheckpointHistory.nearest_state_data`). ``live``: the stores of the snapshotter
    running in this process (serve's), read where it has the run's partition."""

    cache = StateDataCache()  # a state rebuilt at nearby revisions starts from one checkpoint

    def nearest(run_id: str, revision: int) -> dict[str, Any] | None:
        history = CheckpointHistory(snapshotter_dir(settings.state_dir), settings.checkpoint_key_bytes(), live, cache)
        with history as hist:
            return hist.nearest_state_data(run_id, revision)  # checked: digest, signature, versions

    return nearest


def get_state(settings: Settings, run_id: str, revision: int | None = None) -> RunState:
    with Projection(settings.state_dir) as proj:
        if revision is None:
            return proj.state(run_id)
        log = open_settings_log(settings, create=False)
        try:
            return state_at(log, proj, run_id, revision, nearest=nearest_checkpoint(settings))
        finally:
            log.close()


def explain_field(settings: Settings, run_id: str, path: str) -> list[FieldChange]:
    """Every patch that changed ``path``. Raises :class:`FieldNeverSet` when none did."""
    with Projection(settings.state_dir) as proj:
        log = open_settings_log(settings, create=False)
        try:
            changes = explain(log, proj, run_id, path)
        finally:
            log.close()
    if not changes:
        raise FieldNeverSet(run_id, path)
    return changes


def checkpoints(settings: Settings, run_id: str) -> list[Checkpoint]:
    with CheckpointHistory(snapshotter_dir(settings.state_dir)) as hist:
        return hist.of(run_id)


@dataclass
class ResumePlan:
    """What to do to resume a run from its latest checkpoint."""

    checkpoint: Checkpoint
    #: the run's revision in the local projection (None: no projection of it here)
    current_revision: int | None
    #: accepted patches after the checkpoint, in log order, read from the log itself
    tail: list[Decision]


def resume_plan(settings: Settings, run_id: str) -> ResumePlan:
    """The latest checkpoint's verdict and the plan to resume from it. Raises
    :class:`RunNotFound` when the run has no checkpoint."""
    with CheckpointHistory(snapshotter_dir(settings.state_dir)) as hist:
        cp = hist.latest(run_id)
    if cp is None:
        raise RunNotFound(run_id)
    if cp.state.erasure is not None:  # the tombstone: nothing to resume
        raise RunErased(run_id, cp.state.erasure.model_dump(mode="json"))
    current = None
    if (Path(settings.state_dir) / "layout.json").exists():
        with Projection(settings.state_dir) as proj:
            header = proj.header(run_id)
            current = None if header is None else header.revision
    seen = split_patch_ids(decode_patch_ids(cp.patch_ids))
    log = open_settings_log(settings, create=False)
    try:  # the log, not the projection: a lagging projector must not hide what happened since
        tail = accepted_after(log, cp.state, cp.partition, cp.covers_offset, lambda p: patch_id_digest(p) in seen)
    finally:
        log.close()
    return ResumePlan(cp, current, tail)


def list_runs(settings: Settings, status: str | None = None) -> list[RunHeader]:
    with Projection(settings.state_dir) as proj:
        return proj.runs(status)


def history(settings: Settings, run_id: str) -> list[Decision]:
    """Every decision on the run's patches in log order. Raises :class:`RunNotFound`."""
    with Projection(settings.state_dir) as proj:
        decisions = proj.history(run_id)
    if not decisions:
        raise RunNotFound(run_id)
    return decisions


def dead_letters(settings: Settings) -> list[DeadLetter]:
    with Projection(settings.state_dir) as proj:
        return proj.dead_letters()


def get_context(settings: Settings, run_id: str, now: datetime | None = None, max_tokens: int | None = None) -> str:
    with Projection(settings.state_dir) as proj:
        return proj.context(run_id, now=now or datetime.now(UTC), max_tokens=max_tokens)


def run_verify(
    settings: Settings, on_progress: Callable[[int, int], None] | None = None, deep: bool = False
) -> VerifyReport:
    """Projection == replay; ``deep`` also checks the log's storage and every checkpoint."""
    log = open_settings_log(settings, create=False)
    key = checkpoint_key(settings, log)
    try:
        return verify(
            log,
            settings.state_dir,
            on_progress=on_progress,
            deep=(lambda lg: check_checkpoints(lg, key)) if deep else None,
        )
    finally:
        log.close()


@dataclass
class Erased:
    """What ``erase`` did: the erasure record that stands, and whether this call made it."""

    run_id: str
    erasure: dict[str, str]
    first: bool
    #: the erasure's decision, when awaited and the projector took it in time
    decision: Decision | None = None
    #: the erasure record's patch id (None: the run was erased before)
    patch_id: str | None = None


def erase(settings: Settings, run_id: str, reason: str, by: str, *, wait_s: float = 0.0) -> Erased:
    """Erase a run: an erasure record on the events log (the projector and the snapshotter
    then drop everything of the run from their stores and checkpoints, and compact the
    bytes away), and the run's keys destroyed, which leaves every copy of its content on
    the log unreadable. Erasing an erased run returns the first record (``first`` False).
    ``wait_s``: wait that long for the projector's decision on the erasure.

    Raises :class:`KeyStoreError` without a master key or for a run stored before content
    was sealed (its content on the log cannot be erased), :class:`RunNotFound` for a run
    the key store never held a key for."""
    log = open_settings_log(settings)
    try:
        header = _header_or_none(settings, run_id)
        source = decision_source(settings, log) if wait_s > 0 else None
        done = erase_run(
            log,
            run_id,
            reason,
            by,
            Author(agent_id=settings.agent_id, agent_version=settings.agent_version),
            0 if header is None else header.revision,
            known=header is not None,
        )
        if (
            source is not None
            and done.first
            and not settings.log.startswith("kafka://")
            and not log.group_members(settings.group_id)
        ):
            # Nothing projects this embedded log, whose projections are on this machine:
            # finish the erasure here rather than leave the content readable until one runs.
            project(settings, until_caught_up=True)
        if source is not None and done.first:
            deadline = time.monotonic() + wait_s
            while done.decision is None and time.monotonic() < deadline:
                done.decision = source(run_id, done.patch_id)
                if done.decision is None:
                    time.sleep(0.05)
        return done
    finally:
        log.close()


def erase_run(
    log: EventLog,
    run_id: str,
    reason: str,
    by: str,
    author: Author,
    revision: int,
    *,
    known: bool = False,
    patch_id: str | None = None,
) -> Erased:
    """The erasure itself, on an open log (``runstate erase``, ``DELETE /runs/{id}``): the
    erasure record appended (content-free, readable for good), then the keys destroyed.
    ``revision``: the run's revision as the caller sees it (kept in the record); ``known``:
    the caller's projection holds the run. Raises as :func:`erase`."""
    if not isinstance(log, SealedLog):
        raise KeyStoreError(
            "erasure needs sealed content: set RUNSTATE_MASTER_KEY (or RUNSTATE_MASTER_KEY_FILE; "
            "`runstate keys generate` makes one). Without it runs are stored as they are and "
            "cannot be erased from the log."
        )
    try:
        erasure, appended = log.erase(run_id, reason, by, author, revision, patch_id=patch_id)
    except RunNotFound:
        if known:
            raise KeyStoreError(
                f"run {run_id!r} was stored before its content was sealed (no key of its own): "
                "its content on the log cannot be erased"
            ) from None
        raise
    return Erased(run_id, erasure, appended is not None, patch_id=appended)


def _header_or_none(settings: Settings, run_id: str) -> RunHeader | None:
    if not (Path(settings.state_dir) / "layout.json").exists():
        return None
    try:
        with Projection(settings.state_dir) as proj:
            return proj.header(run_id)
    except RunstateError:
        return None


def generate_master_key() -> str:
    return MasterKey.generate()


@contextmanager
def _key_store(settings: Settings, *, also: MasterKey | None = None, check: bool = True) -> Iterator[KeyStore]:
    """The key store of the configured log with the configured master keys (and ``also``)."""
    masters = settings.master()
    if masters is None:
        raise KeyStoreError("no master key configured (RUNSTATE_MASTER_KEY or RUNSTATE_MASTER_KEY_FILE)")
    if also is not None:
        masters = MasterKeys([*masters.by_id.values(), also])
    log = _open_raw(settings, create=False)
    try:
        store = KeyStore(log, masters, check=check)
        try:
            yield store
        finally:
            store.close()
    finally:
        log.close()


def rotate_master_key(settings: Settings, new: MasterKey) -> Rotation:
    """Rotate to ``new``: every run key ends wrapped by it, or nothing changes (see
    :meth:`KeyStore.rotate`). The configured keys must open every live run key. Raises
    :class:`KeyStoreError`."""
    # The new key beside the configured ones: a rotation cut short is resumed from either side.
    with _key_store(settings, also=new) as store:
        return store.rotate(new)


def key_status(settings: Settings) -> KeyReport:
    """Where the key store stands: its master, a rotation under way, keys by master, and
    the problems to act on (read with the configured keys, never written)."""
    with _key_store(settings, check=False) as store:
        return store.report()


def repair_master_record(settings: Settings) -> MasterRecord:
    """Write the key store's check record again for the configured master key, once that
    key opens the run keys that name it (:meth:`KeyStore.repair`)."""
    with _key_store(settings, check=False) as store:
        return store.repair()


def erasure_of(settings: Settings, run_id: str) -> dict[str, str] | None:
    """The erasure record of an erased run in the projection, or None."""
    header = _header_or_none(settings, run_id)
    return None if header is None or header.erasure is None else header.erasure.model_dump(mode="json")
