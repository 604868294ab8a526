"""Issue 15 attack 6, "verify with revocation off": ``verify-origin`` and the aiohttp middleware (the
README's exchange) fail closed while a directory's revocation list was never fetched, and poll it
every 300 s +/-10 % (injected sleep) while the directory is cached, so a revocation takes effect
without a restart. Real directory host on loopback (allow-listed), real requests over loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import VerifierPolicy, build_verifier, build_verify_origin, signature_middleware
from tests.verify.fakes import Ticks
from tests.verify.strangers import BODY, LOOPBACK, Host, directory_doc, host, revocation_doc, signed

AGENT = SigningKey.from_seed(bytes(range(32)))
REVOKED = "/revoked.json"

Origin = Callable[[Ticks], AbstractAsyncContextManager[str]]


@asynccontextmanager
async def verify_origin(ticks: Ticks) -> AsyncIterator[str]:
    app = build_verify_origin(VerifierPolicy(), egress=LOOPBACK, sleep=ticks.sleep)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


@asynccontextmanager
async def middleware_exchange(ticks: Ticks) -> AsyncIterator[str]:
    verifier = build_verifier(egress=LOOPBACK, sleep=ticks.sleep)

    async def ok(_request: web.Request) -> web.Response:
        return web.json_response({"verified": True})

    app = web.Application(middlewares=[signature_middleware(verifier)])
    app.router.add_route("*", "/{tail:.*}", ok)
    app.on_cleanup.append(lambda _app: verifier.close())
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


@pytest.fixture
async def directory() -> AsyncIterator[Host]:
    async with host() as found:
        now = int(time.time())
        found.directory(directory_doc(AGENT, now=now, revocation_url=found.base + REVOKED))
        found.serve(REVOKED, revocation_doc(as_of=now))
        yield found


async def post(origin: str, directory: Host) -> tuple[int, str | None]:
    url = f"{origin}/svc.v1.ExchangeService/DiscoverResources"
    fields = signed(f'"{directory.base}"', AGENT, now=int(time.time()), url=url)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            URL(url, encoded=True), data=BODY, headers=list(fields), skip_auto_headers=("Content-Type",)
        ) as resp,
    ):
        doc = await resp.json(content_type=None)
        return resp.status, doc.get("reason")


def list_fetches(directory: Host) -> int:
    return directory.seen.count(REVOKED)


@pytest.mark.parametrize(
    "make_origin", [verify_origin, middleware_exchange], ids=["verify-origin", "middleware"]
)
async def test_revocation_a_list_never_fetched_fails_closed_until_a_poll_succeeds(
    directory: Host, make_origin: Origin
) -> None:
    ticks = Ticks()
    directory.serve(REVOKED, b"", status=503)
    async with make_origin(ticks) as origin:
        assert await post(origin, directory) == (401, "revocation-unavailable")
        assert await post(origin, directory) == (401, "revocation-unavailable")  # from memory: retried later
        assert list_fetches(directory) == 1
        directory.serve(REVOKED, revocation_doc(as_of=int(time.time())))
        await ticks.tick()  # the scheduled poll, 300 s +/-10 % later
        assert 270 <= ticks.delays[0] <= 330
        assert await post(origin, directory) == (200, None)


@pytest.mark.parametrize(
    "make_origin", [verify_origin, middleware_exchange], ids=["verify-origin", "middleware"]
)
async def test_revocation_is_polled_periodically_and_takes_effect_without_a_restart(
    directory: Host, make_origin: Origin
) -> None:
    ticks = Ticks()
    async with make_origin(ticks) as origin:
        assert await post(origin, directory) == (200, None)
        assert list_fetches(directory) == 1
        directory.serve(REVOKED, revocation_doc(AGENT.thumbprint, as_of=int(time.time())))
        assert await post(origin, directory) == (200, None)  # until the next poll
        await ticks.tick()
        assert list_fetches(directory) == 2
        assert await post(origin, directory) == (401, "key-revoked")
        directory.serve(REVOKED, revocation_doc(as_of=int(time.time())))  # dropped from the list …
        await ticks.tick()
        assert list_fetches(directory) == 3
        assert await post(origin, directory) == (401, "key-revoked")  # … but it stays revoked here
        assert all(270 <= d <= 330 for d in ticks.delays)
