"""The Schema Registry client's own bounds, against a registry that accepts connections and
never answers (a stalled process, a half-open connection): no broker needed."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from runstate.eventlog.base import TopicNames
from runstate.eventlog.registry import RegistryFraming
from runstate.schemas.errors import LogConfigError

pytest.importorskip("confluent_kafka.schema_registry")


def test_a_registry_that_never_answers_is_a_clear_error_not_a_hang() -> None:
    """confluent-kafka's registry client waits for an answer without end unless given a
    timeout: a stalled registry then held serve's start (and a projector's lookup of a new
    schema id) for good, silently. With runstate's default bound, its retries end in the
    error that names the registry."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/apis/ccompat/v7"
    framing = RegistryFraming(url, TopicNames())
    outcome: list[BaseException | None] = []

    def prepare() -> None:
        try:
            framing.prepare()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t0 = time.monotonic()
    worker = threading.Thread(target=prepare, daemon=True)
    worker.start()
    worker.join(90)
    try:
        assert not worker.is_alive(), "prepare() still waiting on a registry that never answers after 90 s"
        print(f"answered after {time.monotonic() - t0:.1f}s")
        assert isinstance(outcome[0], LogConfigError), outcome
        assert "cannot reach the schema registry" in str(outcome[0]) and url in str(outcome[0])
    finally:
        listener.close()
        for conn in held:
            conn.close()
