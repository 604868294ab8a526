"""A deadline that moves with every request without a timer per request.

Read timeouts, idle timeouts and pool expiry move their deadline each time bytes flow: a timer per
move (``call_later`` then ``cancel``) would cost the event loop two heap operations per request. A
``Deadline`` keeps one loop timer and moves only a number; when the timer fires before the
deadline it re-arms for what remains, so it fires at most about once per period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["TIMER_SLACK_S", "Deadline"]

# The loop's clock ticks in milliseconds: a timer may fire up to 1 ms before its deadline; counted as due.
TIMER_SLACK_S = 0.001


class Deadline:
    """``on_due()`` once the loop's clock reaches the deadline set last; ``clear`` stands it down."""

    __slots__ = ("_at", "_handle", "_loop", "_on_due", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the armed timer fires
        self._on_due: Callable[[], None] | None = None
        self.deadline: float | None = None  # loop time; None: nothing is due

    def set(self, deadline: float, on_due: Callable[[], None]) -> None:
        """Call ``on_due`` at ``deadline`` (loop time) unless moved or cleared first."""
        self.deadline, self._on_due = deadline, on_due
        if self._handle is None or self._at > deadline:  # an earlier timer re-arms when it fires
            self._arm(deadline)

    def push(self, deadline: float) -> None:
        """Move a pending deadline later (bytes moved): a number changes, no timer."""
        if self.deadline is not None:
            self.deadline = deadline

    def clear(self) -> None:
        """Nothing is due (the timer, if armed, fires once more and does nothing). ``on_due`` is let go:
        it is often a method of the owner, which holds this, and a cycle would outlive the owner."""
        self.deadline = self._on_due = None

    def cancel(self) -> None:
        """Nothing is due and no timer stays armed (the owner is closing)."""
        self.deadline = self._on_due = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at, self._handle = at, self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        deadline = self.deadline
        if deadline is None:
            return
        if self._loop.time() < deadline - TIMER_SLACK_S:
            self._arm(deadline)
            return
        on_due, self.deadline, self._on_due = self._on_due, None, None
        assert on_due is not None
        on_due()
