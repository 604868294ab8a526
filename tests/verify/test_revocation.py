"""Revocation polling with a fake fetcher, clock, sleep and random source (spec "Key publication,
rotation and revocation" 3: every 300 s +/-10 %; a failed poll keeps the last set)."""

from __future__ import annotations

import asyncio

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import RevocationList, render_revocation_list
from signing_proxy.verify import FetchResult, RevocationPoller
from tests.verify.fakes import NOW, Clock, FakeFetch

KEY = SigningKey.from_seed(bytes(32))
REV_URL = "https://agent.example/revocations.json"


async def test_poller_polls_every_300s_with_10_percent_jitter_and_no_real_sleep() -> None:
    clock, fetch, delays = Clock(), FakeFetch(), []
    fetch.answers[REV_URL] = FetchResult(200, render_revocation_list(RevocationList(NOW, frozenset())), None)
    randoms = iter([0.0, 0.5, 0.999999, 0.25])

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)
        clock.now += seconds

    poller = RevocationPoller(fetch, clock=clock, sleep=fake_sleep, rand=lambda: next(randoms))
    await asyncio.wait_for(poller.run(REV_URL, rounds=5), 5)
    assert len(fetch.calls) == 5
    assert delays[0] == pytest.approx(270)
    assert delays[1] == pytest.approx(300)
    assert delays[2] == pytest.approx(330, abs=0.01)
    assert delays[3] == pytest.approx(285)
    assert all(270 <= d <= 330 for d in delays)


async def test_poller_replaces_the_set_and_keeps_it_when_a_poll_fails() -> None:
    clock, fetch = Clock(), FakeFetch()
    revoked = KEY.thumbprint
    fetch.answers[REV_URL] = FetchResult(
        200, render_revocation_list(RevocationList(NOW, frozenset({revoked}))), None
    )
    poller = RevocationPoller(fetch, clock=clock, sleep=lambda _s: asyncio.sleep(0), rand=lambda: 0.5)
    assert await poller.poll_once(REV_URL)
    assert poller.revoked() == {revoked}
    assert poller.age_s(REV_URL) == 0
    clock.now += 300
    fetch.answers[REV_URL] = FetchResult(503, b"", None)
    assert not await poller.poll_once(REV_URL)
    assert poller.revoked() == {revoked}  # the last set is kept
    assert poller.age_s(REV_URL) == 300  # and its age shows the failure
    fetch.answers[REV_URL] = FetchResult(200, b"not json", None)
    assert not await poller.poll_once(REV_URL)
    assert poller.revoked() == {revoked}
