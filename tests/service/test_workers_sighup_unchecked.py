"""``run --workers N``: a SIGHUP's file whose build the parent could not check is taken for the
workers it restarts later, as the running workers take it; a failure in the parent's SIGHUP work
never stops the proxy, and the workers are sent the SIGHUP all the same.

The faults: (a) the parent kept a SIGHUP's file for later restarts only when its check (a worker's
build, tried in a child) passed; a check that could not be made (the key store locked by a ``keys``
command, the child past its limit) kept the file before, which the running workers had left: a
worker restarted later admitted the clients the SIGHUP removed (it failed open). (b) The check's
fork failing (EAGAIN under a pids limit) raised out of the signal handler: the parent exited, every
worker with it, and the SIGHUP never reached them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

from signing_proxy.cli import restart_copy
from signing_proxy.cli.restart_copy import RestartCopy
from signing_proxy.config import Config, parse_config
from signing_proxy.core.keys import KeyProvider
from signing_proxy.service import workers
from signing_proxy.service.workers import run_workers
from signing_proxy.storage.keystore import KeyStore
from tests.cli.test_workers_sighup_restart import (
    ADMITTED,
    PROBES,
    REVOKED,
    both_workers_restarted,
    reload,
    status_line,
)
from tests.harness import WAIT_S, ProxyProcess, run_cli, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOT_CHECKED = "though the parent could not check its build"
KEPT_BACK = "serves the last configuration that passed its build"
SECRET = "MYSECRETPIN4711"

# the parent's check, as it fails on a host: sitecustomize.py in the proxy's PYTHONPATH, run before
# ``run`` imports it (``from ..service.workers import run_check`` takes this one)
CHECK_CANNOT_FORK = """
import errno
import signing_proxy.service.workers as workers

def run_check(check, limit_s=10.0):
    raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")  # fork, a pids limit

workers.run_check = run_check
"""
CHECK_HANGS = """
import threading
import signing_proxy.service.workers as workers

real = workers.run_check

def run_check(check, limit_s=10.0):
    def hung():
        threading.Event().wait(60)  # killed at its limit, long before
        return check()
    return real(hung, 0.5)

