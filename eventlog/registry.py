"""Records in the Confluent Schema Registry's framing, so that Kafka's own tools read runstate's topics.

On Kafka with ``RUNSTATE_SCHEMA_REGISTRY_URL`` set, a record that runstate writes in Avro's
single-object encoding (``C3 01`` + the schema's 8-byte fingerprint + the Avro body) goes to
the topic as the registry's wire format instead (``00`` + the registered schema's 4-byte
big-endian id + the same Avro body): Kafka Connect's ``AvroConverter``, ksqlDB, Flink's
``avro-confluent``, the consoles and confluent-kafka's ``AvroDeserializer`` read it. The body
is not touched, so the swap costs a dictionary lookup and a copy of the record.

Which schemas, under which subjects:

- the events topic: patches (``runstate.v.Patch``) and, with sealing on, their envelopes
  (``runstate.v.Sealed``); the decisions topic: decisions (``runstate.v.Decision``) and their
  envelopes. One topic holds more than one record type, so the subject is
  ``<topic>-<record name>`` (Confluent's ``TopicRecordNameStrategy``): the registry checks
  each type's evolution on its own, and two deployments with other topic prefixes never
  share a subject.
- the checkpoints topic: runstate's own binary pieces and heads, each wrapped in a record of
  one ``bytes`` field (``runstate.v.CheckpointRecord``): a registry-aware consumer reads them
  (and an archive keeps them); what the bytes mean is runstate's (docs/checkpoints.md).
- the keys topic and the dead letters stay as they are: the keys topic is runstate's
  internal state, and a dead letter carries the bytes that came, whatever they were.

A subject's compatibility is raised to ``BACKWARD`` where it is weaker (what runstate's
schema evolution guarantees: a new version reads every older one); a stricter one is kept.
A schema the registry refuses (incompatible) stops the process at start, with the
registry's reason.

Readers take both framings, record by record: a topic moved from one to the other, with
both kinds of record in it, replays as it was written. An id that is not one of
runstate's schemas is left as it came: the decoder then names it (a dead letter). While
the registry cannot be reached, a record whose id this process has not seen yet is held
(retried, logged), never skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from runstate.eventlog.base import TopicNames
from runstate.schemas.codec import KINDS, MAGIC, NAMESPACE, published, schema_fingerprint
from runstate.schemas.errors import LogConfigError

log = logging.getLogger(__name__)

#: The first byte of a record in the registry's wire format.
CONFLUENT_MAGIC = b"\x00"
#: The checkpoints topic's wrapper: runstate's own bytes as one Avro ``bytes`` field.
CHECKPOINT_RECORD_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": f"{NAMESPACE}.CheckpointRecord",
    "doc": "A runstate checkpoint piece or head, as runstate wrote it (docs/checkpoints.md)",
    "fields": [{"name": "body", "type": "bytes"}],
}
#: Compatibility levels that keep what runstate's evolution needs (a new reader reads old data).
KEEPS_BACKWARD = frozenset({"BACKWARD", "BACKWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"})
#: How a checkpoint head written without the framing starts (``snapshotter.pieces.HEAD_MAGIC``):
#: its first byte is the framing's, but no registry gives out ids that high.
RAW_HEAD = b"\x00rsh"
#: How long a read waits between two tries of a registry it cannot reach.
RETRY_S = 2.0
#: Seconds a registry request may take (confluent-kafka's client, which tries a request four
#: times, has no bound of its own: a registry that accepts and never answers held a caller for good).
REGISTRY_TIMEOUT_S = 5.0

_WRAPPED = "checkpoint"
_UNSEEN = object()


def _varint(n: int) -> bytes:
    """Avro's zig-zag variable-length long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _record_name(schema: dict[str, Any]) -> str:
    return str(schema["name"])


