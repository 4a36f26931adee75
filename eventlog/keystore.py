"""Run keys: one AES-256 key per run, wrapped by the operator's master key, kept in a
compacted topic of the log (``<prefix>.keys``), and destroyed to erase a run.

Records of the keys topic (JSON; keyed so that compaction keeps what must stay):

- ``<run>\\0<key id>`` → ``{"run_id", "kid", "master", "wrapped"}``: one key of a run, AES-GCM
  wrapped by the master key named by ``master`` (its id, not the key). A run may have
  several keys (two producers that started it at once each made one); every sealed record
  names the key it was sealed with. Destroyed: replaced by ``{"run_id", "kid", "destroyed": true}``.
- ``<run>`` → ``{"run_id", "erased": {"at", "by", "reason"}}``: the run was erased.
- ``__master__`` → ``{"master", "check"}``: which master key the store is written with;
  a process given another key refuses to start.

Every record of a run lives on the run's partition number (the events topic's), so a
projector reads the keys of the partitions it owns, not the whole topic.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runstate.eventlog.base import EventLog
from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import KeyStoreError, LogConfigError, RunErased

MASTER_RECORD = "__master__"
_CHECK = b"runstate master key check"


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
            raise KeyStoreError(f"{where} is not a master key: give 64 hex digits (32 random bytes), "
                                "e.g. from `runstate keys generate`")  # fmt: skip
        return cls(raw)

    @classmethod
    def from_file(cls, path: str) -> MasterKey:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise KeyStoreError(f"cannot read the master key file {path}: {e.strerror}") from e
        return cls.parse(text, where=f"master key file {path}")

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


@dataclass
class RunKeys:
    """What the key store holds for one run."""

    #: key id -> wrapped key (None: destroyed), in the order they were written
    keys: dict[str, str | None]
    #: the erasure record, or None
    erased: dict[str, str] | None = None


def _record_key(run_id: str, kid: str) -> str:
    return f"{run_id}\0{kid}"


class KeyStore:
    """The keys topic, read per partition into memory as needed. Thread-safe."""

    def __init__(self, log: EventLog, master: MasterKey) -> None:
        self.log = log
        self.master = master
        self.topic = log.topics.keys
        try:
            self.partitions = log.partitions(self.topic)
        except LogConfigError as e:
            raise LogConfigError(f"{e}. Content is sealed (a master key is configured), which needs the keys "
                                 "topic: `runstate topics create` makes it") from e  # fmt: skip
        self._runs: dict[int, dict[str, RunKeys]] = {}
        self._read_to: dict[int, int] = {}
        self._lock = threading.RLock()
        self._masters: dict[int, dict[str, Any]] = {}
        self._producer = log.producer()
        self._check_master()

    def _check_master(self) -> None:
        """Refuse a master key other than the one the store was written with; write the
        check record on first use."""
        p = partition_for(MASTER_RECORD, self.partitions)
        self._refresh(p)
        rec = self._masters.get(p)
        if rec is None:
            self._append(MASTER_RECORD, {"master": self.master.id, "check": self.master.wrap(MASTER_RECORD, _CHECK)})
            return
        ok = rec.get("master") == self.master.id
        if ok:
            try:
                ok = self.master.unwrap(MASTER_RECORD, str(rec.get("check"))) == _CHECK
            except ValueError:
                ok = False
        if not ok:
            raise KeyStoreError(f"the master key (id {self.master.id}) is not the one {self.topic} was written with "
                                f"(id {rec.get('master')}); give that key, or rotate to this one with "
                                "`runstate keys rotate`")  # fmt: skip

    def _append(self, key: str, value: dict[str, Any], run_id: str | None = None) -> None:
        p = partition_for(run_id if run_id is not None else key, self.partitions)
        raw = orjson.dumps(value)
        self._producer.append(self.topic, key, raw, partition=p)
        with self._lock:
            # What this process wrote, known without reading the partition again (folding
            # is idempotent: the next refresh reads the record once more, to the same effect).
            self._fold(p, self._runs.setdefault(p, {}), key.encode(), raw)

    def _refresh(self, partition: int) -> None:
        """Read the partition's new records (from where it was read to)."""
        with self._lock:
            start = self._read_to.get(partition, 0)
            end = self.log.end_offsets(self.topic).get(partition, 0)
            runs = self._runs.setdefault(partition, {})
            for rec in self.log.scan(self.topic, partition, start, end):
                self._fold(partition, runs, rec.key, rec.value)
            self._read_to[partition] = max(start, end)

    def _fold(self, partition: int, runs: dict[str, RunKeys], key: bytes | None, value: bytes) -> None:
        try:
            k = (key or b"").decode()
            v = orjson.loads(value)
        except (UnicodeDecodeError, orjson.JSONDecodeError):
            return  # a damaged record: the keys it held are missing, and their runs say so
        if not isinstance(v, dict):
            return
        if k == MASTER_RECORD:
            self._masters[partition] = v
            return
        run_id = str(v.get("run_id", k.split("\0", 1)[0]))
        entry = runs.setdefault(run_id, RunKeys({}))
        if "erased" in v and "\0" not in k:
            entry.erased = entry.erased or v["erased"]  # the first erasure record stands
        elif "\0" in k:
            kid = k.split("\0", 1)[1]
            entry.keys[kid] = None if v.get("destroyed") else str(v.get("wrapped", ""))

    def run(self, run_id: str, *, refresh: bool = False) -> RunKeys | None:
        """What the store holds for the run (read again from the log when ``refresh`` or
        when the partition was never read)."""
        p = partition_for(run_id, self.partitions)
        with self._lock:
            if refresh or p not in self._read_to:
                self._refresh(p)
            return self._runs.get(p, {}).get(run_id)

    def create(self, run_id: str) -> tuple[str, bytes]:
        """A new key for the run, stored (acknowledged) before it is returned."""
        key = AESGCM.generate_key(bit_length=256)
        kid = os.urandom(8).hex()
        self._append(_record_key(run_id, kid), {"run_id": run_id, "kid": kid, "master": self.master.id,
                                                "wrapped": self.master.wrap(_record_key(run_id, kid), key)},
                     run_id)  # fmt: skip
        return kid, key

    def unwrap(self, run_id: str, kid: str, wrapped: str) -> bytes:
        """Raises ``ValueError`` for a damaged record or another master key."""
        return self.master.unwrap(_record_key(run_id, kid), wrapped)

    def erase(self, run_id: str, erasure: dict[str, str]) -> dict[str, str]:
        """Record the erasure (the first record stands; it is returned) and destroy every key
        of the run: each key record is replaced, and the old ones purged from the log's
        files (at once on the embedded log; by Kafka's cleaner within the topic's
        ``max.compaction.lag.ms``). The caller has just read the run's partition
        (:meth:`SealedLog.erase`)."""
        entry = self.run(run_id)
        if entry is None or entry.erased is None:
            self._append(run_id, {"run_id": run_id, "erased": erasure})
        entry = self.run(run_id)
        assert entry is not None and entry.erased is not None
        for kid, wrapped in list(entry.keys.items()):
            if wrapped is not None:
                self._append(_record_key(run_id, kid), {"run_id": run_id, "kid": kid, "destroyed": True}, run_id)
        for kid in entry.keys:
            self.log.purge_superseded(self.topic, _record_key(run_id, kid))
        return entry.erased

    def all_runs(self) -> dict[str, RunKeys]:
        for p in range(self.partitions):
            self._refresh(p)
        return {r: k for runs in self._runs.values() for r, k in runs.items()}

    def rewrap(self, new: MasterKey) -> int:
        """Wrap every live key with ``new`` (master key rotation); returns how many. The
        check record is written last: a rotation cut short is run again with the old key."""
        n = 0
        for run_id, entry in self.all_runs().items():
            for kid, wrapped in entry.keys.items():
                if wrapped is None:
                    continue
                try:
                    key = self.unwrap(run_id, kid, wrapped)
                except ValueError:
                    continue  # already wrapped by the new key (a rotation run again), or damaged
                name = _record_key(run_id, kid)
                self._append(name, {"run_id": run_id, "kid": kid, "master": new.id, "wrapped": new.wrap(name, key)},
                             run_id)  # fmt: skip
                self.log.purge_superseded(self.topic, name)
                n += 1
        self._append(MASTER_RECORD, {"master": new.id, "check": new.wrap(MASTER_RECORD, _CHECK)})
        self.log.purge_superseded(self.topic, MASTER_RECORD)
        return n

    def close(self) -> None:
        self._producer.close()


