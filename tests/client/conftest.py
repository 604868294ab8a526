"""Two origins for the adapters' redirect tests: ``redirecting`` answers 307 to ``landing``; both
trust ``REDIRECT_KEY`` (the key the tests sign with) and record what arrives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from tests.harness import VerifyingOrigin

REDIRECT_KEY = SigningKey.from_seed(b"\x32" * 32)


@pytest.fixture
def landing() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin({REDIRECT_KEY.thumbprint: REDIRECT_KEY.public}) as started:
        yield started


@pytest.fixture
def redirecting(landing: VerifyingOrigin) -> Iterator[VerifyingOrigin]:
    async def moved(request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": landing.url("/landing")})

    with VerifyingOrigin({REDIRECT_KEY.thumbprint: REDIRECT_KEY.public}, handler=moved) as started:
        yield started
