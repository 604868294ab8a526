"""``RateGate``: the one "a line at most once per period, with the count between" of the package."""

from __future__ import annotations

from signing_proxy.ratelog import RateGate


def test_a_line_is_due_first_then_once_a_period_with_the_events_between() -> None:
    now = [100.0]
    gate = RateGate(60.0, lambda: now[0])
    assert gate.due("a") == 1
    assert [gate.due("a") for _ in range(3)] == [None, None, None]
    assert gate.due("b") == 1  # each key its own period
    now[0] += 59.999
    assert gate.due("a") is None
    now[0] += 0.001
    assert gate.due("a") == 5  # the four held back, and this one


def test_a_clock_stepped_back_is_never_silent_until_it_catches_up() -> None:
    gate = RateGate(60.0)
    assert gate.due("a", now=1000.0) == 1
    assert gate.due("a", now=999.0) == 1
    assert gate.due("a", now=1000.0) is None  # 1 s after the line at 999
    assert gate.due("a", now=1059.0) == 2
