"""``service.workers``: a SIGHUP that reaches a worker before its event loop takes SIGHUP (the parent
forwards one to a worker it has just forked) is recorded, not left to end the worker; one that reached
the parent before it forwarded them is passed on to what the parent reads for later workers."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from signing_proxy.service import workers
from signing_proxy.service.workers import run_workers, start_masked

pytestmark = pytest.mark.integration

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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


def _blocked(native_id: int) -> set[int]:
    """The signals blocked in thread ``native_id`` of this process (``/proc``, ``SigBlk``)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def test_a_thread_the_parent_starts_never_takes_its_signals() -> None:
    """The parent blocks its signals around each fork, in its own thread only: a thread started
    unmasked (the log writer) took a SIGTERM arriving meanwhile, and its handler ran at once, before
    the new worker was recorded: the worker never got it, and the parent waited for it for good."""
    started = threading.Event()
    release = threading.Event()
    ids: list[int] = []

    def run() -> None:
        ids.append(threading.get_native_id())
        started.set()
        release.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    start_masked(thread.start)
    try:
        assert started.wait(10)
        parents = {int(sig) for sig in workers.SIGNALS}
        assert parents <= _blocked(ids[0])
        assert not parents & _blocked(threading.get_native_id())  # ours: as they were
    finally:
        release.set()
        thread.join(10)


@pytest.mark.usefixtures("parent_handlers")
def test_holding_again_keeps_a_sighup_already_held() -> None:
    """The entry point holds SIGHUP before the command's modules are imported, and ``run`` holds it
    again: one that came between the two is still applied once the loop takes SIGHUP."""
    from signing_proxy.service.workers import hold_sighup, take_held_sighup

    hold_sighup()
    os.kill(os.getpid(), signal.SIGHUP)  # while the entry point imports the command
    hold_sighup()  # cmd_run
    assert take_held_sighup()
    assert not take_held_sighup()  # forgotten once asked
