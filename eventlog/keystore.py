"""Run keys: one AES-256 key per run, wrapped by the operator's master key, kept in a
compacted topic of the log (``<prefix>.keys``), and destroyed to erase a run.

Records of the keys topic (JSON; keyed so that compaction keeps what must stay):

- ``<run>\\0<key id>`` → ``{"run_id", "kid", "master", "wrapped"}``: one key of a run, AES-GCM
  wrapped by the master key named by ``master`` (its id, not the key). A run may have
  several keys (two producers that started it at once each made one); every sealed record
  names the key it was sealed with. Destroyed: replaced by ``{"run_id", "kid", "destroyed": true}``.
- ``<run>`` → ``{"run_id", "erased": {"at", "by", "reason"}}``: the run was erased.
- ``__master__`` → ``{"master", "check", "epoch", "state", "retired"}``: the master key run
  keys are wrapped with from here on in this partition (a check value wrapped by it, so a
  process given another key refuses to start), which masters it retired (a rotation), and
  whether the rotation that made it is ``done`` or still ``rotating``. The record on the
  partition of ``__master__`` is the store's; a rotation writes one to every partition.

Every record of a run lives on the run's partition number (the events topic's), so a
projector reads the keys of the partitions it owns, not the whole topic.

Why a rotation leaves no window (see :meth:`KeyStore.rotate`): in each partition the
master record orders the run keys around it. A run key wrapped by a retired master that
lands *before* the partition's master record is rewrapped by the rotation's sweep, which
reads the partition after writing that record; one that lands *after* it is stale: no
process seals with it, and the process that wrote it learns so from reading its own
append back (:meth:`KeyStore.create`) before it seals anything, so the append it was made
for fails instead of being acknowledged unreadable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runstate.eventlog.base import EventLog
from runstate.eventlog.partitioner import partition_for
from runstate.schemas import sealed
from runstate.schemas.errors import KeyStoreError, LogConfigError, RunErased

MASTER_RECORD = "__master__"
_CHECK = b"runstate master key check"


def parse_key_bytes(text: str, *, where: str, what: str) -> bytes:
    """32 random bytes given as 64 hex digits or (URL-safe) base64, as ``runstate keys
    generate`` prints them. Raises :class:`KeyStoreError` naming ``where``."""
    t = text.strip()
    raw: bytes | None = None
    if len(t) == 64:
        try:
            raw = bytes.fromhex(t)
        except ValueError:
            raw = None
    if raw is None:
        try:
            raw = base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))
        except (binascii.Error, ValueError):
            raw = b""
    if len(raw) != 32:
        raise KeyStoreError(
            f"{where} is not {what}: give 64 hex digits (32 random bytes), e.g. from `runstate keys generate`"
        )
    return raw


class MasterKey:
    """The operator's key: wraps run keys, never leaves the process."""

    def __init__(self, raw: bytes) -> None:
        if len(raw) != 32:
            raise KeyStoreError(f"a master key is 32 bytes (64 hex digits), got {len(raw)} bytes")
        self._aead = AESGCM(raw)
        #: names the key in records without revealing it (a keyed digest of a random key)
        self.id = hashlib.blake2b(raw, digest_size=8, person=b"runstate-master").hexdigest()

    @classmethod
    def parse(cls, text: str, *, where: str = "RUNSTATE_MASTER_KEY") -> MasterKey:
        """64 hex digits, or 32 bytes in (URL-safe) base64. Raises :class:`KeyStoreError`."""
        return cls(parse_key_bytes(text, where=where, what="a master key"))

    @classmethod
    def from_file(cls, path: str) -> MasterKey:
        return MasterKeys.from_file(path).primary

    @staticmethod
    def generate() -> str:
        return os.urandom(32).hex()

    def wrap(self, name: str, key: bytes) -> str:
        nonce = os.urandom(12)
        return base64.b64encode(nonce + self._aead.encrypt(nonce, key, name.encode())).decode()

    def unwrap(self, name: str, wrapped: str) -> bytes:
        """Raises ``ValueError`` when ``wrapped`` does not open with this key for ``name``."""
        try:
            raw = base64.b64decode(wrapped, validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], name.encode())
        except (InvalidTag, binascii.Error, ValueError, TypeError) as e:
            raise ValueError("does not open with the master key") from e


