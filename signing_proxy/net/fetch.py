"""Requests the proxy makes on its own behalf, through its own signing pipeline.

``fetch`` prepares a request exactly as it prepares an agent's (``ProxyApp.prepare``: the same
headers, the same signature, the same next-hop relay), sends it on the shared upstream pool (HTTPS
verified against the system store, ``upstream.ca_file`` or a pinned CA), and buffers the answer up
to a byte bound within one overall deadline. Redirects are not followed. Discovery fetches
manifests and calls DiscoverResources with it; ``signing-proxy discover`` fetches its URL with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import FieldError
from ..core.uri import parse_absolute_uri
from ..errors import ProxyError
from .upstream import ResponseHead, UpstreamConnection

if TYPE_CHECKING:
    from ..service.app import ProxyApp

__all__ = ["FetchedResponse", "fetch"]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True)
class FetchedResponse:
    """A complete, buffered upstream answer."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    truncated: bool = False  # ``truncate=True`` and the body was longer than ``max_bytes``

    def header(self, name: str) -> str | None:
        """All field lines named ``name`` joined with ``", "`` (RFC 9110 section 5.3), or None."""
        lname = name.lower()
        values = [v for n, v in self.headers if n.lower() == lname]
        return ", ".join(values) if values else None


class _BufferingSink:
    """A ``ResponseSink`` that keeps the answer in memory; above ``max_bytes`` it fails (or, with
    ``truncate``, ends) the exchange and closes the connection."""

    __slots__ = ("chunks", "conn", "done", "head", "max_bytes", "size", "truncate", "truncated", "url")

    def __init__(self, conn: UpstreamConnection, max_bytes: int, url: str, truncate: bool) -> None:
        self.conn = conn
        self.max_bytes = max_bytes
        self.url = url
        self.truncate = truncate
        self.truncated = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head: ResponseHead | None = None
        self.chunks: list[bytes] = []
        self.size = 0

    def on_head(self, head: ResponseHead) -> None:
        self.head = head

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            if self.truncate:
                self.chunks.append(data[: len(data) - (self.size - self.max_bytes)])
                self.truncated = True
            # the connection's own failure path: detaches this sink, never reuses the socket, closes it
            self.conn._fail(
                ProxyError(502, "response-too-large", f"{self.url}: larger than {self.max_bytes} bytes")
            )
            return
        self.chunks.append(data)

    def on_feed_end(self) -> None:
        pass

    def on_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_fail(self, error: ProxyError) -> None:
        if self.truncated:
            self.on_complete()
        elif not self.done.done():
            self.done.set_exception(error)


async def fetch(
    app: ProxyApp,
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    max_bytes: int,
    truncate: bool = False,
    total_s: float | None = None,
) -> FetchedResponse:
    """Sign and send one request, return its answer; raises ``ProxyError`` (with its stable reason).

    A body above ``max_bytes`` is ``response-too-large``, or with ``truncate`` cut to ``max_bytes``.
    ``total_s`` bounds the whole exchange (default: ``timeouts.connect_s + timeouts.read_s``).
    """
    try:
        target = parse_absolute_uri(url)
    except FieldError as exc:
        raise ProxyError(400, exc.reason, f"{url!r}: {exc.detail}") from None
    framed = bool(body) or method in _BODY_METHODS
    head_only = method == "HEAD"
    timeouts = app.config.timeouts
    limit_s = total_s if total_s is not None else timeouts.connect_s + timeouts.read_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    outgoing = await app.prepare(method, target, headers, body, framed=framed)
    pool = app.pool
    for attempt in (1, 2):
        conn = pool.take_idle(outgoing.connect_to)
        reused = conn is not None
        if conn is None:
            try:
                conn = await asyncio.wait_for(pool.connect(outgoing.connect_to), deadline - loop.time())
            except TimeoutError:
                raise ProxyError(
                    504, "upstream-connect-timeout", f"{url}: no connection within {limit_s:g} s"
                ) from None
        sink = _BufferingSink(conn, max_bytes, url, truncate)
        conn.start(outgoing.head + outgoing.body, sink, head_only=head_only)
        timer = loop.call_at(deadline, _expire, conn, sink, limit_s)
        try:
            await sink.done
        except ProxyError as error:
            if attempt == 1 and reused and error.reason == "upstream-reset" and sink.head is None:
                outgoing = await app.prepare(method, target, headers, body, framed=framed)  # fresh signature
                continue
            raise
        except asyncio.CancelledError:
            conn.sink = None
            conn.reusable = False
            conn.close()
            raise
        finally:
            timer.cancel()
        pool.release(conn)
        head = sink.head
        assert head is not None  # the connection completes only after a final head
        return FetchedResponse(
            head.status,
            head.reason,
            tuple((n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers),
            b"".join(sink.chunks),
            sink.truncated,
        )
    raise AssertionError("unreachable")


def _expire(conn: UpstreamConnection, sink: _BufferingSink, limit_s: float) -> None:
    if conn.sink is sink:
        conn._fail(ProxyError(504, "upstream-timeout", f"{sink.url}: no complete answer in {limit_s:g} s"))
