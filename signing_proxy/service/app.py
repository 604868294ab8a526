"""Wiring: one ``ProxyApp`` holds the configuration, the signer, the upstream pool and the listeners.

Background work goes through ``spawn`` only, which keeps a reference to every task (a bare
``create_task`` can be garbage-collected mid-flight) and lets shutdown wait for in-flight exchanges.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config.schema import Config, parse_host_port
from ..core.keys import KeyProvider
from ..core.uri import Target, parse_absolute_uri
from ..metrics import CONTENT_TYPE, Metrics
from ..net.framing import Outgoing
from ..net.upstream import UpstreamPool
from ..proxy.access import AccessControl
from ..proxy.connect import ConnectHandler
from ..proxy.discovery import Discovery
from ..proxy.pipeline import BearerStore, Signer, prepare_request
from ..proxy.relay import RelayPipeline
from ..proxy.requester import RequesterInjector, injector_for

if TYPE_CHECKING:
    from ..net.server import ClientConnection, _Request

__all__ = ["ProxyApp"]

log = logging.getLogger("signing_proxy")
access_log = logging.getLogger("signing_proxy.access")

LocalEndpoint = Callable[["ClientConnection", "_Request"], int]


class ProxyApp:
    """The running proxy: configuration, signer, upstream pool, listeners and background tasks."""

    def __init__(self, config: Config, keys: KeyProvider, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.keys = keys
        self.clock = clock
        self.metrics = Metrics()
        self.signer = Signer(
            keys,
            label=config.signing.label,
            validity_s=config.signing.validity_s,
            clock=clock,
            metrics=self.metrics,
        )
        self.bearers = BearerStore(config.credentials)
        self.access = AccessControl(config.access)
        # requester injection; ProxyError 500 (exit 2) for a delegation bound to another key or expired
        self.requester: RequesterInjector | None = injector_for(config, keys, clock=clock)
        self.pool = UpstreamPool(
            config.upstream,
            connect_timeout_s=config.timeouts.connect_s,
            read_timeout_s=config.timeouts.read_s,
        )
        self._routes: list[tuple[str, Target]] = sorted(
            ((r.prefix, parse_absolute_uri(r.upstream)) for r in config.routes), key=lambda r: -len(r[0])
        )
        self.connections: set[ClientConnection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._servers: list[asyncio.Server] = []
        self.admin_address: tuple[str, int] | None = None
        self.reuse_port = False  # set by `run --workers N`: N processes share the listening ports
        self._admin_runner: Any = None
        self.draining = False  # set on SIGTERM: finish what is in flight, keep no connection alive
        self.interception = ConnectHandler(self)  # loads or creates the CA; ProxyError if unusable
        self.relay = RelayPipeline(config, self.signer, spawn=self.spawn) if config.mode == "relay" else None
        self.discovery = Discovery.for_app(self)  # 403 + X-Content-Rules; None in relay mode
        self._wire_metric_callbacks()

    def _wire_metric_callbacks(self) -> None:
        callbacks = self.metrics.callbacks

        def key_remaining() -> float | None:
            now = self.clock()
            not_after = self.keys.not_after(now)
            return None if not_after is None else not_after - now

        callbacks.key_remaining = key_remaining
        cache = self.interception.leaves
        if cache is not None:
            callbacks.leaf_cache = lambda: (cache.hits, cache.misses, len(cache))
        relay = self.relay
        if relay is not None:
            callbacks.revocation_ages = lambda: relay.poller.ages() if relay.poller is not None else {}
            callbacks.directory_cache = lambda: (
                (relay.verifier.resolver.fetches, relay.verifier.resolver.hits)
                if relay.verifier is not None
                else None
            )

    # --- live reload (SIGHUP) ---
    RESTART_ONLY = ("mode", "listen", "data_dir", "publish", "intercept", "upstream", "relay")

    def reload(self, config: Config) -> list[str]:
        """Apply a new configuration's live parts atomically; return the sections that need a restart.

        Everything new is built first (a bearer file that cannot be read refuses the whole reload
        with ProxyError), then swapped in one step: a request sees the old or the new, never a mix.
        """
        bearers = BearerStore(config.credentials)
        access = AccessControl(config.access)
        requester = injector_for(config, self.keys, clock=self.clock)  # refused like at start-up
        signer = Signer(
            self.keys,
            label=config.signing.label,
            validity_s=config.signing.validity_s,
            clock=self.clock,
            metrics=self.metrics,
        )
        routes = sorted(
            ((r.prefix, parse_absolute_uri(r.upstream)) for r in config.routes), key=lambda r: -len(r[0])
        )
        pending = [name for name in self.RESTART_ONLY if getattr(config, name) != getattr(self.config, name)]
        kept = {name: getattr(self.config, name) for name in self.RESTART_ONLY}
        self.config = dataclasses.replace(config, **kept)
        self.bearers, self.access, self.signer, self._routes = bearers, access, signer, routes
        self.requester = requester
        if self.relay is not None:
            self.relay.signer = signer
        logging.getLogger("signing_proxy").setLevel(config.log.level.upper())
        return pending

    # --- background work ---
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the pipeline ---
    async def prepare(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        framed: bool,
        client_ip: str = "-",
    ) -> Outgoing:
        """Run the pipeline of this proxy's mode; raises ProxyError instead of forwarding unsigned."""
        if self.relay is not None:
            return await self.relay.prepare(method, target, lines, body, framed=framed)
        return prepare_request(
            method,
            target,
            lines,
            body,
            framed=framed,
            config=self.config,
            signer=self.signer,
            bearers=self.bearers,
            requester=self.requester,
        )

    def route_for(self, raw_target: str) -> Target | None:
        """Map an origin-form target on a configured prefix to the upstream URL (longest prefix wins)."""
        path = raw_target.split("?", 1)[0]
        for prefix, base in self._routes:
            if path.startswith(prefix):
                rest = raw_target[len(prefix) :]  # "v1/x?q" after "/exchange/"
            elif path == prefix[:-1]:
                rest = raw_target[len(prefix) - 1 :]  # "" or "?q" after "/exchange"
            else:
                continue
            return base.with_path_query(base.path + rest)
        return None

    def local_endpoint(self, path: str) -> LocalEndpoint | None:
        if path == "/healthz":
            return lambda conn, _req: conn.local_json(200, {"status": "ok", "version": __version__})
        if path == "/readyz":
            return lambda conn, _req: conn.local_json(*self.readiness())
        if path == "/metrics":
            return lambda conn, _req: conn.local_response(200, CONTENT_TYPE, self.metrics.render())
        return None

    def readiness(self) -> tuple[int, dict[str, object]]:
        """(status, document) for ``/readyz``: a valid signing key, the CA if intercepting, config loaded."""
        key = self.keys.current(self.clock())
        checks = {"config": "ok", "signing_key": "ok" if key is not None else "no-valid-signing-key"}
        ca_check = self.interception.ca_check()
        if ca_check is not None:
            checks["interception_ca"] = ca_check
        if self.requester is not None and self.requester.config.delegation is not None:
            checks["delegation"] = self.requester.check()
        ready = all(v == "ok" for v in checks.values())
        return (200 if ready else 503), {"status": "ready" if ready else "not-ready", "checks": checks}

    async def handle_connect(self, conn: ClientConnection, req: _Request) -> tuple[int, str]:
        """CONNECT: refuse with ``ProxyError`` or take ``conn``'s transport over; (status, outcome)."""
        return await self.interception.handle(conn, req)

    # --- observability ---
    def metrics_request(self, outcome: str) -> None:
        self.metrics.request(self.config.mode, outcome)
        if outcome in ("intercepted", "tunnelled"):
            self.metrics.tunnel(outcome)

    def log_access(self, **fields: object) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        if self.config.log.format == "json":
            access_log.info(json.dumps({"event": "request", **fields}, separators=(",", ":")))
        else:
            access_log.info(" ".join(f"{k}={v}" for k, v in fields.items() if v is not None))

    # --- lifecycle ---
    async def start(self) -> list[tuple[str, int]]:
        """Bind the proxy port; return the bound addresses (port 0 picks one)."""
        from ..net.server import ClientConnection

        host, port = parse_host_port(self.config.listen, "listen")
        loop = asyncio.get_running_loop()
        if self.config.admin.listen is not None:
            self.admin_address = await self._start_admin(self.config.admin.listen)
        server = await loop.create_server(
            lambda: ClientConnection(self),
            host,
            port,
            backlog=1024,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )
        self._servers.append(server)
        return [sock.getsockname()[:2] for sock in server.sockets]

    async def _start_admin(self, listen: str) -> tuple[str, int]:
        from aiohttp import web

        from .admin import build_admin_app

        host, port = parse_host_port(listen, "admin.listen")
        runner = web.AppRunner(build_admin_app(self), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_port=self.reuse_port or None)
        await site.start()
        self._admin_runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[:2] if sockets else (host, port)
        return str(bound[0]), int(bound[1])

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop accepting, let in-flight exchanges finish up to ``drain_s``, then close everything."""
        self.draining = True
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        for server in self._servers:
            server.close()
        deadline = asyncio.get_running_loop().time() + drain_s
        while self._tasks and asyncio.get_running_loop().time() < deadline:
            busy = [c for c in self.connections if c.busy]
            if not busy:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        self.interception.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for server in self._servers:
            await server.wait_closed()
        self.pool.close()
        if self.relay is not None:
            await self.relay.close()