class MasterKeys:
    """The master keys one process holds: usually one; during a rotation the new one and
    the one it replaces, so that the process reads and writes on either side of it."""

    def __init__(self, keys: Iterable[MasterKey]) -> None:
        self.by_id: dict[str, MasterKey] = {}
        for k in keys:
            self.by_id.setdefault(k.id, k)
        if not self.by_id:
            raise KeyStoreError("no master key given")
        self.primary = next(iter(self.by_id.values()))

    @classmethod
    def parse(cls, text: str, *, where: str = "RUNSTATE_MASTER_KEY") -> MasterKeys:
        """One key or several, separated by commas, spaces or lines (the first is this
        process's own). Raises :class:`KeyStoreError`."""
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        if not parts:
            raise KeyStoreError(f"{where} is empty: give 64 hex digits, e.g. from `runstate keys generate`")
        return cls(MasterKey.parse(p, where=where) for p in parts)

    @classmethod
    def from_file(cls, path: str) -> MasterKeys:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise KeyStoreError(f"cannot read the master key file {path}: {e.strerror}") from e
        return cls.parse(text, where=f"master key file {path}")

    @classmethod
    def of(cls, key: MasterKey | MasterKeys) -> MasterKeys:
        return key if isinstance(key, MasterKeys) else cls([key])

    def __contains__(self, master_id: object) -> bool:
        return master_id in self.by_id

    def get(self, master_id: str) -> MasterKey | None:
        return self.by_id.get(master_id)

    @property
    def ids(self) -> list[str]:
        return list(self.by_id)


@dataclass(frozen=True)
class MasterRecord:
    """A ``__master__`` record: see the module docstring."""

    master: str
    check: str
    epoch: int = 0
    state: Literal["done", "rotating"] = "done"
    retired: tuple[str, ...] = ()

    @classmethod
    def parse(cls, v: Any) -> MasterRecord:
        """Raises ``ValueError`` for what is not a master record."""
        if not isinstance(v, dict) or not isinstance(v.get("master"), str) or not isinstance(v.get("check"), str):
            raise ValueError("not a master record")
        state = v.get("state", "done")
        retired = v.get("retired", [])
        if state not in ("done", "rotating") or not isinstance(retired, list) or not isinstance(v.get("epoch", 0), int):
            raise ValueError("not a master record")
        return cls(v["master"], v["check"], int(v.get("epoch", 0)), state, tuple(str(r) for r in retired))

    def dump(self) -> dict[str, Any]:
        return {
            "master": self.master,
            "check": self.check,
            "epoch": self.epoch,
            "state": self.state,
            "retired": list(self.retired),
        }

    @classmethod
    def made(
        cls, key: MasterKey, epoch: int, state: Literal["done", "rotating"], retired: Iterable[str]
    ) -> MasterRecord:
        return cls(key.id, key.wrap(MASTER_RECORD, _CHECK), epoch, state, tuple(sorted(set(retired) - {key.id})))


#: what stands in a partition where the newest ``__master__`` record cannot be read
_DAMAGED = "damaged"


@dataclass
class RunKeys:
    """What the key store holds for one run."""

    #: key id -> wrapped key (None: destroyed), in the order they were written
    keys: dict[str, str | None]
    #: the erasure record, or None
    erased: dict[str, str] | None = None
    #: key id -> the id of the master key that wrapped it ("" for a record that names none)
    masters: dict[str, str] = field(default_factory=dict)
    #: keys wrapped by a master that their partition had retired when they were written:
    #: never sealed with (see the module docstring)
    stale: set[str] = field(default_factory=set)

    def usable(self) -> list[str]:
        """The keys a record may be sealed with, oldest first."""
        return [k for k, w in self.keys.items() if w is not None and k not in self.stale]


