"""Discovery through real sockets: a publisher edge refuses with 403 + X-Content-Rules, and the
proxy (a real ``signing-proxy run`` process) answers the unmodified client with the publisher's
authorized exchanges, fetched signed from its manifest (on the edge's own origin; another origin only
with ``allow_cross_site`` and the egress policy) (spec "What the service does" 5-6, "Manifest",
"Versioning"). HTTP targets arrive in absolute form; HTTPS ones inside an intercepted
CONNECT tunnel, trusted through the proxy's CA bundle only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.config import ConfigError, load_config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.proxy.discovery import LINK_REL, Discovery
from signing_proxy.service.app import ProxyApp
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, Arrival, ProxyProcess, proxy_env
from tests.proxy.publisher import DEFAULT_RULES, EDGE_BODY, EXCHANGE_DOMAIN, RESALE_DOMAIN, Publisher

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
RESTRICTIONS = [{"axis": "RESTRICTION_KIND_FUNCTION", "values": ["SUMMARIZE", "RETRIEVE"]}]
LOOPBACK = {"allow_private": ["127.0.0.1/32"]}  # the test exchange and the other-origin manifest server


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The HTTPS edge's own CA, trusted by the proxy for 127.0.0.1 only."""
    tmp = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.generate()
    (tmp / "edge-ca.pem").write_bytes(ca.cert_pem())
    with LeafContextCache(ca, 4) as leaves:
        yield {"ca_file": tmp / "edge-ca.pem", "tls": leaves.get("127.0.0.1")}


@pytest.fixture(scope="module")
def publisher() -> Iterator[Publisher]:
    with Publisher(KEY) as pub:
        yield pub


@pytest.fixture(scope="module")
def tls_publisher(pki: dict[str, Any]) -> Iterator[Publisher]:
    with Publisher(KEY, edge_tls=pki["tls"]) as pub:
        yield pub


def start_proxy(
    tmp: Path, pki: dict[str, Any] | None = None, egress: dict[str, Any] | None = None, **discovery: Any
) -> ProxyProcess:
    config: dict[str, Any] = {"log": {"format": "json"}, "discovery": discovery, "egress": egress or {}}
    if pki is not None:
        config["upstream"] = {"pin_ca_files": {"127.0.0.1": str(pki["ca_file"])}}
        config["intercept"] = {"allowed_ports": [443, pki["port"]]}
    return ProxyProcess(tmp, config, key=KEY)


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Any], tls_publisher: Publisher
) -> Iterator[ProxyProcess]:
    with start_proxy(tmp_path_factory.mktemp("proxy"), {**pki, "port": tls_publisher.edge.port}) as process:
        yield process


@pytest.fixture(autouse=True)
def _env(
    monkeypatch: pytest.MonkeyPatch, proxy: ProxyProcess, publisher: Publisher, tls_publisher: Publisher
) -> Iterator[None]:
    publisher.clear()
    tls_publisher.clear()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(proxy.tmp / "data" / "ca.pem"))  # the proxy's CA only
    with proxy_env(monkeypatch, proxy.url, https=True):
        yield


def get(url: str, method: str = "GET") -> requests.Response:
    """An unmodified client: ``requests`` configured by the environment only."""
    return requests.request(method, url, timeout=WAIT_S)


def assert_signed(arrival: Arrival) -> None:
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.keyids == [KEY.thumbprint]
    assert arrival.header("content-digest") is not None


def assert_exchanges(doc: dict[str, Any], publisher: Publisher) -> None:
    assert doc["exchanges"] == [
        {"domain": EXCHANGE_DOMAIN, "endpoint": publisher.exchange_endpoint, "relationship": "DIRECT"},
        {"domain": RESALE_DOMAIN, "endpoint": "https://resale.example/v1", "relationship": "RESELLER"},
    ]


# --- the answer to a refusal ----------------------------------------------------------------------


def test_refusal_over_http_is_answered_with_the_publishers_exchanges(publisher: Publisher) -> None:
    url = publisher.refused("first")
    manifest_url = publisher.manifest_url("first")
    r = get(url)
    assert r.status_code == 403
    assert r.headers["X-Content-Rules"] == manifest_url
    assert r.headers["Link"] == f'<{manifest_url}>; rel="{LINK_REL}"; type="application/json"'
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.headers["X-Edge"] == "kept"  # the edge's own fields stay
    assert "X-Edge-Hop" not in r.headers  # but never one its Connection names (RFC 9110 section 7.6.1)
    assert r.headers["Cache-Control"] == "no-store"  # ... except those describing the replaced body
    doc = r.json()
    assert doc["status"] == 403
    assert doc["reason"] == "content-rules"
    assert doc["uri"] == url
    assert doc["x_content_rules"] == manifest_url
    assert doc["manifest_url"] == manifest_url
    assert doc["manifest"] == {
        "ver": "1.0",
        "role": "ROLE_PUBLISHER",
        "domain": "127.0.0.1",
        "contact": "licensing@publisher.example",
    }
    assert_exchanges(doc, publisher)
    assert "manifest_error" not in doc
    assert "discover_resources" not in doc  # off by default
    # the refused request and the manifest fetch (on the edge's origin) both left the proxy signed
    refused, fetched = publisher.edge.arrivals
    assert_signed(refused)
    assert_signed(fetched)
    assert fetched.method == "GET"
    assert fetched.target_uri == manifest_url
    assert fetched.header("accept") == "application/json"


