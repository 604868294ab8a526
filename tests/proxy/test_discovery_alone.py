"""Discovery given only what it uses (a fetch callable, its configuration, a requester source):
no app, no CA, no sockets. The loopback behaviour with a real edge is in test_discovery.py."""

from __future__ import annotations

import json

from signing_proxy.config import parse_config
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.client import FetchedResponse
from signing_proxy.proxy.discovery import Discovery

EDGE = parse_absolute_uri("https://pub.example/articles/1")
MANIFEST = {
    "ver": "1.0",
    "role": "ROLE_PUBLISHER",
    "domain": "pub.example",
    "exchanges": [{"domain": "x.example", "endpoint": "https://x.example/v1", "relationship": "DIRECT"}],
}


class Fetches:
    """Records each fetch and answers from a table of URL -> (status, body)."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, bytes]] = []

    async def __call__(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
    ) -> FetchedResponse:
        self.calls.append((method, url, body))
        if url not in self.answers:
            raise ProxyError(502, "upstream-connect-failed", f"{url}: refused")
        status, payload = self.answers[url]
        return FetchedResponse(status, "", (("Cache-Control", "max-age=600"),), payload)


class Requester:
    def __init__(self) -> None:
        self.asked = 0

    def document(self) -> dict[str, object]:
        self.asked += 1
        return {"id": "agent-1"}

    def is_exchange_call(self, method: str, target: object) -> bool:
        return True


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
        "(https://pub.example/.well-known/svc.json: refused)",
    }


async def test_discover_resources_sends_the_requester_it_is_given() -> None:
    offers = json.dumps({"offers": []}).encode()
    fetch = Fetches(
        {
            "https://pub.example/.well-known/svc.json": (200, json.dumps(MANIFEST).encode()),
            "https://x.example/v1/svc.v1.ExchangeService/DiscoverResources": (200, offers),
        }
    )
    requester = Requester()
    finding = await discovery(fetch, requester, discover_resources=True).find("x", EDGE)
    method, url, body = fetch.calls[-1]
    assert (method, url) == ("POST", "https://x.example/v1/svc.v1.ExchangeService/DiscoverResources")
    assert json.loads(body)["requester"] == {"id": "agent-1"}
    assert requester.asked == 1
    assert finding.doc["discover_resources"]["requester"] == "sent"  # type: ignore[index]
