"""The manifest watcher (spec rule 7): authorized, removed when the exchange leaves a provider's
``exchanges``, a failed fetch revoking nothing, the refresh clamped to its bounds, the callback."""

from __future__ import annotations

import json

import pytest

from signing_proxy.errors import DirectoryError
from signing_proxy.verify import FetchResult
from signing_proxy.verify.manifest_watch import ManifestWatcher, ProviderState
from tests.verify.fakes import NOW, Clock, FakeFetch

URL = "https://pub.example/.well-known/svc.json"


def manifest(*exchanges: str, max_age: int | None = 600) -> FetchResult:
    doc = {
        "ver": "1.0",
        "role": "ROLE_PUBLISHER",
        "domain": "pub.example",
        "exchanges": [
            {"domain": d, "endpoint": f"https://{d}/v1", "relationship": "DIRECT"} for d in exchanges
        ],
    }
    cache = f"max-age={max_age}" if max_age is not None else None
    return FetchResult(200, json.dumps(doc).encode(), cache)


@pytest.fixture
def parts() -> tuple[ManifestWatcher, FakeFetch, Clock, list[tuple[str, str]]]:
    fetch, clock, changes = FakeFetch(), Clock(), []

    def changed(old: ProviderState, new: ProviderState) -> None:
        changes.append((old.state, new.state))

    watcher = ManifestWatcher(
        ["pub.example"],
        "exchange.example",
        fetch,
        on_change=changed,
        clock=clock,
        min_refresh_s=60,
        max_refresh_s=3600,
    )
    return watcher, fetch, clock, changes


async def test_authorized_then_removed(
    parts: tuple[ManifestWatcher, FakeFetch, Clock, list[tuple[str, str]]],
) -> None:
    watcher, fetch, clock, changes = parts
    fetch.answers[URL] = manifest("exchange.example", "other.example")
    assert await watcher.check_due() == 600  # max-age within the bounds
    (state,) = watcher.states()
    assert (state.state, state.relationship, state.checked_at) == ("authorized", "DIRECT", NOW)
    fetch.answers[URL] = manifest("other.example", max_age=5)
    clock.now += 600
    assert await watcher.check_due() == 60  # max-age 5 clamped up to min_refresh_s
    assert watcher.states()[0].state == "removed"
    assert watcher.counts() == {"pending": 0, "authorized": 0, "removed": 1, "unavailable": 0}
    assert changes == [("pending", "authorized"), ("authorized", "removed")]
    assert fetch.calls == [URL, URL]


async def test_nothing_is_fetched_before_it_is_due(
    parts: tuple[ManifestWatcher, FakeFetch, Clock, list[tuple[str, str]]],
) -> None:
    watcher, fetch, clock, _changes = parts
    fetch.answers[URL] = manifest("exchange.example", max_age=10**9)
    assert await watcher.check_due() == 3600  # clamped down to max_refresh_s
    clock.now += 3599
    assert await watcher.check_due() == 1
    assert len(fetch.calls) == 1


async def test_a_failed_fetch_revokes_nothing_and_retries_soon(
    parts: tuple[ManifestWatcher, FakeFetch, Clock, list[tuple[str, str]]],
) -> None:
    watcher, fetch, clock, changes = parts
    fetch.answers[URL] = manifest("exchange.example")
    await watcher.check_due()
    fetch.answers[URL] = DirectoryError("directory-fetch-timeout", "slow")
    clock.now += 600
    assert await watcher.check_due() == 60
    state = watcher.states()[0]
    assert (state.state, state.last_authorized, state.reason) == (
        "unavailable",
        True,
        "directory-fetch-timeout",
    )
    fetch.answers[URL] = FetchResult(
        200, b'{"ver":"1.0","role":"ROLE_PUBLISHER","domain":"evil.example"}', None
    )
    clock.now += 60
    await watcher.check_due()
    assert watcher.states()[0].reason == "manifest-domain-mismatch"  # served by pub.example: refused
    assert changes == [("pending", "authorized"), ("authorized", "unavailable")]


async def test_a_callback_that_raises_does_not_stop_the_watcher(
    parts: tuple[ManifestWatcher, FakeFetch, Clock, list[tuple[str, str]]],
) -> None:
    watcher, fetch, _clock, _changes = parts

    def broken(_old: ProviderState, _new: ProviderState) -> None:
        raise RuntimeError("embedder bug")

    watcher.on_change = broken
    fetch.answers[URL] = manifest("exchange.example")
    await watcher.check_due()
    assert watcher.states()[0].as_json()["state"] == "authorized"


def test_a_provider_given_as_url_is_fetched_there() -> None:
    watcher = ManifestWatcher(["http://127.0.0.1:8443/"], "exchange.example", FakeFetch())
    assert watcher.states()[0].url == "http://127.0.0.1:8443/.well-known/svc.json"
