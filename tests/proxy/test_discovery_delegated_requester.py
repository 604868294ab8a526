"""DiscoverResources with the real requester injection and signing pipeline: a delegated requester
goes only where its delegation goes (an exchange not in ``requester.exchanges`` got one typed
DELEGATED without it, which the spec refuses, "Delegation token missing", and which carried the
agent's name and scopes for nothing), and a requester that cannot be built is a refusal, not a
note saying the call went without one when nothing left."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from signing_proxy.config import parse_config
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.net.client import FetchedResponse
from signing_proxy.proxy.discovery import Discovery
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.requester import RequesterInjector
from tests.proxy.test_requester import HOUR, NOW, PROXY, Clock, Keys, config, injector

EDGE = parse_absolute_uri("https://pub.example/a/1")


def manifest(endpoint: str) -> bytes:
    exchange = {"domain": "x.example", "endpoint": endpoint, "relationship": "DIRECT"}
    return json.dumps(
        {"ver": "1.0", "role": "ROLE_PUBLISHER", "domain": "pub.example", "exchanges": [exchange]}
    ).encode()


class PipelineFetch:
    """What the proxy's signed fetch does up to the wire: the pipeline signs (or refuses) the call."""

    def __init__(self, pipeline: SigningPipeline, endpoint: str) -> None:
        self.pipeline, self.endpoint = pipeline, endpoint
        self.sent: list[tuple[str, bytes]] = []

    async def __call__(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        max_bytes: int,
        egress: bool = False,
    ) -> FetchedResponse:
        if url.endswith("/.well-known/svc.json"):
            return FetchedResponse(200, "", (), manifest(self.endpoint))
        out = self.pipeline.prepare(method, parse_absolute_uri(url), list(headers), body, framed=True)
        self.sent.append((url, out.body))
        return FetchedResponse(200, "", (), b'{"offer_groups":[]}')


def discover(
    tmp_path: Path, inj: RequesterInjector, clock: Clock, endpoint: str
) -> tuple[Any, PipelineFetch]:
    signer = Signer(Keys(PROXY), label="agent", validity_s=300, clock=clock)
    pipeline = SigningPipeline(config=config(tmp_path), signer=signer, bearers=BearerStore(()), requester=inj)
    fetch = PipelineFetch(pipeline, endpoint)
    section = parse_config({"discovery": {"discover_resources": True}}).discovery
    found = asyncio.run(Discovery(lambda: section, fetch, requester=lambda: inj).find("x", EDGE))
    return found.doc["discover_resources"], fetch


def test_a_delegated_requester_is_not_sent_to_an_exchange_its_delegation_does_not_go_to(
    tmp_path: Path,
) -> None:
    clock = Clock()
    shown, fetch = discover(
        tmp_path, injector(tmp_path, clock=clock), clock, "https://other-exchange.example/v1"
    )
    assert fetch.sent == []
    assert shown["requester"] == "not-sent"
    assert shown["error"]["reason"] == "delegation-not-sent"


def test_a_requester_that_cannot_be_built_is_a_refusal_and_nothing_is_sent(tmp_path: Path) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    clock.now = NOW + HOUR + 1  # past the chain's expiry, after it was loaded
    shown, fetch = discover(tmp_path, inj, clock, "https://exchange.example/v1")  # a listed exchange
    assert fetch.sent == []
    assert shown["requester"] == "unavailable"
    assert shown["error"]["reason"].startswith("delegation-")
    assert "note" not in shown  # it said "sent without one"
