"""The running projector: the consume loop (``loop.py``, where the commit order is written)
and the garbage-collection policy of long-running processes (``gc_policy.py``)."""
