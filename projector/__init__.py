"""decide + reduce (pure), the RocksDB projection store, the consume loop, queries, replay."""

from projector.book import RunBook
from projector.decide import decide
from projector.loop import Projector
from projector.queries import Projection, state_digest

__all__ = ["Projection", "Projector", "RunBook", "decide", "state_digest"]
