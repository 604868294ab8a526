"""Discovery given only what it uses (a fetch callable, its configuration, a requester source):
no app, no CA, no sockets. The loopback behaviour with a real edge is in test_discovery.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.errors import ManifestError
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import EgressError, ProxyError
from signing_proxy.net.client import FetchedResponse
from signing_proxy.proxy import manifest_cache
from signing_proxy.proxy.discovery import Discovery, Finding
from tests.memory import held_after

EDGE = parse_absolute_uri("https://pub.example/articles/1")
MANIFEST: dict[str, Any] = {
    "ver": "1.0",
    "role": "ROLE_PUBLISHER",
    "domain": "pub.example",
    "exchanges": [{"domain": "x.example", "endpoint": "https://x.example/v1", "relationship": "DIRECT"}],
}


OWN = "https://pub.example/.well-known/svc.json"
MANIFEST_BODY = json.dumps(MANIFEST).encode()
EXCHANGE = "https://x.example/v1/svc.v1.ExchangeService/DiscoverResources"


class Fetches:
    """Records each fetch and answers from a table of URL -> (status, body) or an exception to raise."""

    def __init__(self, answers: dict[str, tuple[int, bytes] | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, bytes]] = []
        self.egress: dict[str, bool] = {}  # URL -> whether the egress policy was asked for

    async def __call__(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
        egress: bool = False,
    ) -> FetchedResponse:
        self.calls.append((method, url, body))
        self.egress[url] = egress
        answer = self.answers.get(url)
        if answer is None:  # the client's detail carries internal text: it must stay in the log
            raise ProxyError(502, "upstream-connect-failed", f"{url}: [Errno 111] Connect call failed")
        if isinstance(answer, Exception):
            raise answer
        status, payload = answer
        return FetchedResponse(status, "", (("Cache-Control", "max-age=600"),), payload)


class Requester:
    """A requester without a delegation: its document is the same whether one is asked for or not."""

    def __init__(self) -> None:
        self.asked = 0

    def document(self, *, delegation: bool = True) -> dict[str, object]:
        self.asked += 1
        return {"id": "agent-1"}

    def is_exchange_call(self, method: str, target: object) -> bool:
        return True


def member(finding: Finding, name: str) -> dict[str, Any]:
    value = finding.doc[name]
    assert isinstance(value, dict)
    return value


def discovery(fetch: Fetches, requester: Requester | None = None, **section: object) -> Discovery:
    config = parse_config({"discovery": section}).discovery
    return Discovery(lambda: config, fetch, requester=lambda: requester)


async def test_one_fetch_serves_every_refusal_while_cached() -> None:
    fetch = Fetches({"https://pub.example/.well-known/svc.json": (200, json.dumps(MANIFEST).encode())})
    found = discovery(fetch)
    first = await found.find("see our manifest", EDGE)
    second = await found.find("see our manifest", EDGE)
    assert first.usable
    assert second.usable
    assert [c[:2] for c in fetch.calls] == [("GET", "https://pub.example/.well-known/svc.json")]


async def test_an_unreachable_manifest_is_a_finding_with_its_reason_not_an_exception() -> None:
    finding = await discovery(Fetches({})).find("see our manifest", EDGE)
    assert not finding.usable
    assert finding.doc["manifest_error"] == {
        "reason": "manifest-fetch-failed",
        "detail": "https://pub.example/.well-known/svc.json: upstream-connect-failed "
        "(the fetch failed; the cause is in the proxy's log)",
    }


async def test_discover_resources_sends_the_requester_it_is_given() -> None:
    offers = json.dumps({"offers": []}).encode()
    fetch = Fetches(
        {
            "https://pub.example/.well-known/svc.json": (200, json.dumps(MANIFEST).encode()),
            EXCHANGE: (200, offers),
        }
    )
    requester = Requester()
    finding = await discovery(fetch, requester, discover_resources=True).find("x", EDGE)
    method, url, body = fetch.calls[-1]
    assert (method, url) == ("POST", EXCHANGE)
    assert json.loads(body)["requester"] == {"id": "agent-1"}
    assert requester.asked == 1
    assert member(finding, "discover_resources")["requester"] == "sent"


class UnlistedRequester(Requester):
    """A requester with a delegation, for an exchange not in requester.exchanges."""

    def document(self, *, delegation: bool = True) -> dict[str, object]:
        self.asked += 1
        doc: dict[str, object] = {"id": "agent-1"}
        return {**doc, "delegation": {"token": "secret"}} if delegation else doc

    def is_exchange_call(self, method: str, target: object) -> bool:
        return False


async def test_an_unlisted_exchange_gets_the_requester_without_its_delegation() -> None:
    fetch = Fetches({OWN: (200, MANIFEST_BODY), EXCHANGE: (200, b"{}")})
    finding = await discovery(fetch, UnlistedRequester(), discover_resources=True).find("x", EDGE)
    _, url, body = fetch.calls[-1]
    assert url == EXCHANGE
    assert json.loads(body)["requester"] == {"id": "agent-1"}  # spec: in every request; no delegation
    assert member(finding, "discover_resources")["requester"] == "sent-without-delegation"


# --- issue 16 item 5: discovery is a request-forgery channel ---------------------------------------


async def test_discovery_request_forgery_the_refusing_origin_is_fetched_as_the_agents_request() -> None:
    fetch = Fetches({OWN: (200, MANIFEST_BODY), EXCHANGE: (200, b"{}")})
    finding = await discovery(fetch, discover_resources=True).find(f"<{OWN}>", EDGE)
    assert finding.usable
    assert fetch.egress == {OWN: False, EXCHANGE: True}  # every exchange endpoint passes the policy


@pytest.mark.parametrize(
    "named",
    [
        "https://pub.example:8443/.well-known/svc.json",  # another port of the same host
        "http://pub.example/.well-known/svc.json",  # another scheme (and insecure for https)
        "https://cdn.pub.example/.well-known/svc.json",  # the same site, another origin
    ],
)
async def test_discovery_request_forgery_another_origin_is_not_fetched_by_default(named: str) -> None:
    fetch = Fetches({named: (200, MANIFEST_BODY)})
    finding = await discovery(fetch).find(named, EDGE)
    assert finding.manifest_url is None
    assert member(finding, "manifest_error")["reason"] in {"manifest-cross-site", "manifest-insecure"}
    assert fetch.calls == []


async def test_discovery_request_forgery_another_origin_goes_through_the_egress_policy() -> None:
    other = "https://cdn.pub.example/m.json"
    refused = EgressError(
        "egress-address", "cdn.pub.example resolves to a loopback address not in allow_private"
    )
    fetch = Fetches({other: refused})
    finding = await discovery(fetch, allow_cross_site=True).find(other, EDGE)
    assert fetch.egress == {other: True}
    assert finding.doc["manifest_error"] == {
        "reason": "egress-address",
        "detail": "the host is not a public address and not in egress.allow_private",
    }


@pytest.mark.parametrize(
    ("named", "reason"),
    [
        ("https://user:pw@cdn.pub.example/m.json", "egress-userinfo"),
        ("https://cdn.pub.example/m#x", "egress-fragment"),
    ],
)
async def test_discovery_request_forgery_a_stranger_url_is_refused_not_repaired(
    named: str, reason: str
) -> None:
    fetch = Fetches({})
    finding = await discovery(fetch, allow_cross_site=True).find(named, EDGE)
    assert member(finding, "manifest_error")["reason"] == reason
    assert fetch.calls == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ((200, b'["internal"]'), "discover-resources-malformed"),
        ((200, b'"internal"'), "discover-resources-malformed"),
        ((200, b"<h1>internal</h1>"), "discover-resources-malformed"),
        # each reads with json.loads and cannot be written back inside the problem document: a 500
        ((200, b'{"internal": ' + b"[" * 100 + b"]" * 100 + b"}"), "discover-resources-malformed"),
        ((200, b'{"internal": 1e999}'), "discover-resources-malformed"),
        ((200, b'{"internal": NaN}'), "discover-resources-malformed"),
        ((500, b'{"admin": "internal"}'), "discover-resources-refused"),
        (
            ProxyError(502, "upstream-connect-failed", "10.0.0.7:443: [Errno 111] internal"),
            "upstream-connect-failed",
        ),
        (EgressError("egress-address", "x.example resolves to a private address"), "egress-address"),
    ],
)
async def test_discovery_request_forgery_only_a_discover_resources_response_is_shown(
    answer: tuple[int, bytes] | Exception, reason: str
) -> None:
    fetch = Fetches({OWN: (200, MANIFEST_BODY), EXCHANGE: answer})
    finding = await discovery(fetch, discover_resources=True).find("x", EDGE)
    found = member(finding, "discover_resources")
    assert found["error"]["reason"] == reason
    assert "response" not in found
    shown = json.dumps(finding.doc)
    assert "internal" not in shown
    assert "10.0.0.7" not in shown
    assert "Errno" not in shown


async def test_discovery_request_forgery_an_exchange_endpoint_with_a_query_is_never_called() -> None:
    manifest = {
        **MANIFEST,
        "exchanges": [{**MANIFEST["exchanges"][0], "endpoint": "https://x.example/admin?x="}],
    }
    fetch = Fetches({OWN: (200, json.dumps(manifest).encode())})
    finding = await discovery(fetch, discover_resources=True).find("x", EDGE)
    assert member(finding, "discover_resources")["error"]["reason"] == "egress-query"
    assert [c[1] for c in fetch.calls] == [OWN]


async def test_the_manifest_cache_keeps_what_discovery_reads_within_its_bounds() -> None:
    """A stranger's origin can name a new manifest URL with each refusal: each entry holds only what
    discovery reads, and all of them at most manifest_cache.MAX_BYTES as charged."""
    ballast = {"ext": {"deep": [[[[[0] * 50] * 10] * 10]]}, "unknown": list(range(2000))}
    body = json.dumps({**MANIFEST, **ballast}).encode()
    fetch = Fetches({f"{OWN}?n={i}": (200, body) for i in range(600)})
    found = discovery(fetch)
    for i in range(600):
        manifest = await found.manifest(f"{OWN}?n={i}", same_origin=True)
        assert (dict(manifest.ext), dict(manifest.extra), manifest.catalog_contributors) == ({}, {}, ())
        assert manifest.exchanges  # what the refusal answer shows is kept
    assert found.cache.bytes <= manifest_cache.MAX_BYTES
    assert len(found.cache) == manifest_cache.MAX_BYTES // (4 * len(body))  # the oldest went
    assert len(fetch.calls) == 600


async def test_a_cached_refusal_holds_its_reason_not_the_answer_it_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refusal used to keep the error itself, and a raised error's traceback holds the frames that
    read the answer: a 60 KB document parsed into ~10,000 lists stayed held, about 1.4 MB per
    refusal, charged 1 KiB. Each URL a stranger names is charged too."""
    caplog.set_level(logging.WARNING, logger="signing_proxy")  # refusals are logged: not measured here
    body = b"[" + b"[]," * 19_999 + b"[]]"  # JSON, not a manifest object
    urls = [f"{OWN}?n={i}&pad={'p' * 20_000}" for i in range(100)]
    fetch = Fetches({url: (200, body) for url in urls})
    found = discovery(fetch)
    with held_after() as held:
        for url in urls:
            with pytest.raises(ManifestError):
                await found.manifest(url, same_origin=True)
    assert held.mib < 8.0  # 124 MiB when each refusal kept its error
    entry = found.cache.fresh((fetch.egress[urls[-1]], urls[-1]), found.clock())
    assert entry is not None
    assert entry.error is not None
    assert entry.error.__traceback__ is None
    assert len(entry.error.detail) <= 512
    assert found.cache.bytes >= 100 * 20_000  # each URL charged
