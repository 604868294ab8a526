"""One provider's check never stops the others': an entry the manifest code cannot take as a host
(``pub-a.example/``), or a check that fails unexpectedly, leaves that provider ``unavailable`` and
due again after the minimum, and the providers after it are checked (a removal is noticed)."""

from __future__ import annotations

import json
import logging

import pytest

from signing_proxy.verify import FetchResult
from signing_proxy.verify.manifest_watch import ManifestWatcher
from tests.verify.fakes import NOW, Clock, FakeFetch

EXCHANGE = "exchange.example"


def manifest(domain: str, *exchanges: str) -> FetchResult:
    doc = {
        "ver": "1.0",
        "role": "ROLE_PUBLISHER",
        "domain": domain,
        "exchanges": [
            {"domain": d, "endpoint": f"https://{d}/v1", "relationship": "DIRECT"} for d in exchanges
        ],
    }
    return FetchResult(200, json.dumps(doc).encode(), "max-age=600")


def watcher(providers: list[str], fetch: FakeFetch, clock: Clock) -> ManifestWatcher:
    return ManifestWatcher(providers, EXCHANGE, fetch, clock=clock, min_refresh_s=60, max_refresh_s=3600)


async def test_a_provider_that_is_no_host_does_not_stop_the_others() -> None:
    fetch, clock = FakeFetch(), Clock()
    fetch.answers["https://pub-a.example//.well-known/svc.json"] = manifest("pub-a.example", EXCHANGE)
    fetch.answers["https://pub-b.example/.well-known/svc.json"] = manifest("pub-b.example", "other.example")
    watch = watcher(["pub-a.example/", "pub-b.example"], fetch, clock)
    assert await watch.check_due() == 60  # the malformed one is due again after the minimum
    states = {s.provider: s for s in watch.states()}
    assert (states["pub-a.example/"].state, states["pub-a.example/"].reason) == (
        "unavailable",
        "provider-malformed",
    )
    assert states["pub-a.example/"].next_check_at == NOW + 60
    assert states["pub-b.example"].state == "removed"  # checked: this exchange left its list
    clock.now += 60
    await watch.check_due()  # the next cycle: the same, nothing raised
    assert len(fetch.calls) == 3  # pub-a twice (each minute), pub-b once (its max-age)


async def test_an_unexpected_failure_of_one_check_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fetch, clock = FakeFetch(), Clock()
    fetch.answers["https://pub-a.example/.well-known/svc.json"] = RuntimeError("a bug in a fetcher")
    fetch.answers["https://pub-b.example/.well-known/svc.json"] = manifest("pub-b.example", EXCHANGE)
    watch = watcher(["pub-a.example", "pub-b.example"], fetch, clock)
    with caplog.at_level(logging.ERROR, logger="signing_proxy.manifests"):
        assert await watch.check_due() == 60
    states = {s.provider: s for s in watch.states()}
    assert (states["pub-a.example"].state, states["pub-a.example"].reason) == (
        "unavailable",
        "manifest-check-failed",
    )
    assert states["pub-a.example"].next_check_at == NOW + 60
    assert states["pub-b.example"].state == "authorized"
    assert any("pub-a.example" in r.getMessage() for r in caplog.records)
