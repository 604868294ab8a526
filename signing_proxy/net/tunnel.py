"""CONNECT tunnels as the engine sees them: the first byte after ``200``, TLS termination, blind pipes.

After ``200 Connection Established`` a :class:`TunnelStart` owns the client transport until the
first byte tells a TLS ClientHello (0x16) from plain HTTP; it then hands the transport to a TLS
session or straight to a new inner connection protocol. A :class:`BlindTunnel` joins client and
upstream byte for byte with backpressure and half-close, and closes it after ``idle_s`` with no
byte moving either way. What to intercept, and what a failure means to the operator, is the
policy's (``proxy.connect``); it is told through callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import typing
from collections.abc import Callable, MutableMapping

from .tls import TlsSession, TlsTransport

__all__ = ["CONNECT_ESTABLISHED", "BlindTunnel", "TunnelStart"]

log = logging.getLogger("signing_proxy.proxy.connect")

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
TLS_HANDSHAKE_RECORD = 0x16  # first byte of a TLS record carrying a ClientHello


class TunnelStart(asyncio.Protocol):
    """The client transport's protocol from ``200 Connection Established`` to the first byte."""

    def __init__(
        self,
        raw: asyncio.Transport,
        *,
        host: str,
        port: int,
        context: ssl.SSLContext,
        client_ip: str,
        handshake_timeout_s: float,
        inner: Callable[[str], asyncio.Protocol],
        on_failed: Callable[[TunnelStart, ssl.SSLError | None], None],
        handshakes: MutableMapping[ssl.SSLObject, TunnelStart],
        starting: set[TunnelStart],
    ) -> None:
        self.raw = raw
        self.host = host
        self.port = port
        self.authority = f"{host}:{port}"
        self.expected_sni = host.strip("[]")
        self.context = context
        self.client_ip = client_ip
        self.sni_refused = False
        self.session: TlsSession | None = None
        self._inner = inner  # scheme -> the protocol that serves the requests inside the tunnel
        self._on_failed = on_failed
        self._handshakes = handshakes
        self._starting = starting
        self._timeout_s = handshake_timeout_s
        self._done = False
        starting.add(self)
        self._timer = asyncio.get_running_loop().call_later(handshake_timeout_s, self._timeout)

    def begin(self, early: bytes) -> None:
        self.raw.set_protocol(self)
        if not self.raw.is_closing():  # before the early bytes: a pause they cause must stand (plain
            self.raw.resume_reading()  # HTTP pipelined after the CONNECT pauses its inner connection)
        if early:
            self.data_received(early)

    # --- raw transport callbacks until the tunnel knows what it carries ---
    def data_received(self, data: bytes) -> None:
        if not data:
            return
        if data[0] == TLS_HANDSHAKE_RECORD:
            session = TlsSession(
                self.raw, self.context, on_established=self._established, on_failed=self._failed
            )
            self.session = session
            self._handshakes[session.sslobj] = self
            self.raw.set_protocol(session)
            session.data_received(data)
            return
        self._finish()
        inner = self._inner("http")
        self.raw.set_protocol(inner)
        inner.connection_made(self.raw)
        inner.data_received(data)

    def eof_received(self) -> bool | None:
        self._finish()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    # --- TLS outcomes ---
    def _established(self, transport: TlsTransport) -> asyncio.Protocol:
        self._finish()
        self.session = None  # it holds our callbacks: no cycle is left for the collector to find
        return self._inner("https")

    def _failed(self, exc: ssl.SSLError | None) -> None:
        timed_out = self._done
        self._finish()
        if not (self.sni_refused or timed_out):
            self._on_failed(self, exc)
        self.session = None  # as above: a stranger's failed handshake is freed at once, not at a pass

    def _timeout(self) -> None:
        if self._done:
            return
        self._done = True  # a failure report from the abort below is not a second log line
        self._starting.discard(self)
        log.info(
            "CONNECT %s from %s: no %s within %g s; closing",
            self.authority,
            self.client_ip,
            "TLS handshake" if self.session is not None else "data",
            self._timeout_s,
        )
        self.raw.abort()

    def _finish(self) -> None:
        self._done = True
        self._timer.cancel()
        self._starting.discard(self)
        if self.session is not None:  # the SNI check needs it no more; the entry would keep us alive
            self._handshakes.pop(self.session.sslobj, None)

    def abort(self) -> None:
        self._finish()
        self.raw.abort()


class _Link(typing.Protocol):
    """What a side of a blind tunnel tells its tunnel."""

    def active(self) -> None: ...
    def close(self) -> None: ...
    def end_lost(self, end: _PipeEnd) -> None: ...


class _Ended:
    """What the sides of a finished tunnel tell instead: nothing is left to hear it. Their tunnel is
    no longer theirs, so the two sides, the tunnel and their transports form no cycle that would
    wait for the cycle collector."""

    def active(self) -> None:
        pass

    def close(self) -> None:
        pass

    def end_lost(self, end: _PipeEnd) -> None:
        pass


_ENDED = _Ended()


