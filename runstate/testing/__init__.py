"""Test kits that ship with runstate, for anyone who writes a backend.

:class:`LogConformance` is the log interface's contract as a pytest suite: subclass it
once per backend with a ``log`` fixture, as ``tests/eventlog/test_conformance_embedded.py`` and
``tests/eventlog/test_kafka_log.py`` do for the embedded log and Kafka.
"""

from runstate.testing.log_conformance import LogConformance

__all__ = ["LogConformance"]
