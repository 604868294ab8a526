"""httpx: ``SignatureAuth``, an ``httpx.Auth`` in httpx's generator style, sync and async.

httpx runs an auth flow last, on the request exactly as it will be sent (URL, headers, body), so the
signature covers the request sent (an empty query is dropped from its URL first; a redirect the
client follows itself, ``follow_redirects=True``, would resend this signature: leave it off). The
body is read first (``requires_request_body``): a streamed body is read up to
``limits.max_body_bytes`` and then sent from memory with a ``Content-Length``; a larger one raises
``NotSigned`` (413) and nothing is sent. The async flow looks at the key store (and the delegation
file) in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator

import httpx

from .signer import OWNED, Signer, read_limited, read_limited_async

__all__ = ["SignatureAuth"]


class SignatureAuth(httpx.Auth):
    """Signs every request of an ``httpx.Client`` or ``httpx.AsyncClient`` with ``signer``."""

    requires_request_body = True

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """The I/O-free flow, for a request whose body is read (``requires_request_body``)."""
        self._sign(request)
        yield request

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self.signer.refresh_if_due()
        if _streamed(request):  # read it within the limit (else refuse), then send it from memory
            self.signer.declared_too_large(request.headers.get("content-length"))
            assert isinstance(request.stream, httpx.SyncByteStream)
            _replace_body(request, read_limited(request.stream, self.signer.max_body_bytes))
        self._sign(request)
        yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if self.signer.refresh_due():
            await asyncio.to_thread(self.signer.refresh)
        if _streamed(request):
            self.signer.declared_too_large(request.headers.get("content-length"))
            assert isinstance(request.stream, httpx.AsyncByteStream)
            _replace_body(request, await read_limited_async(request.stream, self.signer.max_body_bytes))
        self._sign(request)
        yield request

    def _sign(self, request: httpx.Request) -> None:
        if request.url.raw_path.endswith(b"?") and not request.url.query:  # sent as "/p?" otherwise
            request.url = request.url.copy_with(query=None)  # the target signed: no empty query
        headers = request.headers
        lines = headers.multi_items()
        content = request.content
        signed = self.signer.sign(request.method, str(request.url), lines, content)
        if signed is None:
            return
        for name in OWNED.intersection(name.lower() for name, _ in lines):
            del headers[name]
        for name, value in signed.fields:
            headers[name] = value
        if signed.body is not content:
            _replace_body(request, signed.body)


def _streamed(request: httpx.Request) -> bool:
    """True while the body is a stream not yet read into memory."""
    try:
        request.content  # noqa: B018  # raises until the body is read
    except httpx.RequestNotRead:
        return True
    return False


def _replace_body(request: httpx.Request, body: bytes) -> None:
    """Send ``body`` from memory, framed by ``Content-Length`` (no longer chunked)."""
    request._content = body  # as httpx's own ``Request.read`` leaves a body read into memory
    request.stream = httpx.ByteStream(body)
    request.headers.pop("transfer-encoding", None)
    request.headers["Content-Length"] = str(len(body))
