"""The package's one HTTP client: every request the package makes on its own behalf goes through it.

``HttpClient`` sends a request on an ``UpstreamPool`` (HTTPS verified against the system store,
``upstream.ca_file`` or a pinned CA; connect and read bounded by ``timeouts.*``), optionally through
a next-hop relay (absolute form), and buffers the answer up to a byte bound within one overall
deadline. Redirects are not followed. A caller that signs (the proxy) passes its pipeline as
``prepare``; without it the request goes unsigned. Manifests, directories, revocation lists and
``signing-proxy discover`` pages all come through here; those named by a remote party pass an
``EgressPolicy`` (``net.egress``), and then go to the address it vetted, on a connection of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeVar

from ..config import TimeoutsConfig, UpstreamConfig
from ..core.errors import FieldError
from ..core.fields import Fields
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError
from .egress import EgressPolicy
from .framing import BODY_METHODS, Outgoing, drop_hop_by_hop, keep_piece, outgoing
from .upstream import ResponseHead, UpstreamConnection, UpstreamPool

__all__ = ["FetchedResponse", "HttpClient", "Prepare"]

T = TypeVar("T")


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


class Prepare(Protocol):
    """Turns a request into wire bytes (the proxy's signing pipeline); raises ``ProxyError``."""

    def __call__(
        self, method: str, target: Target, lines: Sequence[tuple[str, str]], body: bytes, /, *, framed: bool
    ) -> Awaitable[Outgoing]: ...


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
        self.chunks: list[bytes | bytearray] = []
        self.size = 0

    def on_head(self, head: ResponseHead) -> None:
        self.head = head

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            if self.truncate:
                keep_piece(self.chunks, data[: len(data) - (self.size - self.max_bytes)])
                self.truncated = True
            # the connection's own failure path: detaches this sink, never reuses the socket, closes it
            self.conn._fail(
                ProxyError(502, "response-too-large", f"{self.url}: larger than {self.max_bytes} bytes")
            )
            return
        keep_piece(self.chunks, data)

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


class HttpClient:
    """Buffered requests on an upstream pool, bounded by ``timeouts``, optionally through ``via``.

    ``via`` is a next-hop relay (``proxy.pipeline.next_hop_target``); it applies to unsigned
    requests, since a ``prepare`` callable decides itself where its bytes go (``Outgoing.connect_to``).
    """

    def __init__(
        self,
        pool: UpstreamPool,
        timeouts: TimeoutsConfig,
        *,
        via: Target | None = None,
        owns_pool: bool = False,
    ) -> None:
        self.pool = pool
        self.timeouts = timeouts  # replaceable on reload: the default deadline follows it
        self.via = via
        self._owns_pool = owns_pool

    @classmethod
    def standalone(
        cls,
        upstream: UpstreamConfig | None = None,
        timeouts: TimeoutsConfig | None = None,
        *,
        via: Target | None = None,
    ) -> HttpClient:
        """A client with its own pool, for users without a proxy app (an exchange, verify-origin).

        ``upstream.ca_file``/``pin_ca_files``/``pool_max_idle_per_host`` and ``timeouts.connect_s``/
        ``read_s`` apply; ``upstream.next_hop`` does not (pass ``via`` to relay): the caller decides.
        """
        upstream = upstream if upstream is not None else UpstreamConfig()
        timeouts = timeouts if timeouts is not None else TimeoutsConfig()
        pool = UpstreamPool(upstream, connect_timeout_s=timeouts.connect_s, read_timeout_s=timeouts.read_s)
        return cls(pool, timeouts, via=via, owns_pool=True)

    async def fetch(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        max_bytes: int,
        truncate: bool = False,
        total_s: float | None = None,
        prepare: Prepare | None = None,
        egress: EgressPolicy | None = None,
    ) -> FetchedResponse:
        """Send one request (signed by ``prepare`` when given), return its answer; raises ``ProxyError``.

        A body above ``max_bytes`` is ``response-too-large``, or with ``truncate`` cut to ``max_bytes``.
        ``total_s`` bounds the whole exchange (default: ``timeouts.connect_s + timeouts.read_s``). A
        reused connection the upstream closed before answering is retried once, freshly prepared.
        With ``egress`` (a URL named by a remote party) the URL is checked and its address vetted
        before any connect (``EgressError``), and the request goes on a fresh, unpooled connection to
        that address; a next hop (``via``, or a ``prepare`` that routes elsewhere) still carries it.
        """
        limit_s = total_s if total_s is not None else self.timeouts.connect_s + self.timeouts.read_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        address: str | None = None
        if egress is not None:
            target = egress.check_url(url)
            try:
                address = await _within(egress.vet(target), deadline - loop.time())
            except TimeoutError:
                raise ProxyError(
                    504, "upstream-connect-timeout", f"{url}: no address resolved within {limit_s:g} s"
                ) from None
        else:
            try:
                target = parse_absolute_uri(url)
            except FieldError as exc:
                raise ProxyError(400, exc.reason, f"{url!r}: {exc.detail}") from None
        framed = bool(body) or method in BODY_METHODS
        head_only = method == "HEAD"
        pool = self.pool
        for attempt in (1, 2):
            if prepare is not None:  # prepared per attempt: a retry carries a fresh signature
                wire = await prepare(method, target, headers, body, framed=framed)
            else:
                fields = drop_hop_by_hop(headers)
                if address is not None:  # one exchange per egress connection: let the server know
                    fields = Fields([*fields, ("Connection", "close")])
                wire = outgoing(method, target, fields, body, framed=framed, keyid=None, via=self.via)
            # egress: straight to the vetted address, unless a next hop (configuration) carries it
            vetted = address if address is not None and wire.connect_to == target else None
            conn = pool.take_idle(wire.connect_to) if vetted is None else None
            reused = conn is not None
            if conn is None:
                opening = (
                    pool.connect(wire.connect_to) if vetted is None else pool.connect_vetted(target, vetted)
                )
                try:
                    conn = await _within(opening, deadline - loop.time())
                except TimeoutError:
                    raise ProxyError(
                        504, "upstream-connect-timeout", f"{url}: no connection within {limit_s:g} s"
                    ) from None
                if conn.transport is None or conn.transport.is_closing():
                    # closed before we wrote: no sink saw it, so fail now rather than at the deadline
                    raise ProxyError(
                        502, "upstream-reset", f"{url}: the upstream closed the connection before answering"
                    )
            sink = _BufferingSink(conn, max_bytes, url, truncate)
            conn.start(wire.head, wire.body, sink, head_only=head_only)
            timer = loop.call_at(deadline, _expire, conn, sink, limit_s)
            try:
                await sink.done
            except ProxyError as error:
                answered = sink.head is not None
                # the sink's future keeps ``error``, whose traceback keeps this frame: were the frame
                # to keep the sink too, its body so far would wait in that cycle for a full pass of
                # the collector (start-up frozen, it rarely comes)
                del sink
                if attempt == 1 and reused and error.reason == "upstream-reset" and not answered:
                    continue
                raise
            except asyncio.CancelledError:
                conn.sink = None
                conn.reusable = False
                conn.abort()  # given up: nothing of it is owed to the upstream
                raise
            finally:
                timer.cancel()
            if vetted is None:
                pool.release(conn)
            else:  # never pooled: a stranger could otherwise park idle sockets, one per name it invents
                conn.reusable = False
                conn.close()
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

    async def close(self) -> None:
        """Close the idle connections of a pool this client owns (``standalone``); else nothing."""
        if self._owns_pool:
            self.pool.close()
            await asyncio.sleep(0)  # let the closed transports run connection_lost before the loop ends

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()


async def _within(step: Awaitable[T], limit_s: float) -> T:
    """``asyncio.wait_for(step, limit_s)``, but a failure of ``step`` is raised without wait_for's
    frame in its traceback: in Python 3.11 that frame holds the task that holds the failure, a cycle
    that keeps the caller's frame (its request body with it) until a full pass of the collector."""
    try:
        return await asyncio.wait_for(step, limit_s)
    except TimeoutError:
        raise
    except Exception as exc:
        raise exc.with_traceback(None) from exc.__cause__  # the same exception, a new traceback


def _expire(conn: UpstreamConnection, sink: _BufferingSink, limit_s: float) -> None:
    if conn.sink is sink:
        conn._fail(ProxyError(504, "upstream-timeout", f"{sink.url}: no complete answer in {limit_s:g} s"))
