"""``signing-proxy verify-origin``: an origin that verifies every request and answers the verdict.

The tool to debug a deployment end to end: point a proxy (or a chain of relays) at it and each
answer is JSON saying whether layer 1 verified, which labels and keyids signed, where each key was
found, the exact signature bases — or the refusal reason and the label it concerns. The status is
200 for a verified request and 401 for a refused one, so scripts can use it as a check.
"""

from __future__ import annotations

from aiohttp import web

from ..core.errors import VerificationError
from ..errors import problem_body
from ..net.client import HttpClient
from .directory import DirectoryResolver, http_fetcher
from .middleware import verify_aiohttp_request
from .revocation import RevocationPoller
from .verifier import RequestVerifier, VerifierPolicy, stack_summary

__all__ = ["build_verify_origin"]

_CLIENT = web.AppKey("client", HttpClient)
_VERIFIER = web.AppKey("verifier", RequestVerifier)


def build_verify_origin(
    policy: VerifierPolicy,
    *,
    external_origin: str | None = None,
    client: HttpClient | None = None,
    egress: object | None = None,
) -> web.Application:
    """An aiohttp app answering every path with the verification verdict of the request.

    Directories and revocation lists are fetched through ``client`` (default: a standalone one,
    closed with the app).
    """
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def on_startup(app: web.Application) -> None:
        own = client if client is not None else HttpClient.standalone()
        app[_CLIENT] = own
        fetch = http_fetcher(own)
        app[_VERIFIER] = RequestVerifier(
            DirectoryResolver(fetch), policy, revocations=RevocationPoller(fetch)
        )

    async def on_cleanup(app: web.Application) -> None:
        if client is None:
            await app[_CLIENT].close()

    async def verdict(request: web.Request) -> web.Response:
        try:
            stack = await verify_aiohttp_request(app[_VERIFIER], request, external_origin=external_origin)
        except VerificationError as exc:
            extra: dict[str, object] = {"verified": False, "method": request.method, "path": request.raw_path}
            if exc.label:
                extra["label"] = exc.label
            return web.Response(
                status=401,
                body=problem_body(401, exc.reason, exc.detail, **extra),
                content_type="application/problem+json",
            )
        return web.json_response({**stack_summary(stack), "method": request.method, "path": request.raw_path})

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", verdict)
    return app
