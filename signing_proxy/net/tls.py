"""TLS over an existing transport: a server-side ``ssl.SSLObject`` between two ``MemoryBIO``\\ s.

After ``CONNECT`` the client's socket is already a transport with bytes read from it (the first
byte tells a TLS ClientHello from plain HTTP), so the TLS server is layered on that transport
here rather than with ``loop.start_tls``, which cannot be handed bytes already read and which
would hide a refused SNI behind a generic handshake error. ``TlsSession`` is the raw transport's
protocol: it feeds ciphertext to OpenSSL, writes what OpenSSL produces, and once the handshake is
done presents a ``TlsTransport`` to the application protocol (a ``ClientConnection``). Flow
control is the raw transport's: its ``pause_writing``/``resume_writing`` reach the application
protocol unchanged (encryption is synchronous, so the raw write buffer is the only buffer), and
``pause_reading``/``resume_reading`` go straight to the socket. It works on any event loop whose
transports offer ``set_protocol`` (asyncio and uvloop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from .outbox import close_within

__all__ = ["CERTIFICATE_ALERTS", "TlsSession", "TlsTransport"]

log = logging.getLogger("signing_proxy.net.tls")

READ_CHUNK_BYTES = 64 * 1024  # plaintext read from OpenSSL per call
WRITE_CHUNK_BYTES = 64 * 1024  # plaintext handed to SSLObject.write per call (bounds the BIO)

# Alerts a client sends when it does not accept our certificate (OpenSSL reason codes).
CERTIFICATE_ALERTS = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "TLSV1_ALERT_ACCESS_DENIED",
        "TLSV1_ALERT_DECRYPT_ERROR",
    }
)


class TlsTransport(asyncio.Transport):
    """What the application protocol sees: plaintext in and out of one TLS session."""

    def __init__(self, session: TlsSession) -> None:
        super().__init__(extra=None)
        self._session = session
        # write() is the session's own: no method of ours in between, one call less per write
        self.write = session.write_plain  # type: ignore[method-assign]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sslobj = self._session.sslobj
        if name == "ssl_object":
            return sslobj
        if name == "sslcontext":
            return sslobj.context
        if name == "cipher":
            return sslobj.cipher()
        if name == "peercert":
            return sslobj.getpeercert()
        if name == "compression":
            return sslobj.compression()
        return self._session.raw.get_extra_info(name, default)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self._session.write_plain(data)

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close; use close()")

    def is_closing(self) -> bool:
        return self._session.closing or self._session.raw.is_closing()

    def close(self) -> None:
        self._session.close()

    def abort(self) -> None:
        self._session.abort()

    def is_reading(self) -> bool:
        return bool(self._session.raw.is_reading())

    def pause_reading(self) -> None:
        self._session.pause_reading()

    def resume_reading(self) -> None:
        self._session.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._session.raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return int(self._session.raw.get_write_buffer_size())

    def get_write_buffer_limits(self) -> tuple[int, int]:
        low, high = self._session.raw.get_write_buffer_limits()
        return int(low), int(high)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._session.app = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._session.app is not None
        return self._session.app


class TlsSession(asyncio.Protocol):
    """The raw transport's protocol while it carries one server-side TLS session.

    ``on_established`` is called once the handshake completes and returns the application
    protocol, which then gets ``connection_made(TlsTransport)``; ``on_failed(exc)`` is called once
    when the handshake fails or the peer leaves before it completes (``exc`` None).
    """

    def __init__(
        self,
        raw: asyncio.Transport,
        context: ssl.SSLContext,
        *,
        on_established: Callable[[TlsTransport], asyncio.Protocol],
        on_failed: Callable[[ssl.SSLError | None], None],
    ) -> None:
        self.raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.sslobj = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.app: asyncio.BaseProtocol | None = None
        self.transport: TlsTransport | None = None
        self.closing = False
        self.handshake_done = False
        self.answered = False  # we sent handshake bytes (our certificate): the ClientHello was complete
        self._failed = False
        self._app_paused = False  # the application asked us to stop delivering plaintext
        self._on_established = on_established
        self._on_failed = on_failed
        self._eof = False
        self._lost = False

    # --- raw transport callbacks ---
    def data_received(self, data: bytes) -> None:
        if self._lost:
            return
        self._incoming.write(data)
        if self.handshake_done:
            self._read_plain()
        else:
            self._pump()

    def eof_received(self) -> bool | None:
        self._incoming.write_eof()
        self._eof = True
        self._pump()
        # Once the application has the stream, it decides (its eof_received, in _read_plain): a
        # half-close after a complete request still gets its answer (RFC 9112 section 9.6), and
        # close_notify closes only the peer's side (RFC 8446 section 6.1). Before: we close.
        return True if self.app is not None and not self.closing else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.closing = True
        if not self.handshake_done:
            self._fail(None)
        elif self.app is not None:
            self.app.connection_lost(exc)
        # the application and its transport refer back to us: without these, every tunnel that ends
        # waits for the cycle collector (about 20 KiB each, OpenSSL's buffers with them)
        self.app = self.transport = None

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.app is not None:
            self.app.resume_writing()

    # --- driving OpenSSL ---
    def _pump(self) -> None:
        if not self.handshake_done:
            try:
                self.sslobj.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                if self._eof:
                    self._fail(None)
                return
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):  # the peer ended its stream (a FIN, or
                # close_notify) inside the handshake: it left, as when the socket closes, and the
                # caller tells "inside its ClientHello" from "after our certificate" by ``answered``
                self._flush()
                self._fail(None)
                return
            except ssl.SSLError as exc:
                self._flush()  # the alert we send, if any
                self._fail(exc)
                return
            self.handshake_done = True
            self._flush()
            self.transport = TlsTransport(self)
            self.app = self._on_established(self.transport)
            self.app.connection_made(self.transport)
        self._read_plain()

    def _read_plain(self) -> None:
        app = self.app
        while app is not None and not self._app_paused and not self._lost:
            try:
                data = self.sslobj.read(READ_CHUNK_BYTES)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""
            except ssl.SSLError as exc:
                log.debug("TLS error from %s: %s", self._peer(), exc.reason or exc)
                self._flush()
                self.raw.abort()
                return
            if not data:  # close_notify, or the TCP stream ended
                self._flush()
                if isinstance(app, asyncio.Protocol) and not app.eof_received():
                    self.close()
                return
            assert isinstance(app, asyncio.Protocol)
            app.data_received(data)
            if not self._incoming.pending and not self.sslobj.pending():
                break  # nothing left to decrypt: another read would only raise SSLWantReadError
        self._flush()

    def _flush(self) -> None:
        if not self._outgoing.pending:
            return
        data = self._outgoing.read()
        if data and not self.raw.is_closing():
            self.answered = True
            self.raw.write(data)

    def _fail(self, exc: ssl.SSLError | None) -> None:
        if self._failed:
            return
        self._failed = True
        self.closing = True
        try:
            self._on_failed(exc)
        finally:
            if not self.raw.is_closing():
                self.raw.close()  # flushes the alert, then closes

    def _peer(self) -> str:
        peer = self.raw.get_extra_info("peername")
        return str(peer[0]) if peer else "-"

    # --- what TlsTransport asks for ---
    def write_plain(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or self.raw.is_closing():
            return
        try:
            if len(data) <= WRITE_CHUNK_BYTES:  # a request's answer, most often: one record or a few
                self.sslobj.write(data)
                self._flush()
                return
            view = memoryview(data)
            while view:
                written = self.sslobj.write(view[:WRITE_CHUNK_BYTES])
                view = view[written:]
                self._flush()
        except ssl.SSLError as exc:
            log.debug("TLS write to %s failed: %s", self._peer(), exc.reason or exc)
            self.abort()

    def pause_reading(self) -> None:
        self._app_paused = True
        if not self.raw.is_closing():
            self.raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._app_paused:
            return
        self._app_paused = False
        if not self.raw.is_closing():
            self.raw.resume_reading()
        if self.handshake_done:  # plaintext OpenSSL decrypted while we were paused
            asyncio.get_running_loop().call_soon(self._read_plain)

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self.handshake_done and not self._lost:
            with contextlib.suppress(ssl.SSLError):
                self.sslobj.unwrap()  # sends close_notify; the peer's answer is not awaited
            self._flush()
        if not self.raw.is_closing():
            close_within(self.raw)  # bounded: a client that never reads the end is aborted

    def abort(self) -> None:
        self.closing = True
        self.raw.abort()
