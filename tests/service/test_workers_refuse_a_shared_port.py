"""``run --workers N``: a second instance on an address the first serves is refused (exit 2), as a
single process is, instead of sharing it.

The fault: every socket of a ``--workers`` instance carries SO_REUSEPORT, so a second instance by the
same user on the same ``listen``, ``publish.listen`` or ``admin.listen`` bound beside the first without
an error, and the kernel balanced clients between two configurations and key stores.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import WAIT_S, ProxyProcess, children, free_port, stop_process, wait_for

pytestmark = pytest.mark.integration


def addresses() -> dict[str, str]:
    return {key: f"127.0.0.1:{free_port()}" for key in ("listen", "publish.listen", "admin.listen")}


def config_of(tmp: Path, where: dict[str, str]) -> dict[str, Any]:
    return {
        "listen": where["listen"],
        "data_dir": str(tmp / "data"),
        "publish": {"listen": where["publish.listen"], "domain": "agent.example"},
        "admin": {"listen": where["admin.listen"]},
        "signing": {"key": None},  # the key store: publishing needs it
    }


def second_instance(tmp: Path, config: dict[str, Any]) -> tuple[int, str]:
    """``run --workers 2`` with ``config``: its exit status and stderr, or a failure if it serves."""
    tmp.mkdir()
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--config", str(path), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )
    try:
        _, stderr = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        _, stderr = proc.communicate(timeout=WAIT_S)
        last = stderr.splitlines()[-3:]
        pytest.fail(f"the second instance served beside the first: {last}")
    return proc.returncode, stderr


@pytest.mark.parametrize("shared", ["listen", "publish.listen", "admin.listen"])
def test_a_second_workers_instance_on_an_address_in_use_exits_2_naming_it(
    tmp_path: Path, shared: str
) -> None:
    first = addresses()
    (tmp_path / "a").mkdir()
    with ProxyProcess(tmp_path / "a", config_of(tmp_path / "a", first), extra_args=("--workers", "2")) as a:
        wait_for(lambda: a.said("listening on") >= 2, "both workers")
        second = {**addresses(), shared: first[shared]}  # the other two: free ports of its own
        status, stderr = second_instance(tmp_path / "b", config_of(tmp_path / "b", second))
        assert status == 2, stderr
        assert f"{shared}: cannot bind {first[shared]}" in stderr
        assert a.proc is not None
        assert a.proc.poll() is None  # the first serves on


@pytest.mark.parametrize("spelled", [":0", ":00"])
@pytest.mark.parametrize("other", ["publish.listen", "admin.listen"])
def test_another_address_on_port_0_is_refused_however_spelled(
    tmp_path: Path, other: str, spelled: str
) -> None:
    """Every worker binds publish.listen and admin.listen itself: on port 0 each would take a port of
    its own. The port is read as a number: ``:00`` is port 0 too."""
    where = {**addresses(), other: "127.0.0.1" + spelled}
    status, stderr = second_instance(tmp_path / "b", config_of(tmp_path, where))
    assert status == 2, stderr
    assert f"{other}: with --workers, give a fixed port (every worker binds it)" in stderr


def test_the_probe_refuses_a_port_a_socket_listens_on_with_so_reuseport() -> None:
    from signing_proxy.service.workers import refuse_shared

    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            refuse_shared("127.0.0.1", port)
    refuse_shared("127.0.0.1", port)  # free again: nothing in the way
    refuse_shared("127.0.0.1", 0)  # a new port: nothing to check


def test_a_reserved_address_refuses_another_instances_probe_and_takes_its_own_workers() -> None:
    """The fault: the parent's reserved socket kept SO_REUSEADDR, which the probe sets too: while no
    worker of the first instance listened (starting, or every one restarting), a second instance's
    probe bound beside it, and both instances then served the port."""
    from signing_proxy.service.ports import reserve_addresses
    from signing_proxy.service.workers import refuse_shared, reserve_port

    reserved, port = reserve_port("127.0.0.1", 0)
    held = [reserved, *reserve_addresses("127.0.0.1", free_port())]
    try:
        for sock in held:
            where = sock.getsockname()[1]
            with pytest.raises(OSError, match="in use"):
                refuse_shared("127.0.0.1", where)  # nothing listens: the reservation alone refuses
            with socket.socket() as worker:  # as a worker's listener binds: beside it
                worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                worker.bind(("127.0.0.1", where))
                worker.listen()
        assert held[0].getsockname()[1] == port
    finally:
        for sock in held:
            sock.close()


def time_wait_on(port: int) -> int:
    """The connections in TIME_WAIT on local port ``port`` (``/proc/net/tcp``: state 06)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(int(row.split()[1].rsplit(":", 1)[1], 16) == port and row.split()[3] == "06" for row in rows)


def close_from_the_server(port: int, path: str) -> None:
    """One request on its own connection, ``Connection: close``: the server closes first, and the
    connection waits out TIME_WAIT on the server's side of ``port``."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: agent.example\r\nConnection: close\r\n\r\n".encode())
        while sock.recv(65536):
            pass


def test_an_instance_on_fixed_ports_starts_again_at_once_after_the_one_before_stopped(tmp_path: Path) -> None:
    """With the reservation's SO_REUSEADDR cleared once bound, the connections of the instance
    stopped a moment ago (TIME_WAIT) still hold none of its addresses."""
    config = config_of(tmp_path, addresses())
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as a:
        wait_for(lambda: a.said("listening on") >= 2, "both workers")
        for port, path in ((a.port, "/healthz"), (a.publish_port, "/"), (a.admin_port, "/healthz")):
            close_from_the_server(port, path)
    assert time_wait_on(a.port) >= 1  # what the instance below must bind beside
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as again:
        wait_for(lambda: again.said("listening on") >= 2, "both workers")
        assert again.port == a.port
        close_from_the_server(again.admin_port, "/healthz")
        assert again.proc is not None
        assert again.proc.poll() is None


@pytest.mark.parametrize("shared", ["listen", "publish.listen", "admin.listen"])
def test_a_second_instance_is_refused_while_every_worker_of_the_first_is_restarting(
    tmp_path: Path, shared: str
) -> None:
    from signing_proxy.storage.keystore import KeyStore

    first = addresses()
    (tmp_path / "a").mkdir()
    with ProxyProcess(tmp_path / "a", config_of(tmp_path / "a", first), extra_args=("--workers", "2")) as a:
        assert a.proc is not None
        wait_for(lambda: a.said("listening on") >= 2, "both workers")
        index = KeyStore(tmp_path / "a" / "data").path / "keys.json"
        index.chmod(0o640)  # too open: every restart of a worker is refused until it is mended
        try:
            for pid in children(a.proc.pid):
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: a.said("not started") >= 2, "refusals")
            with pytest.raises(ConnectionRefusedError):  # none of its workers listens
                socket.create_connection(("127.0.0.1", a.port), timeout=WAIT_S).close()
            second = {**addresses(), shared: first[shared]}
            status, stderr = second_instance(tmp_path / "b", config_of(tmp_path / "b", second))
            assert status == 2, stderr
            assert f"{shared}: cannot bind {first[shared]}" in stderr
        finally:
            index.chmod(0o600)
        wait_for(lambda: a.said("listening on") >= 4, "its workers back")
        assert a.proc.poll() is None
