"""A wall clock stepped by NTP moves no lifetime nor schedule: the resolver, the revocation poller and
the manifest watcher time them on a monotonic clock, so the documented durations hold (a failure
remembered 30 s, a keyid re-fetch at most every 30 s, a manifest re-checked on its max-age).

Each test injects two fake clocks, the wall one stepped an hour (a day) one way and the monotonic
one advanced past the lifetime (or not): through ``build_verifier``, the production wiring, and the
watcher as the gateway makes it. On the wall clock alone a step back held all of these for the step.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.errors import DirectoryError
from signing_proxy.verify import FetchResult, RequestVerifier, build_verifier, directory_url
from signing_proxy.verify.manifest_watch import ManifestWatcher
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.strangers import directory_doc, revocation_doc

KEY = SigningKey.from_seed(bytes(range(32)))
ROTATED = SigningKey.from_seed(bytes(range(1, 33)))
BASE = "https://agent.example"
URL = directory_url(BASE)
REV_URL = "https://agent.example/revoked.json"
STEP_S = 3600.0  # an NTP correction of an hour
MONOTONIC_START = 10_000.0  # unrelated to the wall clock, as a real one is


async def never_wakes(_seconds: float) -> None:
    """The periodic revocation poller waits in this until closed: only ``ensure`` polls here."""
    await asyncio.Event().wait()


@dataclass
class Parts:
    verifier: RequestVerifier
    fetch: FakeFetch
    wall: Clock
    mono: Clock


def two_clocks() -> tuple[Clock, Clock]:
    wall, mono = Clock(), Clock()
    mono.now = MONOTONIC_START
    return wall, mono


@pytest.fixture
async def parts() -> AsyncIterator[Parts]:
    wall, mono = two_clocks()
    verifier = build_verifier(clock=wall, monotonic=mono, sleep=never_wakes)
    fetch = FakeFetch()
    verifier.resolver.fetch = fetch
    assert verifier.revocations is not None
    verifier.revocations.fetch = fetch
    yield Parts(verifier, fetch, wall, mono)
    await verifier.close()


def directory(*keys: SigningKey, revocation_url: str | None = None) -> FetchResult:
    return FetchResult(200, directory_doc(*keys, now=NOW, revocation_url=revocation_url), "max-age=600")


async def test_a_failure_remembered_30_s_is_retried_after_30_s_though_the_wall_clock_stepped_back(
    parts: Parts,
) -> None:
    parts.fetch.answers[URL] = DirectoryError("directory-fetch-failed", "down")
    with pytest.raises(DirectoryError):
        await parts.verifier.resolver.get(BASE)
    parts.fetch.answers[URL] = directory(KEY)
    parts.wall.now -= STEP_S
    parts.mono.now += 29
    with pytest.raises(DirectoryError) as remembered:
        await parts.verifier.resolver.get(BASE)
    assert "failed recently" in remembered.value.detail  # still within its 30 s: not fetched
    parts.mono.now += 2
    found = await parts.verifier.resolver.get(BASE)
    assert found.lookup(KEY.thumbprint) is not None
    assert parts.fetch.calls == [URL, URL]


async def test_a_keyid_refetch_is_allowed_30_s_after_the_fetch_though_the_wall_clock_stepped_back(
    parts: Parts,
) -> None:
    parts.fetch.answers[URL] = directory(KEY)
    await parts.verifier.resolver.get(BASE)
    parts.fetch.answers[URL] = directory(KEY, ROTATED)  # the agent rotates a key in
    parts.wall.now -= STEP_S
    parts.mono.now += 31
    refetched = await parts.verifier.resolver.refetch_for_keyid(BASE)
    assert refetched is not None
    assert refetched.lookup(ROTATED.thumbprint) is not None
    parts.mono.now += 29
    assert await parts.verifier.resolver.refetch_for_keyid(BASE) is None  # still once per 30 s


async def test_a_wall_clock_stepped_forward_does_not_expire_a_fresh_entry(parts: Parts) -> None:
    parts.fetch.answers[URL] = directory(KEY)
    first = await parts.verifier.resolver.get(BASE)
    parts.wall.now += STEP_S  # past the entry's 600 s on the wall clock
    parts.mono.now += 1
    assert await parts.verifier.resolver.get(BASE) is first
    assert parts.fetch.calls == [URL]
    parts.mono.now += 600  # its max-age, on the clock that times it
    await parts.verifier.resolver.get(BASE)
    assert parts.fetch.calls == [URL, URL]


async def test_a_list_never_fetched_is_retried_and_aged_on_the_monotonic_clock(parts: Parts) -> None:
    poller = parts.verifier.revocations
    assert poller is not None
    parts.fetch.answers[URL] = directory(KEY, revocation_url=REV_URL)
    await parts.verifier.resolver.get(BASE)  # cached: its list is tracked
    parts.fetch.answers[REV_URL] = DirectoryError("revocation-fetch-failed", "down")
    with pytest.raises(DirectoryError) as unavailable:
        await poller.ensure(URL, REV_URL)
    assert unavailable.value.reason == "revocation-unavailable"
    parts.fetch.answers[REV_URL] = FetchResult(200, revocation_doc(ROTATED.thumbprint, as_of=NOW), None)
    parts.wall.now -= STEP_S
    parts.mono.now += 31  # past retry_s (30)
    assert await poller.ensure(URL, REV_URL) == {ROTATED.thumbprint}
    parts.wall.now -= STEP_S
    parts.mono.now += 10
    assert poller.age_s(URL) == 10  # the metric's age: not negative after the step back


def provider_manifest(*exchanges: str) -> FetchResult:
    doc = {
        "ver": "1.0",
        "role": "ROLE_PUBLISHER",
        "domain": "pub.example",
        "exchanges": [
            {"domain": d, "endpoint": f"https://{d}/v1", "relationship": "DIRECT"} for d in exchanges
        ],
    }
    return FetchResult(200, json.dumps(doc).encode(), "max-age=300")


MANIFEST_URL = "https://pub.example/.well-known/svc.json"


async def test_a_manifest_recheck_is_due_on_its_max_age_though_the_wall_clock_stepped_back() -> None:
    """Spec rule 7: the exchange leaving the provider's manifest is noticed on the manifest's
    lifetime; a wall clock stepped back a day put that off by a day."""
    wall, mono = two_clocks()
    fetch = FakeFetch()
    fetch.answers[MANIFEST_URL] = provider_manifest("exchange.example")
    watcher = ManifestWatcher(["pub.example"], "exchange.example", fetch, clock=wall, monotonic=mono)
    assert await watcher.check_due() == 300
    assert watcher.states()[0].next_check_at == NOW + 300  # shown on the wall clock
    fetch.answers[MANIFEST_URL] = provider_manifest("other.example")
    wall.now -= 86_400
    mono.now += 300
    assert await watcher.check_due() == 300
    assert watcher.states()[0].state == "removed"
    assert fetch.calls == [MANIFEST_URL, MANIFEST_URL]


async def test_a_manifest_is_not_rechecked_early_when_the_wall_clock_steps_forward() -> None:
    wall, mono = two_clocks()
    fetch = FakeFetch()
    fetch.answers[MANIFEST_URL] = provider_manifest("exchange.example")
    watcher = ManifestWatcher(["pub.example"], "exchange.example", fetch, clock=wall, monotonic=mono)
    await watcher.check_due()
    wall.now += 86_400
    mono.now += 100
    assert await watcher.check_due() == 200
    assert fetch.calls == [MANIFEST_URL]


def test_the_real_wall_clock_comes_with_the_real_monotonic_one_and_a_fake_alone_drives_both() -> None:
    """What the gateway's watcher and a resolver made without clocks time with; a test's fake clock
    given alone drives both, as it did before there were two."""
    from signing_proxy.verify.directory import duration_clock  # here: the other tests run without it

    watcher = ManifestWatcher(["pub.example"], "exchange.example", FakeFetch())
    assert duration_clock(watcher.clock, watcher.monotonic) is time.monotonic
    fake = Clock()
    assert duration_clock(fake, None) is fake
    assert duration_clock(fake, time.monotonic) is time.monotonic
