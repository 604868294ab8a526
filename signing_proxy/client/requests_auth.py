"""requests: ``SignatureAuth``, a ``requests.auth.AuthBase`` that signs the prepared request.

requests calls an auth last while preparing (after URL, headers, body and any ``auth=`` header),
so the signature covers what is sent. A body given as a file or a generator is read up to
``limits.max_body_bytes`` and sent from memory with a ``Content-Length``; a larger one raises
``NotSigned`` (413) and nothing is sent. The URL is sent in the form signed (``http://h:80/p`` as
``http://h/p``): requests writes the URL as given to a proxy, and a verifier rebuilds that.

requests re-applies no auth to a redirect it follows: it copies the first request's fields to the
new URL. A signature covers one URL, and the copy would hand another origin a signature it could
replay for the first, so the signature's fields are taken off a request once it is answered with a
redirect, and the redirect goes out unsigned (a verifier refuses it). To sign a redirect, pass
``allow_redirects=False`` and send the next request yourself.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

import requests
from requests.auth import AuthBase

from ..core.errors import FieldError
from ..core.uri import parse_absolute_uri
from .signer import OWNED, Signer, read_limited

__all__ = ["SignatureAuth"]

_READ_SIZE = 64 * 1024
# what a signature is made of: taken off a request answered with a redirect, which requests copies
# (Authorization is the caller's or a configured bearer's: requests itself drops it across origins)
_SIGNATURE_FIELDS = OWNED - {"authorization"}


class SignatureAuth(AuthBase):
    """Signs every request of ``requests`` (``auth=`` on a call or a ``Session``) with ``signer``."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        signer = self.signer
        signer.refresh_if_due()
        headers = request.headers
        body = _body_bytes(request.body, signer, headers.get("Content-Length"))
        assert request.method is not None
        assert request.url is not None
        request.url = _as_signed(request.url)
        signed = signer.sign(request.method, request.url, list(headers.items()), body)
        sent = body
        if signed is not None:
            for name in OWNED:
                headers.pop(name, None)
            for name, value in signed.fields:
                headers[name] = value
            if signed.host is not None:
                headers["Host"] = signed.host
            sent = signed.body
            # the caller's body, for a redirect that resends it: never the Requester added here
            request.hooks["response"].append(partial(_unsign_redirected, body=body))
        if sent is not body or (request.body is not None and body is not request.body):
            _set_body(request, sent)  # the bytes digested are the bytes sent
        return request


def _as_signed(url: str) -> str:
    """``url`` in the form the signer signs (default port, empty query and case as ``core.uri``
    writes them); unchanged when it cannot be signed (``Signer.sign`` then refuses it)."""
    try:
        return parse_absolute_uri(url).uri
    except FieldError:
        return url


def _unsign_redirected(response: requests.Response, *, body: bytes, **_kwargs: Any) -> requests.Response:
    """A ``response`` hook: a redirect is followed with a copy of ``response.request``'s fields (and,
    for 307 and 308, its body), so both are put back as the caller gave them."""
    if response.is_redirect:
        request = response.request
        for name in _SIGNATURE_FIELDS:
            request.headers.pop(name, None)
        if request.body is not None and request.body != body:
            _set_body(request, body)
    return response


def _body_bytes(body: Any, signer: Signer, declared: str | None) -> bytes:
    """The prepared body as bytes: text encoded as requests sends it, a file or iterator read within
    the limit."""
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    signer.declared_too_large(declared)
    if hasattr(body, "read"):
        return read_limited(_file_chunks(body), signer.max_body_bytes)
    if isinstance(body, Iterable):
        return read_limited(
            (c.encode("utf-8") if isinstance(c, str) else c for c in body), signer.max_body_bytes
        )
    raise TypeError(f"cannot sign a request body of type {type(body).__name__}")


def _file_chunks(body: Any) -> Iterable[bytes]:
    while chunk := body.read(_READ_SIZE):
        yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk


def _set_body(request: requests.PreparedRequest, body: bytes) -> None:
    request.body = body
    # requests noted a file body's position to rewind it for a 307/308: bytes have no seek(), and
    # the redirect was refused (UnrewindableBodyError); the bytes are resent as they are
    request._body_position = None  # type: ignore[attr-defined]
    request.headers.pop("Transfer-Encoding", None)
    request.headers["Content-Length"] = str(len(body))
