"""Spec rule 7 in a running gateway: it re-fetches a provider's svc.json on its cache lifetime and
reports, on the admin port (/providers and /metrics), when this exchange leaves the provider's list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess, wait_for
from tests.proxy.gateway_backend import Backend

pytestmark = pytest.mark.integration


def manifest(*exchanges: str) -> bytes:
    entries = [{"domain": d, "endpoint": f"https://{d}/v1", "relationship": "DIRECT"} for d in exchanges]
    doc = {"ver": "1.0", "role": "ROLE_PUBLISHER", "domain": "pub.example", "exchanges": entries}
    return json.dumps(doc).encode()


def test_gateway_reports_a_provider_that_drops_this_exchange(tmp_path: Path) -> None:
    with Backend() as backend:
        backend.manifest = manifest("exchange.example")
        config: dict[str, Any] = {
            "mode": "gateway",
            "egress": {"allow_private": ["127.0.0.1/32"]},
            "admin": {"listen": "127.0.0.1:0"},
            "gateway": {
                "upstream": backend.url,
                "providers": [backend.url],
                "exchange_domain": "exchange.example",
                "manifest_min_refresh_s": 1,
                "manifest_max_refresh_s": 1,
            },
        }
        with ProxyProcess(tmp_path, config) as gateway:
            line = next(x for x in gateway.stderr_lines if " admin on http://" in x)
            admin = line.split(" admin on ", 1)[1].strip()

            def state() -> str:
                doc = requests.get(admin + "/providers", timeout=WAIT_S, proxies={"http": ""}).json()
                assert [p["url"] for p in doc] == [backend.url + "/.well-known/svc.json"]
                return str(doc[0]["state"])

            wait_for(lambda: state() == "authorized", "the provider's manifest to be read")
            backend.manifest = manifest("other.example")
            wait_for(lambda: state() == "removed", "the exchange's removal to be noticed")
            metrics = requests.get(admin + "/metrics", timeout=WAIT_S, proxies={"http": ""}).text
            assert 'signing_proxy_gateway_providers{state="removed"} 1.0' in metrics
            wait_for(  # a log line: written by the writer's thread, a moment after the state changed
                lambda: any("no longer lists exchange exchange.example" in x for x in gateway.stderr_lines),
                "the warning that the provider dropped this exchange",
            )
