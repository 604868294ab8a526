"""The proxy's request policy over the engine: one agent request from parsed head to streamed answer.

``ProxyHandler`` is the ``net.server.Handler`` of the proxy port. Per request: access control, where
the request goes (absolute-form target, a sidecar route, the port's own ``/healthz``, ``/readyz``,
``/metrics``, or CONNECT), the body up to the limit, the mode's pipeline (sign, or verify and stack a
relay label), forward (``net.forward``), discovery's answer to a held 403, and one signed retry of
an idempotent request an origin challenged with ``Accept-Signature`` (``proxy.challenges``). An
ExecuteTransaction call we signed is tapped on its way back (a bounded copy of the body) so that
``transactions`` learns the retrieval URLs it binds before the agent sees the answer end. Nothing the
pipeline refuses is forwarded; every refusal is a problem+json response with a stable reason.

The handler is given what it uses, never the app: a :class:`Policy` (replaced whole on a
configuration reload, so a request sees the old or the new, never a mix) and the stable parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..core.challenge import RetryPlan
from ..core.errors import FieldError
from ..core.uri import Target, forwarded_target, parse_absolute_uri, spelled, valid_host_field
from ..errors import ProxyError
from ..metrics import Metrics
from ..net.forward import ResponseStream, forward
from ..net.framing import Outgoing
from ..net.request import AbortConnection, Request
from ..net.server import ClientConnection
from ..net.tunnel import BlindTunnel
from ..net.upstream import UpstreamPool
from ..net.websocket import switch
from .access import AccessControl
from .accesslog import MAX_PENDING, AccessLog
from .challenges import challenge_hold
from .discovery import Discovery
from .transactions import TransactionKeys

__all__ = ["LocalEndpoint", "Policy", "Prepare", "ProxyHandler", "Routes"]

log = logging.getLogger("signing_proxy.proxy")

LocalEndpoint = Callable[[ClientConnection, Request], int]
_CLOSING_STATUSES = frozenset({400, 403, 413, 431})  # the rest of the connection cannot be trusted
T = TypeVar("T")
_LOGGED_TARGET_CHARS = 259  # a DNS name (253), a colon and a port: an access line stays one pipe write


class Prepare(Protocol):
    """The mode's pipeline: the request as it goes on the wire, signed; ``ProxyError`` instead of unsigned.

    ``retry``: sign as an origin's ``Accept-Signature`` challenge asked (``proxy.challenges``).
    """

    def __call__(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        framed: bool,
        retry: RetryPlan | None = None,
    ) -> Awaitable[Outgoing]: ...


class Routes:
    """Sidecar routes: an origin-form prefix mapped to an upstream base URL (longest prefix wins)."""

    def __init__(self, routes: Sequence[tuple[str, str]], *, as_received: bool = False) -> None:
        """``as_received``: targets keep the request target as received (``core.uri.spelled``), for
        a proxy that verifies someone else's signature over it and sends it on (``Policy``)."""
        self._routes = sorted(
            ((prefix, parse_absolute_uri(up)) for prefix, up in routes), key=lambda r: -len(r[0])
        )
        self.as_received = as_received

    def target_for(self, raw_target: str) -> Target | None:
        path = raw_target.split("?", 1)[0]
        for prefix, base in self._routes:
            if path.startswith(prefix):
                rest = raw_target[len(prefix) :]  # "v1/x?q" after "/exchange/"
            elif path == prefix[:-1]:
                rest = raw_target[len(prefix) - 1 :]  # "" or "?q" after "/exchange"
            else:
                continue
            path_query = base.path + rest
            target = base.with_path_query(path_query)
            return spelled(target, path_query) if self.as_received else target
        return None


@dataclass(frozen=True, slots=True)
class Policy:
    """What a configuration reload may change, swapped in one step."""

    mode: str
    # a relay or a gateway: targets go on as received, as the signatures they verify were made over
    # them; the agent's hop sends the canonical target it signs
    as_received: bool
    access: AccessControl
    connect_timeout_s: float
    idle_s: float  # timeouts.client_idle_s: a piped WebSocket (and a blind tunnel) closes after this silence
    routes: Routes
    prepare: Prepare
    access_log: AccessLog
    signature_agent: str  # signing.signature_agent: what a challenge's retry would send as a member


