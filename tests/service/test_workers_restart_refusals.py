"""``run --workers N``: a worker the parent restarts, and a configuration its siblings refused.

The faults: (a) the parent stored as accepted any file a SIGHUP could parse, though its workers
refused it (a credentials file missing or too open: checks run only in a worker's build); a worker
restarted later was built from it, and tried again every second for good, while its siblings served
the configuration before. (b) A restarted worker refused (exit 2) made the parent stop its healthy
siblings and exit 2, as if the configuration had been refused at start-up.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from signing_proxy.service import workers
from signing_proxy.service.workers import run_workers
from tests.cli.test_workers_sighup_restart import ADMITTED, REVOKED, reload, status_line
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for
from tests.service.test_workers_load_the_store_afresh import kill_a_worker

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
PROBES = 12  # connections, each new: the kernel spreads them over the workers


def test_a_worker_restarted_after_a_refused_sighup_serves_the_configuration_before(tmp_path: Path) -> None:
    with ProxyProcess(tmp_path, {"access": ADMITTED}, key=KEY, extra_args=("--workers", "2")) as proxy:
        wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
        proxy.rewrite_config(access=REVOKED)
        reload(proxy, "configuration reloaded")  # accepted: 127.0.0.1 refused from now on
        missing = tmp_path / "missing-auth.txt"
        proxy.rewrite_config(access={**ADMITTED, "proxy_auth_file": str(missing)})  # valid YAML
        reload(proxy, "new configuration refused")  # refused by every worker's checks
        kill_a_worker(proxy)
        wait_for(
            lambda: proxy.said("listening on") >= 3 or proxy.said("not started") >= 1,
            "the worker's restart",
        )
        assert proxy.said("listening on") == 3, proxy.stderr_lines[-6:]
        assert {status_line(proxy.port)[:12] for _ in range(PROBES)} == {b"HTTP/1.1 403"}  # what they serve
        passed = "last configuration that passed"
        wait_for(lambda: proxy.said(passed) >= 1, "the parent saying restarted workers keep the one before")
        warned = [line for line in proxy.stderr_lines if passed in line]
        assert len(warned) == 1, warned
        assert str(missing) in warned[0]


def test_a_killed_worker_whose_restart_is_refused_is_tried_again_while_its_sibling_serves(
    tmp_path: Path,
) -> None:
    auth = tmp_path / "auth.txt"
    auth.write_text("user:secret-password\n")
    auth.chmod(0o600)
    config = {"access": {**ADMITTED, "proxy_auth_file": str(auth)}}
    with (
        VerifyingOrigin() as origin,
        ProxyProcess(tmp_path, config, key=KEY, extra_args=("--workers", "2")) as proxy,
    ):
        origin.trust(KEY)
        parent = proxy.proc
        assert parent is not None
        wait_for(lambda: proxy.said("listening on") >= 2, "both workers listening")
        auth.chmod(0o644)  # an edit nobody signalled: a worker's build refuses the file now
        kill_a_worker(proxy)
        wait_for(lambda: proxy.said("not started") >= 1 or parent.poll() is not None, "the refusal")
        assert parent.poll() is None, proxy.stderr_lines[-6:]
        refusal = [line for line in proxy.stderr_lines if "not started" in line]
        assert "access.proxy_auth_file" in refusal[0]
        assert "secret-password" not in "\n".join(proxy.stderr_lines)
        via = {"http": f"http://user:secret-password@127.0.0.1:{proxy.port}"}
        for _ in range(PROBES):  # its sibling serves every one
            resp = requests.get(
                origin.url("/s"), proxies=via, timeout=WAIT_S, headers={"Connection": "close"}
            )
            assert resp.json()["verified"] is True
        auth.chmod(0o600)
        wait_for(lambda: proxy.said("listening on") >= 3, "the worker started once the file is mended")
        assert parent.poll() is None
        assert proxy.said("not started") == 1  # said once, though tried every second


@pytest.mark.usefixtures("parent_handlers")
def test_a_refused_restart_is_tried_again_said_once_per_reason_and_its_sibling_is_left_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(workers, "RESTART_BACKOFF_S", 0.05)
    tell = workers.tell_parent
    tries = tmp_path / "tries"
    tries.mkdir()
    sibling = tmp_path / "sibling-ended"

    def stopped(_sig: int, _frame: object) -> None:
        sibling.touch()
        os._exit(0)

    def worker(index: int) -> int:
        if index == 1:  # serves until the parent stops it
            signal.signal(signal.SIGTERM, stopped)
            threading.Event().wait(WAIT_S)
            return 0
        n = len(list(tries.iterdir()))
        (tries / str(n)).touch()
        if n == 0:
            return 1  # the first start: it dies (a crash), and is restarted
        if n <= 3:
            tell("access.proxy_auth_file: mode is 0644")
            return 2  # three restarts refused for one reason
        if n == 4:
            tell("credentials[0].bearer_file: gone")
            return 2  # then for another
        os.kill(os.getppid(), signal.SIGTERM)  # mended: it would serve; the test ends here
        return 0

    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        status = run_workers(2, worker)
    assert status == 0
    assert len(list(tries.iterdir())) == 6
    assert sibling.exists()  # left serving until the parent's SIGTERM at the end
    lines = [r.getMessage() for r in caplog.records if "not started" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "access.proxy_auth_file: mode is 0644" in lines[0]
    assert "credentials[0].bearer_file: gone" in lines[1]
