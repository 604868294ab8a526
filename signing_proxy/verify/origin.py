"""``signing-proxy verify-origin``: an origin that verifies every request and answers the verdict.

The tool to debug a deployment end to end: point a proxy (or a chain of relays) at it and each
answer is JSON saying whether layer 1 verified, which labels and keyids signed, where each key was
found, the exact signature bases — or the refusal reason and the label it concerns. The status is
200 for a verified request and 401 for a refused one, so scripts can use it as a check (503 with
``Retry-After`` when it had no budget left to fetch a new key directory: ``verify.fetches_per_s``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..config import LimitsConfig, VerifyConfig
from ..core.errors import VerificationError
from ..errors import ProxyError, problem_body
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from ..net.request import busy
from .build import build_verifier
from .middleware import received
from .verifier import RequestVerifier, VerifierPolicy, refusal_answer, stack_summary

__all__ = ["build_verify_origin"]

_VERIFIER = web.AppKey("verifier", RequestVerifier)
# a body is held whole to be digested: limits.max_body_bytes's default, the most the proxy signs
MAX_BODY_BYTES = LimitsConfig.max_body_bytes
# and the bodies of all connections at once, as the proxy's limits.max_buffered_bytes (default):
# 256 connections (the gate's cap) each one byte short of 10 MiB held 2.5 GB
MAX_HELD_BYTES = LimitsConfig.max_buffered_bytes
# a body silent this long is answered 408 and its bytes given back: bodies stopped short of their
# end held the budget for as long as their sockets stayed open (13 of them locked every body out)
BODY_SILENCE_S = 10.0


def build_verify_origin(
    policy: VerifierPolicy,
    *,
    external_origin: str | None = None,
    client: HttpClient | None = None,
    egress: EgressPolicy | None = None,
    limits: VerifyConfig | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    max_held_bytes: int = MAX_HELD_BYTES,
    body_silence_s: float = BODY_SILENCE_S,
) -> web.Application:
    """An aiohttp app answering every path with the verification verdict of the request.

    Directories and revocation lists are fetched through ``client`` (default: a standalone one,
    closed with the app) under ``egress`` (default: public https only); revocation lists are polled
    every 300 s +/-10 % and fail closed until first fetched (``clock``/``sleep``/``rand``: for tests).
    A request whose body would take the bodies held at once past ``max_held_bytes`` (counted as
    they arrive: a head alone holds none) is answered 503 ``server-busy``; one whose body goes
    silent for ``body_silence_s`` 408 ``request-timeout``.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    held = 0  # bytes reserved by the requests in flight

    async def on_startup(app: web.Application) -> None:
        app[_VERIFIER] = build_verifier(
            policy, client=client, egress=egress, limits=limits, clock=clock, sleep=sleep, rand=rand
        )

    async def on_cleanup(app: web.Application) -> None:
        await app[_VERIFIER].close()  # stops the pollers; closes the client only if it is ours

    async def verdict(request: web.Request) -> web.Response:
        nonlocal held
        taken = 0  # this request's bytes, charged as they arrive: a head alone holds nothing

        async def read(request: web.Request) -> bytes:
            nonlocal held, taken
            parts = []
            while chunk := await _within(body_silence_s, request.content.readany()):
                size = taken + len(chunk)
                if size > MAX_BODY_BYTES:  # as aiohttp's client_max_size answers it
                    raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=size)
                if held + len(chunk) > max_held_bytes:
                    raise busy()  # the proxy's answer, Retry-After and all
                held, taken = held + len(chunk), taken + len(chunk)
                parts.append(chunk)
            return b"".join(parts)

        try:
            method, uri, fields, body, entries = await received(request, external_origin, None, read)
            stack = await app[_VERIFIER].verify(method, uri, fields, body, entries=entries)
        except ProxyError as exc:  # the body: past the budget, or silent
            return web.Response(
                status=exc.status,
                body=problem_body(exc.status, exc.reason, exc.detail),
                content_type="application/problem+json",
                headers=dict(exc.headers),
            )
        except VerificationError as exc:
            extra: dict[str, object] = {"verified": False, "method": request.method, "path": request.raw_path}
            if exc.label:
                extra["label"] = exc.label
            status, headers = refusal_answer(exc)
            return web.Response(
                status=status,
                body=problem_body(status, exc.reason, exc.detail, **extra),
                content_type="application/problem+json",
                headers=dict(headers),
            )
        finally:
            held -= taken
        return web.json_response({**stack_summary(stack), "method": request.method, "path": request.raw_path})

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", verdict)
    return app


async def _within(seconds: float, read: Awaitable[bytes]) -> bytes:
    """``read``'s bytes, or 408 ``request-timeout`` when none came for ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            return await read
    except TimeoutError:
        raise ProxyError(408, "request-timeout", "no byte of the body came in time") from None