def test_refusal_over_https_inside_a_tunnel_follows_the_default_manifest_address(
    tls_publisher: Publisher,
) -> None:
    url = tls_publisher.edge.url("/default")
    manifest_url = tls_publisher.edge.url("/.well-known/svc.json")
    r = get(url)
    assert r.status_code == 403
    assert r.headers["X-Content-Rules"] == DEFAULT_RULES  # not a URL: {origin}/.well-known/svc.json
    assert r.headers["Link"].startswith(f"<{manifest_url}>;")
    doc = r.json()
    assert doc["reason"] == "content-rules"
    assert doc["uri"] == url
    assert doc["manifest_url"] == manifest_url
    assert_exchanges(doc, tls_publisher)
    refused, fetched = tls_publisher.edge.arrivals
    assert_signed(refused)
    assert_signed(fetched)  # fetched over verified TLS, signed for its https:// URL
    assert fetched.target_uri == manifest_url


def test_an_https_origin_never_gets_its_manifest_over_plain_http(tls_publisher: Publisher) -> None:
    r = get(tls_publisher.refused("v1.0", remote=True))  # names an http:// manifest
    assert r.status_code == 403
    doc = r.json()
    assert doc["manifest_error"]["reason"] == "manifest-insecure"
    assert "exchanges" not in doc
    assert "Link" not in r.headers
    assert tls_publisher.fetches("v1.0") == 0


def test_a_head_request_gets_the_head_of_the_answer(publisher: Publisher) -> None:
    r = get(publisher.refused("head"), method="HEAD")
    assert r.status_code == 403
    assert r.headers["Content-Type"] == "application/problem+json"
    assert int(r.headers["Content-Length"]) > 0
    assert r.content == b""
    assert get(publisher.edge.url("/ok")).text == "hello"  # the connection stayed in step


def test_a_large_refusal_body_is_cut_off_not_buffered(publisher: Publisher) -> None:
    r = get(publisher.edge.url("/huge"))
    assert r.status_code == 403
    assert_exchanges(r.json(), publisher)
    assert get(publisher.edge.url("/ok")).text == "hello"


def test_other_responses_stream_through_unchanged(publisher: Publisher) -> None:
    r = get(publisher.edge.url("/forbidden"))  # a 403 without X-Content-Rules
    assert r.status_code == 403
    assert r.content == EDGE_BODY
    assert "Link" not in r.headers
    ok = get(publisher.edge.url("/ok"))
    assert (ok.status_code, ok.text) == (200, "hello")
    assert len(publisher.edge.arrivals) == 2  # the two requests, no manifest fetch
    assert publisher.manifests.arrivals == []


# --- the manifest is validated first (spec "Versioning" 2, "Manifest") -----------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("v1.0", None),
        ("v1.7", None),  # a recognised major is accepted whatever the minor
        ("v2.0", "manifest-version-unsupported"),
        ("one", "manifest-version-malformed"),
        ("empty", "manifest-version-malformed"),
        ("missing", "manifest-version-missing"),
        ("no-exchanges", "manifest-missing-exchanges"),
        ("bad-relationship", "manifest-unknown-relationship"),
        ("other-domain", "manifest-domain-mismatch"),
        ("agent", "manifest-not-publisher"),
    ],
)
def test_manifest_is_validated_before_its_exchanges_are_shown(
    name: str, reason: str | None, publisher: Publisher
) -> None:
    r = get(publisher.refused(name))
    assert r.status_code == 403  # kept whatever discovery found
    assert r.headers["X-Content-Rules"] == publisher.manifest_url(name)
    assert r.headers["Link"].startswith(f"<{publisher.manifest_url(name)}>;")
    doc = r.json()
    assert doc["reason"] == "content-rules"
    assert doc["manifest_url"] == publisher.manifest_url(name)
    if reason is None:
        assert_exchanges(doc, publisher)
        assert "manifest_error" not in doc
    else:
        assert doc["manifest_error"]["reason"] == reason
        assert reason in doc["detail"]
        assert "exchanges" not in doc
    assert publisher.fetches(name) == 1


