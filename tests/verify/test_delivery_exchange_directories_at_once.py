"""The delivery side asks its configured exchange directories at once, as a verifier asks broker
directories (``verify.verifier.ConfiguredDirectories``): one that hangs no longer holds the
retrieval of a URL another exchange signed for the whole fetch timeout, again each time its failure
memory ran out; two never fetched are fetched together. The fetch timeout is 30 s, no verification
is given more than 5 s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.verify import (
    DeliveryPolicy,
    DeliveryVerifier,
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    directory_url,
)
from signing_proxy.verify.directory import NEGATIVE_TTL_S
from tests.verify.fakes import NOW, Clock
from tests.verify.test_delivery import EXCHANGE, OTHER, bound_url, fetch

E1, E2 = "https://exchange-one.example", "https://exchange-two.example"
FETCH_TIMEOUT_S = 30.0
WAIT_S = 5.0


def listing(key: SigningKey) -> FetchResult:
    body = render_directory(Directory((DirectoryKey(key.public, NOW - 60, NOW + 3600),)))
    return FetchResult(200, body, "max-age=3600")


@dataclass
class Exchanges:
    """A fetcher: ``answers`` by URL; a URL in ``hanging`` never answers (until the test ends); one
    in ``meet`` answers only once the URL it names was asked. ``asked``: set per URL on arrival."""

    answers: dict[str, FetchResult] = field(default_factory=dict)
    hanging: set[str] = field(default_factory=set)
    meet: dict[str, str] = field(default_factory=dict)
    asked: dict[str, asyncio.Event] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def arrival(self, url: str) -> asyncio.Event:
        return self.asked.setdefault(url, asyncio.Event())

    async def __call__(self, url: str) -> FetchResult:
        self.calls.append(url)
        self.arrival(url).set()
        if url in self.meet:
            await self.arrival(self.meet[url]).wait()  # bounded by the resolver's fetch timeout
        if url in self.hanging:
            await self.release.wait()
        return self.answers[url]


@pytest.fixture
async def made() -> AsyncIterator[tuple[DeliveryVerifier, Exchanges, Clock]]:
    fake, clock = Exchanges(), Clock()
    resolver = DirectoryResolver(fake, clock=clock, fetch_timeout_s=FETCH_TIMEOUT_S)
    policy = DeliveryPolicy(exchange_directories=(E1, E2))
    verifier = DeliveryVerifier(RequestVerifier(resolver, clock=clock), policy)
    yield verifier, fake, clock
    await asyncio.wait_for(verifier.close(), WAIT_S)
    fake.release.set()


async def retrieved(verifier: DeliveryVerifier, key: SigningKey) -> str:
    url = bound_url(key=key)
    async with asyncio.timeout(WAIT_S):
        return (await verifier.verify("GET", url, fetch(url), b"")).exchange_source


async def test_a_url_one_exchange_signed_does_not_wait_for_another_exchanges_hanging_directory(
    made: tuple[DeliveryVerifier, Exchanges, Clock],
) -> None:
    verifier, fake, clock = made
    fake.answers[directory_url(E1)] = listing(EXCHANGE)
    fake.answers[directory_url(E2)] = FetchResult(503, b"", None)  # E2's host answers, then dies
    assert await retrieved(verifier, EXCHANGE) == E1
    fake.hanging.add(directory_url(E2))
    fake.asked.pop(directory_url(E2))
    clock.now += NEGATIVE_TTL_S + 1  # E2's failure memory ran out; E1's copy lives an hour
    assert await retrieved(verifier, EXCHANGE) == E1  # waited for E2's retry 30 s before
    await asyncio.wait_for(fake.arrival(directory_url(E2)).wait(), WAIT_S)
    assert fake.calls.count(directory_url(E2)) == 2


async def test_exchange_directories_never_fetched_are_fetched_at_once(
    made: tuple[DeliveryVerifier, Exchanges, Clock],
) -> None:
    verifier, fake, _clock = made
    fake.answers[directory_url(E1)] = listing(EXCHANGE)
    fake.answers[directory_url(E2)] = listing(OTHER)
    # each answers only once the other was asked: one after the other, neither would
    fake.meet = {directory_url(E1): directory_url(E2), directory_url(E2): directory_url(E1)}
    assert await retrieved(verifier, EXCHANGE) == E1
    assert await retrieved(verifier, OTHER) == E2


async def test_a_key_rotated_into_one_exchanges_directory_does_not_wait_for_anothers_refetch(
    made: tuple[DeliveryVerifier, Exchanges, Clock],
) -> None:
    """No cached copy lists the key: every exchange directory is fetched again, at once, and the
    first listing it is taken (one after the other, E2's hanging re-fetch, asked first, held it)."""
    verifier, fake, clock = made
    rotated = SigningKey.from_seed(bytes([21]) * 32)
    fake.answers[directory_url(E2)] = listing(OTHER)
    fake.answers[directory_url(E1)] = listing(EXCHANGE)
    verifier.policy = DeliveryPolicy(exchange_directories=(E2, E1))  # E2 asked first
    assert await retrieved(verifier, EXCHANGE) == E1  # both cached
    fake.hanging.add(directory_url(E2))
    fake.asked.pop(directory_url(E2))
    body = render_directory(
        Directory(tuple(DirectoryKey(k.public, NOW - 60, NOW + 3600) for k in (EXCHANGE, rotated)))
    )
    fake.answers[directory_url(E1)] = FetchResult(200, body, "max-age=3600")  # E1 rotates a key in
    clock.now += 31  # past verify.keyid_refetch_s; both copies live an hour
    assert await retrieved(verifier, rotated) == E1
    await asyncio.wait_for(fake.arrival(directory_url(E2)).wait(), WAIT_S)  # asked again too
