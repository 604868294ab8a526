"""Issue 16 item 5, "Discovery is a request-forgery channel", through a real ``signing-proxy run``.

A publisher's ``X-Content-Rules`` and manifest name URLs the proxy then fetches: another port of the
refusing host, an exchange endpoint that is really an internal service, a manifest that redirects.
Only the refusing origin itself is fetched as the agent's own request; anything else needs
``discovery.allow_cross_site`` (manifests) and passes the egress policy (manifests and every exchange
endpoint), and what comes back reaches the agent only as a DiscoverResources response (a JSON object).
Arrivals are counted at every server: "not fetched" means no request reached it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, proxy_env, wait_for
from tests.proxy.publisher import INTERNAL_SECRET, Publisher

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
LOOPBACK = ["127.0.0.1/32"]


@pytest.fixture(scope="module")
def publisher() -> Iterator[Publisher]:
    with Publisher(KEY) as pub:
        yield pub


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """The defaults (same origin only, public addresses only), with DiscoverResources on."""
    config = {"log": {"format": "json"}, "discovery": {"discover_resources": True}}
    with ProxyProcess(tmp_path_factory.mktemp("strict"), config, key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def lenient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """Other origins allowed, and the loopback test servers allow-listed for egress."""
    config = {
        "log": {"format": "json"},
        "discovery": {"discover_resources": True, "allow_cross_site": True},
        "egress": {"allow_private": LOOPBACK},
    }
    with ProxyProcess(tmp_path_factory.mktemp("lenient"), config, key=KEY) as process:
        yield process


@pytest.fixture(autouse=True)
def _fresh(publisher: Publisher) -> None:
    publisher.clear()


def get(monkeypatch: pytest.MonkeyPatch, proxy: ProxyProcess, url: str) -> requests.Response:
    """An unmodified client through ``proxy``; the answer must be the discovery 403."""
    with proxy_env(monkeypatch, proxy.url):
        r = requests.get(url, timeout=WAIT_S)
    assert r.status_code == 403
    assert r.headers["Content-Type"] == "application/problem+json"
    return r


def offers(r: requests.Response) -> dict[str, Any]:
    found = r.json()["discover_resources"]
    assert isinstance(found, dict)
    return found


def test_discovery_request_forgery_another_port_of_the_same_host_is_not_fetched(
    monkeypatch: pytest.MonkeyPatch, strict: ProxyProcess, publisher: Publisher
) -> None:
    r = get(monkeypatch, strict, publisher.refused("v1.0", remote=True))  # 127.0.0.1:other-port
    doc = r.json()
    assert doc["manifest_error"]["reason"] == "manifest-cross-site"
    assert "Link" not in r.headers
    assert publisher.manifests.arrivals == []  # no request reached the other port
    assert [a.method for a in publisher.edge.arrivals] == ["GET"]  # only the agent's own request


def test_discovery_request_forgery_another_origin_passes_the_egress_policy(
    monkeypatch: pytest.MonkeyPatch, lenient: ProxyProcess, publisher: Publisher
) -> None:
    named = f"http://127.0.0.2:{publisher.internal.port}/m.json"  # loopback, but not allow-listed
    refused = get(monkeypatch, lenient, publisher.naming(named))
    assert refused.json()["manifest_error"] == {
        "reason": "egress-address",
        "detail": "the host is not a public address and not in egress.allow_private",
    }
    assert INTERNAL_SECRET not in refused.text
    assert publisher.internal.arrivals == []
    allowed = get(monkeypatch, lenient, publisher.refused("v1.0", remote=True))  # 127.0.0.1 is listed
    assert allowed.json()["manifest"]["domain"] == "127.0.0.1"
    [fetched] = publisher.manifests.arrivals
    assert fetched.verified  # signed like every request of the proxy's own


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("internal", "egress-query"),  # http://127.0.0.1:PORT/admin?x=, the example
        ("internal-plain", "egress-address"),  # http://127.0.0.1:PORT/admin: loopback, not listed
        ("internal-name", "egress-scheme"),  # http://localhost:PORT/admin: plain http, nothing listed
        ("internal-https", "egress-address"),  # https, but loopback and not allow-listed
    ],
)
def test_discovery_request_forgery_an_exchange_endpoint_on_loopback_is_never_contacted(
    manifest: str, reason: str, monkeypatch: pytest.MonkeyPatch, strict: ProxyProcess, publisher: Publisher
) -> None:
    r = get(monkeypatch, strict, publisher.refused(manifest))  # the manifest itself is on the edge
    found = offers(r)
    assert found["error"]["reason"] == reason
    assert str(publisher.internal.port) not in found["error"]["detail"]
    assert "response" not in found
    assert INTERNAL_SECRET not in r.text
    assert publisher.internal.arrivals == []  # never contacted
    # the full cause is in the proxy's log, not in the answer
    wait_for(
        lambda: any(reason in line and "DiscoverResources" in line for line in strict.stderr_lines),
        "the refusal in the proxy's log",
    )


def test_discovery_request_forgery_an_endpoint_with_a_query_stays_refused_when_allow_listed(
    monkeypatch: pytest.MonkeyPatch, lenient: ProxyProcess, publisher: Publisher
) -> None:
    r = get(monkeypatch, lenient, publisher.refused("internal"))
    assert offers(r)["error"]["reason"] == "egress-query"
    assert INTERNAL_SECRET not in r.text
    assert publisher.internal.arrivals == []


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("array-answer", "discover-resources-malformed"),  # JSON, but not an object
        ("text-answer", "discover-resources-malformed"),  # an HTML page
        ("error-answer", "discover-resources-refused"),  # a JSON object with status 500
    ],
)
def test_discovery_request_forgery_a_non_json_object_exchange_answer_is_not_shown(
    manifest: str, reason: str, monkeypatch: pytest.MonkeyPatch, lenient: ProxyProcess, publisher: Publisher
) -> None:
    r = get(monkeypatch, lenient, publisher.refused(manifest))
    found = offers(r)
    assert found["error"]["reason"] == reason
    assert "response" not in found
    assert INTERNAL_SECRET not in r.text
    [call] = publisher.exchange.arrivals  # it was asked, signed, through the egress policy
    assert call.verified


def test_discovery_request_forgery_a_redirect_from_a_cross_origin_manifest_is_not_followed(
    monkeypatch: pytest.MonkeyPatch, lenient: ProxyProcess, publisher: Publisher
) -> None:
    r = get(monkeypatch, lenient, publisher.refused("redirect", remote=True))  # 302 to the internal service
    url = publisher.manifest_url("redirect", remote=True)
    assert r.json()["manifest_error"] == {
        "reason": "manifest-fetch-failed",
        "detail": f"{url} answered 302 (redirects are not followed)",
    }
    assert len(publisher.manifests.arrivals) == 1
    assert publisher.internal.arrivals == []  # the Location was never fetched
    assert INTERNAL_SECRET not in r.text
    assert "/admin" not in r.text  # nor shown


def test_discovery_request_forgery_a_failed_fetch_shows_a_stable_reason_not_its_cause(
    monkeypatch: pytest.MonkeyPatch, lenient: ProxyProcess, publisher: Publisher
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/m.json"
        r = get(monkeypatch, lenient, publisher.naming(url))
    assert r.json()["manifest_error"] == {
        "reason": "manifest-fetch-failed",
        "detail": f"{url}: upstream-connect-failed (the fetch failed; the cause is in the proxy's log)",
    }
