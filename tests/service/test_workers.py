"""``run --workers N``: N event loops share one port; signals reach every worker; none is left behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from signing_proxy.service.workers import run_workers
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, children, run_cli, wait_for

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()


def test_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    with (
        VerifyingOrigin() as origin,
        ProxyProcess(tmp_path, {}, key=KEY, extra_args=("--workers", "2")) as proxy,
    ):
        origin.trust(KEY)
        assert proxy.proc is not None
        wait_for(
            lambda: sum("listening on" in line for line in proxy.stderr_lines) >= 2, "both workers listening"
        )
        workers = children(proxy.proc.pid)
        assert len(workers) == 2
        for _ in range(20):  # a new connection each time: the kernel spreads them over the workers
            resp = requests.get(
                origin.url("/w"), proxies={"http": proxy.url}, timeout=WAIT_S, headers={"Connection": "close"}
            )
            assert resp.json()["verified"] is True
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: sum("configuration reloaded" in line for line in proxy.stderr_lines) >= 2,
            "SIGHUP reaching both workers",
        )
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(WAIT_S) == 0
    assert all(a.verified and a.oracle == "ok" for a in origin.arrivals)
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert os.getpid() not in workers


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_end_with_their_parent_even_when_it_is_killed(tmp_path: Path) -> None:
    """A parent SIGKILLed (or OOM-killed) left its workers serving on the shared port with the old
    configuration, beside the instance a supervisor starts next."""
    with ProxyProcess(tmp_path, {}, key=KEY, extra_args=("--workers", "2")) as proxy:
        assert proxy.proc is not None
        wait_for(
            lambda: sum("listening on" in line for line in proxy.stderr_lines) >= 2, "both workers listening"
        )
        workers = children(proxy.proc.pid)
        assert len(workers) == 2
        proxy.proc.kill()
        proxy.proc.wait(WAIT_S)
        try:
            wait_for(lambda: not any(alive(pid) for pid in workers), "the workers ending with their parent")
        finally:
            for pid in workers:  # ours: never left behind, whatever the outcome
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_a_sigterm_during_a_restarts_backoff_forks_no_worker(tmp_path: Path) -> None:
    """A worker that dies within RESTART_BACKOFF_S of its start is restarted after a wait; a SIGTERM
    in that wait reached the running workers, and the parent then forked one that nobody told to
    stop, and waited for it without end."""
    with ProxyProcess(tmp_path, {}, key=KEY, extra_args=("--workers", "2")) as proxy:
        assert proxy.proc is not None
        parent = proxy.proc.pid
        wait_for(lambda: sum("listening on" in line for line in proxy.stderr_lines) >= 2, "both workers")
        first = children(parent)
        seen = set(first)
        try:
            os.kill(min(first), signal.SIGKILL)
            wait_for(lambda: bool(children(parent) - seen), "the worker restarted")
            restarted = children(parent) - seen
            seen |= restarted
            os.kill(restarted.pop(), signal.SIGKILL)  # again at once: its next start waits out the backoff
            time.sleep(0.2)  # the parent has reaped it and sleeps
            proxy.proc.send_signal(signal.SIGTERM)
            assert proxy.proc.wait(WAIT_S) == 0
        finally:
            for pid in children(parent) | seen:  # ours: never left behind, whatever the outcome
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_a_restarted_worker_signs_with_the_store_as_it_is_now(tmp_path: Path) -> None:
    """The parent loaded the store once, at start; a worker it restarted later signed and published
    that copy (keys rotated or revoked since) until its first reload."""
    data = tmp_path / "data"
    assert run_cli("keys", "rotate", "--data-dir", str(data)).returncode == 0  # the store, with K1
    config = {"data_dir": str(data), "signing": {"key": None}}
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as proxy:
        assert proxy.proc is not None

        def announced() -> list[str]:
            return [
                line.split("keyid=")[1].split()[0] for line in proxy.stderr_lines if "listening on" in line
            ]

        wait_for(lambda: len(announced()) >= 2, "both workers listening")
        assert run_cli("keys", "rotate", "--now", "--data-dir", str(data)).returncode == 0  # K2 signs now
        current = json.loads(run_cli("keys", "list", "--json", "--data-dir", str(data)).stdout)["signing"]
        assert current not in announced()
        os.kill(min(children(proxy.proc.pid)), signal.SIGKILL)
        wait_for(lambda: len(announced()) >= 3, "the worker restarted")
        assert announced()[2] == current


def test_a_fork_that_fails_raises_its_error_and_leaves_the_parents_signals_unblocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with pytest.raises(BlockingIOError):
            run_workers(1, lambda _index: 0)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert not blocked & {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
