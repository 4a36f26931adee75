"""The state directory: ``<state_dir>/layout.json`` (which log, topic and partition count
the projections follow) + one projection store per partition (``p000``, ``p001``, ...)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from runstate.eventlog.partitioner import partition_for
from runstate.schemas.errors import StoreError

LAYOUT_VERSION = 1


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as temp file -> fsync -> rename -> fsync(dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def check_state_dir(state_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`StoreError` naming ``state_dir`` when it exists and is not a directory
    (it is created when missing)."""
    path = Path(state_dir)
    if path.exists() and not path.is_dir():
        raise StoreError(
            f"the state directory {str(path)!r} is a file, not a directory: point --state-dir "
            "(RUNSTATE_STATE_DIR) at a directory; it is created if missing"
        )


class Layout:
    """The projection directory of one events topic."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        check_state_dir(state_dir)
        self.root = Path(state_dir)
        self.file = self.root / "layout.json"
        #: (topic, partitions) once read: they never change for a state directory (``ensure``
        #: refuses another layout), and queries ask for them on every call.
        self._read: tuple[str, int] | None = None

    def ensure(self, topic: str, partitions: int, log_id: str) -> None:
        """Record (or check) which log (its identity), topic and partition count these
        projections follow.

        Raises :class:`StoreError` if the directory holds projections of another log or
        layout: a log re-created or swapped is never projected on top of the old state.
        """
        if self.file.exists():
            have = self._load()
            if have.get("topic") != topic or have.get("partitions") != partitions:
                raise StoreError(
                    f"{self.root} holds projections of topic {have.get('topic')!r} with "
                    f"{have.get('partitions')} partitions; the log has {topic!r} with {partitions}. "
                    "Use another --state-dir or delete this one to rebuild from the log."
                )
            if have.get("log_id") is None:  # written before logs had identities: adopt this one
                write_atomic(self.file, json.dumps({**have, "log_id": log_id}).encode())
            elif have["log_id"] != log_id:
                raise StoreError(
                    f"{self.root} holds projections of log {have['log_id']}, but the log is {log_id} "
                    "(re-created, or another log under the same name). Point --log at the log these "
                    "projections follow, or use another --state-dir (or delete this one) to rebuild."
                )
            return
        body = {"version": LAYOUT_VERSION, "topic": topic, "partitions": partitions, "log_id": log_id}
        write_atomic(self.file, json.dumps(body).encode())

    def read(self) -> tuple[str, int]:
        if self._read is not None:
            return self._read
        if not self.file.exists():
            raise StoreError(f"no projections in {self.root} (run `runstate project` first)")
        have = self._load()
        try:
            self._read = (str(have["topic"]), int(have["partitions"]))
        except (KeyError, TypeError, ValueError) as e:
            raise self._damaged(f"no {e}") from e
        return self._read

    def _load(self) -> dict[str, Any]:
        """The layout file's JSON object. Raises :class:`StoreError` naming the file when it is not one."""
        try:
            have = json.loads(self.file.read_bytes())
        except (OSError, ValueError) as e:
            raise self._damaged(str(e)) from e
        if not isinstance(have, dict):
            raise self._damaged("not a JSON object")
        return have

    def _damaged(self, why: str) -> StoreError:
        return StoreError(
            f"{self.file} is not a layout file ({why}): restore it, or delete {self.root} to rebuild "
            "the projections from the log"
        )

    def store_path(self, partition: int) -> Path:
        return self.root / f"p{partition:03d}"

    def partition_of(self, run_id: str) -> int:
        return partition_for(run_id, self.read()[1])
