"""CONNECT: intercept the tunnel and sign what is inside it, or pass it through blind.

``HTTPS_PROXY`` means ``CONNECT host:port``. The checks come first and are answered as ordinary
problem responses before any ``200``: client allow-list, proxy credentials, the authority-form
target, and ``intercept.allowed_ports``. A host matching ``intercept.tunnel`` becomes a blind TCP
tunnel (upstream connected first, so a failure is still a 502; then bytes flow both ways with
backpressure and half-close until ``timeouts.client_idle_s`` of silence both ways; never signed,
counted and logged as ``tunnelled``, the line saying whether it ended ``idle``). Every other
host is intercepted: after ``200 Connection Established`` the first byte tells a TLS ClientHello
(0x16) from plain HTTP. TLS is terminated with a leaf minted by our CA for the CONNECT host
(a ClientHello naming another host in SNI is refused with ``unrecognized_name``); either way a
``ClientConnection`` bound to ``Target(scheme, host, port, "/")`` then serves the inner requests,
so signing, limits, keep-alive, problem responses and streaming are the forward proxy's own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ..config import Config, host_matches
from ..core.uri import Target
from ..errors import ProxyError
from ..net.dial import open_upstream
from ..net.leaves import LeafContextCache
from ..net.request import RETRY_AFTER_S, Request, parse_connect_target
from ..net.server import ClientConnection
from ..net.tls import CERTIFICATE_ALERTS
from ..net.tunnel import CONNECT_ESTABLISHED, BlindTunnel, TunnelStart
from ..storage.ca import (
    CA_CERT_FILENAME,
    CAError,
    CertificateAuthority,
    load_ca,
    load_or_create_ca,
)
from ..verify.cache import TokenBucket
from .exchange import Policy

__all__ = ["CA_INSTALL_HINT", "ConnectHandler", "ca_cert_path", "load_interception_ca"]

log = logging.getLogger("signing_proxy.proxy.connect")
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


def _short_of_resources(host: str, exc: OSError) -> ProxyError:
    """A leaf's PEM reaches OpenSSL through a memfd (or a temp file): a process out of descriptors
    (EMFILE, ENFILE) or memory cannot mint one now, though the next CONNECT may. Like a full proxy,
    it is a ``503 server-busy`` with ``Retry-After``, not an internal error."""
    log.warning("cannot mint a leaf for CONNECT %s now: %s", host, exc.strerror or exc)
    return ProxyError(
        503,
        "server-busy",
        "the proxy is short of file descriptors or memory to intercept this host; try again shortly",
        headers=(("Retry-After", str(RETRY_AFTER_S)),),
    )


LEAF_MINTS_PER_S = 50  # our choice: new host names' leaves a second, at ~2 ms each a tenth of a core
LEAF_MINT_BURST = 200  # our choice: an agent (a browser) opening many hosts at once is not refused


class ConnectHandler:
    """Answers CONNECT: owns the CA, the leaf cache and the open tunnels.

    Given the restart-only configuration, the live ``Policy`` (access, timeouts, access log), the
    factory of inner connections (``inner(tunnel, proxy_authorization)``) and the outcome counter;
    never the app.
    """

    def __init__(
        self,
        config: Config,
        *,
        policy: Callable[[], Policy],
        inner: Callable[[Target, str | None], asyncio.Protocol],
        count: Callable[[str], None],
    ) -> None:
        self.config = config.intercept
        self._policy = policy
        self._inner = inner
        self._count = count
        self.ca: CertificateAuthority | None = None
        self.leaves: LeafContextCache | None = None
        if self.config.enabled:
            try:
                self.ca = load_interception_ca(config)
                self.leaves = LeafContextCache(self.ca, self.config.leaf_cache_size)
            except OSError as exc:
                raise CAError("ca-unavailable", f"cannot prepare leaf contexts ({exc})") from None
        # a new host name's leaf costs the loop ~2 ms (key, certificate, context) before any TLS
        # arrives: whoever may CONNECT chose how many; what a burst of new hosts mints is bounded
        self._mints = TokenBucket(LEAF_MINTS_PER_S, LEAF_MINT_BURST, time.monotonic)
        self._sni_callback = self._check_sni
        self._handshakes: weakref.WeakKeyDictionary[ssl.SSLObject, TunnelStart] = weakref.WeakKeyDictionary()
        self._starting: set[TunnelStart] = set()
        self._tunnels: set[BlindTunnel] = set()

    # --- status ---
    def ca_check(self) -> str | None:
        """``/readyz``: "ok", or why interception cannot work; None when interception is off."""
        if self.ca is None:
            return None
        if datetime.now(UTC) >= self.ca.not_after:
            return "ca-expired"
        return "ok"

    # --- CONNECT ---
    async def handle(self, conn: ClientConnection, req: Request) -> tuple[int, str]:
        """Refuse (raise ``ProxyError``, answered before any 200) or take the connection over.

        Returns the status and outcome for the access log. ``conn`` never serves another request.
        """
        policy = self._policy()
        conn.keep_alive = False  # a refusal closes the connection; a tunnel takes it over
        if conn.tunnel is not None:
            raise ProxyError(400, "connect-in-tunnel", "a CONNECT inside a CONNECT tunnel is not proxied")
        if not policy.access.client_allowed(conn.client_ip):
            raise ProxyError(
                403, "client-not-allowed", "this address may not use the proxy (access.allow_clients)"
            )
        credentials = req.header("proxy-authorization")
        policy.access.check_proxy_auth(credentials)
        host, port = parse_connect_target(req.url.decode("latin-1"))
        if port not in self.config.allowed_ports:
            raise ProxyError(
                403,
                "connect-port-not-allowed",
                f"CONNECT to port {port} is not allowed (intercept.allowed_ports)",
            )
        early = b"".join(req.body)
        if any(host_matches(pattern, host) for pattern in self.config.tunnel):
            return await self._blind(conn, host, port, early, policy)
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
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):  # OpenSSL refused the leaf we made: a fault of ours
                raise
            raise _short_of_resources(host, exc) from None
        raw = conn.take_over()
        if raw is None:
            return 499, "client-gone"
        raw.write(CONNECT_ESTABLISHED)
        start = TunnelStart(
            raw,
            host=host,
            port=port,
            context=context,
            client_ip=conn.client_ip,
            handshake_timeout_s=self.config.handshake_timeout_s,
            inner=lambda scheme: self._inner(Target(scheme, host, port, "/"), credentials),
            on_failed=self._tls_failed,
            handshakes=self._handshakes,
            starting=self._starting,
        )
        start.begin(early)
        self._count("intercepted")
        return 200, "intercepted"

    def _context_for(self, host: str) -> ssl.SSLContext:
        assert self.leaves is not None
        if host not in self.leaves and not self._mints.take():
            raise ProxyError(
                503,
                "interception-busy",
                f"certificates for new host names are made at most {LEAF_MINTS_PER_S} a second; retry",
                headers=(("Retry-After", str(RETRY_AFTER_S)),),
            )
        context = self.leaves.get(host)
        if context.sni_callback is not self._sni_callback:
            context.sni_callback = self._sni_callback  # refuse a different SNI, never switch leaves
        return context

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
        self._count("sni-mismatch")
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

    def _tls_failed(self, start: TunnelStart, exc: ssl.SSLError | None) -> None:
        """Say why an intercepted handshake failed, in words an operator can act on."""
        reason = exc.reason if exc is not None else None
        if reason in CERTIFICATE_ALERTS:
            self._count("client-tls-untrusted")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: the client rejected our certificate (%s); %s",
                start.authority,
                start.client_ip,
                reason,
                CA_INSTALL_HINT,
            )
        elif reason == "CALLBACK_FAILED":  # ssl could not read the server name as ASCII for _check_sni
            self._count("sni-mismatch")
            log.warning(
                "refused TLS from %s in CONNECT %s: the ClientHello names a server name that is not "
                "ASCII (SNI mismatch)",
                start.client_ip,
                start.authority,
            )
        elif exc is None and start.session is not None and not start.session.answered:
            self._count("client-tls-failed")
            log.info(
                "CONNECT %s from %s: the client closed the connection inside its ClientHello",
                start.authority,
                start.client_ip,
            )
        elif exc is None:
            self._count("client-tls-failed")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: the client closed the connection; "
                "if it does not trust the interception CA, %s",
                start.authority,
                start.client_ip,
                CA_INSTALL_HINT,
            )
        else:
            self._count("client-tls-failed")
            log.warning(
                "TLS handshake for CONNECT %s from %s failed: %s",
                start.authority,
                start.client_ip,
                reason or exc,
            )

    # --- blind tunnels ---
    async def _blind(
        self, conn: ClientConnection, host: str, port: int, early: bytes, policy: Policy
    ) -> tuple[int, str]:
        tunnel = BlindTunnel(conn.client_ip, f"{host}:{port}", self._tunnel_finished, idle_s=policy.idle_s)
        await open_upstream(lambda: tunnel.upstream, host, port, tls=None, timeout_s=policy.connect_timeout_s)
        if tunnel.upstream_gone:  # it hung up while we were still connecting: the tunnel has ended
            tunnel.close()
            raise ProxyError(
                502, "upstream-reset", f"{host}:{port} closed the connection before the tunnel opened"
            )
        raw = conn.take_over()
        if raw is None:
            tunnel.close()
            return 499, "client-gone"
        raw.write(CONNECT_ESTABLISHED)
        self._tunnels.add(tunnel)
        tunnel.attach_client(raw, early)
        self._count("tunnelled")
        return 200, "tunnelled"

    def _tunnel_finished(self, tunnel: BlindTunnel) -> None:
        self._tunnels.discard(tunnel)
        if not tunnel.attached:
            return
        self._policy().access_log.event(
            "tunnel",
            client=tunnel.client_ip,
            host=tunnel.authority,
            duration_ms=round(tunnel.duration_s * 1000, 2),
            bytes_up=tunnel.client.bytes_in,
            bytes_down=tunnel.upstream.bytes_in,
            outcome="tunnelled",
            ended=tunnel.ended,  # "idle": closed after timeouts.client_idle_s with no byte either way
        )

    # --- lifecycle ---
    def taken_over(self) -> int:
        """Client connections held here: TLS handshakes under way and blind tunnels (an intercepted
        tunnel, once its handshake is done, is a ClientConnection the engine counts)."""
        return len(self._starting) + len(self._tunnels)

    def close(self) -> None:
        """Close tunnels that are starting or blind (intercepted ones are ClientConnections)."""
        for start in list(self._starting):
            start.abort()
        for tunnel in list(self._tunnels):
            tunnel.close()
        if self.leaves is not None:
            self.leaves.close()
