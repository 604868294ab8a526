"""Directory resolution and revocation polling, with a fake fetcher, clock, sleep and random source."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.verify.directory import (
    DirectoryError,
    DirectoryResolver,
    FetchResult,
    RevocationPoller,
    aiohttp_fetcher,
    directory_url,
    ttl_from_cache_control,
)

NOW = 1_700_000_000
KEY = SigningKey.from_seed(bytes(32))


class Clock:
    def __init__(self) -> None:
        self.now = float(NOW)

    def __call__(self) -> float:
        return self.now


class FakeFetch:
    """Answers from a dict of url -> FetchResult (or exception); counts calls."""

    def __init__(self) -> None:
        self.answers: dict[str, FetchResult | Exception] = {}
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, url: str) -> FetchResult:
        self.calls.append(url)
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer


def directory_body(revocation_url: str | None = None) -> bytes:
    return render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),), revocation_url))


BASE = "https://agent.example"
URL = directory_url(BASE)


@pytest.fixture
def fetch() -> FakeFetch:
    f = FakeFetch()
    f.answers[URL] = FetchResult(200, directory_body(), "max-age=600")
    return f


def test_directory_url_joins_without_double_slash() -> None:
    assert (
        directory_url("https://a.example/")
        == "https://a.example/.well-known/http-message-signatures-directory"
    )
    assert (
        directory_url("https://a.example/reg/x")
        == "https://a.example/reg/x/.well-known/http-message-signatures-directory"
    )


@pytest.mark.parametrize(
    ("header", "ttl"),
    [
        (None, 300),
        ("max-age=600", 600),
        ("public, max-age=5", 60),
        ("max-age=999999", 21600),
        ("no-store", 60),
    ],
)
def test_cache_control_is_honoured_between_floor_and_ceiling(header: str | None, ttl: float) -> None:
    assert ttl_from_cache_control(header, 60, 21600) == ttl


async def test_cached_until_max_age_then_refetched(fetch: FakeFetch) -> None:
    clock = Clock()
    resolver = DirectoryResolver(fetch, clock=clock)
    assert (await resolver.get(BASE)).lookup(KEY.thumbprint) is not None
    clock.now += 599
    await resolver.get(BASE)
    assert len(fetch.calls) == 1
    clock.now += 2
    await resolver.get(BASE)
    assert len(fetch.calls) == 2


async def test_one_inflight_fetch_per_url(fetch: FakeFetch) -> None:
    fetch.gate = asyncio.Event()
    resolver = DirectoryResolver(fetch, clock=Clock())
    waiters = [asyncio.ensure_future(resolver.get(BASE)) for _ in range(10)]
    await asyncio.sleep(0)
    fetch.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert len(fetch.calls) == 1
    assert all(r is results[0] for r in results)


async def test_failure_is_negatively_cached_briefly(fetch: FakeFetch) -> None:
    clock = Clock()
    fetch.answers[URL] = FetchResult(404, b"", None)
    resolver = DirectoryResolver(fetch, clock=clock, negative_ttl_s=30)
    for _ in range(3):
        with pytest.raises(DirectoryError) as err:
            await resolver.get(BASE)
    assert err.value.reason == "directory-fetch-failed"
    assert len(fetch.calls) == 1
    clock.now += 31
    fetch.answers[URL] = FetchResult(200, directory_body(), None)
    await resolver.get(BASE)
    assert len(fetch.calls) == 2


async def test_failed_refresh_keeps_the_cached_directory(fetch: FakeFetch) -> None:
    clock = Clock()
    resolver = DirectoryResolver(fetch, clock=clock)
    first = await resolver.get(BASE)
    clock.now += 700
    fetch.answers[URL] = DirectoryError("directory-fetch-timeout", "slow")
    assert await resolver.get(BASE) is first  # a failed fetch is no evidence a key was withdrawn


async def test_malformed_or_private_directory_is_refused(fetch: FakeFetch) -> None:
    fetch.answers[URL] = FetchResult(200, b'{"keys":[{"kty":"OKP","crv":"Ed25519","x":"x","d":"y"}]}', None)
    with pytest.raises(DirectoryError) as err:
        await DirectoryResolver(fetch, clock=Clock()).get(BASE)
    assert "private-member" in err.value.reason


async def test_pinned_directories_are_never_fetched(fetch: FakeFetch) -> None:
    pinned = Directory((DirectoryKey(KEY.public, 0, 2**40),))
    resolver = DirectoryResolver(fetch, clock=Clock(), pinned={"https://broker.example": pinned})
    assert await resolver.get("https://broker.example/") is pinned
    assert fetch.calls == []


# --- the aiohttp fetcher against a real loopback server ------------------------------------------


@pytest.fixture
async def server() -> Iterator[TestServer]:
    async def directory(_r: web.Request) -> web.Response:
        return web.Response(
            body=directory_body(),
            content_type="application/jwk-set+json",
            headers={"Cache-Control": "max-age=120"},
        )

    async def huge(_r: web.Response) -> web.Response:
        return web.Response(body=b"x" * 100_000)

    async def slow(_r: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(body=b"{}")

    async def moved(_r: web.Request) -> web.Response:
        raise web.HTTPFound("/a/.well-known/http-message-signatures-directory")

    app = web.Application()
    app.router.add_get("/a/.well-known/http-message-signatures-directory", directory)
    app.router.add_get("/huge/.well-known/http-message-signatures-directory", huge)  # type: ignore[arg-type]
    app.router.add_get("/slow/.well-known/http-message-signatures-directory", slow)
    app.router.add_get("/moved/.well-known/http-message-signatures-directory", moved)
    async with TestServer(app, host="127.0.0.1") as srv:
        yield srv  # type: ignore[misc]


async def test_aiohttp_fetcher_bounds_size_and_time_and_refuses_redirects(server: TestServer) -> None:
    import aiohttp

    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as session:
        resolver = DirectoryResolver(aiohttp_fetcher(session, max_bytes=4096, timeout_s=0.5), clock=Clock())
        directory = await resolver.get(f"{base}/a")
        assert directory.lookup(KEY.thumbprint) is not None
        for path, reason in (
            ("huge", "directory-too-large"),
            ("slow", "directory-fetch-timeout"),
            ("moved", "directory-fetch-failed"),
        ):
            with pytest.raises(DirectoryError) as err:
                await resolver.get(f"{base}/{path}")
            assert err.value.reason == reason


# --- revocation polling ------------------------------------------------------------------------


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
