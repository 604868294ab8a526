"""The verifier on aiohttp: verify a request as received, and a middleware that refuses with 401.

``signature_middleware`` runs ``RequestVerifier.verify`` on the raw end-to-end header lines (a
hop-by-hop field, or one ``Connection`` names, counts as absent), raw path and exact body of each
request, answers a refusal with 401 problem+json carrying the stable reason
(503 with ``Retry-After`` for ``verifier-busy``: no fetch budget left for a new key directory;
421 ``misdirected-request`` for a ``Host`` outside ``hosts``), and otherwise puts the
``VerifiedStack`` in ``request[SIGNATURE]`` — the only thing a handler should trust.

The origin a signature must cover is ``external_origin`` when given, else the scheme and ``Host`` of
the request, and then only for the names in ``hosts`` (loopback by default, any port): a signature
made for ``https://publisher-a.example/article`` must not verify at another service that a client
sends it to with that ``Host`` (``hosts=None``: any name, for a tool that gates nothing).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence

from aiohttp import StreamReader, web
from aiohttp.typedefs import Middleware

from ..core.errors import FieldError, VerificationError
from ..core.fields import Fields
from ..core.signatures import SignatureEntry, VerifiedStack, parse_signature_stack
from ..core.uri import LOOPBACK_HOSTS, is_host_name, served_authority
from ..errors import problem_body
from ..net.framing import drop_hop_by_hop
from .verifier import RequestVerifier, refusal_answer

__all__ = [
    "SIGNATURE",
    "Handler",
    "as_received",
    "exempt_check",
    "received",
    "refusal",
    "served_hosts",
    "signature_middleware",
    "verify_aiohttp_request",
]

SIGNATURE = web.RequestKey("signature", VerifiedStack)  # request[SIGNATURE]: the verified result


Hosts = Iterable[str] | None  # the names a verifier answers for without external_origin (None: any)


async def verify_aiohttp_request(
    verifier: RequestVerifier,
    request: web.Request,
    *,
    external_origin: str | None = None,
    hosts: Hosts = LOOPBACK_HOSTS,
) -> VerifiedStack:
    """Verify an aiohttp request as received (raw end-to-end header lines, raw path, exact body).

    ``external_origin`` (``https://exchange.example``) is the origin clients used when a TLS-terminating
    load balancer sits in front (RFC 9421 section 7.4.3); otherwise scheme and Host of the request,
    a Host naming one of ``hosts``.
    """
    return await _verify(verifier, request, external_origin, served_hosts(hosts))


async def _verify(
    verifier: RequestVerifier, request: web.Request, external_origin: str | None, hosts: frozenset[str] | None
) -> VerifiedStack:
    """``verifier.verify`` of the request ``as_received``, its stack parsed once."""
    method, uri, fields, body, entries = await received(request, external_origin, hosts)
    return await verifier.verify(method, uri, fields, body, entries=entries)


def served_hosts(hosts: Hosts) -> frozenset[str] | None:
    """``hosts`` as compared (lower case), checked: ValueError for an entry that is not a host name
    or address alone (``exchange.example``, ``127.0.0.1``, ``[::1]``; no port)."""
    if hosts is None:
        return None
    return _served((hosts,) if isinstance(hosts, str) else tuple(hosts))


@functools.lru_cache(maxsize=64)  # per request through verify_aiohttp_request: a few lists per process
def _served(hosts: tuple[str, ...]) -> frozenset[str]:
    for host in hosts:
        if not isinstance(host, str) or not is_host_name(host):
            raise ValueError(f"hosts: a host name or address without a port, got {host!r}")
    return frozenset(host.lower() for host in hosts)


LOOPBACK = served_hosts(LOOPBACK_HOSTS)  # the names answered for until told: as ``as_received`` takes them


async def as_received(
    request: web.Request, external_origin: str | None, hosts: frozenset[str] | None = LOOPBACK
) -> tuple[str, str, Fields, bytes]:
    """Method, target URI, header field lines and body of ``request`` exactly as they arrived
    (``received``, without the parsed stack)."""
    method, uri, fields, body, _entries = await received(request, external_origin, hosts)
    return method, uri, fields, body


async def received(
    request: web.Request,
    external_origin: str | None,
    hosts: frozenset[str] | None,
    read: Callable[[web.Request], Awaitable[bytes]] | None = None,
) -> tuple[str, str, Fields, bytes, tuple[SignatureEntry, ...]]:
    """Method, target URI, header field lines, body and parsed stack of ``request`` as they arrived
    (raw lines, raw path, the bytes read): what every aiohttp face of the verifier checks.

    The whole body is read here (within aiohttp's ``client_max_size``: 413 above it; by ``read``
    when given), before any handler runs; the request then replays those very bytes to whatever
    reads it next (``read``, ``text``, ``json``, ``post``, ``multipart`` or streaming ``content``).

    The field lines are the end-to-end ones (``net.framing.drop_hop_by_hop``, as the gateway and the
    relay verify them): without ``Connection``, the other hop-by-hop fields and every field a
    ``Connection`` names. Such a field ends at this hop (RFC 9110 section 7.6.1), so a signature
    covering it is checked as one whose covered field is absent (``missing-covered-header``; a
    ``Signature-Input`` named there is ``missing-signature``), on every face alike.

    VerificationError when no target URI can be made that is the one the request goes to: a target
    not in origin form, or (without ``external_origin``) not exactly one ``Host`` of ``host[:port]``
    (``malformed-host``), or one whose name is not in ``hosts`` (``misdirected-request``).
    """
    if not request.raw_path.startswith("/"):
        raise VerificationError("malformed-target", "the request target must be in origin form")
    if external_origin:
        origin = external_origin.rstrip("/")
    else:
        values = [v.decode("latin-1") for k, v in request.raw_headers if k.lower() == b"host"]
        try:
            authority = served_authority(values, hosts, "hosts, or external_origin")
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from None
        origin = f"{request.scheme}://{authority}"
    if _decoded(request):
        raise VerificationError(
            "content-coding-decoded",
            "this server decodes request bodies (aiohttp's auto_decompress): the Content-Digest of a "
            "body sent with a Content-Encoding cannot be checked; run the server with auto_decompress=False",
        )
    lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
    fields = drop_hop_by_hop(lines)
    entries = parse_signature_stack(fields)  # no stack, or one that cannot be read: refused here,
    body = await (request.read() if read is None else read(request))  # before the body is read
    _replay(request, body)
    return request.method, origin + request.raw_path, fields, body, entries


def _replay(request: web.Request, body: bytes) -> None:
    """Give ``request`` a body stream that replays ``body``, the bytes just read (and then verified).

    ``request.read()`` drains aiohttp's input stream: only ``read``/``text``/``json`` and an
    url-encoded ``post`` see the body afterwards (from read's cache), while ``content`` (streaming),
    ``multipart()`` and a multipart ``post()`` read that stream and got nothing (or a 500). With this
    stream every way of reading sees exactly the bytes that were verified; none reads the socket again.

    aiohttp (3.14) has no public way to give a request another body stream (``clone()`` keeps it), and
    the request reads it from the private ``_payload`` (``content``, ``multipart``, ``post``): set here
    only, with the reified ``content`` forgotten. tests/verify/test_middleware_body.py pins it on every
    face, so an aiohttp that reads the body elsewhere fails there.
    """
    if not request.body_exists:  # no body at all (aiohttp's empty stream): nothing to replay
        return
    # a limit above the body: the stream never asks the connection to pause for bytes already held
    replay = StreamReader(request.protocol, max(len(body), 2**16), loop=asyncio.get_running_loop())
    replay.feed_data(body)
    replay.feed_eof()
    request._payload = replay
    request._cache.pop("content", None)


# what aiohttp's request parsers decode (http_parser.py, _http_parser.pyx), compared as they compare
_DECODED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})


def _decoded(request: web.Request) -> bool:
    """Whether ``request.read()`` gives the body decoded, not the bytes sent: a Content-Encoding
    aiohttp decodes, on a server that decodes (its ``auto_decompress``, on by default). Content-Digest
    covers the content as sent, with its coding (RFC 9530), and the encoded bytes are gone by then:
    a digest over them was refused and one over the decoded content accepted."""
    codings = request.headers.getall("Content-Encoding", ())
    if not any(c.isascii() and c.lower() in _DECODED_CODINGS for c in codings):
        return False
    # aiohttp keeps a server's keyword arguments privately: unreadable, it is taken to decode
    server = getattr(request.protocol, "_manager", None)
    options = getattr(server, "_kwargs", None)
    return not isinstance(options, dict) or options.get("auto_decompress", True) is not False


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def exempt_check(exempt_paths: Sequence[str]) -> Callable[[web.Request], bool]:
    """Whether a request may reach its handler unverified: its raw path (the bytes sent, without the
    query; no percent-decoding) is exactly one of ``exempt_paths`` AND aiohttp routed it to the
    resource registered for that very path (any method that resource accepts).

    Both, because either alone lets an unsigned request reach a protected handler: aiohttp's
    ``request.path`` is fully decoded while routing keeps ``%2F`` (``/.well-known%2Fsvc.json`` would
    count as exempt yet go to a catch-all), and a method the exempt route does not accept (``POST``
    to a ``GET`` route) falls through to whatever else matches. A handler that runs for any other
    resource — a catch-all, a dynamic route, a 404 or 405 — runs only after a verdict. An exempt
    path therefore needs its own plain route (``router.add_get("/healthz", ...)``).
    """
    paths = frozenset((exempt_paths,) if isinstance(exempt_paths, str) else exempt_paths)

    def exempt(request: web.Request) -> bool:
        if not paths:
            return False
        path = request.raw_path.partition("?")[0]
        if path not in paths:
            return False
        resource = request.match_info.route.resource
        return resource is not None and resource.canonical == path

    return exempt


def signature_middleware(
    verifier: RequestVerifier,
    *,
    external_origin: str | None = None,
    hosts: Hosts = LOOPBACK_HOSTS,
    exempt_paths: Sequence[str] = (),
) -> Middleware:
    """aiohttp middleware: refuse unverified requests with 401 problem+json (503 when busy, 421 for a
    name outside ``hosts``); else put the ``VerifiedStack`` in ``request[SIGNATURE]`` for the handler
    (trust only that).

    ``external_origin`` (``https://exchange.example``): the origin clients sign for, when TLS ends in
    front; otherwise the request's scheme and ``Host``, whose name must be one of ``hosts`` (the
    names this service answers for: ``("exchange.example",)``; loopback by default; ValueError for
    an entry with a port). ``exempt_paths`` (``("/healthz",)``) pass unverified only to the plain
    route registered for exactly that raw path (``exempt_check``); every other handler gets
    ``request[SIGNATURE]``."""
    exempt = exempt_check(exempt_paths)
    served = served_hosts(hosts)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if exempt(request):
            return await handler(request)
        try:
            request[SIGNATURE] = await _verify(verifier, request, external_origin, served)
        except VerificationError as exc:
            return refusal(exc)
        return await handler(request)

    return middleware


def refusal(exc: VerificationError) -> web.Response:
    """401 problem+json carrying the refusal reason (and the label it concerns); 503 with
    ``Retry-After`` for ``verifier-busy``."""
    extra: dict[str, object] = {"label": exc.label} if exc.label else {}
    status, headers = refusal_answer(exc)
    return web.Response(
        status=status,
        body=problem_body(status, exc.reason, exc.detail, **extra),
        content_type="application/problem+json",
        headers=dict(headers),
    )
