"""Coverage-guided fuzz targets (atheris, libFuzzer's engine) for runstate's input edges.

    python tests/fuzz_targets.py TARGET [libFuzzer options] [corpus dirs]

The property of every target: each input is accepted, rejected with a typed error (a
:class:`~runstate.schemas.errors.RunstateError`) or dead-lettered: never another exception.
A hang is caught by libFuzzer's ``-timeout``. ``tests/test_fuzz.py`` runs each target for
seconds on its checked-in corpus (``tests/data/fuzz/TARGET``); ``scripts/fuzz.sh`` runs one
for as long as asked. A crash found becomes a regression test of its own.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["runstate"]):
    import orjson

    from runstate.app import unencodable
    from runstate.eventlog.base import Record
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.eventlog.keystore import Keyring, KeyStore, MasterKey
    from runstate.eventlog.sealed import SealedLog
    from runstate.producers.run_producer import RunProducer
    from runstate.projector.core.outcomes import DeadLetter, Erased
    from runstate.projector.core.runbook import read_record
    from runstate.schemas import codec, sealed
    from runstate.schemas.errors import ContractError, RunstateError
    from runstate.schemas.generated.structs import Patch
    from runstate.schemas.patch import Author, parse_draft
    from runstate.snapshotter.checkpoint import validate, validate_coverage


def record_decoder(data: bytes) -> None:
    """A log record's value (the events topic), under a key that may or may not be its run."""
    got = read_record(Record("runstate.events", 0, 7, b"r", data, 0, (), checksum_ok=True))
    assert isinstance(got, Patch | DeadLetter), got


def patch_parser(data: bytes) -> None:
    """A patch file or a body's JSON, as the CLI and serve read it."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return  # the callers answer this one themselves (a ContractError naming the file)
    try:
        parse_draft(parsed, where="fuzz.json")
    except RunstateError:
        pass


def checkpoint_reader(data: bytes) -> None:
    """A record of the checkpoints topic: a run's checkpoint or a partition's coverage."""
    for read in (lambda: validate(data), lambda: validate(data, b"k" * 32), lambda: validate_coverage(data, 0)):
        try:
            read()
        except RunstateError:
            pass


_producer: RunProducer | None = None


def http_body(data: bytes) -> None:
    """A ``POST /runs/{id}/patches`` body through what serve does before appending: JSON,
    the encodable check, the completed patch, its record (the size limit)."""
    global _producer
    if _producer is None:
        log = EmbeddedLog(Path(tempfile.mkdtemp()) / "log.db", partitions=1)
        _producer = RunProducer(log, Author(agent_id="fuzz", agent_version="1"))
    try:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ContractError(f"not JSON: {e}") from e
        if unencodable(parsed) is None:
            _producer.encode(_producer.build("fuzz-run", parsed))
    except RunstateError:
        pass


_sealed: SealedLog | None = None


def sealed_record(data: bytes) -> None:
    """A record of the events topic of a log whose content is sealed: the bytes as they
    come, and after a sealed record's header (so that the engine explores sealed bodies),
    opened by the log and read by the projector's core."""
    global _sealed
    if _sealed is None:
        inner = EmbeddedLog(Path(tempfile.mkdtemp()) / "log.db", partitions=1)
        _sealed = SealedLog(inner, Keyring(KeyStore(inner, MasterKey(b"m" * 32))))
    for value in (data, codec.MAGIC + sealed._writer().fingerprint + data):
        rec = _sealed.open(Record("runstate.events", 0, 7, b"r", value, 0, (), checksum_ok=True))
        got = read_record(rec)
        assert isinstance(got, Patch | DeadLetter | Erased), got


TARGETS: dict[str, Callable[[bytes], None]] = {
    "record_decoder": record_decoder,
    "patch_parser": patch_parser,
    "checkpoint_reader": checkpoint_reader,
    "http_body": http_body,
    "sealed_record": sealed_record,
}


def main() -> None:
    name = sys.argv[1]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
