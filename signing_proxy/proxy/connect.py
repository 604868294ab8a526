"""CONNECT: intercept the tunnel and sign what is inside it, or pass it through blind.

``HTTPS_PROXY`` means ``CONNECT host:port``. The checks come first and are answered as ordinary
problem responses before any ``200``: client allow-list, proxy credentials, the authority-form
target, and ``intercept.allowed_ports``. A host matching ``intercept.tunnel`` becomes a blind TCP
tunnel (upstream connected first, so a failure is still a 502; then bytes flow both ways with
backpressure and half-close; never signed, counted and logged as ``tunnelled``). Every other
host is intercepted: after ``200 Connection Established`` the first byte tells a TLS ClientHello
(0x16) from plain HTTP. TLS is terminated with a leaf minted by our CA for the CONNECT host
(a ClientHello naming another host in SNI is refused with ``unrecognized_name``); either way a
``ClientConnection`` bound to ``Target(scheme, host, port, "/")`` then serves the inner requests,
so signing, limits, keep-alive, problem responses and streaming are the forward proxy's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import typing
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.schema import Config, host_matches
from ..core.uri import Target
from ..errors import ProxyError
from ..net.server import ClientConnection, parse_connect_target
from ..net.tls import CERTIFICATE_ALERTS, TlsSession, TlsTransport
from ..net.upstream import open_upstream
from ..storage.ca import (
    CA_CERT_FILENAME,
    CAError,
    CertificateAuthority,
    LeafContextCache,
    load_ca,
    load_or_create_ca,
)

if TYPE_CHECKING:
    from ..net.server import _Request
    from ..service.app import ProxyApp

__all__ = ["CA_INSTALL_HINT", "ConnectHandler", "ca_cert_path", "load_interception_ca"]

log = logging.getLogger("signing_proxy.proxy.connect")
access_log = logging.getLogger("signing_proxy.access")

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
TLS_HANDSHAKE_RECORD = 0x16  # first byte of a TLS record carrying a ClientHello
CA_INSTALL_HINT = (
    "the client must trust the interception CA: `signing-proxy ca export --out ca.pem` and add it to "
    'the client\'s trust store, or start the agent after `eval "$(signing-proxy env)"`'
)


def ca_cert_path(config: Config) -> Path:
    """Where the interception CA certificate lives: ``intercept.ca_cert`` or ``<data_dir>/ca.pem``."""
    if config.intercept.ca_cert:
        return Path(config.intercept.ca_cert).expanduser()
    return config.data_path / CA_CERT_FILENAME


def load_interception_ca(config: Config) -> CertificateAuthority:
    """The operator CA (``intercept.ca_cert``/``ca_key``), or ours, created on first run; ``CAError``."""
    intercept = config.intercept
    try:
        if intercept.ca_cert and intercept.ca_key:
            return load_ca(Path(intercept.ca_cert).expanduser(), Path(intercept.ca_key).expanduser())
        return load_or_create_ca(config.data_path, validity_days=intercept.ca_validity_days)
    except OSError as exc:
        where = exc.filename or config.data_path
        raise CAError("ca-unavailable", f"{where}: {exc.strerror or exc}") from None


class ConnectHandler:
    """Answers CONNECT for one ``ProxyApp``: owns the CA, the leaf cache and the open tunnels."""

    def __init__(self, app: ProxyApp) -> None:
        self.app = app
        self.config = app.config.intercept
        self.ca: CertificateAuthority | None = None
        self.leaves: LeafContextCache | None = None
        if self.config.enabled:
            try:
                self.ca = load_interception_ca(app.config)
                self.leaves = LeafContextCache(self.ca, self.config.leaf_cache_size)
            except CAError as exc:
                raise ProxyError(500, exc.reason, f"interception CA: {exc.detail or exc.reason}") from None
            except OSError as exc:
                raise ProxyError(
                    500, "ca-unavailable", f"interception CA: cannot prepare leaf contexts ({exc})"
                ) from None
        self._sni_callback = self._check_sni
        self._handshakes: weakref.WeakKeyDictionary[ssl.SSLObject, _TunnelStart] = weakref.WeakKeyDictionary()
        self._starting: set[_TunnelStart] = set()
        self._tunnels: set[_BlindTunnel] = set()

    # --- status ---
    def ca_check(self) -> str | None:
        """``/readyz``: "ok", or why interception cannot work; None when interception is off."""
        if self.ca is None:
            return None
        if datetime.now(UTC) >= self.ca.not_after:
            return "ca-expired"
        return "ok"

    # --- CONNECT ---
    async def handle(self, conn: ClientConnection, req: _Request) -> tuple[int, str]:
        """Refuse (raise ``ProxyError``, answered before any 200) or take the connection over.

        Returns the status and outcome for the access log. ``conn`` never serves another request.
        """
        app = self.app
        conn.keep_alive = False  # a refusal closes the connection; a tunnel takes it over
        if conn.tunnel is not None:
            raise ProxyError(400, "connect-in-tunnel", "a CONNECT inside a CONNECT tunnel is not proxied")
        if not app.access.client_allowed(conn.client_ip):
            raise ProxyError(
                403, "client-not-allowed", "this address may not use the proxy (access.allow_clients)"
            )
        app.access.check_proxy_auth(req.header("proxy-authorization"))
        host, port = parse_connect_target(req.url.decode("latin-1"))
        if port not in self.config.allowed_ports:
            raise ProxyError(
                403,
                "connect-port-not-allowed",
                f"CONNECT to port {port} is not allowed (intercept.allowed_ports)",
            )
        early = b"".join(req.body)
        if any(host_matches(pattern, host) for pattern in self.config.tunnel):
            return await self._blind(conn, host, port, early)
        if self.leaves is None:
            raise ProxyError(
                403,
                "interception-disabled",
                "HTTPS interception is off (intercept.enabled: false); only intercept.tunnel hosts "
                "may be CONNECTed",
            )
        try:
            context = self._context_for(host)
        except CAError as exc:
            if exc.reason == "leaf-host-invalid":
                raise ProxyError(400, "connect-host-invalid", exc.detail) from None
            log.error("interception CA cannot mint a leaf for %s: %s", host, exc)
            raise ProxyError(503, "interception-ca-unusable", exc.detail) from None
        raw = self._take_over(conn)
        if raw is None:
            return 499, "client-gone"
        raw.write(CONNECT_ESTABLISHED)
        start = _TunnelStart(self, raw, host=host, port=port, context=context, client_ip=conn.client_ip)
        self._starting.add(start)
        start.begin(early)
        app.metrics_request("intercepted")
        return 200, "intercepted"

    def _context_for(self, host: str) -> ssl.SSLContext:
        assert self.leaves is not None
        context = self.leaves.get(host)
        if context.sni_callback is not self._sni_callback:
            context.sni_callback = self._sni_callback  # refuse a different SNI, never switch leaves
        return context

    def _take_over(self, conn: ClientConnection) -> asyncio.Transport | None:
        """Detach the client transport from ``conn`` (which then closes nothing) and return it."""
        raw, conn.transport = conn.transport, None
        self.app.connections.discard(conn)
        if raw is None or raw.is_closing():
            return None
        return raw

    def _check_sni(
        self, sslobj: ssl.SSLObject, server_name: str | None, _context: ssl.SSLContext
    ) -> int | None:
        start = self._handshakes.get(sslobj)
        if start is None:  # not one of our handshakes: fail closed
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        if server_name is None or server_name.lower().removesuffix(".") == start.expected_sni:
            return None
        start.sni_refused = True
        log.warning(
            "refused TLS from %s in CONNECT %s: the ClientHello names %r (SNI mismatch)",
            start.client_ip,
            start.authority,
            server_name,
        )
        self.app.metrics_request("sni-mismatch")
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

    # --- blind tunnels ---
    async def _blind(self, conn: ClientConnection, host: str, port: int, early: bytes) -> tuple[int, str]:
        tunnel = _BlindTunnel(self, conn.client_ip, f"{host}:{port}")
        await open_upstream(
            lambda: tunnel.upstream, host, port, tls=None, timeout_s=self.app.config.timeouts.connect_s
        )
        raw = self._take_over(conn)
        if raw is None:
            tunnel.close()
            return 499, "client-gone"
        raw.write(CONNECT_ESTABLISHED)
        self._tunnels.add(tunnel)
        tunnel.attach_client(raw, early)
        self.app.metrics_request("tunnelled")
        return 200, "tunnelled"

    # --- lifecycle ---
    def close(self) -> None:
        """Close tunnels that are starting or blind (intercepted ones are ClientConnections)."""
        for start in list(self._starting):
            start.abort()
        for tunnel in list(self._tunnels):
            tunnel.close()
        if self.leaves is not None:
            self.leaves.close()

    def log_event(self, event: str, **fields: object) -> None:
        """An access-log line for something that is not one request (a tunnel that ended)."""
        if not self.app.config.log.access_log or not access_log.isEnabledFor(logging.INFO):
            return
        if self.app.config.log.format == "json":
            access_log.info(json.dumps({"event": event, **fields}, separators=(",", ":")))
        else:
            access_log.info(" ".join([f"event={event}", *(f"{k}={v}" for k, v in fields.items())]))


class _TunnelStart(asyncio.Protocol):
    """The client transport's protocol from ``200 Connection Established`` to the first byte."""

    def __init__(
        self,
        handler: ConnectHandler,
        raw: asyncio.Transport,
        *,
        host: str,
        port: int,
        context: ssl.SSLContext,
        client_ip: str,
    ) -> None:
        self.handler = handler
        self.raw = raw
        self.host = host
        self.port = port
        self.authority = f"{host}:{port}"
        self.expected_sni = host.strip("[]")
        self.context = context
        self.client_ip = client_ip
        self.sni_refused = False
        self._done = False
        self._session: TlsSession | None = None
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(handler.config.handshake_timeout_s, self._timeout)

    def begin(self, early: bytes) -> None:
        self.raw.set_protocol(self)
        if early:
            self.data_received(early)
        if not self.raw.is_closing():
            self.raw.resume_reading()

    # --- raw transport callbacks until the tunnel knows what it carries ---
    def data_received(self, data: bytes) -> None:
        if not data:
            return
        if data[0] == TLS_HANDSHAKE_RECORD:
            session = TlsSession(
                self.raw, self.context, on_established=self._established, on_failed=self._failed
            )
            self._session = session
            self.handler._handshakes[session.sslobj] = self
            self.raw.set_protocol(session)
            session.data_received(data)
            return
        self._finish()
        inner = ClientConnection(self.handler.app, tunnel=Target("http", self.host, self.port, "/"))
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
        return ClientConnection(self.handler.app, tunnel=Target("https", self.host, self.port, "/"))

    def _failed(self, exc: ssl.SSLError | None) -> None:
        timed_out = self._done
        self._finish()
        if self.sni_refused or timed_out:
            return
        app = self.handler.app
        reason = exc.reason if exc is not None else None
        if reason in CERTIFICATE_ALERTS:
            app.metrics_request("client-tls-untrusted")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: the client rejected our certificate (%s); %s",
                self.authority,
                self.client_ip,
                reason,
                CA_INSTALL_HINT,
            )
        elif exc is None and self._session is not None and not self._session.answered:
            app.metrics_request("client-tls-failed")
            log.info(
                "CONNECT %s from %s: the client closed the connection inside its ClientHello",
                self.authority,
                self.client_ip,
            )
        elif exc is None:
            app.metrics_request("client-tls-failed")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: the client closed the connection; "
                "if it does not trust the interception CA, %s",
                self.authority,
                self.client_ip,
                CA_INSTALL_HINT,
            )
        else:
            app.metrics_request("client-tls-failed")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: %s",
                self.authority,
                self.client_ip,
                reason or exc,
            )

    def _timeout(self) -> None:
        if self._done:
            return
        self._done = True  # a failure report from the abort below is not a second log line
        self.handler._starting.discard(self)
        log.info(
            "CONNECT %s from %s: no %s within %g s; closing",
            self.authority,
            self.client_ip,
            "TLS handshake" if self._session is not None else "data",
            self.handler.config.handshake_timeout_s,
        )
        self.raw.abort()

    def _finish(self) -> None:
        self._done = True
        self._timer.cancel()
        self.handler._starting.discard(self)

    def abort(self) -> None:
        self._finish()
        self.raw.abort()


