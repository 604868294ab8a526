"""aiohttp: ``SigningMiddleware``, a client middleware (``ClientSession(middlewares=...)``, aiohttp >= 3.12).

aiohttp runs a session's middlewares on every request it sends, redirects and retries included,
after the request is built (URL, headers, cookies, ``auth=``), so each one is signed as sent. A body
that is not in memory (a file, an async iterator, form data) is read up to ``limits.max_body_bytes``
and sent from memory; a larger one raises ``NotSigned`` (413) and nothing is sent. The key store (and
the delegation file) is looked at in a worker thread, never on the event loop, and so is a key on a
PKCS#11 token asked to sign (``Signer.sign_async``: bounded by ``signing.pkcs11.timeout_s``, after
which ``NotSigned`` 503 is raised and nothing is sent).

aiohttp keeps a ``Host`` the caller set when it follows a redirect to another origin: signed for that
Host, the request would hand the new origin a signature it could replay at the first (the path the
redirect chose, the method, a 307's body). A redirect aiohttp follows to an origin other than the one
the caller's Host was set for is signed for its own URL, sent with that URL's Host, as httpx's redirect
hooks sign it; a redirect within that origin keeps the caller's Host. Each hop of one request runs in
the caller's task, so what a hop answered with a redirect is kept in a ``ContextVar`` for the next.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import ClientRequest, ClientResponse, payload
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_middlewares import ClientHandlerType

from .signer import OWNED, NotSigned, Signer, too_large

__all__ = ["SigningMiddleware"]

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})  # what aiohttp follows


@dataclass(frozen=True, slots=True)
class _Redirected:
    """A request of this task was answered with a redirect: the ``Host`` it carried (aiohttp sends
    the same on the next hop when the caller set it) and the origin that Host was set for."""

    host: str | None
    origin: str  # as yarl spells it: scheme, host and port


# the last request of this task answered with a redirect, read (and cleared) by the next one
_REDIRECTED: ContextVar[_Redirected | None] = ContextVar("signing_proxy_aiohttp_redirected", default=None)


class SigningMiddleware:
    """Signs every request of the ``aiohttp.ClientSession`` it is given to with ``signer``."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        signer = self.signer
        if signer.refresh_due():
            await asyncio.to_thread(signer.refresh)
        if request.compress:  # the digest would cover bytes other than those sent
            raise NotSigned(
                400,
                "compressed-body",
                "compress= cannot be signed: compress the body yourself and set Content-Encoding",
            )
        headers = request.headers
        caller_host = headers.get("Host")
        own = str(request.url.origin())
        host_for = _host_origin(own, caller_host)
        if host_for != own:  # a redirect to another origin: signed for where it goes
            headers["Host"] = request.url.host_port_subcomponent or ""  # as aiohttp writes it for the URL
        original = request.body
        body = await _body_bytes(original, signer.max_body_bytes)
        signed = await signer.sign_async(request.method, str(request.url), list(headers.items()), body)
        sent = body
        if signed is not None:
            for name in OWNED:
                headers.popall(name, None)
            for name, value in signed.fields:
                headers.add(name, value)
            if signed.host is not None:
                headers["Host"] = signed.host
            sent = signed.body
        in_memory = isinstance(original, bytes | payload.BytesPayload)
        if sent is not body or not in_memory:
            await request.update_body(sent)  # a stream read whole, or a body with the Requester
        response = await handler(request)
        if response.status in _REDIRECTS:  # aiohttp may follow it, with the caller's Host
            _REDIRECTED.set(_Redirected(caller_host, host_for))
        if sent is not body and 300 <= response.status < 400:
            # aiohttp follows a 307/308 with this request's body: the caller's, never the Requester
            # (and delegation) added for this exchange; the next request is signed anew
            await request.update_body(body)
        return response


def _host_origin(own: str, host: str | None) -> str:
    """The origin a request to the origin ``own`` carrying ``host`` had its Host set for: the first
    of the redirects aiohttp is following when ``host`` is the Host the request redirected last
    carried (aiohttp resends a caller's Host wherever it is redirected), else ``own``. What this
    task's last redirect left is read once. A redirect the caller did not have followed
    (``allow_redirects=False``) is read by the task's next request: if that one carries the same
    Host to another origin it is signed for its URL too, the safe side of a request that cannot be
    told from the redirect followed by hand."""
    earlier = _REDIRECTED.get()
    if earlier is None:
        return own
    _REDIRECTED.set(None)
    return earlier.origin if earlier.host == host else own


async def _body_bytes(body: payload.Payload | bytes, limit: int) -> bytes:
    """The payload's bytes as they would be written, read within ``limit`` (else ``NotSigned`` 413)."""
    if isinstance(body, bytes):
        return body
    size = body.size
    if size is not None and size > limit:
        raise too_large(limit)
    if isinstance(body, payload.BytesPayload):
        return await body.as_bytes()
    collector = _Collector(limit)
    await body.write(collector)
    return b"".join(collector.parts)


class _Collector(AbstractStreamWriter):
    """A writer that keeps what a payload writes, refusing past ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise too_large(self.limit)
        self.parts.append(bytes(chunk))

    async def write_eof(self, chunk: bytes = b"") -> None:
        if chunk:
            await self.write(chunk)

    async def drain(self) -> None:
        return None

    def enable_compression(self, encoding: str = "deflate", strategy: Any = None) -> None:
        raise NotSigned(400, "compressed-body", "a compressed request body cannot be signed in-process")

    def enable_chunking(self) -> None:
        return None

    async def write_headers(self, status_line: str, headers: Any) -> None:
        return None