#: Why a sealed record cannot be opened (the record's header ``runstate-key`` says which).
KEY_ERASED = b"erased"
KEY_MISSING = b"missing"
KEY_DAMAGED = b"damaged"


class Keyring:
    """The keys one process holds in the clear: bounded (the runs held longest leave first),
    and dropped when the run is erased. Thread-safe."""

    def __init__(self, store: KeyStore, max_runs: int = 100_000) -> None:
        self.store = store
        self._keys: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self._max = max_runs
        self._lock = threading.Lock()

    def for_sealing(self, run_id: str) -> tuple[str, bytes]:
        """The key to seal the run's next record with (its first live key; made when the run
        has none). Raises :class:`RunErased`."""
        held = self._keys.get(run_id)
        if held:
            kid = next(iter(held))
            return kid, held[kid]
        entry = self.store.run(run_id, refresh=True)
        if entry is not None and entry.erased is not None:
            raise RunErased(run_id, entry.erased)
        if entry is not None:
            for kid, wrapped in entry.keys.items():
                if wrapped is not None:
                    try:
                        return kid, self._hold(run_id, kid, self.store.unwrap(run_id, kid, wrapped))
                    except ValueError:
                        continue
        kid, key = self.store.create(run_id)
        return kid, self._hold(run_id, kid, key)

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
        for kid, wrapped in ({} if entry is None else entry.keys).items():
            if wrapped is not None:
                try:
                    return kid, self._hold(run_id, kid, self.store.unwrap(run_id, kid, wrapped))
                except ValueError:
                    continue
        return None

    def for_opening(self, run_id: str, kid: str) -> bytes:
        """The key ``kid`` of the run, or why not: :data:`KEY_ERASED`, :data:`KEY_MISSING`
        or :data:`KEY_DAMAGED` (returned as the value, so that the caller tells the three
        apart from a key by its length)."""
        held = self._keys.get(run_id)  # the hot path, once per record read: no lock (a dict read is atomic)
        if held is not None:
            key = held.get(kid)
            if key is not None:
                return key
        entry = self.store.run(run_id)
        if entry is None or (entry.erased is None and kid not in entry.keys):
            entry = self.store.run(run_id, refresh=True)  # written since the partition was read
        if entry is not None and entry.erased is not None:
            return KEY_ERASED
        wrapped = None if entry is None else entry.keys.get(kid, "")
        if wrapped is None:
            return KEY_ERASED
        if not wrapped:
            return KEY_MISSING
        try:
            return self._hold(run_id, kid, self.store.unwrap(run_id, kid, wrapped))
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