class _PipeEnd(asyncio.Protocol):
    """One side of a blind tunnel: bytes arriving here are written to the other side."""

    def __init__(self, tunnel: _BlindTunnel) -> None:
        self.tunnel = tunnel
        self.transport: asyncio.Transport | None = None
        self.peer: _PipeEnd | None = None
        self.bytes_in = 0
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        out = self.peer.transport if self.peer is not None else None
        if out is not None and not out.is_closing():
            out.write(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        peer = self.peer
        if peer is None or peer.eof or peer.transport is None:
            self.tunnel.close()
            return None
        if not peer.transport.is_closing() and peer.transport.can_write_eof():
            peer.transport.write_eof()  # half-close: the other direction keeps flowing
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.end_lost(self)

    def pause_writing(self) -> None:  # our side cannot take more: stop reading the other side
        out = self.peer.transport if self.peer is not None else None
        if out is not None and not out.is_closing():
            out.pause_reading()

    def resume_writing(self) -> None:
        out = self.peer.transport if self.peer is not None else None
        if out is not None and not out.is_closing():
            out.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # what is buffered is still written first


class _BlindTunnel:
    """Client and upstream joined byte for byte: not intercepted, not signed."""

    def __init__(self, handler: ConnectHandler, client_ip: str, authority: str) -> None:
        self.handler = handler
        self.client_ip = client_ip
        self.authority = authority
        self.client = _PipeEnd(self)
        self.upstream = _PipeEnd(self)
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.started = time.perf_counter()
        self.attached = False  # the client side joined (after 200); before that only upstream exists
        self._lost = 0
        self._finished_already = False

    def attach_client(self, raw: asyncio.Transport, early: bytes) -> None:
        self.attached = True
        raw.set_protocol(self.client)
        self.client.connection_made(raw)
        if early:
            self.client.data_received(early)
        raw.resume_reading()

    def end_lost(self, end: _PipeEnd) -> None:
        self._lost += 1
        self.close()  # one side gone: the other is closed once its buffered bytes are written
        if self._lost >= (2 if self.attached else 1):
            self._finished()

    def close(self) -> None:
        self.client.close()
        self.upstream.close()

    def _finished(self) -> None:
        if self._finished_already:
            return
        self._finished_already = True
        self.handler._tunnels.discard(self)
        if not self.attached:
            return
        self.handler.log_event(
            "tunnel",
            client=self.client_ip,
            host=self.authority,
            duration_ms=round((time.perf_counter() - self.started) * 1000, 2),
            bytes_up=self.client.bytes_in,
            bytes_down=self.upstream.bytes_in,
            outcome="tunnelled",
        )
