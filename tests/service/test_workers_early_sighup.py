"""``service.workers``: a SIGHUP that reaches a worker before its event loop takes SIGHUP (the parent
forwards one to a worker it has just forked) is recorded, not left to end the worker; one that reached
the parent before it forwarded them is passed on to what the parent reads for later workers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from signing_proxy.service.workers import run_workers

pytestmark = pytest.mark.integration

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture
def parent_handlers() -> Iterator[None]:
    """run_workers installs the parent's handlers in this process: put the test runner's back."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.mark.usefixtures("parent_handlers")
def test_a_sighup_before_the_workers_loop_takes_it_does_not_end_the_worker(tmp_path: Path) -> None:
    tried = tmp_path / "tried"
    read_end, write_end = os.pipe()

    def worker(_index: int) -> int:
        if tried.exists():  # a restart after the SIGHUP ended the first: end the test's parent here
            return 2
        tried.touch()
        os.kill(os.getpid(), signal.SIGHUP)  # its loop has not taken SIGHUP yet
        from signing_proxy.service.workers import take_held_sighup

        os.write(write_end, b"alive, held" if take_held_sighup() else b"alive")
        return 2  # "refused to start": the parent stops, and returns

    try:
        assert run_workers(1, worker) == 2
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as said:
        assert said.read() == b"alive, held"


@pytest.mark.usefixtures("parent_handlers")
def test_a_sighup_before_the_parent_forwards_them_is_passed_on() -> None:
    from signing_proxy.service.workers import hold_sighup

    hold_sighup()
    os.kill(os.getpid(), signal.SIGHUP)  # during the parent's start-up: before run_workers forwards
    calls: list[int] = []
    assert run_workers(1, lambda _index: 2, lambda: calls.append(1)) == 2
    assert calls == [1]