def test_a_second_refusal_within_max_age_fetches_nothing(publisher: Publisher) -> None:
    for _ in range(3):
        r = get(publisher.refused("cached"))  # served with max-age=600
        assert_exchanges(r.json(), publisher)
    assert publisher.fetches("cached") == 1
    refused = [a for a in publisher.edge.arrivals if "/refuse/" in a.target_uri]
    assert len(refused) == 3  # every refused request still went to the edge


def test_another_origin_is_refused_by_default(publisher: Publisher) -> None:
    r = get(publisher.refused("v1.0", remote=True))  # 127.0.0.1:edge names 127.0.0.1:another-port
    assert r.status_code == 403
    doc = r.json()
    assert doc["manifest_error"]["reason"] == "manifest-cross-site"
    assert "manifest_url" not in doc
    assert "Link" not in r.headers
    assert publisher.fetches("v1.0") == 0


def test_cross_site_allowed_and_no_store_honoured_down_to_cache_min_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    with (
        start_proxy(tmp_path, egress=LOOPBACK, allow_cross_site=True, cache_min_s=0) as lenient,
        proxy_env(monkeypatch, lenient.url),
    ):
        r = get(publisher.refused("cross", remote=True))
        doc = r.json()
        assert doc["manifest_url"] == publisher.manifest_url("cross", remote=True)
        assert_exchanges(doc, publisher)
        for _ in range(2):
            assert_exchanges(get(publisher.refused("nostore")).json(), publisher)
    [fetched] = publisher.manifests.arrivals  # another origin: through the egress policy, still signed
    assert_signed(fetched)
    assert publisher.fetches("nostore") == 2  # no-store with cache_min_s 0: fetched every time


def test_no_store_is_still_cached_for_cache_min_s(publisher: Publisher) -> None:
    for _ in range(2):
        assert_exchanges(get(publisher.refused("nostore")).json(), publisher)
    assert publisher.fetches("nostore") == 1  # the default floor of 60 s


