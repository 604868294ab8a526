"""httpx: ``SignatureAuth``, an ``httpx.Auth`` in httpx's generator style, sync and async.

httpx runs an auth flow last, on the request exactly as it will be sent (URL, headers, body), so the
signature covers the request sent (an empty query is dropped from its URL first). A redirect the
client follows itself (``follow_redirects=True``) never reaches an auth: httpx copies the first
request's fields, signature included, to the new URL, where it could be replayed for the first.
``redirect_hooks()`` (``async_redirect_hooks()`` for an ``AsyncClient``) are the client's
``event_hooks`` that sign each such request for its own URL, with the caller's body (never a
Requester added for the first). The body is read first (``requires_request_body``): a streamed
body is read up to ``limits.max_body_bytes`` and then sent from memory with a ``Content-Length``; a
larger one raises ``NotSigned`` (413) and nothing is sent. The async flow looks at the key store
(and the delegation file) in a worker thread, never on the event loop, and has a key on a PKCS#11
token sign in one too (``Signer.sign_async``: bounded by ``signing.pkcs11.timeout_s``, after which
``NotSigned`` 503 is raised and nothing is sent).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass

import httpx

from .signer import OWNED, REDACTED, SignedRequest, Signer, read_limited, read_limited_async

__all__ = ["SignatureAuth"]


# what the auth knew of a request it signed, in its extensions (httpx hands the same dict on to the
# request it builds for a redirect): the request signed, the caller's body and Authorization
_SIGNED = "signing_proxy.signed"

RequestHook = Callable[[httpx.Request], None]
AsyncRequestHook = Callable[[httpx.Request], Awaitable[None]]


class SignatureAuth(httpx.Auth):
    """Signs every request of an ``httpx.Client`` or ``httpx.AsyncClient`` with ``signer``.

    With ``follow_redirects=True`` pass ``event_hooks=auth.redirect_hooks()`` (an ``AsyncClient``:
    ``auth.async_redirect_hooks()``) too, so each redirect is signed for its own URL."""

    requires_request_body = True

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._follows = False  # redirect hooks were handed out: each request remembers what it was

    def redirect_hooks(self) -> dict[str, list[RequestHook]]:
        """``event_hooks`` for an ``httpx.Client`` that follows redirects: sign each for its URL."""
        self._follows = True
        return {"request": [self._sign_redirect]}

    def async_redirect_hooks(self) -> dict[str, list[AsyncRequestHook]]:
        """``event_hooks`` for an ``httpx.AsyncClient`` that follows redirects."""
        self._follows = True

        async def sign_redirect(request: httpx.Request) -> None:
            if _SIGNED in request.extensions:
                await self._refresh_off_loop()
            if self._redirected(request):
                await self._sign_async(request)

        return {"request": [sign_redirect]}

    async def _refresh_off_loop(self) -> None:
        """Re-read the key store when due, in a worker thread: never on the event loop."""
        if self.signer.refresh_due():
            await asyncio.to_thread(self.signer.refresh)

    def _sign_redirect(self, request: httpx.Request) -> None:
        """A request hook: a request httpx built for a redirect from one we signed (the one signed
        passes unchanged) is signed for its own method and URL, over the caller's body and with the
        caller's ``Authorization``, or sent with none of the first signature's fields when its host
        is not signed. httpx copies every field: the first signature, and a bearer we added."""
        if self._redirected(request):
            self._sign(request)

    def _redirected(self, request: httpx.Request) -> bool:
        """True for a request httpx built for a redirect from one we signed, put back as its caller
        gave it (body, ``Authorization``, none of our fields) to be signed for its own URL."""
        signed: _Signed | None = request.extensions.get(_SIGNED)
        if signed is None or signed.request() is request:
            return False
        if request.method == signed.method:  # the body is resent (307, 308; 301, 302 but for POST)
            _replace_body(request, signed.body)
        else:  # turned into a GET: httpx sends no body
            request._content = b""
        headers = request.headers
        kept = "authorization" in headers  # httpx drops Authorization for another origin
        for name in OWNED:
            headers.pop(name, None)
        if kept and signed.authorization is not None:
            headers["Authorization"] = signed.authorization  # the caller's, never a bearer we added
        return True

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
        await self._refresh_off_loop()
        if _streamed(request):
            self.signer.declared_too_large(request.headers.get("content-length"))
            assert isinstance(request.stream, httpx.AsyncByteStream)
            _replace_body(request, await read_limited_async(request.stream, self.signer.max_body_bytes))
        await self._sign_async(request)
        yield request

    def _sign(self, request: httpx.Request) -> None:
        lines, content = _to_sign(request)
        signed = self.signer.sign(request.method, str(request.url), lines, content)
        self._apply(request, lines, content, signed)

    async def _sign_async(self, request: httpx.Request) -> None:
        """``_sign`` on an event loop: a key on a token signs in a worker thread (``Signer.sign_async``)."""
        lines, content = _to_sign(request)
        signed = await self.signer.sign_async(request.method, str(request.url), lines, content)
        self._apply(request, lines, content, signed)

    def _apply(
        self,
        request: httpx.Request,
        lines: list[tuple[str, str]],
        content: bytes,
        signed: SignedRequest | None,
    ) -> None:
        """Put ``signed``'s fields (and body) on ``request``, whose ``lines`` and ``content`` it signed."""
        headers = request.headers
        if self._follows:  # only a redirect hook asks what a request was
            _remember(request, content)
        if signed is None:  # a hosts.unsigned host (its redirects are still signed where they go)
            return
        for name in OWNED.intersection(name.lower() for name, _ in lines):
            del headers[name]
        for name, value in signed.fields:
            headers[name] = value
        if signed.host is not None:
            headers["Host"] = signed.host
        if signed.body is not content:
            _replace_body(request, signed.body)


def _to_sign(request: httpx.Request) -> tuple[list[tuple[str, str]], bytes]:
    """The field lines and body to sign ``request`` with, its URL in the form signed."""
    if request.url.raw_path.endswith(b"?") and not request.url.query:  # sent as "/p?" otherwise
        request.url = request.url.copy_with(query=None)  # the target signed: no empty query
    return request.headers.multi_items(), request.content


def _remember(request: httpx.Request, content: bytes) -> None:
    """Note in ``request``'s extensions that it is the one handled last of its chain, and on the
    first of a chain what its caller gave (the body, the ``Authorization``)."""
    known: _Signed | None = request.extensions.get(_SIGNED)
    if known is None:
        caller = request.headers.get("authorization")
        request.extensions[_SIGNED] = _Signed(weakref.ref(request), request.method, content, caller)
    else:
        known.request = weakref.ref(request)


@dataclass(slots=True, repr=False)
class _Signed:
    """The request this auth handled last in a chain of redirects, and what its caller gave (its
    ``repr``, in ``request.extensions``, shows no ``Authorization`` value)."""

    request: weakref.ref[httpx.Request]
    method: str
    body: bytes
    authorization: str | None

    def __repr__(self) -> str:
        caller = REDACTED if self.authorization else self.authorization  # None, "" or hidden
        return (
            f"_Signed(request={self.request!r}, method={self.method!r}, body=<{len(self.body)} bytes>, "
            f"authorization={caller!r})"
        )


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
