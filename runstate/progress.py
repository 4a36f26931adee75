"""Progress of long work (verify, a partition's restore, the projector and snapshotter
catching up, the demo) on a terminal: records done / total and the rate.

Shown only when the stream is a terminal and the user did not ask for ``--quiet``: piped
into a file or read by another program, a command prints its result and nothing else.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """One progress line for one piece of work.

    ``inline`` rewrites the line in place (``\\r``), for commands that print nothing else
    meanwhile; otherwise each update is a line of its own (the demo, whose workers print
    too). Updates closer than ``every_s`` apart are dropped, except the last one.
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        quiet: bool = False,
        inline: bool = True,
        every_s: float = 0.5,
        unit: str = "records",
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = not quiet and bool(isatty and isatty())
        self.inline = inline
        self.every_s = every_s
        self.unit = unit
        self._t0 = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: int, total: int | None = None, note: str = "", *, force: bool = False) -> None:
        """Report ``done`` of ``total`` (None: unknown) and an optional note."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        rate = done / max(1e-9, now - self._t0)
        of = f"/{total:,}" if total is not None else ""
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        text = f"{self.label}: {done:,}{of} {self.unit}{pct}, {rate:,.0f}/s" + (f", {note}" if note else "")
        if self.inline:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    def finish(self) -> None:
        """End the line (inline mode) so that what follows starts on a new one."""
        if self.enabled and self.inline and self._shown:
            self.stream.write("\n")
            self.stream.flush()
        self._shown = False