# --- modes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["off", "passthrough"])
def test_off_and_passthrough_keep_the_edge_body(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    (tmp_path / "c.yaml").write_text(f"discovery:\n  mode: {mode}\n")  # a bare YAML `off` is a boolean
    assert load_config(tmp_path / "c.yaml").discovery.mode == mode
    with start_proxy(tmp_path, mode=mode) as process, proxy_env(monkeypatch, process.url):
        r = get(publisher.refused("v1.0"))
        cross = get(publisher.refused("v1.0", remote=True))
    assert r.status_code == 403
    assert r.content == EDGE_BODY
    assert r.headers["Content-Type"].startswith("text/html")
    assert "X-Edge-Hop" not in r.headers
    assert r.headers["X-Content-Rules"] == publisher.manifest_url("v1.0")
    if mode == "off":
        assert "Link" not in r.headers
    else:
        assert (
            r.headers["Link"]
            == f'<{publisher.manifest_url("v1.0")}>; rel="describedby"; type="application/json"'
        )
    assert "Link" not in cross.headers  # passthrough links only what the origin rule allows
    assert cross.content == EDGE_BODY
    assert publisher.fetches("v1.0") == 0  # neither mode fetches anything


@pytest.mark.parametrize("mode", ["follow", "passthrough"])
def test_only_a_403_with_content_rules_is_discovery(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    # spec Errors: "Status 403 with header X-Content-Rules"; on any other status it is the origin's
    # header, forwarded as it came, and nothing is fetched
    with start_proxy(tmp_path, mode=mode) as process, proxy_env(monkeypatch, process.url):
        r = get(publisher.edge.url("/served-with-rules"))
    assert (r.status_code, r.content) == (200, EDGE_BODY)
    assert r.headers["X-Content-Rules"] == publisher.manifest_url("v1.0")
    assert "Link" not in r.headers
    assert publisher.fetches("v1.0") == 0


# --- end to end: refused, then offers from the authorized exchange ---------------------------------


def test_end_to_end_the_refused_uri_comes_back_with_the_exchanges_offers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    url = publisher.refused("v1.0") + "?page=2"
    with (
        start_proxy(
            tmp_path, egress=LOOPBACK, discover_resources=True, acceptable_restrictions=RESTRICTIONS
        ) as process,
        proxy_env(monkeypatch, process.url),
    ):
        r = requests.get(url, timeout=WAIT_S)  # nothing but HTTP_PROXY tells it about the proxy
    assert r.status_code == 403
    doc = r.json()
    assert doc["reason"] == "content-rules"
    assert_exchanges(doc, publisher)
    found = doc["discover_resources"]
    assert found["exchange"] == EXCHANGE_DOMAIN
    assert found["url"] == publisher.exchange_endpoint + "/svc.v1.ExchangeService/DiscoverResources"
    assert found["status"] == 200
    assert found["requester"] == "not-configured"
    assert "without" in found["note"]
    assert found["response"] == {
        "offer_groups": [{"uri": url, "offers": [{"offer_id": "offer-0", "price_cents": "25"}]}]
    }
    # what the exchange received: signed (pinned key, both verifiers), the spec's body
    assert publisher.exchange_refusals == []
    [call] = publisher.exchange.arrivals
    assert_signed(call)
    assert call.method == "POST"
    assert call.header("content-type") == "application/json"
    assert publisher.discover_calls == [
        {"ver": "1.0", "exchange": EXCHANGE_DOMAIN, "uris": [url], "acceptable_restrictions": RESTRICTIONS}
    ]


def test_discover_resources_carries_the_configured_requester(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    requester = {"id": "agent-7", "domain": "agent.example", "type": "REQUESTER_TYPE_AGENT"}
    in_order = ["ver", "exchange", "requester", "uris", "acceptable_restrictions"]
    for exchanges, sent in (([publisher.exchange_endpoint], True), (["https://other.example/v1"], False)):
        publisher.clear()
        config = {
            "egress": LOOPBACK,
            "discovery": {"discover_resources": True},
            "requester": {**requester, "exchanges": exchanges},
        }
        with ProxyProcess(tmp_path, config, key=KEY) as process, proxy_env(monkeypatch, process.url):
            r = get(publisher.refused("v1.0"))
        found = r.json()["discover_resources"]
        [call] = publisher.discover_calls
        assert list(call) == in_order  # the spec: the Requester is sent in every request
        assert call["requester"] == requester
        if sent:
            assert found["requester"] == "sent"
        else:  # a delegation would go only to the exchanges the operator lists
            assert found["requester"] == "sent-without-delegation"
            assert "requester.exchanges" in found["note"]
        assert found["status"] == 200


def test_discover_resources_needs_a_direct_exchange(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: Publisher
) -> None:
    with start_proxy(tmp_path, discover_resources=True) as process, proxy_env(monkeypatch, process.url):
        doc = get(publisher.refused("reseller-only")).json()
    assert doc["exchanges"] == [
        {"domain": RESALE_DOMAIN, "endpoint": "https://resale.example/v1", "relationship": "RESELLER"}
    ]
    assert doc["discover_resources"]["error"]["reason"] == "no-direct-exchange"
    assert publisher.exchange.arrivals == []


# --- in-process: the cache under concurrency, configuration ----------------------------------------


def test_concurrent_refusals_share_one_manifest_fetch(tmp_path: Path, publisher: Publisher) -> None:
    config = parse_config({"data_dir": str(tmp_path), "intercept": {"enabled": False}})

    async def go() -> list[Any]:
        app = ProxyApp(config, StaticKeyProvider(KEY))
        try:
            discovery = app.discovery
            assert isinstance(discovery, Discovery)
            url = publisher.manifest_url("shared")
            fetching = (discovery.manifest(url, same_origin=True) for _ in range(5))
            results = await asyncio.gather(*fetching)
            assert discovery.fetches == 1
            return results
        finally:
            await app.stop(drain_s=0)

    manifests = asyncio.run(go())
    assert len({id(m) for m in manifests}) == 1
    assert publisher.fetches("shared") == 1


def test_relay_mode_leaves_refusals_to_the_agents_proxy(tmp_path: Path) -> None:
    app = ProxyApp(
        parse_config({"mode": "relay", "data_dir": str(tmp_path), "relay": {"verify": False}}),
        StaticKeyProvider(KEY),
    )
    assert app.discovery is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"mode": "follw"}, "discovery.mode: must be one of follow, off, passthrough"),
        ({"cache_min_s": -1}, "discovery.cache_min_s: must be zero or a positive integer"),
        ({"cache_min_s": 600, "cache_max_s": 60}, "discovery.cache_min_s: must not exceed cache_max_s"),
        ({"max_manifest_bytes": 0}, "discovery.max_manifest_bytes: must be a positive integer"),
        ({"acceptable_restrictions": [{"values": ["X"]}]}, "discovery.acceptable_restrictions[0]:"),
        (
            {"acceptable_restrictions": [{"axis": "A", "values": ["two words"]}]},
            "discovery.acceptable_restrictions[0].values[0]: must be a non-empty ASCII word",
        ),
        ({"allow_cross_site": "yes"}, "discovery.allow_cross_site: must be true or false"),
    ],
)
def test_discovery_config_mistakes_name_their_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"discovery": raw})
