"""The fork and the wait ``run_workers`` and ``run_check`` share: a child never gets out of the helper
into its parent's code, whatever it raises, and the wait is bounded, leaving a child that runs on to
its caller."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import cast

import pytest

from signing_proxy.service.workers import _fork_child, _told, _wait_exit, run_check, tell_parent

LONG_S = 60.0  # a deadline no healthy child comes near


@contextmanager
def forked(run: Callable[[], int]) -> Iterator[tuple[int, int]]:
    """``_fork_child(run)``; a child that got out of it ends at once (status 99, what the test fails
    on), and a child still running afterwards is killed and reaped."""
    parent = os.getpid()
    try:
        pid, read_end = _fork_child(run)
    finally:
        if os.getpid() != parent:
            os._exit(99)
    try:
        yield pid, read_end
    finally:
        with suppress(ChildProcessError):  # reaped by the test already
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def exit_code(pid: int) -> int:
    exited = _wait_exit(pid, (), time.monotonic() + LONG_S, 0.01)
    assert exited is not None
    assert exited[0] == pid
    return os.waitstatus_to_exitcode(exited[1])


def test_a_child_that_raises_exits_1_and_what_it_told_before_reaches_the_parent() -> None:
    def run() -> int:
        tell_parent("before the error")
        raise RuntimeError("a bug")

    with forked(run) as (pid, read_end):
        assert exit_code(pid) == 1
        assert _told(read_end) == "before the error"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [(SystemExit(0), 1), (KeyboardInterrupt(), 1), (None, 3)],
    ids=["system-exit-0", "keyboard-interrupt", "returns-3"],
)
def test_a_child_exits_with_what_it_returns_else_1(raised: BaseException | None, expected: int) -> None:
    def run() -> int:
        if raised is not None:
            raise raised
        return 3

    with forked(run) as (pid, read_end):
        assert exit_code(pid) == expected
        assert _told(read_end) == ""


def test_a_child_that_returns_no_exit_status_exits_1() -> None:
    with forked(lambda: cast(int, "not a status")) as (pid, read_end):
        assert exit_code(pid) == 1
        os.close(read_end)


@pytest.mark.parametrize("by_pidfd", [True, False], ids=["pidfd", "polled"])
def test_the_wait_returns_none_at_its_deadline_and_leaves_the_child_running(by_pidfd: bool) -> None:
    def run() -> int:
        time.sleep(LONG_S)
        return 0

    with forked(run) as (pid, read_end):
        os.close(read_end)
        pidfd = os.pidfd_open(pid) if by_pidfd else None
        try:
            started = time.monotonic()
            exited = _wait_exit(pid, () if pidfd is None else (pidfd,), started + 0.3, 0.01)
            waited = time.monotonic() - started
        finally:
            if pidfd is not None:
                os.close(pidfd)
        assert exited is None
        assert 0.3 <= waited < LONG_S / 2
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # not reaped: still running
        os.kill(pid, signal.SIGKILL)
        _, raw = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(raw) == -signal.SIGKILL


def test_the_wait_is_woken_by_the_pidfd_as_the_child_exits() -> None:
    def run() -> int:
        time.sleep(0.2)
        return 5

    with forked(run) as (pid, read_end):
        os.close(read_end)
        pidfd = os.pidfd_open(pid)
        try:
            started = time.monotonic()
            exited = _wait_exit(pid, (pidfd,), started + LONG_S)  # no polling: the pidfd wakes it
        finally:
            os.close(pidfd)
        assert exited is not None
        assert exited[0] == pid
        assert os.waitstatus_to_exitcode(exited[1]) == 5
        assert time.monotonic() - started < LONG_S / 2


def test_run_check_reports_the_status_and_the_reason_and_a_hung_check_is_killed() -> None:
    def refuses() -> int:
        tell_parent("the key store is locked")
        return 2

    def fails() -> int:
        raise RuntimeError("a bug")

    def hangs() -> int:
        time.sleep(LONG_S)
        return 0

    assert run_check(refuses) == (2, "the key store is locked")
    assert run_check(fails) == (1, "")
    started = time.monotonic()
    assert run_check(hangs, 0.3) == (None, "")
    assert time.monotonic() - started < LONG_S / 2


def test_the_parent_holds_no_write_end_so_a_childs_exit_reads_as_the_pipes_end() -> None:
    """Each fork's write end is closed in the parent: kept, it leaked a descriptor per worker restart
    (every second for a refused one), and a read of the pipe would never see its end."""
    with forked(lambda: 0) as (pid, read_end):
        try:
            assert exit_code(pid) == 0
            readable, _, _ = select.select([read_end], [], [], 5.0)
            assert readable
            assert os.read(read_end, 1) == b""
        finally:
            os.close(read_end)


def test_run_check_of_a_check_that_ends_on_a_signal_is_none() -> None:
    """A check killed by a signal has no exit status: not known, as one that ran past its limit."""

    def killed() -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    assert run_check(killed) == (None, "")