class ConnectPolicy(Protocol):
    async def handle(self, conn: ClientConnection, req: Request) -> tuple[int, str]: ...


class ProxyHandler:
    """Serves the proxy port's requests (``net.server.Handler``)."""

    def __init__(
        self,
        policy: Policy,
        *,
        pool: UpstreamPool,
        metrics: Metrics,
        local: Callable[[str], LocalEndpoint | None],
        discovery: Discovery | None,
        draining: Callable[[], bool],
        transactions: TransactionKeys | None = None,
        challenges: bool = False,
        learn: Callable[[Target], object] | None = None,
    ) -> None:
        self.policy = policy
        self.challenges = challenges  # agent mode: retry once, signed as an Accept-Signature asks
        self.learn = learn  # an origin whose challenge asked for web-bot-auth (profiles.learn)
        self.pool = pool
        self.metrics = metrics
        self.local = local
        self.discovery = discovery
        self.draining = draining
        self.transactions = transactions  # retrieval URLs bound by forwarded ExecuteTransaction answers
        self.connect: ConnectPolicy | None = None  # set once the CONNECT policy exists (it needs the engine)
        self.pipes: set[BlindTunnel] = set()  # WebSocket pipes running (limits.max_connections counts them)
        self._observe_latency = metrics.upstream_latency.observe

    def close_pipes(self) -> None:
        """Close the WebSocket pipes running (a stop): each then ends, and its line is written."""
        for pipe in list(self.pipes):
            pipe.close()

    def count(self, outcome: str) -> None:
        """Count one request's outcome (and tunnels by kind)."""
        self.metrics.request(self.policy.mode, outcome)
        if outcome in ("intercepted", "tunnelled", "websocket"):
            self.metrics.tunnel(outcome)

    # --- net.server.Handler ---
    def connection_made(self, conn: ClientConnection) -> None:
        access = self.policy.access  # decided once per connection, and again after a reload changed it
        conn.client_allowed, conn.access_of = access.client_allowed(conn.client_ip), access

    def refused(self, client_ip: str, error: ProxyError, method: str) -> None:
        """A request the engine refused before it reached ``serve`` (``net.refusals.Refusals``: 414,
        431, 400 ``malformed-request``...): counted under its reason and logged like one served, the
        method and host ``-`` when not read. The reasons are the engine's constants: a closed set."""
        self.count(error.reason)
        self.policy.access_log.request(
            client_ip, method or "-", "-", error.status, 0, 0, 0, None, None, error.reason
        )

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        policy = self.policy
        started = time.perf_counter()
        written_before = conn.written
        outcome, status, keyid, host, sent_out = "error", 0, None, "-", 0
        profile: str | None = None
        try:
            if req.method == "CONNECT":  # refused (ProxyError) or the tunnel takes the transport over
                # userinfo is never logged; a stranger's target up to 8 KiB is cut to a host's length
                host = req.url.decode("latin-1").rpartition("@")[2][:_LOGGED_TARGET_CHARS]
                if self.connect is None:
                    raise ProxyError(405, "connect-not-supported", "CONNECT is not served here")
                status, outcome = await self.connect.handle(conn, req)
                return False
            target, local = self._resolve(conn, req, policy)
            host = target.host if target is not None else "-"
            if local is not None:
                status = local(conn, req)
                outcome = "local"
                return conn.keep_alive
            assert target is not None
            if req.upgrade is not None:
                status, outcome, keyid, profile, sent_out = await self._websocket(conn, req, target, policy)
                return False
            body = await conn.read_body(req)

            def build() -> Awaitable[Outgoing]:
                return policy.prepare(req.method, target, req.headers, body, framed=req.framed)

            outgoing = await build()
            keyid, profile = outgoing.keyid, outgoing.profile
            # a resend (net.forward) signs again what we sign; a gateway's signature is the client's,
            # checked once and sent again as it was: a second check would refuse it as its own replay
            resend = build if policy.mode != "gateway" else None
            transactions = self.transactions
            tap = transactions.tap_for(req.method, target, keyid) if transactions is not None else None
            hold = self.discovery.holds if self.discovery is not None else None
            challenge = (
                challenge_hold(outgoing, hold, self.learn, policy.signature_agent)
                if self.challenges
                else None
            )
            stream = await forward(
                conn,
                self.pool,
                outgoing,
                resend,
                hold=challenge or hold,
                on_latency=self._observe_latency,
                tap=tap,
            )
            if challenge is not None and challenge.plan is not None and stream.held is not None:
                plan = challenge.plan  # one signed retry, as the challenge asked; its answer goes back

                def rebuild() -> Awaitable[Outgoing]:
                    return policy.prepare(
                        req.method, target, req.headers, body, framed=req.framed, retry=plan
                    )

                outgoing = await rebuild()
                keyid, profile = outgoing.keyid, outgoing.profile
                stream = await forward(
                    conn, self.pool, outgoing, rebuild, hold=hold, on_latency=self._observe_latency, tap=tap
                )
            if stream.held is not None:
                await self._answer_refusal(conn, stream)
            status, sent_out = stream.status, stream.bytes_out
            outcome = _forwarded(policy, keyid)
            self.count(outcome)
            return conn.keep_alive and not stream.close_after and not self.draining()
        except ProxyError as error:
            status, outcome = error.status, error.reason
            self.count(error.reason)
            keep = (
                conn.keep_alive
                and req.complete
                and not req.too_large
                and error.status not in _CLOSING_STATUSES
            )
            conn.keep_alive = keep
            conn.write_problem(error)
            return keep
        except AbortConnection as cut:
            outcome = "aborted"
            status, sent_out = cut.status, cut.bytes_out  # after its head: logged and counted as sent
            if req.refusal is None:
                conn.abort()
            else:  # its body could not be parsed: the engine answered so, and closes after its answer
                status, outcome = req.refusal.status, req.refusal.reason
                self.count(outcome)
            return False
        except Exception:  # a bug: the request still gets an answer, the log gets the traceback
            log.exception("unexpected error serving %s %s", req.method, host)
            status, outcome = 500, "internal-error"
            self.count(outcome)
            if conn.written > written_before:  # an answer had begun: only closing is honest now
                conn.abort()
            else:
                conn.write_problem(ProxyError(500, outcome, "the proxy failed on this request"), close=True)
            return False
        finally:
            self.metrics.transferred(req.body_size, sent_out)
            access = policy.access_log
            records = access.records
            if records is not None:  # AccessLog.request(), written out: the call cost 1.3 us in place
                records.append(
                    (
                        access.json,
                        time.time(),
                        conn.client_ip,
                        req.method,
                        host,
                        status,
                        int((time.perf_counter() - started) * 100_000 + 0.5),  # hundredths of a ms
                        req.body_size,
                        sent_out,
                        keyid,
                        profile,
                        outcome,
                    )
                )
                waiting = len(records)
                if waiting == 1 or waiting >= MAX_PENDING:
                    access.recorded()

    def _resolve(
        self, conn: ClientConnection, req: Request, policy: Policy
    ) -> tuple[Target | None, LocalEndpoint | None]:
        """Where the request goes; access control happens here so no refused request reaches upstream."""
        if conn.access_of is not policy.access:  # a reload: the rules apply to open connections too
            allowed = policy.access.client_allowed(conn.client_ip)
            if allowed and conn.tunnel is not None:  # its CONNECT's credentials (407: asked again next time)
                policy.access.check_proxy_auth(conn.tunnel_credentials)
            conn.client_allowed, conn.access_of = allowed, policy.access
        if not conn.client_allowed:
            raise ProxyError(
                403, "client-not-allowed", "this address may not use the proxy (access.allow_clients)"
            )
        if req.host_lines != 1 and (req.host_lines or req.version == "1.1"):
            raise ProxyError(
                400, "malformed-host", "an HTTP/1.1 request carries one Host (RFC 9112 section 3.2)"
            )
        if req.host is not None and not valid_host_field(req.host):
            raise ProxyError(400, "malformed-host", "Host must be host[:port] (RFC 9112 section 3.2)")
        raw = req.url.decode("latin-1")
        if policy.as_received and "#" in raw:  # a relay or a gateway passes the target on as it came
            raise ProxyError(
                400, "malformed-target", "a request target has no fragment (RFC 9112 section 3.2)"
            )
        tunnel = conn.tunnel
        if tunnel is not None:
            if not raw.startswith("/"):
                raise ProxyError(400, "malformed-target", "requests inside a tunnel use origin-form targets")
            if policy.as_received:
                return _target(lambda: spelled(tunnel.with_path_query(raw), raw)), None
            return _target(lambda: tunnel.with_path_query(raw)), None
        if raw.startswith("/"):
            path = raw.split("?", 1)[0]
            local = self.local(path)
            if local is not None:
                return None, local
            policy.access.check_proxy_auth(req.header("proxy-authorization"))
            route = _target(lambda: policy.routes.target_for(raw))  # "/a%zz": a 400, not a 500
            if route is None:
                raise ProxyError(404, "no-route", f"{path} is not a proxied URL or a configured route")
            return route, None
        if policy.mode == "gateway":  # RFC 9421 2.2.2: an absolute-form target is the target URI signed
            raise ProxyError(
                400,
                "malformed-target",
                "a gateway takes origin-form targets (its clients sign its Host or external origin)",
            )
        policy.access.check_proxy_auth(req.header("proxy-authorization"))
        if req.upgrade == "websocket":
            raw = _websocket_as_http(raw)
        parse = forwarded_target if policy.as_received else parse_absolute_uri
        return _target(lambda: parse(raw)), None

    async def _websocket(
        self, conn: ClientConnection, req: Request, target: Target, policy: Policy
    ) -> tuple[int, str, str | None, str | None, int]:
        """Sign (or verify) the handshake like any request, then let the engine switch protocols
        (RFC 6455): status, outcome, keyid, profile, bytes sent to the client."""
        conn.keep_alive = False  # after a handshake the connection is a pipe, or it closes
        early = b"".join(req.body)  # frames the client sent before our 101: the upstream's, not a body
        outgoing = await policy.prepare(req.method, target, req.headers, b"", framed=False)
        switched = await switch(
            conn,
            self.pool,
            outgoing,
            early=early,
            idle_s=policy.idle_s,
            on_finished=self._websocket_finished,
            pipes=self.pipes,
            max_head_bytes=self.pool.max_head_bytes,
        )
        outcome = "websocket" if switched.piped else _forwarded(policy, outgoing.keyid)
        self.count(outcome)
        return switched.status, outcome, outgoing.keyid, outgoing.profile, switched.bytes_out

    def _websocket_finished(self, pipe: BlindTunnel) -> None:
        self.pipes.discard(pipe)
        self.policy.access_log.event(
            "websocket",
            client=pipe.client_ip,
            host=pipe.authority,
            duration_ms=round(pipe.duration_s * 1000, 2),
            bytes_up=pipe.client.bytes_in,
            bytes_down=pipe.upstream.bytes_in,
            outcome=f"websocket-{pipe.ended}",
        )

    async def _answer_refusal(self, conn: ClientConnection, stream: ResponseStream) -> None:
        """Write discovery's answer to a held 403 (status kept, Link, problem+json body)."""
        assert self.discovery is not None
        assert stream.held is not None
        head, body = await self.discovery.refusal(stream.held, stream.target, keep_alive=conn.keep_alive)
        conn.write(head if stream.head_only else head + body)
        stream.head_written = True
        stream.bytes_out = 0 if stream.head_only else len(body)
        try:
            await conn.drain()
        except AbortConnection:
            raise AbortConnection(stream.held.status, stream.bytes_out) from None


def _websocket_as_http(uri: str) -> str:
    """``ws://`` and ``wss://`` name the ``http(s)`` URI the handshake is sent to (RFC 6455 section 3)."""
    scheme, sep, rest = uri.partition("://")
    mapped = {"ws": "http", "wss": "https"}.get(scheme.lower())
    return f"{mapped}{sep}{rest}" if mapped is not None and sep else uri


def _target(build: Callable[[], T]) -> T:
    """What ``build`` makes of a received target; a target it cannot read is the client's ``400``."""
    try:
        return build()
    except FieldError as exc:
        raise ProxyError.of(exc) from None


def _forwarded(policy: Policy, keyid: str | None) -> str:
    """The outcome of a request that went upstream: ``verified`` at a gateway (it signs nothing),
    else ``signed``, or ``unsigned`` (no key: a ``hosts.unsigned`` host, or no label verified)."""
    return ("verified" if policy.mode == "gateway" else "signed") if keyid else "unsigned"
