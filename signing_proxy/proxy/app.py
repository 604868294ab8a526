"""Wiring: one ``ProxyApp`` holds the configuration, the signer, the upstream pool and the listeners.

Background work goes through ``spawn`` only, which keeps a reference to every task (a bare
``create_task`` can be garbage-collected mid-flight) and lets shutdown wait for in-flight exchanges.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config import Config, parse_host_port
from ..core.uri import Target, parse_absolute_uri
from .access import AccessControl
from .connect import ConnectHandler
from .pipeline import BearerStore, KeyProvider, Outgoing, Signer, prepare_request
from .relay import RelayPipeline
from .upstream import UpstreamPool

if TYPE_CHECKING:
    from .server import ClientConnection, _Request

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
        self.signer = Signer(
            keys, label=config.signing.label, validity_s=config.signing.validity_s, clock=clock
        )
        self.bearers = BearerStore(config.credentials)
        self.access = AccessControl(config.access)
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
        self.counters: dict[str, int] = {}
        self.interception = ConnectHandler(self)  # loads or creates the CA; ProxyError if unusable
        self.relay = RelayPipeline(config, self.signer, spawn=self.spawn) if config.mode == "relay" else None

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
            return self._readyz
        return None

    def _readyz(self, conn: ClientConnection, _req: _Request) -> int:
        key = self.keys.current(self.clock())
        checks = {"config": "ok", "signing_key": "ok" if key is not None else "no-valid-signing-key"}
        ca_check = self.interception.ca_check()
        if ca_check is not None:
            checks["interception_ca"] = ca_check
        ready = all(v == "ok" for v in checks.values())
        return conn.local_json(
            200 if ready else 503, {"status": "ready" if ready else "not-ready", "checks": checks}
        )

    async def handle_connect(self, conn: ClientConnection, req: _Request) -> tuple[int, str]:
        """CONNECT: refuse with ``ProxyError`` or take ``conn``'s transport over; (status, outcome)."""
        return await self.interception.handle(conn, req)

    # --- observability ---
    def metrics_request(self, outcome: str) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1

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
        from .server import ClientConnection

        host, port = parse_host_port(self.config.listen, "listen")
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=1024, reuse_address=True
        )
        self._servers.append(server)
        return [sock.getsockname()[:2] for sock in server.sockets]

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop accepting, let in-flight exchanges finish up to ``drain_s``, then close everything."""
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