workers.run_check = run_check
"""


def listening_ports(proxy: ProxyProcess) -> set[str]:
    return {
        line.split("listening on http://")[1].split()[0]
        for line in proxy.stderr_lines
        if "listening on" in line
    }


def a_restarted_worker_serves_the_sighup(proxy: ProxyProcess, why: str, during: Callable[[], object]) -> None:
    """SIGHUP with 127.0.0.1 removed from the file, ``during`` run once both workers reloaded;
    the parent says once that it could not check the file (``why``), and both workers restarted
    afterwards refuse 127.0.0.1 as their siblings did."""
    assert proxy.proc is not None
    wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
    assert len(listening_ports(proxy)) == 1  # the file's port 0, resolved once by the parent
    assert status_line(proxy.port).startswith(b"HTTP/1.1 200")
    proxy.rewrite_config(access=REVOKED)
    reload(proxy, "configuration reloaded")
    during()
    assert proxy.proc.poll() is None
    assert {status_line(proxy.port)[:12] for _ in range(PROBES)} == {b"HTTP/1.1 403"}
    both_workers_restarted(proxy)
    answers = {status_line(proxy.port)[:12] for _ in range(PROBES)}
    assert answers == {b"HTTP/1.1 403"}, proxy.stderr_lines[-8:]
    wait_for(lambda: proxy.said(NOT_CHECKED) >= 1, "the parent saying the file was not checked")
    (line,) = [line for line in proxy.stderr_lines if NOT_CHECKED in line]
    assert why in line
    assert proxy.said(KEPT_BACK) == 0
    assert not any("Traceback" in line for line in proxy.stderr_lines), proxy.stderr_lines


def test_a_sighup_whose_check_finds_the_key_store_locked_is_served_by_a_restarted_worker(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    assert run_cli("keys", "rotate", "--data-dir", str(data)).returncode == 0
    config = {"data_dir": str(data), "signing": {"key": None}, "access": ADMITTED}
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as proxy:
        held = [os.open(KeyStore(data).path / ".lock", os.O_RDWR)]

        def release() -> None:
            os.close(held.pop())

        try:
            fcntl.flock(held[0], fcntl.LOCK_EX)  # a `keys rotate` holding the store's lock a while
            a_restarted_worker_serves_the_sighup(proxy, "not checked: ", release)
        finally:
            for fd in held:
                os.close(fd)


@pytest.mark.parametrize(
    ("patch", "why"),
    [(CHECK_CANNOT_FORK, "could not be started: BlockingIOError, EAGAIN"), (CHECK_HANGS, "did not finish")],
    ids=["fork-fails", "check-hangs"],
)
def test_a_sighup_whose_check_could_not_run_is_served_by_a_restarted_worker(
    tmp_path: Path, patch: str, why: str
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(patch)
    path = [str(site), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"PYTHONPATH": os.pathsep.join(path)}
    config = {"access": ADMITTED}
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2"), env=env) as proxy:
        a_restarted_worker_serves_the_sighup(proxy, why, lambda: None)


def config_of(allowed: list[str]) -> Config:
    return parse_config({"listen": "127.0.0.1:0", "access": {"allow_clients": allowed}})


@pytest.mark.parametrize(
    ("outcome", "taken", "warned"),
    [
        ((0, ""), True, None),
        ((1, "not checked: key store: busy"), True, NOT_CHECKED),
        ((None, ""), True, NOT_CHECKED),
        (BlockingIOError(11, f"no fork {SECRET}"), True, NOT_CHECKED),
        (RuntimeError(f"a bug {SECRET}"), True, NOT_CHECKED),
        ((2, "access.proxy_auth_file: gone"), False, KEPT_BACK),
    ],
    ids=["passed", "store-busy", "killed", "no-fork", "a-bug", "refused"],
)
def test_the_parent_keeps_a_sighups_file_back_only_when_the_build_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    outcome: tuple[int | None, str] | Exception,
    taken: bool,
    warned: str | None,
) -> None:
    before, fresh = config_of(["127.0.0.0/8"]), config_of(["10.0.0.0/8"])

    def run_check(_check: Callable[[], int]) -> tuple[int | None, str]:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(restart_copy, "run_check", run_check)
    copy = RestartCopy(before, typing.cast(KeyProvider, object()), None, lambda: fresh)
    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        copy.on_sighup()
    assert copy.accepted is (fresh if taken else None)
    lines = [r.getMessage() for r in caplog.records if "SIGHUP" in r.getMessage()]
    assert len(lines) == (0 if warned is None else 1), lines
    assert warned is None or warned in lines[0]
    assert SECRET not in "\n".join(lines)


def appears(path: Path) -> bool:
    """Whether ``path`` exists within ``WAIT_S`` (in a worker: no pytest there to fail)."""
    try:
        wait_for(path.exists, str(path))
    except AssertionError:
        return False
    return True


@pytest.mark.usefixtures("parent_handlers")
def test_what_the_parents_sighup_work_raises_is_one_line_and_the_workers_get_the_sighup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def on_sighup() -> None:
        raise RuntimeError(f"a bug of ours, quoting the file: pin {SECRET}")

    def worker(index: int) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})  # taken below, never missed
        (tmp_path / f"ready-{index}").touch()
        if index == 0 and appears(tmp_path / "ready-1"):
            os.kill(os.getppid(), signal.SIGHUP)
        if signal.sigtimedwait({signal.SIGHUP}, WAIT_S) is not None or workers.take_held_sighup():
            (tmp_path / f"got-{index}").touch()
        # the parent's SIGTERM ends the test, sent only while it still runs run_workers: the old
        # code had left it by then, and this process is the test runner
        if index == 0 and appears(tmp_path / "got-1") and (tmp_path / "got-0").exists():
            os.kill(os.getppid(), signal.SIGTERM)
        threading.Event().wait(WAIT_S)
        return 0

    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        # a tick: the parent's wait wakes every second, wherever the signal landed
        assert run_workers(2, worker, on_sighup, lambda: None) == 0
    assert (tmp_path / "got-0").exists()
    assert (tmp_path / "got-1").exists()
    lines = [r.getMessage() for r in caplog.records if "SIGHUP" in r.getMessage()]
    assert lines == [
        "SIGHUP: the parent's work for restarted workers failed (RuntimeError); the workers reload"
    ]
    assert not any(r.exc_info for r in caplog.records)
