"""``run --workers N`` and SIGHUP: a worker the parent restarts serves what its siblings serve, the
configuration of the last SIGHUP accepted, not the one read at start; and ``listen: ...:0``, resolved
once by the parent, is not reported as a change on every reload."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.harness import WAIT_S, ProxyProcess, children, free_port, wait_for

pytestmark = pytest.mark.integration

ADMITTED = {"allow_clients": ["127.0.0.0/8"]}  # the test's own address
REVOKED = {"allow_clients": ["10.0.0.0/8"]}  # 127.0.0.1 no longer
PROBES = 20  # connections, each new: the kernel spreads them over the workers


def status_line(port: int) -> bytes:
    """The status line the proxy answers ``GET /healthz`` with on a new connection from 127.0.0.1."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
        with sock.makefile("rb") as answer:
            return answer.readline().rstrip()


def reload(proxy: ProxyProcess, outcome: str) -> None:
    """SIGHUP the parent, and wait until both workers said ``outcome`` once more."""
    assert proxy.proc is not None
    before = proxy.said(outcome)
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: proxy.said(outcome) >= before + 2, f"both workers saying {outcome!r}")


def both_workers_restarted(proxy: ProxyProcess) -> None:
    """SIGKILL every worker; wait until the parent has restarted both and they listen."""
    assert proxy.proc is not None
    first = children(proxy.proc.pid)
    assert len(first) == 2
    listening = proxy.said("listening on")
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: proxy.said("listening on") >= listening + 2, "both workers restarted")
    assert not children(proxy.proc.pid) & first


def after_the_reload_nothing(_proxy: ProxyProcess) -> None:
    pass


def after_the_reload_a_bad_file_refused(proxy: ProxyProcess) -> None:
    """The file broken and SIGHUPed: refused, the workers keep serving the last one accepted."""
    (proxy.tmp / "config.yaml").write_text("access: [\n")
    reload(proxy, "new configuration refused")


def after_the_reload_an_edit_not_signalled(proxy: ProxyProcess) -> None:
    """The file edited back, no SIGHUP: the running workers do not serve it, nor may one restarted."""
    proxy.rewrite_config(access=ADMITTED)


@pytest.mark.parametrize(
    "then",
    [after_the_reload_nothing, after_the_reload_a_bad_file_refused, after_the_reload_an_edit_not_signalled],
)
def test_a_restarted_worker_serves_the_configuration_of_the_last_sighup(tmp_path: Path, then: Any) -> None:
    """A worker restarted after a SIGHUP started from the configuration the parent read at start:
    127.0.0.1, removed from access.allow_clients, was admitted again by it (it failed open)."""
    with ProxyProcess(tmp_path, {"access": ADMITTED}, extra_args=("--workers", "2")) as proxy:
        wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
        assert status_line(proxy.port).startswith(b"HTTP/1.1 200")
        proxy.rewrite_config(access=REVOKED)
        reload(proxy, "configuration reloaded")
        assert {status_line(proxy.port)[:12] for _ in range(PROBES)} == {b"HTTP/1.1 403"}
        then(proxy)
        both_workers_restarted(proxy)
        answers = {status_line(proxy.port)[:12] for _ in range(PROBES)}
        assert answers == {b"HTTP/1.1 403"}, proxy.stderr_lines


def test_a_sighup_with_listen_at_port_0_unchanged_reports_no_pending_listen(tmp_path: Path) -> None:
    """The parent resolves ``listen: 127.0.0.1:0`` once; each worker compared the file's ``:0`` with
    that port and said "not applied until restart: listen" on every reload."""
    with ProxyProcess(tmp_path, {}, extra_args=("--workers", "2")) as proxy:
        wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
        reload(proxy, "configuration reloaded")
        assert proxy.said("not applied until restart") == 0, proxy.stderr_lines
        proxy.rewrite_config(listen=f"127.0.0.1:{free_port()}")  # a real change is still named
        reload(proxy, "configuration reloaded")
        assert proxy.said("not applied until restart: listen") == 2, proxy.stderr_lines


def test_a_worker_restarted_after_a_file_of_the_start_up_copy_is_gone_still_starts(tmp_path: Path) -> None:
    """A restarted worker was built from the start-up configuration first, then reloaded: once a
    bearer file only that copy named was retired (rotated by a SIGHUP), the restart failed with
    exit 2 and the parent stopped every worker."""
    old, new = tmp_path / "bearer-v1", tmp_path / "bearer-v2"
    for path, token in ((old, "tok1"), (new, "tok2")):
        path.write_text(token + "\n")
        path.chmod(0o600)

    def credentials(path: Path) -> list[dict[str, Any]]:
        return [{"hosts": ["api.example"], "bearer_file": str(path)}]

    with ProxyProcess(tmp_path, {"credentials": credentials(old)}, extra_args=("--workers", "2")) as proxy:
        wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
        proxy.rewrite_config(credentials=credentials(new))
        reload(proxy, "configuration reloaded")
        old.unlink()  # the operator retires the old token file: every worker serves bearer-v2
        both_workers_restarted(proxy)
        assert proxy.proc is not None
        assert proxy.proc.poll() is None
        assert status_line(proxy.port).startswith(b"HTTP/1.1 200")