@dataclass
class KeyReport:
    """Where the key store stands (``runstate keys status``)."""

    master: str | None
    epoch: int
    state: str
    retired: list[str]
    #: partitions whose own master record names another master than the store's
    partitions_behind: list[int]
    #: live keys by the id of the master that wraps them
    keys_by_master: dict[str, int]
    stale: int
    erased_runs: int
    #: problems an operator must act on (a damaged or missing check record)
    problems: list[str]


@dataclass
class Rotation:
    """What :meth:`KeyStore.rotate` did."""

    rewrapped: int
    already: int
    resumed: bool


def _record_key(run_id: str, kid: str) -> str:
    return f"{run_id}\0{kid}"


class KeyStore:
    """The keys topic, read per partition into memory as needed. Thread-safe.

    ``check``: refuse (:class:`KeyStoreError`) a master key other than the store's, a
    damaged or missing check record, or a keys topic lost while the log holds sealed
    records; writes the first check record on first use. Only ``keys repair`` opens a
    store without it."""

    def __init__(self, log: EventLog, master: MasterKey | MasterKeys, *, check: bool = True) -> None:
        self.log = log
        self.masters = MasterKeys.of(master)
        self.topic = log.topics.keys
        try:
            self.partitions = log.partitions(self.topic)
        except LogConfigError as e:
            raise LogConfigError(
                f"{e}. Content is sealed (a master key is configured), which needs the keys "
                "topic: `runstate topics create` makes it"
            ) from e
        self._runs: dict[int, dict[str, RunKeys]] = {}
        self._read_to: dict[int, int] = {}
        self._lock = threading.RLock()
        #: the newest master record of each partition read (or _DAMAGED)
        self._part_master: dict[int, MasterRecord | str] = {}
        #: masters each partition retired, as of the records read
        self._retired: dict[int, set[str]] = {}
        self._producer = log.producer()
        self.home = partition_for(MASTER_RECORD, self.partitions)
        if check:
            self._check_master()

    # -- the check record ------------------------------------------------------------------

    def store_record(self) -> MasterRecord | None:
        """The store's master record (read again). Raises :class:`KeyStoreError` when it is
        damaged."""
        self._refresh(self.home)
        rec = self._part_master.get(self.home)
        if rec == _DAMAGED:
            raise KeyStoreError(
                f"the master check record ({MASTER_RECORD}, partition {self.home} of {self.topic}) "
                "is damaged: nothing is written until it is repaired with the master key the store "
                "was written with: `runstate keys repair` (it checks that key against the run keys "
                "first); never with a new key"
            )
        assert rec is None or isinstance(rec, MasterRecord)
        return rec

    def _check_master(self) -> None:
        rec = self.store_record()
        if rec is None:
            if self._holds_records():
                raise KeyStoreError(
                    f"{self.topic} holds run keys but no master check record ({MASTER_RECORD}): "
                    "it was lost or damaged. Repair it with the master key the store was written "
                    "with: `runstate keys repair`"
                )
            if self._events_hold_sealed():
                raise KeyStoreError(
                    f"the events topic holds sealed records but {self.topic} is empty: the run keys "
                    "were lost. Restore the keys topic from its backup; nothing is written "
                    "until then"
                )
            self._write_master(self.home, MasterRecord.made(self.masters.primary, 1, "done", ()))
            return
        held = self.masters.get(rec.master)
        if held is None:
            if any(i in rec.retired for i in self.masters.ids):
                raise KeyStoreError(
                    f"the master key was rotated to id {rec.master} (this process holds "
                    f"{', '.join(self.masters.ids)}, retired): configure the new key, and keep "
                    "the old one beside it until `runstate keys status` says the rotation "
                    "is done"
                )
            raise KeyStoreError(
                f"the master key (id {self.masters.primary.id}) is not the one {self.topic} was "
                f"written with (id {rec.master}); give that key, or rotate to this one with "
                "`runstate keys rotate`"
            )
        try:
            ok = held.unwrap(MASTER_RECORD, rec.check) == _CHECK
        except ValueError:
            ok = False
        if not ok:
            raise KeyStoreError(
                f"the master check record of {self.topic} names master id {rec.master} but does not "
                "open with it: it is damaged. Repair it: `runstate keys repair`"
            )

    def _holds_records(self) -> bool:
        ends = self.log.end_offsets(self.topic)
        return any(next(iter(self.log.scan(self.topic, p, 0, end, 1)), None) is not None for p, end in ends.items())

    def _events_hold_sealed(self) -> bool:
        """Whether any record of the events topic is sealed (read when the keys topic is
        empty: once in a store's life, or when its keys were lost)."""
        events = self.log.topics.events
        try:
            ends = self.log.end_offsets(events)
        except LogConfigError:
            return False
        for p, end in ends.items():
            for rec in self.log.scan(events, p, 0, end):
                if sealed.is_sealed(rec.value):
                    return True
        return False

    def _write_master(self, partition: int, rec: MasterRecord) -> None:
        self._append(MASTER_RECORD, rec.dump(), partition)

    # -- reading and writing records -------------------------------------------------------

    def _append(self, key: str, value: dict[str, Any], partition: int) -> None:
        raw = orjson.dumps(value)
        self._producer.append(self.topic, key, raw, partition=partition)
        with self._lock:
            # What this process wrote, known without reading the partition again (folding
            # is idempotent: the next refresh reads the record once more, in log order).
            self._fold(partition, self._runs.setdefault(partition, {}), key.encode(), raw, True)

    def _refresh(self, partition: int) -> None:
        """Read the partition's new records (from where it was read to)."""
        with self._lock:
            start = self._read_to.get(partition, 0)
            end = self.log.end_offsets(self.topic).get(partition, 0)
            runs = self._runs.setdefault(partition, {})
            for rec in self.log.scan(self.topic, partition, start, end):
                self._fold(partition, runs, rec.key, rec.value, rec.checksum_ok)
            self._read_to[partition] = max(start, end)

    def _fold(self, partition: int, runs: dict[str, RunKeys], key: bytes | None, value: bytes, ok: bool) -> None:
        try:
            k = (key or b"").decode()
        except UnicodeDecodeError:
            return  # a damaged key: the run it held is missing, and says so
        if k == MASTER_RECORD:
            try:
                if not ok:
                    raise ValueError("checksum")
                rec = MasterRecord.parse(orjson.loads(value))
            except (ValueError, orjson.JSONDecodeError):
                self._part_master[partition] = _DAMAGED
                return
            self._part_master[partition] = rec
            self._retired.setdefault(partition, set()).update(rec.retired)
            return
        try:
            v = orjson.loads(value) if ok else None
        except orjson.JSONDecodeError:
            v = None
        if not isinstance(v, dict):
            return  # a damaged record: the keys it held are missing, and their runs say so
        run_id = str(v.get("run_id", k.split("\0", 1)[0]))
        entry = runs.setdefault(run_id, RunKeys({}))
        if "erased" in v and "\0" not in k:
            entry.erased = entry.erased or v["erased"]  # the first erasure record stands
        elif "\0" in k:
            kid = k.split("\0", 1)[1]
            if v.get("destroyed"):
                entry.keys[kid] = None
                entry.stale.discard(kid)
                return
            master = str(v.get("master", ""))
            entry.keys[kid] = str(v.get("wrapped", ""))
            entry.masters[kid] = master
            current = self._part_master.get(partition)
            live = isinstance(current, MasterRecord) and current.master == master
            if master in self._retired.get(partition, ()) and not live:
                entry.stale.add(kid)
            else:
                entry.stale.discard(kid)

    def run(self, run_id: str, *, refresh: bool = False) -> RunKeys | None:
        """What the store holds for the run (read again from the log when ``refresh`` or
        when the partition was never read)."""
        p = partition_for(run_id, self.partitions)
        with self._lock:
            if refresh or p not in self._read_to:
                self._refresh(p)
            return self._runs.get(p, {}).get(run_id)

    def create(self, run_id: str) -> tuple[str, bytes]:
        """A new key for the run, stored (acknowledged) and read back before it is returned.
        Raises :class:`KeyStoreError` when the run's partition had retired this process's
        master before the key landed and the process holds no newer one (a rotation this
        process has not been given the key of): nothing may be sealed with that key."""
        p = partition_for(run_id, self.partitions)
        key = AESGCM.generate_key(bit_length=256)
        tried: set[str] = set()
        while (master := self._wrapping_master(p)).id not in tried:  # once more only for a newer held master
            tried.add(master.id)
            kid = os.urandom(8).hex()
            name = _record_key(run_id, kid)
            self._append(
                name, {"run_id": run_id, "kid": kid, "master": master.id, "wrapped": master.wrap(name, key)}, p
            )
            self._refresh(p)  # in log order: a master record that came first makes the key stale
            entry = self._runs[p][run_id]
            if kid not in entry.stale:
                return kid, key
        current = self._part_master.get(p)
        raise KeyStoreError(
            f"the master key was rotated (partition {p} of {self.topic} now wraps with master id "
            f"{getattr(current, 'master', '?')}; this process holds {', '.join(self.masters.ids)}): "
            "restart it with the new master key; nothing was sealed with the retired one"
        )

    def _wrapping_master(self, partition: int) -> MasterKey:
        """The master new run keys of ``partition`` are wrapped with: its own master record's,
        else the store's, when this process holds it; else this process's own."""
        for p in (partition, self.home):
            rec = self._part_master.get(p)
            if isinstance(rec, MasterRecord) and rec.master in self.masters:
                return self.masters.by_id[rec.master]
        return self.masters.primary

    def open_key(self, run_id: str, kid: str, entry: RunKeys) -> bytes:
        """The run key ``kid`` in the clear. Raises ``ValueError`` for a damaged record (or
        one no held master opens), :class:`KeyStoreError` for a key wrapped by a master this
        process was not given (a rotation it has not been told of: it must stop, not
        dead-letter what it cannot read)."""
        wrapped = entry.keys.get(kid)
        if not wrapped:
            raise ValueError("no such key")
        named = entry.masters.get(kid, "")
        name = _record_key(run_id, kid)
        if named:
            held = self.masters.get(named)
            if held is None and not self._names_master(named):
                raise ValueError("wrapped by a master key the store never named: damaged")
            if held is None:
                raise KeyStoreError(
                    f"run {run_id!r}: its key {kid} is wrapped by master id {named}, which this process "
                    f"was not given (it holds {', '.join(self.masters.ids)}): the master key was "
                    "rotated; configure the new key"
                )
            return held.unwrap(name, wrapped)
        for held in self.masters.by_id.values():  # a record from before records named their master
            try:
                return held.unwrap(name, wrapped)
            except ValueError:
                continue
        raise ValueError("does not open with any master key given")

    def _names_master(self, master_id: str) -> bool:
        """Whether a master record read so far names ``master_id`` (current or retired)."""
        return any(
            isinstance(r, MasterRecord) and (r.master == master_id or master_id in r.retired)
            for r in self._part_master.values()
        )

    def erase(self, run_id: str, erasure: dict[str, str]) -> dict[str, str]:
        """Record the erasure (the first record stands; it is returned) and destroy every key
        of the run: each key record is replaced, and the old ones purged from the log's
        files (at once on the embedded log; by Kafka's cleaner within the topic's
        ``max.compaction.lag.ms``). Idempotent: a projector finishing an erasure whose
        process died after appending it calls it again."""
        p = partition_for(run_id, self.partitions)
        entry = self.run(run_id, refresh=True)
        if entry is None or entry.erased is None:
            self._append(run_id, {"run_id": run_id, "erased": erasure}, p)
        entry = self.run(run_id)
        assert entry is not None and entry.erased is not None
        for kid, wrapped in list(entry.keys.items()):
            if wrapped is not None:
                self._append(_record_key(run_id, kid), {"run_id": run_id, "kid": kid, "destroyed": True}, p)
        for kid in entry.keys:
            self.log.purge_superseded(self.topic, _record_key(run_id, kid))
        return entry.erased

    def all_runs(self) -> dict[str, RunKeys]:
        for p in range(self.partitions):
            self._refresh(p)
        return {r: k for runs in self._runs.values() for r, k in runs.items()}

    # -- rotation --------------------------------------------------------------------------

    def rotate(self, new: MasterKey) -> Rotation:
        """Rotate to ``new``: every live run key ends wrapped by it, or nothing changes.

        First every live key is opened with the masters this process holds; any that does
        not open stops the rotation before it writes anything (:class:`KeyStoreError` naming
        them). Then a master record naming ``new`` (``rotating``, the old master retired) is
        written to the store's partition and to every other partition, each partition is
        swept (its keys rewrapped, the old records purged), and the store's record is
        marked ``done``. Cut short, the rotation is resumed by running it again with the
        same new key (the old one beside it for the keys not yet rewrapped); another new key
        is refused until it is done."""
        self.masters = MasterKeys([*self.masters.by_id.values(), new])
        rec = self.store_record()
        if rec is None:
            raise KeyStoreError(f"{self.topic} has no master check record: nothing to rotate")
        if rec.master == new.id and rec.state == "done":
            return Rotation(0, sum(len(e.usable()) for e in self.all_runs().values()), resumed=False)
        if rec.state == "rotating" and rec.master != new.id:
            raise KeyStoreError(
                f"a rotation to master id {rec.master} is under way and not finished: finish it "
                "first (`runstate keys rotate` with that key as the new one, the old one "
                "configured); `runstate keys status` says where it stands"
            )
        resumed = rec.master == new.id
        runs = self.all_runs()
        unreadable = []
        for run_id, entry in sorted(runs.items()):
            for kid in entry.usable():
                try:
                    self.open_key(run_id, kid, entry)
                except (ValueError, KeyStoreError) as e:
                    named = entry.masters.get(kid) or "?"
                    why = "damaged" if isinstance(e, ValueError) else f"wrapped by master id {named}, not given"
                    unreadable.append(f"{run_id}/{kid} ({why})")
        if unreadable:
            shown = ", ".join(unreadable[:10]) + (f" and {len(unreadable) - 10} more" if len(unreadable) > 10 else "")
            raise KeyStoreError(
                f"nothing rotated: {len(unreadable)} run key(s) do not open with the master keys "
                f"given: {shown}. Give every master key they name (RUNSTATE_MASTER_KEY takes several, "
                "comma-separated), or repair the damaged records first"
            )
        epoch = rec.epoch if resumed else rec.epoch + 1
        retired = set(rec.retired) | ({rec.master} if not resumed else set())
        marker = MasterRecord.made(new, epoch, "rotating", retired)
        order = [self.home, *(p for p in range(self.partitions) if p != self.home)]
        for p in order:
            self._refresh(p)
            have = self._part_master.get(p)
            if not (isinstance(have, MasterRecord) and have.master == new.id and have.epoch == epoch):
                self._write_master(p, marker)
        rewrapped = already = 0
        for p in order:
            self._refresh(p)  # after the partition's marker: every key written before it is here
            for run_id, entry in list(self._runs.get(p, {}).items()):
                for kid in entry.usable():
                    if entry.masters.get(kid) == new.id:
                        already += 1
                        continue
                    key = self.open_key(run_id, kid, entry)
                    name = _record_key(run_id, kid)
                    self._append(
                        name, {"run_id": run_id, "kid": kid, "master": new.id, "wrapped": new.wrap(name, key)}, p
                    )
                    self.log.purge_superseded(self.topic, name)
                    rewrapped += 1
        self._write_master(self.home, MasterRecord.made(new, epoch, "done", retired))
        self.log.purge_superseded(self.topic, MASTER_RECORD)
        return Rotation(rewrapped, already, resumed)

    def repair(self) -> MasterRecord:
        """Write the store's check record again for this process's master key, after
        checking that key against the run keys: it must open every live key that names it,
        and at least one key (unless the store holds none). Refused while the record stands
        and opens (there is nothing to repair). Raises :class:`KeyStoreError`."""
        try:
            rec = self.store_record()
        except KeyStoreError:
            rec = None
        else:
            if rec is not None and rec.master in self.masters:
                try:
                    if self.masters.by_id[rec.master].unwrap(MASTER_RECORD, rec.check) == _CHECK:
                        raise KeyStoreError(
                            "the master check record is sound and opens with this key: nothing to repair"
                        )
                except ValueError:
                    pass
        key = self.masters.primary
        opened, refused = 0, []
        runs = self.all_runs()
        for run_id, entry in runs.items():
            for kid in entry.usable():
                if entry.masters.get(kid, "") not in ("", key.id):
                    continue
                try:
                    key.unwrap(_record_key(run_id, kid), entry.keys[kid] or "")
                    opened += 1
                except ValueError:
                    refused.append(f"{run_id}/{kid}")
        if refused or (opened == 0 and any(e.usable() for e in runs.values())):
            raise KeyStoreError(
                f"this master key (id {key.id}) is not the store's: it opens {opened} run key(s) and "
                f"not {len(refused) or 'the others'}; nothing written"
            )
        epoch = max((r.epoch for r in self._part_master.values() if isinstance(r, MasterRecord)), default=0)
        fresh = MasterRecord.made(key, epoch + 1, "done", rec.retired if rec is not None else ())
        self._write_master(self.home, fresh)
        return fresh

    def report(self) -> KeyReport:
        """Where the store stands, read from the whole keys topic (never raises for a damaged
        check record: it is among the problems)."""
        problems = []
        try:
            rec = self.store_record()
        except KeyStoreError as e:
            rec, problems = None, [str(e)]
        runs = self.all_runs()
        if rec is None and not problems and self._holds_records():
            problems.append(f"{self.topic} holds run keys but no master check record: `runstate keys repair`")
        by_master: dict[str, int] = {}
        stale = 0
        for entry in runs.values():
            for kid in entry.usable():
                m = entry.masters.get(kid) or "(unnamed)"
                by_master[m] = by_master.get(m, 0) + 1
            stale += sum(1 for k in entry.stale if entry.keys.get(k) is not None)
        behind = []
        if rec is not None:
            for p in range(self.partitions):
                have = self._part_master.get(p)
                if (
                    p != self.home
                    and rec.state == "rotating"
                    and not (isinstance(have, MasterRecord) and have.master == rec.master)
                ):
                    behind.append(p)
        return KeyReport(
            None if rec is None else rec.master,
            0 if rec is None else rec.epoch,
            "damaged" if rec is None and problems else ("empty" if rec is None else rec.state),
            [] if rec is None else list(rec.retired),
            behind,
            by_master,
            stale,
            sum(1 for e in runs.values() if e.erased is not None),
            problems,
        )

    def close(self) -> None:
        self._producer.close()


