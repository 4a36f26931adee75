"""Scale-out: one against two projector processes on the same Kafka topic, in one run, and a
model of the curve to 8 and 32 instances from the per-record costs measured here.

    .venv/bin/python bench/bench_scaleout.py            # starts its own broker
    .venv/bin/python bench/bench_scaleout.py --quick
    RUNSTATE_BENCH_KAFKA=127.0.0.1:9092 .venv/bin/python bench/bench_scaleout.py

A topic of 8 partitions is filled at the producer's native speed (records encoded once, sent
by confluent-kafka) with two-event patches over 1,000 runs. Then ``runstate project
--until-caught-up`` drains it: one process, then two processes of the same consumer group
(sharing the state directory, each opening the stores of its own partitions), each on a
fresh group, alternated over the rounds. Printed: events/s of each, the speed-up, and where
the time goes: each projector's CPU seconds per record (its own process's), the broker's
(the broker process's CPU over the same drain), and what is left of the wall time.

The model: k instances, each with a core of its own and at least one partition, each paying
the per-record CPU measured here; the broker (or cluster) paying its per-record CPU, on cores
of its own. Rate(k) = min(k / projector cost, brokers / broker cost): linear until the
brokers are the limit; rebalances, the network between machines and skew between partitions
are not in it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer

from benchkit import AUTHOR, TRUST, kafka_broker, scratch

from runstate.eventlog.base import TopicNames
from runstate.eventlog.kafka import PRODUCER_DEFAULTS, KafkaLog
from runstate.schemas.codec import encode
from runstate.schemas.patch import Patch

T0 = datetime(2026, 11, 2, tzinfo=UTC)
PARTITIONS = 8


def fill(bootstrap: str, topics: TopicNames, runs: int, per_run: int) -> int:
    log = KafkaLog(bootstrap, topics=topics)
    log.create_topics(PARTITIONS)
    log.close()
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS})
    events = 0
    for i in range(per_run + 1):
        for r in range(runs):
            run = f"run-{r:05d}"
            evs = (
                [{"type": "RunStarted", "goal": {"statement": "scale"}, "policy": TRUST}]
                if i == 0
                else [
                    {
                        "type": "FactConfirmed",
                        "fact": {"id": f"f{i}", "statement": f"observation {i}", "evidence": f"artifact://o/{i}"},
                    },
                    {"type": "BudgetConsumed", "tokens": 10},
                ]
            )
            patch = Patch.model_validate(
                {
                    "patch_id": f"{run}-{i}",
                    "run_id": run,
                    "expected_revision": i,
                    "events": evs,
                    "author": AUTHOR,
                    "created_at": T0 + timedelta(seconds=i),
                }
            )
            events += len(evs)
            while True:
                try:
                    p.produce(topics.events, encode(patch), run.encode())
                    break
                except BufferError:
                    p.poll(0.1)
        p.poll(0)
    assert p.flush(120) == 0
    return events


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(
    bootstrap: str, topics: TopicNames, state: Path, instances: int, broker_pid: int | None
) -> tuple[float, list[float], float]:
    """Wall seconds until every instance exited, each instance's CPU seconds, the broker's."""
    env = {
        **os.environ,
        "RUNSTATE_LOG": f"kafka://{bootstrap}",
        "RUNSTATE_STATE_DIR": str(state),
        "RUNSTATE_TOPIC_PREFIX": topics.events.rsplit(".", 1)[0],
        "RUNSTATE_GROUP_ID": f"g{uuid.uuid4().hex[:8]}",
        "RUNSTATE_PUBLISH_DECISIONS": "false",
    }
    code = (
        "import resource, sys\nfrom runstate.cli import main\n"
        "try:\n    main(['project', '--until-caught-up', '--quiet'])\nexcept SystemExit:\n    pass\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\nprint('CPU', u.ru_utime + u.ru_stime, file=sys.stderr)"
    )
    broker0 = cpu_of(broker_pid) if broker_pid else 0.0
    t = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(instances)
    ]
    cpus = []
    for pr in procs:
        _, err = pr.communicate(timeout=1800)
        cpus.append(next(float(ln.split()[1]) for ln in err.splitlines() if ln.startswith("CPU")))
    wall = time.perf_counter() - t
    return wall, cpus, (cpu_of(broker_pid) - broker0) if broker_pid else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs, per_run = (200, 20) if args.quick else (1000, 500)
    rounds = 1 if args.quick else args.rounds
    with kafka_broker() as (bootstrap, broker_pid):
        with scratch("runstate-bench-scaleout-") as work:
            topics = TopicNames.with_prefix(f"s{uuid.uuid4().hex[:8]}")
            events = fill(bootstrap, topics, runs, per_run)
            records = runs * (per_run + 1)
            print(f"filled {records:,} patches ({events:,} events) on {PARTITIONS} partitions", flush=True)
            res: dict[int, list[tuple[float, list[float], float]]] = {1: [], 2: []}
            for i in range(rounds):
                for k in (1, 2) if i % 2 == 0 else (2, 1):
                    shutil.rmtree(work / "state", ignore_errors=True)
                    res[k].append(drain(bootstrap, topics, work / "state", k, broker_pid))
            for k in (1, 2):
                wall = statistics.median(w for w, _, _ in res[k])
                cpu = statistics.median(sum(c) for _, c, _ in res[k])
                bcpu = statistics.median(b for _, _, b in res[k])
                print(
                    f"RESULT {k} projector process{'es' if k > 1 else ''}: {events / wall:,.0f} events/s "
                    f"({wall:.1f} s wall; projector CPU {cpu:.1f} s = {cpu / records * 1e6:.0f} us per record; "
                    f"broker CPU {bcpu:.1f} s = {bcpu / records * 1e6:.0f} us per record)"
                )
            w1 = statistics.median(w for w, _, _ in res[1])
            w2 = statistics.median(w for w, _, _ in res[2])
            print(
                f"RESULT speed-up of two processes: {w1 / w2:.2f}x "
                "(ideal on this 2-core machine with the broker on it: < 2)"
            )
            proj_us = statistics.median(sum(c) for _, c, _ in res[1]) / records * 1e6
            broker_us = statistics.median(b for _, _, b in res[1]) / records * 1e6
            for k in (1, 2, 8, 32):
                for brokers in (1, 3):
                    rate = min(k * 1e6 / proj_us, brokers * 1e6 / broker_us) * events / records
                    print(
                        f"MODEL {k:2d} instances, {brokers} broker{'s' if brokers > 1 else ''} (a core each): "
                        f"{rate:,.0f} events/s"
                    )


if __name__ == "__main__":
    main()
