"""What the Kafka benchmarks share: a broker to measure against."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def kafka_broker() -> Iterator[tuple[str, int | None]]:
    """``(bootstrap, the broker process's pid)``: ``RUNSTATE_BENCH_KAFKA`` if set (pid None),
    else a single-node broker of its own (runstate.compose.kafka_local), stopped and its
    log (hundreds of MB) removed at the end."""
    given = os.environ.get("RUNSTATE_BENCH_KAFKA")
    if given:
        yield given, None
        return
    from runstate.compose.kafka_local import LocalKafka

    broker_dir = tempfile.mkdtemp(prefix="runstate-bench-kafka-")
    broker = LocalKafka(broker_dir)
    try:
        bootstrap = broker.start()
        print(f"started a local broker at {bootstrap}", flush=True)
        yield bootstrap, broker.proc.pid if broker.proc is not None else None
    finally:
        broker.stop()
        shutil.rmtree(broker_dir, ignore_errors=True)
