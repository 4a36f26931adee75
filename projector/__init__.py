"""The projector: decide + reduce (pure), the RocksDB projection store, the consume loop,
queries and replay.

    decide.py    the decision on one patch (revision check, control events, rebase)
    reducer.py   one pure function per event type: its rules, then its effect
    working.py   a run's working state (header + lazily loaded items) and the per-patch draft
    runbook.py   RunBook: folds log records through decide for many runs (the one replay driver)
    keys.py      the store's keyspace and value encodings
    store.py     one partition's RocksDB store (one WriteBatch per poll batch)
    statedir.py  the state directory: which topic/partitions it follows, a store per partition
    loop.py      Projector: the consume loop (its commit order is written there)
    queries.py   Projection: read-side queries
    context.py   the compact text context for an LLM prompt
    replay.py    state at a revision, explain, verify
"""

from runstate.projector.decide import decide
from runstate.projector.loop import Projector
from runstate.projector.queries import Projection, decision_reader, state_digest
from runstate.projector.runbook import RunBook

__all__ = ["Projection", "Projector", "RunBook", "decide", "decision_reader", "state_digest"]
