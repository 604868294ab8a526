"""Lifecycle of the real process: SIGTERM drains in-flight requests, SIGHUP reloads the live parts
of the configuration atomically (a bad file is refused and the old one keeps serving), and
``SIGNING_PROXY_*`` variables override the file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import yaml
from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()


def via(proxy: ProxyProcess, url: str) -> requests.Response:
    return requests.get(url, proxies={"http": proxy.url}, timeout=WAIT_S)


def test_sigterm_lets_an_in_flight_request_finish(tmp_path: Path) -> None:
    started = threading.Event()

    async def slow(_r: web.Request) -> web.Response:
        started.set()
        await asyncio.sleep(1.5)
        return web.Response(text="finished")

    result: dict[str, object] = {}
    with (
        VerifyingOrigin(handler=slow) as origin,
        ProxyProcess(tmp_path, {"timeouts": {"drain_s": 10}}, key=KEY) as proxy,
    ):
        worker = threading.Thread(target=lambda: result.update(resp=via(proxy, origin.url("/slow"))))
        worker.start()
        assert started.wait(WAIT_S)
        assert proxy.proc is not None
        proxy.proc.send_signal(signal.SIGTERM)
        worker.join(WAIT_S)
        assert proxy.proc.wait(WAIT_S) == 0
        with pytest.raises(requests.ConnectionError):  # no longer accepting
            via(proxy, origin.url("/after"))
    resp = result["resp"]
    assert isinstance(resp, requests.Response)
    assert resp.status_code == 200
    assert resp.text == "finished"
    wait_for(lambda: any("draining in-flight" in line for line in proxy.stderr_lines), "the drain's line")


def reload_with(proxy: ProxyProcess, text: str, marker: str) -> None:
    before = sum(marker in line for line in proxy.stderr_lines)
    (proxy.tmp / "config.yaml").write_text(text)
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: sum(marker in line for line in proxy.stderr_lines) > before, marker)


def test_sighup_applies_a_good_config_and_refuses_a_bad_one(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("reloaded-secret\n")
    token.chmod(0o600)
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, {}, key=KEY) as proxy:
        origin.trust(KEY)
        assert via(proxy, origin.url("/a")).json()["verified"] is True
        config = yaml.safe_load((tmp_path / "config.yaml").read_text())

        # a good new config: a bearer credential for the origin, and a listen change that needs a restart
        good = {
            **config,
            "credentials": [{"hosts": ["127.0.0.1"], "bearer_file": str(token), "allow_plaintext": True}],
            "listen": "127.0.0.1:1",
        }
        reload_with(proxy, yaml.safe_dump(good), "configuration reloaded")
        wait_for(
            lambda: any("not applied until restart: listen" in line for line in proxy.stderr_lines),
            "the reload's line naming what needs a restart",
        )
        assert via(proxy, origin.url("/b")).json()["verified"] is True  # still on the old port
        assert origin.arrivals[-1].header("authorization") == "Bearer reloaded-secret"

        # a bad one: refused with the reason, and the running configuration keeps serving
        reload_with(proxy, "limits:\n  max_body_bytes: -1\n", "new configuration refused")
        refusal = next(line for line in reversed(proxy.stderr_lines) if "new configuration refused" in line)
        assert "limits.max_body_bytes: must be a positive integer" in refusal
        assert via(proxy, origin.url("/c")).json()["verified"] is True
        assert origin.arrivals[-1].header("authorization") == "Bearer reloaded-secret"

        # a config whose bearer file is missing is refused as a whole (nothing half-applied)
        broken = {
            **good,
            "credentials": [
                {"hosts": ["127.0.0.1"], "bearer_file": str(tmp_path / "gone"), "allow_plaintext": True}
            ],
            "hosts": {"unsigned": ["127.0.0.1"]},
        }
        reload_with(proxy, yaml.safe_dump(broken), "new configuration refused")
        assert via(proxy, origin.url("/d")).json()["verified"] is True  # hosts.unsigned was not applied
    assert not any("reloaded-secret" in line for line in proxy.stderr_lines)


def check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIGNING_PROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", "config", "check", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
        env={**clean, **env},
    )


def test_environment_overrides_the_file_and_flags_override_the_environment(tmp_path: Path) -> None:
    key = tmp_path / "agent-key.pem"  # sidecar.yaml's key is mounted from a Secret; config check reads it
    key.write_bytes(SigningKey.generate().to_pem())
    key.chmod(0o600)
    done = check(
        {
            "SIGNING_PROXY_LISTEN": "0.0.0.0:9000",
            "SIGNING_PROXY_ALLOW_CLIENTS": "10.0.0.0/8, 127.0.0.1/32",
            "SIGNING_PROXY_LOG_FORMAT": "json",
            "SIGNING_PROXY_CONFIG": "config/sidecar.yaml",
            "SIGNING_PROXY_KEY": str(key),
        }
    )
    assert done.returncode == 0, done.stderr
    effective = yaml.safe_load(done.stdout)
    assert effective["listen"] == "0.0.0.0:9000"
    assert effective["access"]["allow_clients"] == ["10.0.0.0/8", "127.0.0.1/32"]
    assert effective["routes"][0]["prefix"] == "/exchange/"  # the file named by SIGNING_PROXY_CONFIG
    bad = check({"SIGNING_PROXY_LISTEN": "nowhere"})
    assert bad.returncode == 2
    assert "SIGNING_PROXY_LISTEN (listen: must be HOST:PORT" in bad.stderr
    public = check({"SIGNING_PROXY_LISTEN": "0.0.0.0:9000"})
    assert public.returncode == 2
    assert "SIGNING_PROXY_LISTEN" in public.stderr
