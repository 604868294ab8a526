"""End to end, the delegated key: the key store rotates while a delegation chain is configured, and
delegated exchange calls keep verifying at an exchange that checks layer 1 from the proxy's published
directory and the holder binding (``cnf.jkt`` = the verified keyid) until the bound key's window ends;
then the proxy refuses them with 503 ``delegation-key-expired`` until the chain is re-issued."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.storage.keystore import KeyStore
from tests.harness import DIRECT, WAIT_S, ProxyProcess, proxy_env, wait_for
from tests.proxy.test_delegation_e2e import Exchange, delegated_setup, discover_body

pytestmark = pytest.mark.integration

GRACE_S = 30  # the bound key's window after the rotation: long enough to be seen working, short to wait out
PUBLIC = {"id": "public-bot", "domain": "bot.example", "type": "REQUESTER_TYPE_AGENT"}  # no delegation


def delegated(body: dict[str, Any]) -> bool:
    return "delegation" in body.get("requester", {})


def test_delegated_calls_keep_the_bound_key_through_a_rotation_until_its_window_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the waits below poll the exchange hundreds of times with the delegation; the re-issued chain
    # shares the authority's access count, so the cap is set above what this test spends
    with (
        Exchange(tmp_path) as exchange,
        delegated_setup(tmp_path, exchange.base, max_accesses=100_000) as setup,
    ):
        exchange.trust_owner(setup.owner.public)
        setup.extend("--holder-config", str(setup.config_path))
        old = setup.store_key()
        url = exchange.base + "/svc.v1.ExchangeService/DiscoverResources"

        def post(body: dict[str, Any]) -> requests.Response:
            return requests.post(url, json=body, timeout=WAIT_S)

        with ProxyProcess(tmp_path, setup.config) as proxy, proxy_env(monkeypatch, proxy.url):
            assert post(discover_body()).status_code == 200
            KeyStore(tmp_path / "data").rotate(time.time(), grace_s=GRACE_S)
            assert proxy.proc is not None
            proxy.proc.send_signal(signal.SIGHUP)  # the rotation picked up now, not at the next poll
            new = setup.store_key()
            assert new != old

            def moved() -> bool:  # calls without the delegation follow the store to the new key
                post(discover_body(requester=PUBLIC))
                return exchange.received[-1].keyid == new

            # at most a third of the grace: the checks below run well inside the bound key's window
            wait_for(moved, "the proxy to sign with the new key (SIGHUP)", limit_s=GRACE_S / 3)
            resp = post(discover_body())
            assert resp.status_code == 200, resp.text  # the exchange checked the holder binding
            assert delegated(exchange.received[-1].body)
            assert exchange.received[-1].keyid == old
            ready = requests.get(proxy.url + "/readyz", timeout=WAIT_S, proxies=DIRECT).json()
            assert ready["delegation_key"]["keyid"] == old
            assert ready["delegation_key"]["state"] == "expiring"
            metrics = requests.get(proxy.url + "/metrics", timeout=WAIT_S, proxies=DIRECT).text
            assert "signing_proxy_delegation_key_remaining_seconds " in metrics

            def refused() -> bool:
                return post(discover_body()).status_code == 503

            wait_for(refused, "the bound key's window to end", limit_s=GRACE_S + 30)
            problem = post(discover_body()).json()
            assert problem["reason"] == "delegation-key-expired"
            assert old in problem["detail"]
            assert "--holder-config" in problem["detail"]
            sent = [r for r in exchange.received if delegated(r.body)]
            assert sent
            assert all(r.keyid == old for r in sent)  # never signed with a key the chain does not name
            wait_for(lambda: any("stops signing at" in line for line in proxy.stderr_lines), "the warning")

            setup.extend("--holder-config", str(setup.config_path))  # re-issued to the new key

            def accepted() -> bool:
                return post(discover_body()).status_code == 200

            wait_for(accepted, "the re-issued delegation to be picked up", limit_s=30)
            assert exchange.received[-1].keyid == new
