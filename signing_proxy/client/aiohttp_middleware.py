"""aiohttp: ``SigningMiddleware``, a client middleware (``ClientSession(middlewares=...)``, aiohttp >= 3.12).

aiohttp runs a session's middlewares on every request it sends, redirects and retries included,
after the request is built (URL, headers, cookies, ``auth=``), so each one is signed as sent. A body
that is not in memory (a file, an async iterator, form data) is read up to ``limits.max_body_bytes``
and sent from memory; a larger one raises ``NotSigned`` (413) and nothing is sent. The key store (and
the delegation file) is looked at in a worker thread, never on the event loop, and so is a key on a
PKCS#11 token asked to sign (``Signer.sign_async``: bounded by ``signing.pkcs11.timeout_s``, after
which ``NotSigned`` 503 is raised and nothing is sent).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import ClientRequest, ClientResponse, payload
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_middlewares import ClientHandlerType

from .signer import OWNED, NotSigned, Signer, too_large

__all__ = ["SigningMiddleware"]


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
        original = request.body
        body = await _body_bytes(original, signer.max_body_bytes)
        headers = request.headers
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
        if sent is not body and 300 <= response.status < 400:
            # aiohttp follows a 307/308 with this request's body: the caller's, never the Requester
            # (and delegation) added for this exchange; the next request is signed anew
            await request.update_body(body)
        return response


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
