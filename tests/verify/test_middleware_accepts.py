"""The verifier middleware accepts what the proxy emits in every configuration: plain HTTP, a
sidecar route, HTTPS through an intercepted CONNECT tunnel, and relayed through a broker hop.

The origin mounts ``signature_middleware`` (keys found through directories served by a fake
fetcher, the way an exchange would find them); a request it refused would never reach the handler,
so each test asserts both the 200 and the arrival, which the harness also checks with the
independent http-message-signatures verifier.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, parse_directory, render_directory
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.storage.ca import CertificateAuthority
from signing_proxy.verify import (
    DirectoryResolver,
    EgressPolicy,
    Fetcher,
    FetchResult,
    HttpClient,
    RequestVerifier,
    VerifierPolicy,
    directory_url,
    http_fetcher,
    signature_middleware,
)
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin
from tests.verify.directory_host import served_directory

pytestmark = pytest.mark.integration

AGENT = SigningKey.generate()
BROKER = SigningKey.generate()
AGENT_DIR = "https://agent.example"
BROKER_DIR = "https://broker.example"


async def fake_fetch(url: str) -> FetchResult:
    now = int(time.time())
    keys = {directory_url(AGENT_DIR): AGENT, directory_url(BROKER_DIR): BROKER}
    key = keys.get(url)
    if key is None:
        return FetchResult(404, b"", None)
    return FetchResult(
        200, render_directory(Directory((DirectoryKey(key.public, now - 60, now + 3600),))), None
    )


def middleware() -> Any:
    verifier = RequestVerifier(
        DirectoryResolver(fake_fetch), VerifierPolicy(broker_directories=(BROKER_DIR,))
    )
    return signature_middleware(verifier)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.generate()
    (tmp / "origin-ca.pem").write_bytes(ca.cert_pem())
    with LeafContextCache(ca, 4) as leaves:
        yield {"ca_file": tmp / "origin-ca.pem", "tls": leaves.get("127.0.0.1")}


def agent_config(**extra: Any) -> dict[str, Any]:
    return {"signing": {"signature_agent": AGENT_DIR}, **extra}


def check(origin: VerifyingOrigin, resp: requests.Response, labels: list[str]) -> None:
    assert resp.status_code == 200, resp.text
    arrival = origin.arrivals[-1]
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.labels == labels


def test_plain_http(tmp_path: Path) -> None:
    with (
        VerifyingOrigin(middlewares=[middleware()]) as origin,
        ProxyProcess(tmp_path, agent_config(), key=AGENT) as proxy,
    ):
        origin.trust(AGENT)
        resp = requests.post(
            origin.url("/svc.v1.ExchangeService/DiscoverResources"),
            data=b"{}",
            proxies={"http": proxy.url},
            timeout=WAIT_S,
        )
        check(origin, resp, ["agent"])


def test_sidecar_route(tmp_path: Path) -> None:
    with VerifyingOrigin(middlewares=[middleware()]) as origin:
        origin.trust(AGENT)
        config = agent_config(routes=[{"prefix": "/exchange/", "upstream": origin.url("/v1/")}])
        with ProxyProcess(tmp_path, config, key=AGENT) as proxy:
            resp = requests.post(
                f"{proxy.url}/exchange/svc.v1.ExchangeService/DiscoverResources",
                data=b"{}",
                proxies={},
                timeout=WAIT_S,
            )
        check(origin, resp, ["agent"])


def test_https_through_an_intercepted_tunnel(tmp_path: Path, pki: dict[str, Any]) -> None:
    with VerifyingOrigin(tls=pki["tls"], middlewares=[middleware()]) as origin:
        origin.trust(AGENT)
        config = agent_config(
            upstream={"pin_ca_files": {"127.0.0.1": str(pki["ca_file"])}},
            intercept={"allowed_ports": [origin.port]},
        )
        with ProxyProcess(tmp_path, config, key=AGENT) as proxy:
            resp = requests.post(
                origin.url("/svc.v1.ExchangeService/DiscoverResources"),
                data=b"{}",
                proxies={"https": proxy.url},
                verify=str(tmp_path / "data" / "ca.pem"),
                timeout=WAIT_S,
            )
        check(origin, resp, ["agent"])
        assert origin.arrivals[-1].target_uri.startswith("https://")


LOOPBACK = EgressPolicy(allow_private=("127.0.0.1/32",))  # our test servers: allow-listed


def loopback_fetch(publish_base: str) -> Fetcher:
    """A real fetch (a client per call, so it works on whichever loop the origin runs); the relay's
    revocation list, named at the port-less ``public_url``, is fetched from its listener."""

    async def fetch(url: str) -> FetchResult:
        if url.startswith("http://127.0.0.1/"):
            url = publish_base + url.removeprefix("http://127.0.0.1")
        async with HttpClient.standalone() as client:
            return await http_fetcher(client, egress=LOOPBACK)(url)

    return fetch


def test_relayed_through_a_broker_hop(tmp_path: Path) -> None:
    (tmp_path / "relay").mkdir()
    (tmp_path / "agent").mkdir()
    relay_config = {
        "mode": "relay",
        "signing": {"key": None, "label": "broker"},
        # the relay's own key is read from this listener; its public_url only names the revocation list
        "publish": {"listen": "127.0.0.1:0", "domain": "127.0.0.1", "public_url": "http://127.0.0.1"},
        "egress": {"allow_private": ["127.0.0.1/32"]},  # the agent's directory is on loopback
    }
    with (
        served_directory(AGENT) as agent_base,
        ProxyProcess(tmp_path / "relay", relay_config) as relay,
    ):
        relay_base = f"http://127.0.0.1:{relay.publish_port}"
        verifier = RequestVerifier(
            DirectoryResolver(loopback_fetch(relay_base)),
            VerifierPolicy(broker_directories=(relay_base,)),
            egress=LOOPBACK,
        )
        agent_cfg = {
            "signing": {"signature_agent": agent_base},
            "upstream": {"next_hop": relay.url},
        }
        with (
            VerifyingOrigin(middlewares=[signature_middleware(verifier)]) as origin,
            ProxyProcess(tmp_path / "agent", agent_cfg, key=AGENT) as agent,
        ):
            served = requests.get(directory_url(relay_base), timeout=WAIT_S, proxies={})
            origin.trust(AGENT, *(k.public for k in parse_directory(served.content).keys))
            resp = requests.post(origin.url("/x"), data=b"{}", proxies={"http": agent.url}, timeout=WAIT_S)
            assert resp.status_code == 200, resp.text
            arrival = origin.arrivals[-1]
            assert arrival.verified, arrival.reason
            assert arrival.oracle == "ok", arrival.oracle
            assert arrival.labels == ["agent", "broker"]
