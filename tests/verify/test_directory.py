"""Directory resolution (spec "Key lookup"): cache, single flight, negative cache, stale on error,
with a fake fetcher and clock; and ``http_fetcher`` on the package's HTTP client against loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.verify import (
    DirectoryError,
    DirectoryResolver,
    EgressPolicy,
    FetchResult,
    HttpClient,
    directory_url,
    http_fetcher,
)
from signing_proxy.verify.directory import ttl_from_cache_control
from tests.verify.fakes import NOW, Clock, FakeFetch

KEY = SigningKey.from_seed(bytes(32))
LOOPBACK = EgressPolicy(allow_private=("127.0.0.1/32",))  # the test servers: allow-listed, http allowed


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


# --- http_fetcher on the package's HTTP client, against a real loopback server ------------------


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    release = asyncio.Event()  # the slow answer waits for this: set when the test is over

    async def directory(_r: web.Request) -> web.Response:
        return web.Response(
            body=directory_body(),
            content_type="application/jwk-set+json",
            headers={"Cache-Control": "max-age=120"},
        )

    async def huge(_r: web.Request) -> web.Response:
        return web.Response(body=b"x" * 100_000)

    async def slow(_r: web.Request) -> web.Response:
        await release.wait()
        return web.Response(body=b"{}")

    async def moved(_r: web.Request) -> web.Response:
        raise web.HTTPFound("/a/.well-known/http-message-signatures-directory")

    app = web.Application()
    app.router.add_get("/a/.well-known/http-message-signatures-directory", directory)
    app.router.add_get("/huge/.well-known/http-message-signatures-directory", huge)
    app.router.add_get("/slow/.well-known/http-message-signatures-directory", slow)
    app.router.add_get("/moved/.well-known/http-message-signatures-directory", moved)
    srv = TestServer(app, host="127.0.0.1")
    async with srv:  # started here, closed on the way out (``as`` gives the base class's type)
        try:
            yield srv
        finally:
            release.set()


async def test_http_fetcher_bounds_size_and_time_and_refuses_redirects(server: TestServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    async with HttpClient.standalone() as client:
        resolver = DirectoryResolver(
            http_fetcher(client, egress=LOOPBACK, max_bytes=4096, timeout_s=0.5), clock=Clock()
        )
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


async def test_http_fetcher_reads_cache_control_and_sends_a_plain_get(server: TestServer) -> None:
    async with HttpClient.standalone() as client:
        result = await http_fetcher(client, egress=LOOPBACK)(
            directory_url(f"http://127.0.0.1:{server.port}/a")
        )
    assert (result.status, result.cache_control) == (200, "max-age=120")
    assert result.body == directory_body()


async def test_http_fetcher_names_a_reset_fetch_failed_and_a_refused_url_egress_refused() -> None:
    def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    listener = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with HttpClient.standalone() as client:
            fetch = http_fetcher(client, egress=LOOPBACK)
            with pytest.raises(DirectoryError) as err:
                await fetch(f"http://127.0.0.1:{port}/x")
            assert err.value.reason == "directory-fetch-failed"
            for url in ("ftp://agent.example/x", f"http://127.0.0.1:{port}/x"):
                refusing = fetch if url.startswith("ftp") else http_fetcher(client)  # default: public only
                with pytest.raises(DirectoryError) as err:
                    await refusing(url)
                assert err.value.reason == "directory-egress-refused"
    finally:
        listener.close()
        await listener.wait_closed()


async def test_an_entry_charged_past_the_whole_cache_leaves_alone(fetch: FakeFetch) -> None:
    """Charging what hangs on a directory resized its entry, then evicted the least recently used
    until the bound held: other directories first, and the entry itself last. One that cannot fit
    by itself now leaves alone (what a stranger's directory holds never empties the cache)."""
    other = directory_url("https://other.example")
    fetch.answers[other] = FetchResult(200, directory_body(), "max-age=600")
    gone: list[str] = []
    resolver = DirectoryResolver(fetch, clock=Clock(), max_bytes=64 * 1024, listeners=[gone.append])
    await resolver.get("https://other.example")
    await resolver.get(BASE)
    resolver.charge(URL, 32 * 1024)  # fits: nothing leaves
    assert (len(resolver), gone) == (2, [])
    resolver.charge(URL, 64 * 1024)  # cannot fit by itself
    assert gone == [URL]
    assert (resolver.holds(other), resolver.holds(URL)) == (True, False)
