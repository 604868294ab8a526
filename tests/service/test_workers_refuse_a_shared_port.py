"""``run --workers N``: a second instance on an address the first serves is refused (exit 2), as a
single process is, instead of sharing it.

The fault: every socket of a ``--workers`` instance carries SO_REUSEPORT, so a second instance by the
same user on the same ``listen``, ``publish.listen`` or ``admin.listen`` bound beside the first without
an error, and the kernel balanced clients between two configurations and key stores.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import WAIT_S, ProxyProcess, free_port, stop_process, wait_for

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
        wait_for(lambda: sum("listening on" in line for line in list(a.stderr_lines)) >= 2, "both workers")
        second = {**addresses(), shared: first[shared]}  # the other two: free ports of its own
        status, stderr = second_instance(tmp_path / "b", config_of(tmp_path / "b", second))
        assert status == 2, stderr
        assert f"{shared}: cannot bind {first[shared]}" in stderr
        assert a.proc is not None
        assert a.proc.poll() is None  # the first serves on


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