class _PipeEnd(asyncio.Protocol):
    """One side of a blind tunnel: bytes arriving here are written to the other side."""

    def __init__(self, tunnel: BlindTunnel) -> None:
        self.tunnel: _Link = tunnel
        self.transport: asyncio.Transport | None = None
        self.peer: _PipeEnd | None = None
        self.bytes_in = 0
        self.eof = False
        self.lost = False
        self.held: list[bytes] = []  # arrived before the other side joined (a server that speaks first)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        self.tunnel.active()
        out = self.peer.transport if self.peer is not None else None
        if out is None and self.transport is not None:
            self.held.append(data)  # the client joins after the 200: keep it, read no more until then
            self.transport.pause_reading()
        elif out is not None and not out.is_closing():
            out.write(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        peer = self.peer
        if peer is None or peer.eof or peer.transport is None:
            self.tunnel.close()
            return None
        if peer.transport.is_closing():
            return True  # its connection_lost closes us (end_lost)
        if not peer.transport.can_write_eof():
            # TLS cannot half-close: kept open, the other side would never hear of this end and both
            # sockets would wait for idle_s. Both close (what is buffered is still written first).
            peer.close()
            return None
        peer.transport.write_eof()  # half-close: the other direction keeps flowing
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.tunnel.end_lost(self)

    def pause_writing(self) -> None:  # our side cannot take more: stop reading the other side
        out = self.peer.transport if self.peer is not None else None
        if out is not None and not out.is_closing():
            out.pause_reading()

    def resume_writing(self) -> None:
        self.tunnel.active()  # our side drained: bytes are moving, even if none arrived
        out = self.peer.transport if self.peer is not None else None
        if out is not None and not out.is_closing():
            out.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # what is buffered is still written first


class BlindTunnel:
    """Client and upstream joined byte for byte: not intercepted, not signed.

    ``ended`` says how it ended: ``closed`` (a side closed) or ``idle`` (nothing moved either way
    for ``idle_s``, counted from the last byte read or the last drained write on either side).
    """

    def __init__(
        self,
        client_ip: str,
        authority: str,
        on_finished: Callable[[BlindTunnel], None],
        *,
        idle_s: float,
    ) -> None:
        self.client_ip = client_ip
        self.authority = authority
        self.client = _PipeEnd(self)
        self.upstream = _PipeEnd(self)
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.started = time.perf_counter()
        self.attached = False  # the client side joined (after 200); before that only upstream exists
        self.ended = "closed"
        self._on_finished = on_finished
        self._finished_already = False
        self._idle_s = idle_s
        self._loop = asyncio.get_running_loop()
        self._last_active = self._loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None

    @property
    def duration_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def upstream_gone(self) -> bool:
        """The upstream sent FIN or reset before the client joined: the tunnel is closing, or has
        finished (``on_finished`` already called, unattached); attaching a client would leave it open."""
        return self.upstream.eof or self.upstream.lost

    def adopt_upstream(self, transport: asyncio.Transport) -> None:
        """Take over an upstream connection another protocol opened (a WebSocket handshake's), just
        before ``attach_client``."""
        transport.set_protocol(self.upstream)
        self.upstream.connection_made(transport)
        if not transport.is_closing():
            with contextlib.suppress(AttributeError, RuntimeError):
                transport.resume_reading()  # its first owner paused it, to leave the rest to us

    def attach_client(self, raw: asyncio.Transport, early: bytes) -> None:
        """Join the client (after its ``200``); only to a tunnel whose upstream is not ``upstream_gone``.

        An adopted upstream already closing when the client joins may have told its end to the
        protocol it had before, never to us: it is counted lost now (and aborted, so nothing of it
        lingers), the client is closed once what it was sent is written, and the tunnel finishes when
        the client has gone, as any other.
        """
        self.attached = True
        upstream = self.upstream.transport
        if upstream is not None and upstream.is_closing() and not self.upstream.lost:
            upstream.abort()
            self.upstream.lost = True  # a connection_lost that still comes here changes nothing
        self.active()
        self._idle_timer = self._loop.call_later(self._idle_s, self._check_idle)
        raw.set_protocol(self.client)
        self.client.connection_made(raw)
        held, self.upstream.held = self.upstream.held, []
        for data in held:
            raw.write(data)
        if self.upstream.lost:  # nothing will answer the client: it goes once it has what it was sent
            self.client.close()
            return
        if held and upstream is not None and not upstream.is_closing():
            upstream.resume_reading()
        raw.resume_reading()  # before the early bytes: a pause they cause (the upstream full) must stand
        if early:
            self.client.data_received(early)

    def active(self) -> None:
        """Bytes moved: the idle clock starts again (a timestamp; the timer re-arms when it fires)."""
        self._last_active = self._loop.time()

    def _check_idle(self) -> None:
        self._idle_timer = None
        silent = self._loop.time() - self._last_active
        if silent < self._idle_s:
            self._idle_timer = self._loop.call_later(self._idle_s - silent, self._check_idle)
            return
        self.ended = "idle"
        # abort, not close: what is still buffered has not moved for idle_s and would hold the socket
        for end in (self.client, self.upstream):
            if end.transport is not None and not end.lost:
                end.transport.abort()

    def end_lost(self, end: _PipeEnd) -> None:
        self.close()  # one side gone: the other is closed once its buffered bytes are written
        # each side once, however often it is told (an adopted upstream may be counted before its
        # connection_lost comes here); before the client joins, the upstream is the only side
        finished = self.upstream.lost and (self.client.lost or not self.attached)
        if finished and not self._finished_already:
            self._finished_already = True
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._on_finished(self)
            for side in (self.client, self.upstream):  # see _Ended
                side.tunnel, side.peer, side.transport, side.held = _ENDED, None, None, []

    def close(self) -> None:
        """Close both sides once their buffered bytes are written (the idle timer still bounds that)."""
        self.client.close()
        self.upstream.close()
