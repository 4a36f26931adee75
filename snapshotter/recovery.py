"""Recovery: a partition with no local store is rebuilt from checkpoints + the log's tail.

``restore_partition`` reads the partition of the checkpoints topic (its partition number
is the events partition: same key, same partitioner, same count), keeps the newest
*valid* checkpoint of each run (bad digest, other format/reducer version, unmigratable
schema: skipped and reported), writes those states into the new store, and sets the
store's position to the oldest offset still needed. Records of a run up to its
checkpoint's ``covers_offset`` are then skipped by key. A run whose checkpoints are all
invalid forces the partition back to offset 0: never trusted blindly, never lost.

The states are written from the checkpoint's JSON (after the digest check) into the
store's key layout without a round trip through the models: a restore costs about one
JSON parse per run, which is what makes it much cheaper than replaying the history.
Items are validated by the models when a run is first loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from eventlog.base import EventLog
from projector.store import PendingBatch, ProjectionStore, decision_puts, header_key, item_key
from schemas.state import COLLECTIONS, ITEM_KEY
from snapshotter.checkpoint import CheckpointInvalid, validate_raw

log = logging.getLogger("runstate.recovery")


@dataclass
class RestoreReport:
    partition: int
    runs: int = 0
    start_offset: int = 0
    checkpoints_read: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (checkpoint record offset, reason)


def latest_valid_checkpoints(log_: EventLog, partition: int) -> tuple[dict[str, dict[str, Any]], set[str], RestoreReport]:
    """Newest valid checkpoint (as a JSON document) per run in one partition of the
    checkpoints topic, and the runs that have checkpoints but none valid."""
    report = RestoreReport(partition)
    topic = log_.topics.checkpoints
    end = log_.end_offsets(topic).get(partition, 0)
    by_run: dict[str, list[tuple[int, bytes]]] = {}
    for rec in log_.scan(topic, partition, 0, end):
        report.checkpoints_read += 1
        run = rec.key.decode(errors="replace") if rec.key is not None else "?"
        by_run.setdefault(run, []).append((rec.offset, rec.value))
    latest: dict[str, dict[str, Any]] = {}
    # Newest first: an older checkpoint is parsed only when every newer one is invalid.
    for run, records in by_run.items():
        for offset, value in reversed(records):
            try:
                cp = validate_raw(value)
                if cp["run_id"] != run or cp.get("partition") != partition:
                    raise CheckpointInvalid(cp["run_id"], f"keyed {run!r} on partition {partition}, "
                                                          f"but is for {cp['run_id']!r} p{cp.get('partition')}")  # fmt: skip
                covers = int(cp["covers_offset"])
            except (CheckpointInvalid, KeyError, TypeError, ValueError) as e:
                reason = e.reason if isinstance(e, CheckpointInvalid) else f"not a checkpoint: {e!r}"
                report.rejected.append((offset, reason))
                log.warning("checkpoint p%d@%d of %r skipped: %s", partition, offset, run, reason)
                continue
            cur = latest.get(run)
            if cur is None or covers > cur["covers_offset"]:
                latest[run] = cp
            break
    seen_runs = set(by_run)
    return latest, seen_runs - set(latest), report


def _run_puts(state: dict[str, Any]) -> dict[bytes, bytes]:
    """The store keys of one run (header + one record per item, in list order)."""
    run = state["run_id"]
    goal = dict(state["goal"])
    lists = {"constraints": goal.pop("constraints", [])}
    puts: dict[bytes, bytes] = {}
    seq = 0
    for kind in COLLECTIONS:
        for item in lists.get(kind, state.get(kind, [])):
            puts[item_key(run, kind, item[ITEM_KEY.get(kind, "id")])] = seq.to_bytes(8, "big") + orjson.dumps(item)
            seq += 1
    header = {k: v for k, v in state.items() if k not in COLLECTIONS and k != "goal"}
    header["goal"] = goal
    header["next_seq"] = seq
    puts[header_key(run)] = orjson.dumps(header)
    return puts


def restore_partition(log_: EventLog, partition: int, store: ProjectionStore) -> RestoreReport:
    """Fill a brand-new partition store from checkpoints (see the module docstring)."""
    latest, unusable, report = latest_valid_checkpoints(log_, partition)
    if not latest:
        return report
    start = 0 if unusable else min(cp["covers_offset"] for cp in latest.values()) + 1
    batch = PendingBatch(next_offset=start)
    for run, cp in latest.items():
        batch.puts.update(_run_puts(cp["state"]))
        for d in cp.get("recent_decisions", []):
            batch.puts.update(decision_puts(run, d["patch_id"], d["offset"], orjson.dumps(d)))
        batch.restored[run] = cp["covers_offset"]
    store.write(batch)
    report.runs = len(latest)
    report.start_offset = start
    log.info("partition %d restored: %d runs from checkpoints, tail from offset %d (%d checkpoints rejected)",
             partition, len(latest), start, len(report.rejected))  # fmt: skip
    return report
