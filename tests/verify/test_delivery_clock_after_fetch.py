"""The delivery check judges what is bound in time at the time the exchange key is used: the
exchange directory and its revocation list may take seconds to arrive, and a retrieval URL, a
fetcher signature or an exchange key whose window ended meanwhile is refused. Checks that need no
fetch still come first: a fetch that fails them makes no request.

Each fetch here advances the injected clock while it is in flight (``SlowFetch``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.verify import (
    DeliveryPolicy,
    DeliveryVerifier,
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
)
from signing_proxy.verify.directory import directory_url
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.test_delivery import (
    AGENT,
    EXCHANGE,
    EXCHANGE_BASE,
    OTHER,
    REVOCATIONS,
    bound_url,
    fetch,
    refused,
)


class SlowFetch(FakeFetch):
    """A fetcher each of whose fetches takes ``seconds`` on ``clock``: the clock advances while it
    is in flight, as the wall clock does while a directory is on its way."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds

    async def __call__(self, url: str) -> FetchResult:
        self.clock.now += self.seconds
        return await super().__call__(url)


def serve(fake: FakeFetch, *, not_after: int = NOW + 3600) -> None:
    """The exchange's directory (its key valid until ``not_after``) and an empty revocation list."""
    key = DirectoryKey(EXCHANGE.public, NOW - 60, not_after)
    fake.answers[directory_url(EXCHANGE_BASE)] = FetchResult(
        200, render_directory(Directory((key,), REVOCATIONS)), "max-age=300"
    )
    fake.answers[REVOCATIONS] = FetchResult(200, render_revocation_list(RevocationList(NOW)), None)


class Slow:
    def __init__(self, verifier: DeliveryVerifier, fake: SlowFetch, clock: Clock) -> None:
        self.verifier, self.fake, self.clock = verifier, fake, clock


@pytest.fixture
async def slow() -> AsyncIterator[Slow]:
    """A delivery verifier of the exchange's directory whose every fetch takes 3 s."""
    clock = Clock()
    fake = SlowFetch(clock, 3.0)
    policy = DeliveryPolicy(exchange_directories=(EXCHANGE_BASE,))
    verifier = DeliveryVerifier(RequestVerifier(DirectoryResolver(fake, clock=clock), clock=clock), policy)
    yield Slow(verifier, fake, clock)
    await verifier.close()


async def test_a_fetch_within_every_window_after_the_slow_fetches_is_accepted(slow: Slow) -> None:
    serve(slow.fake)
    url = bound_url(expires=NOW + 600)
    verified = await slow.verifier.verify("GET", url, fetch(url), b"")
    assert verified.exchange_source == EXCHANGE_BASE
    assert slow.clock.now == NOW + 6  # the directory, then its revocation list: 3 s each


@pytest.mark.parametrize("expires", [NOW + 2, NOW + 6])  # ends during the fetches; at their end (exclusive)
async def test_a_url_that_expired_while_the_exchange_key_was_fetched_is_refused(
    slow: Slow, expires: int
) -> None:
    serve(slow.fake)
    url = bound_url(expires=expires)
    assert await refused(slow.verifier, url, fetch(url)) == "retrieval-url-expired"
    assert slow.fake.calls == [directory_url(EXCHANGE_BASE), REVOCATIONS]  # valid when the check began


async def test_a_fetcher_signature_that_expired_while_the_exchange_key_was_fetched_is_refused(
    slow: Slow,
) -> None:
    serve(slow.fake)
    slow.fake.seconds = 160.0  # two fetches: 320 s, past the signature's 300 s window
    url = bound_url(expires=NOW + 600)
    assert await refused(slow.verifier, url, fetch(url)) == "signature-expired"


async def test_an_exchange_key_whose_window_ended_while_it_was_fetched_is_refused(slow: Slow) -> None:
    serve(slow.fake, not_after=NOW + 4)  # valid when the check began, ended once both are fetched (+6)
    url = bound_url(expires=NOW + 600)
    assert await refused(slow.verifier, url, fetch(url)) == "retrieval-url-key-outside-window"


async def test_checks_that_need_no_fetch_still_refuse_before_any_fetch(slow: Slow) -> None:
    serve(slow.fake)
    url = bound_url()
    assert await refused(slow.verifier, url, fetch(url, OTHER, presented=AGENT.public)) == "unknown-keyid"
    expired = bound_url(expires=NOW)
    assert await refused(slow.verifier, expired, fetch(expired)) == "retrieval-url-expired"
    assert slow.fake.calls == []
    assert slow.clock.now == NOW
