"""A line at most once per period: what a stranger can cause once per request (a refused row, a store
that fails, a declined challenge, a broker directory down) would otherwise fill the log.

Beside ``errors`` and ``metrics``: every layer may use it, it uses no layer. Its keys are the
caller's, from a bounded set (line kinds, configured directories, published agents).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RateGate"]


class RateGate:
    """Per key, whether a line is due now: the first, one ``every_s`` after the last, or one after
    the clock stepped back (never silent until it catches up again), counting the events between."""

    __slots__ = ("_at", "_count", "clock", "every_s")

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._at: dict[str, float] = {}  # key -> when its last line was due
        self._count: dict[str, int] = {}  # key -> events since then

    def due(self, key: str = "", now: float | None = None) -> int | None:
        """Count one event of ``key``; the events counted since its last line (this one included) when
        a line is due now, else None."""
        now = self.clock() if now is None else now
        count = self._count.get(key, 0) + 1
        last = self._at.get(key)
        if last is not None and 0 <= now - last < self.every_s:
            self._count[key] = count
            return None
        self._at[key] = now
        self._count.pop(key, None)
        return count
