"""What an agent worker uses to append: :class:`RunProducer`."""

from runstate.producers.run_producer import Receipt, RunProducer

__all__ = ["Receipt", "RunProducer"]