class RegistryFraming:
    """The registry's wire format for one deployment's topics (see the module's doc).

    ``url``: the registry's Confluent-compatible API (Apicurio: ``.../apis/ccompat/v7``);
    ``conf``: confluent-kafka's ``SchemaRegistryClient`` settings besides ``url``
    (``basic.auth.user.info``, ``ssl.ca.location``, ...); ``register``: register the
    schemas (off: look them up, for deployments whose producers may not register)."""

    def __init__(self, url: str, topics: TopicNames, conf: dict[str, Any] | None = None, *, register: bool = True):
        self.url = url
        self.topics = topics
        self.conf = dict(conf or {})
        self.register = register
        self._lock = threading.Lock()
        self._client: Any = None
        #: (topic, fingerprint or _WRAPPED) -> the id records of it are written with
        self._ids: dict[tuple[str, bytes | str], int] = {}
        #: id -> what a record of it becomes (the single-object header, or _WRAPPED), None:
        #: not one of runstate's schemas
        self._known: dict[int, bytes | str | None] = {}
        self._prepared = False

    def describe(self) -> str:
        return f"schema registry {self.url}"

    # -- the registry ----------------------------------------------------------------------

    def _registry(self) -> Any:
        if self._client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as e:
                raise LogConfigError(
                    f"RUNSTATE_SCHEMA_REGISTRY_URL needs confluent-kafka's registry client ({e}): "
                    "pip install 'runstate[registry]'"
                ) from e
            try:
                self._client = SchemaRegistryClient({"url": self.url, "timeout": REGISTRY_TIMEOUT_S, **self.conf})
            except Exception as e:  # a bad setting: the client's own message says which
                raise LogConfigError(f"cannot use the schema registry at {self.url}: {e}") from e
        return self._client

    def _schemas(self) -> list[tuple[str, bytes | str, dict[str, Any]]]:
        """(topic, what its records are, schema) of every schema this code writes."""
        out: list[tuple[str, bytes | str, dict[str, Any]]] = []
        for topic, kinds in (
            (self.topics.events, ("patch", "sealed")),
            (self.topics.decisions, ("decision", "sealed")),
        ):
            for kind in kinds:
                w = max(published(kind).values(), key=lambda w: w.version)
                assert w.schema is not None
                out.append((topic, w.fingerprint, w.schema))
        out.append((self.topics.checkpoints, _WRAPPED, CHECKPOINT_RECORD_SCHEMA))
        return out

    def prepare(self) -> None:
        """Register (or look up) the schemas this code writes, each under its subject, with
        the subject's compatibility at least ``BACKWARD`` (once per process). Raises
        :class:`LogConfigError`: the registry is unreachable, refuses a schema (its reason),
        or does not hold one that must be looked up."""
        with self._lock:
            if self._prepared:
                return
            client = self._registry()  # first: it names the extra to install where the client is missing
            from confluent_kafka.schema_registry import Schema
            from confluent_kafka.schema_registry.error import SchemaRegistryError

            for topic, what, schema in self._schemas():
                subject = f"{topic}-{_record_name(schema)}"
                text = json.dumps(schema)
                try:
                    if self.register:
                        level = self._compatibility(subject)
                        if str(level).upper() not in KEEPS_BACKWARD:
                            client.set_compatibility(subject, "BACKWARD")
                        sid = client.register_schema(subject, Schema(text, "AVRO"))
                    else:
                        sid = client.lookup_schema(subject, Schema(text, "AVRO")).schema_id
                except SchemaRegistryError as e:
                    if e.http_status_code == 409:
                        raise LogConfigError(
                            f"the schema registry at {self.url} refuses {_record_name(schema)} under subject "
                            f"{subject!r} (not compatible with the versions registered before): {e.error_message}. "
                            "runstate does not start: a schema it cannot register could not be read by the "
                            "topic's other consumers"
                        ) from e
                    if e.http_status_code == 404 and not self.register:
                        raise LogConfigError(
                            f"the schema registry at {self.url} does not hold {_record_name(schema)} under "
                            f"{subject!r}, and this process may not register it "
                            "(RUNSTATE_SCHEMA_REGISTRY_REGISTER=false): register it once from a process that may"
                        ) from e
                    raise LogConfigError(f"the schema registry at {self.url} answered {e}") from e
                except Exception as e:  # unreachable (connection refused, TLS, timeout)
                    raise LogConfigError(
                        f"cannot reach the schema registry at {self.url} ({type(e).__name__}: {e}): is it running, "
                        "and is RUNSTATE_SCHEMA_REGISTRY_URL its Confluent-compatible API?"
                    ) from e
                self._ids[(topic, what)] = sid
                self._known[sid] = MAGIC + what if isinstance(what, bytes) else what
            self._prepared = True

    def _compatibility(self, subject: str) -> str:
        """The subject's compatibility level, the registry's global one where the subject has none."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return str(self._registry().get_compatibility(subject))
        except SchemaRegistryError as e:
            if e.http_status_code != 404:
                raise
            return str(self._registry().get_compatibility())

    def _resolve(self, sid: int) -> bytes | str | None:
        """What a record of schema ``sid`` becomes: fetched from the registry once, then
        known. Waits (retrying, logging) while the registry cannot be reached."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        waited = 0.0
        while True:
            try:
                text = self._registry().get_schema(sid).schema_str
                break
            except SchemaRegistryError as e:
                if e.http_status_code == 404:
                    self._known[sid] = None
                    return None
                problem: Exception = e
            except Exception as e:  # unreachable: hold the record, never skip it
                problem = e
            if waited == 0 or waited % 30 < RETRY_S:
                log.warning(
                    "cannot read schema %d from the schema registry at %s (%s): the record waits",
                    sid,
                    self.url,
                    problem,
                )
            time.sleep(RETRY_S)
            waited += RETRY_S
        self._known[sid] = got = _ours(text)
        return got

    # -- the wire ---------------------------------------------------------------------------

    def wrap(self, topic: str, value: bytes) -> bytes:
        """``value`` as written to ``topic`` in the registry's framing (unchanged for a
        topic or record this framing leaves as it is)."""
        if topic == self.topics.checkpoints:
            sid = self._ids.get((topic, _WRAPPED))
            if sid is None:
                self.prepare()
                sid = self._ids[(topic, _WRAPPED)]
            return CONFLUENT_MAGIC + sid.to_bytes(4, "big") + _varint(len(value)) + value
        if value[:2] != MAGIC or len(value) < 10:
            return value
        sid = self._ids.get((topic, value[2:10]))
        if sid is None:
            sid = self._register_writer(topic, value[2:10])
            if sid is None:
                return value
        return CONFLUENT_MAGIC + sid.to_bytes(4, "big") + value[10:]

    def _register_writer(self, topic: str, fp: bytes) -> int | None:
        """The id of an older published schema a record is written with (a copy of old
        records), registered under the topic's subject for its record name."""
        self.prepare()
        if (topic, fp) in self._ids:
            return self._ids[(topic, fp)]
        for kind in KINDS:
            w = published(kind).get(fp)
            if w is not None and w.schema is not None:
                from confluent_kafka.schema_registry import Schema

                subject = f"{topic}-{_record_name(w.schema)}"
                sid = int(self._registry().register_schema(subject, Schema(json.dumps(w.schema), "AVRO")))
                self._ids[(topic, fp)] = sid
                self._known[sid] = MAGIC + fp
                return sid
        return None

    def unwrap(self, topic: str, value: bytes) -> bytes:
        """A record as runstate reads it: one in the registry's framing becomes what it was
        written as; any other comes back as it is."""
        if len(value) < 5 or value[0] != 0 or value[:4] == RAW_HEAD:
            return value
        sid = int.from_bytes(value[1:5], "big")
        what = self._known.get(sid, _UNSEEN)
        if what is _UNSEEN:
            what = self._resolve(sid)
        if what is None:
            return value
        if what == _WRAPPED:
            try:
                n, pos = _read_varint(value, 5)
            except IndexError:
                return value
            return value[pos : pos + n] if pos + n == len(value) else value
        assert isinstance(what, bytes)
        return b"".join((what, memoryview(value)[5:]))  # one copy

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # closing a client that never connected
                pass


def _ours(text: str) -> bytes | str | None:
    """The single-object header of a registered schema's text when it is one of runstate's
    published schemas (by its fingerprint: the registry may keep the text otherwise
    spaced), ``_WRAPPED`` for the checkpoints' wrapper, else None."""
    try:
        fp = schema_fingerprint(json.loads(text))
    except Exception:  # not Avro, or not a schema: not ours
        return None
    if fp == schema_fingerprint(CHECKPOINT_RECORD_SCHEMA):
        return _WRAPPED
    if any(fp in published(kind) for kind in KINDS):
        return MAGIC + fp
    return None
