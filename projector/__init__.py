"""The projector, in four rooms (each imports only the rooms below it):

core/      the pure core: working.py (a run's working state and the per-patch draft),
           reducer.py (one pure function per event type: its rules, then its effect),
           decide.py (the decision on one patch: revision check, control events, rebase),
           runbook.py (RunBook: folds log records through decide; the one replay driver),
           outcomes.py (Decided, Applied, DeadLetter)
store/     keys.py (the keyspace and value encodings), partition.py (one partition's
           RocksDB store: one WriteBatch per poll batch), statedir.py (the state directory)
runtime/   loop.py (Projector: the consume loop; its commit order is written there),
           gc_policy.py (the garbage-collection policy of long-running processes)
read/      queries.py (Projection), context.py (the compact context for a prompt),
           replay.py (a past revision, explain, verify)
"""

from runstate.projector.core.decide import decide
from runstate.projector.core.runbook import RunBook
from runstate.projector.read.queries import Projection, decision_at_reader, decision_reader, state_digest
from runstate.projector.runtime.loop import Projector

__all__ = ["Projection", "Projector", "RunBook", "decide", "decision_at_reader", "decision_reader", "state_digest"]
