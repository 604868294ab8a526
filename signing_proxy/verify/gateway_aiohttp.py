"""The gateway's steps inside an aiohttp exchange: a function and a middleware.

``verify_gateway_request`` runs ``GatewayVerifier.check`` on a request as received (raw end-to-end
header lines, as the gateway mode checks them; raw path; exact body); ``gateway_middleware``
answers a refusal with its status, stable reason and headers (``Retry-After`` on 429) as
problem+json, and otherwise puts the ``GatewayVerdict`` in ``request[GATEWAY]`` — stack,
requester, verified delegation, effective scopes, remaining accesses — the only thing a handler
should trust.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..core.errors import VerificationError
from ..core.uri import LOOPBACK_HOSTS
from ..errors import problem_body
from .gateway import GatewayRefusal, GatewayVerdict, GatewayVerifier
from .middleware import Handler, Hosts, exempt_check, received, served_hosts
from .verifier import refusal_answer

__all__ = ["GATEWAY", "gateway_middleware", "gateway_refusal", "verify_gateway_request"]

GATEWAY = web.RequestKey("gateway", GatewayVerdict)  # request[GATEWAY]: the verified result


async def verify_gateway_request(
    gateway: GatewayVerifier,
    request: web.Request,
    *,
    external_origin: str | None = None,
    hosts: Hosts = LOOPBACK_HOSTS,
) -> GatewayVerdict:
    """Steps 1-5 on an aiohttp request; ``GatewayRefusal`` with the status and reason of a refusal.

    The origin is ``external_origin``, else the request's scheme and ``Host``, a name in ``hosts``
    (``middleware.received``)."""
    return await _verified(gateway, request, external_origin, served_hosts(hosts))


async def _verified(
    gateway: GatewayVerifier, request: web.Request, external_origin: str | None, hosts: frozenset[str] | None
) -> GatewayVerdict:
    try:
        method, uri, fields, body, entries = await received(request, external_origin, hosts)
    except VerificationError as exc:  # no target URI to verify against: refused like a bad signature
        status, headers = refusal_answer(exc)
        raise GatewayRefusal(status, exc.reason, exc.detail, headers) from None
    return await gateway.check(method, uri, fields, body, entries=entries)  # the stack parsed once


def gateway_refusal(refusal: GatewayRefusal) -> web.Response:
    """The refusal as problem+json with its status and extra header fields."""
    return web.Response(
        status=refusal.status,
        body=problem_body(refusal.status, refusal.reason, refusal.detail),
        content_type="application/problem+json",
        headers=dict(refusal.headers),
    )


def gateway_middleware(
    gateway: GatewayVerifier,
    *,
    external_origin: str | None = None,
    hosts: Hosts = LOOPBACK_HOSTS,
    exempt_paths: Sequence[str] = (),
) -> Middleware:
    """aiohttp middleware: refuse what the gateway refuses; else ``request[GATEWAY]`` for the handler.

    ``external_origin`` and ``hosts`` name the origin clients sign for, as for
    ``signature_middleware`` (a ``Host`` outside ``hosts`` is 421 ``misdirected-request``).
    ``exempt_paths`` pass unverified only to the plain route registered for exactly that raw path
    (``middleware.exempt_check``); every other handler gets ``request[GATEWAY]``."""
    exempt = exempt_check(exempt_paths)
    served = served_hosts(hosts)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if exempt(request):
            return await handler(request)
        try:
            request[GATEWAY] = await _verified(gateway, request, external_origin, served)
        except GatewayRefusal as refusal:
            return gateway_refusal(refusal)
        return await handler(request)

    return middleware