#: Why a sealed record cannot be opened (the record's header ``runstate-key`` says which).
KEY_ERASED = b"erased"
KEY_MISSING = b"missing"
KEY_DAMAGED = b"damaged"
#: the key was destroyed but the key store holds no erasure record of its run
KEY_DESTROYED = b"destroyed"


class Keyring:
    """The keys one process holds in the clear: bounded (the runs held longest leave first),
    and dropped when the run is erased. Thread-safe."""

    def __init__(self, store: KeyStore, max_runs: int = 100_000) -> None:
        self.store = store
        self._keys: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self._max = max_runs
        self._lock = threading.Lock()

    def for_sealing(self, run_id: str) -> tuple[str, bytes]:
        """The key to seal the run's next record with (its first usable key; made when the
        run has none). Raises :class:`RunErased`, and :class:`KeyStoreError` when the store
        was rotated to a master this process lacks."""
        held = self._keys.get(run_id)
        if held:
            kid = next(iter(held))
            return kid, held[kid]
        entry = self.store.run(run_id, refresh=True)
        if entry is not None and entry.erased is not None:
            raise RunErased(run_id, entry.erased)
        got = self._first_usable(run_id, entry)
        if got is not None:
            return got
        kid, key = self.store.create(run_id)
        return kid, self._hold(run_id, kid, key)

    def _first_usable(self, run_id: str, entry: RunKeys | None) -> tuple[str, bytes] | None:
        for kid in [] if entry is None else entry.usable():
            try:
                return kid, self._hold(run_id, kid, self.store.open_key(run_id, kid, entry))  # type: ignore[arg-type]
            except ValueError:
                continue
        return None

    def for_copies(self, run_id: str) -> tuple[str, bytes] | None:
        """The key to seal a copy of the run's content with (a checkpoint, a decision, a
        dead letter): its live key, or None when the run has none (written before content
        was sealed, or not a run: a coverage record). Raises :class:`RunErased`."""
        with self._lock:
            held = self._keys.get(run_id)
            if held:
                kid = next(iter(held))
                return kid, held[kid]
        entry = self.store.run(run_id)
        if entry is None:
            entry = self.store.run(run_id, refresh=True)
        if entry is not None and entry.erased is not None:
            raise RunErased(run_id, entry.erased)
        return self._first_usable(run_id, entry)

    def for_opening(self, run_id: str, kid: str) -> bytes:
        """The key ``kid`` of the run, or why not: :data:`KEY_ERASED` (only when the key
        store holds the run's erasure record), :data:`KEY_MISSING`, :data:`KEY_DESTROYED`
        or :data:`KEY_DAMAGED` (returned as the value, so that the caller tells them apart
        from a key by its length). Raises :class:`KeyStoreError` for a key wrapped by a
        master this process was not given."""
        held = self._keys.get(run_id)  # the hot path, once per record read: no lock (a dict read is atomic)
        if held is not None:
            key = held.get(kid)
            if key is not None:
                return key
        entry = self.store.run(run_id)
        if entry is None or (entry.erased is None and kid not in entry.keys):
            entry = self.store.run(run_id, refresh=True)  # written since the partition was read
        if entry is None:
            return KEY_MISSING
        if entry.erased is not None:
            return KEY_ERASED
        if kid not in entry.keys or entry.keys[kid] == "":
            return KEY_MISSING
        if entry.keys[kid] is None:
            return KEY_DESTROYED
        try:
            return self._hold(run_id, kid, self.store.open_key(run_id, kid, entry))
        except ValueError:
            return KEY_DAMAGED

    def _hold(self, run_id: str, kid: str, key: bytes) -> bytes:
        with self._lock:
            self._keys.setdefault(run_id, {})[kid] = key
            while len(self._keys) > self._max:
                self._keys.popitem(last=False)
        return key

    def forget(self, run_id: str) -> None:
        """Drop the run's keys from memory (it was erased)."""
        with self._lock:
            self._keys.pop(run_id, None)

    def erase(self, run_id: str, erasure: dict[str, str]) -> dict[str, str]:
        self.forget(run_id)
        return self.store.erase(run_id, erasure)


#: The key store's name for the checkpoint keys: not a run id (run ids hold no control
#: characters), so no run shares them and none can erase them.
CHECKPOINT_KEYS = "\x01checkpoints"


class CheckpointSigner:
    """Signs checkpoints with a random key kept in the key store like a run key (wrapped by
    the master key, rewrapped by a rotation), and names it in the signature (``kid:hmac``):
    a rotation leaves every checkpoint verifiable, and a forged checkpoint with a
    recomputed digest is refused."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    def sign(self, digest: str) -> str:
        kid, key = self.keyring.for_sealing(CHECKPOINT_KEYS)
        return f"{kid}:{hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()}"

    def verify(self, digest: str, signature: str) -> bool:
        kid, _, mac = signature.partition(":")
        if not mac:
            return False
        try:
            key = self.keyring.for_opening(CHECKPOINT_KEYS, kid)
        except KeyStoreError:
            return False
        if len(key) != sealed.KEY_BYTES:
            return False
        return hmac.compare_digest(mac.encode(), hmac.new(key, digest.encode(), hashlib.sha256).hexdigest().encode())
