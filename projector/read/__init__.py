"""The read side: queries over the stores (``queries.py``), the compact context for a prompt
(``context.py``), and replay: a past revision, explain, verify (``replay.py``)."""
