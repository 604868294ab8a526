"""Assembly: one ``ProxyApp`` builds the proxy from its configuration and runs its lifecycle.

The only place that sees everything. It builds the parts bottom-up (metrics, signer, the upstream
pool and the one HTTP client, the mode's pipeline, discovery, the CONNECT policy, the engine) and
hands each the narrow callables it needs. A configuration reload builds a new ``Policy`` and swaps
it in one step. Background work goes through ``spawn`` only, which keeps a reference to every task
(a bare ``create_task`` can be garbage-collected mid-flight) and lets shutdown wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ..config import Config, parse_host_port
from ..core.challenge import RetryPlan
from ..core.keys import KeyProvider
from ..core.profiles import WEB_BOT_AUTH
from ..core.uri import Target
from ..metrics import Metrics
from ..net.client import FetchedResponse, HttpClient
from ..net.egress import EgressPolicy
from ..net.framing import Outgoing
from ..net.request import Limits
from ..net.server import ClientConnection, Engine
from ..net.upstream import UpstreamPool
from ..proxy.access import AccessControl
from ..proxy.accesslog import AccessLog, Pending
from ..proxy.connect import ConnectHandler
from ..proxy.discovery import Discovery
from ..proxy.exchange import Policy, ProxyHandler, Routes
from ..proxy.gateway import GatewayPipeline, gateway_upstream
from ..proxy.pipeline import BearerStore, SigningPipeline, next_hop_target
from ..proxy.profiles import ProfileSelector
from ..proxy.relay import RelayPipeline
from ..proxy.requester import RELOAD_CHECK_INTERVAL_S, RequesterInjector, injector_for
from ..proxy.signer import Repeats, Signer
from ..proxy.transactions import TransactionKeys
from ..storage.storewatch import NEXT_KEY_PREFIX
from .admin import local_endpoints
from .linewriter import CLOSE_WAIT_S, LineWriter, route_logging

if TYPE_CHECKING:
    from aiohttp.web import AppRunner

__all__ = ["ProxyApp"]

log = logging.getLogger("signing_proxy")

STDERR_FD = 2  # where the logging handler writes (cli/common.configure_logging): the access log too


def _limits(config: Config) -> Limits:
    limits = config.limits
    return Limits(
        max_header_bytes=limits.max_header_bytes,
        max_body_bytes=limits.max_body_bytes,
        client_idle_s=config.timeouts.client_idle_s,
        read_s=config.timeouts.read_s,
        max_request_line_bytes=limits.max_request_line_bytes,
        max_header_fields=limits.max_header_fields,
        max_connections=limits.max_connections,
        max_buffered_bytes=limits.max_buffered_bytes,
    )


def _no_interception(config: Config) -> Config:
    """A gateway answers CONNECT with 405: it needs no interception CA, so none is created."""
    return dataclasses.replace(config, intercept=dataclasses.replace(config.intercept, enabled=False))


class ProxyApp:
    """The running proxy: configuration, signer, upstream pool, listeners and background tasks."""

    # what a reload keeps as it was, and names as "not applied until restart": a section, or one key
    RESTART_ONLY = (
        "mode",
        "listen",
        "data_dir",
        "publish",
        "intercept",
        "upstream",
        "relay",
        "gateway",
        "admin",
        # the key provider is built at start: which key signs is not live configuration (the label is)
        "signing.key",
        "signing.agent",
        "signing.pkcs11",
        "signing.key_lifetime_s",
        # the log handler's format is set once, at start (cli/common.configure_logging): the access
        # log keeps it too, or one stream would mix text and JSON lines until the restart
        "log.format",
    )
    RESTART_ONLY_GATEWAY = ("verify", "egress")  # its verifier and manifest fetches are built at start

    def __init__(self, config: Config, keys: KeyProvider, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.keys = keys
        self.clock = clock
        self.metrics = Metrics()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._servers: list[asyncio.Server] = []
        self._admin_runner: AppRunner | None = None
        self.admin_address: tuple[str, int] | None = None
        self.reuse_port = False  # set by `run --workers N`: N processes share the listening ports
        self.repeats = Repeats()  # bases signed this second, across reloads (``spread`` by --workers)
        self.draining = False  # set on SIGTERM: finish what is in flight, keep no connection alive
        self._cut = asyncio.Event()  # cut_drain: stop() waits no longer for what is in flight
        self._waited = False  # stop()'s wait for what is in flight is over
        self.pool = UpstreamPool(
            config.upstream,
            connect_timeout_s=config.timeouts.connect_s,
            read_timeout_s=config.timeouts.read_s,
            max_head_bytes=config.limits.max_response_header_bytes,
        )
        self.client = HttpClient(self.pool, config.timeouts, via=next_hop_target(config))
        # access-log lines, written off the request path by one thread; kept across reloads
        self.access_writer = LineWriter(STDERR_FD)
        self._unroute_logging: Callable[[], None] = lambda: None  # set at start (route_logging)
        self.access_pending: Pending = []  # the access log's lines, in order across reloads
        # the live parts, rebuilt whole by ``reload``
        self.signer = self._signer(config)
        self.bearers = BearerStore(config.credentials)
        self.profiles = ProfileSelector(config.profiles)  # signing profile per destination (and learned)
        # requester injection; ConfigError (exit 2) for a delegation bound to another key or expired
        self.requester: RequesterInjector | None = injector_for(config, keys, clock=clock)
        self.relay = (
            RelayPipeline(config, self.signer, profiles=self.profiles) if config.mode == "relay" else None
        )
        self.gateway = GatewayPipeline(config) if config.mode == "gateway" else None
        # one key per transaction: retrieval URLs bound by the ExecuteTransaction answers we forward
        self.transactions = TransactionKeys(keys, clock=clock) if config.mode == "agent" else None
        self.pipeline = self._pipeline()
        self.discovery = (  # 403 + X-Content-Rules; the agent's own proxy discovers, never a relay
            Discovery(
                lambda: self.config.discovery,
                self.signed_fetch,
                requester=lambda: self.requester,
                count=self._count_discovery,
            )
            if config.mode == "agent"
            else None
        )
        self.handler = ProxyHandler(
            self._policy(config),
            pool=self.pool,
            metrics=self.metrics,
            # a gateway with an admin port leaves these paths to its backend: answered on the public
            # port they bypassed admin.allow_clients (and shadowed the backend's paths of that name)
            local=(lambda _path: None)  # none: no path of the proxy port is answered locally
            if config.mode == "gateway" and config.admin.listen
            else local_endpoints(self.readiness, self.metrics.render),
            discovery=self.discovery,
            draining=lambda: self.draining,
            transactions=self.transactions,
            challenges=config.mode == "agent",
            learn=self._learn,
        )
        self.engine = Engine(self.handler, _limits(config), self.spawn)
        self.interception = ConnectHandler(  # loads or creates the CA; CAError if unusable
            config if config.mode != "gateway" else _no_interception(config),
            policy=lambda: self.handler.policy,
            inner=self.engine.protocol,
            count=self.handler.count,
        )
        self.handler.connect = self.interception if self.gateway is None else None  # a gateway is no proxy
        self.engine.taken_over += [self.interception.taken_over, lambda: len(self.handler.pipes)]
        self._wire_metric_callbacks()

    # --- parts ---
    def _signer(self, config: Config) -> Signer:
        return Signer(
            self.keys,
            label=config.signing.label,
            validity_s=config.signing.validity_s,
            clock=self.clock,
            metrics=self.metrics,
            repeats=self.repeats,
        )

    def _policy(self, config: Config) -> Policy:
        as_received = config.mode != "agent"  # relay, gateway: what they verify goes on as it came
        return Policy(
            mode=config.mode,
            as_received=as_received,
            access=AccessControl(config.access),
            connect_timeout_s=config.timeouts.connect_s,
            idle_s=config.timeouts.client_idle_s,
            routes=Routes(
                [("/", gateway_upstream(config.gateway))]
                if config.mode == "gateway"
                else [(r.prefix, r.upstream) for r in config.routes],
                as_received=as_received,
            ),
            prepare=self.prepare,
            access_log=AccessLog(
                enabled=config.log.access_log and config.log.level in ("debug", "info"),
                fmt=config.log.format,
                write=self.access_writer.write,
                later=self.access_writer.later,
                pending=self.access_pending,
            ),
            signature_agent=config.signing.signature_agent,
        )

    def _count_discovery(self, counter: str) -> None:
        getattr(self.metrics, counter).inc()

    def _wire_metric_callbacks(self) -> None:
        callbacks = self.metrics.callbacks

        def key_remaining() -> float | None:
            now = self.clock()
            not_after = self.keys.not_after(now)
            return None if not_after is None else not_after - now

        callbacks.key_remaining = key_remaining
        callbacks.access_log_dropped = lambda: self.access_writer.dropped
        callbacks.delegation_key_remaining = lambda: (
            self.requester.bound_key_remaining(self.clock()) if self.requester is not None else None
        )
        engine = self.engine
        callbacks.engine = lambda: (len(engine.connections), engine.refused, engine.buffered)
        cache = self.interception.leaves
        if cache is not None:
            callbacks.leaf_cache = lambda: (cache.hits, cache.misses, len(cache))
        watcher = self.gateway.watcher if self.gateway is not None else None
        if watcher is not None:
            callbacks.providers = watcher.counts
        relay = self.relay
        if relay is not None:
            callbacks.revocation_ages = lambda: relay.poller.ages() if relay.poller is not None else {}
            callbacks.directory_cache = lambda: (
                (relay.verifier.resolver.fetches, relay.verifier.resolver.hits)
                if relay.verifier is not None
                else None
            )

    @property
    def access(self) -> AccessControl:
        return self.handler.policy.access

    @property
    def connections(self) -> set[ClientConnection]:
        return self.engine.connections

    # --- live reload (SIGHUP) ---
    def reload(self, config: Config) -> list[str]:
        """Apply a new configuration's live parts atomically; return the sections that need a restart.

        Everything new is built first (a bearer file that cannot be read refuses the whole reload
        with a ConfigError), then swapped in one step: a request sees the old or the new, never a mix.
        """
        self.access_writer.wake()  # lines logged before the reload go out now, whatever it decides
        config, pending = restart_merge(self.config, config)
        bearers = BearerStore(config.credentials)
        requester = injector_for(config, self.keys, clock=self.clock)  # refused like at start-up
        signer = self._signer(config)
        policy = self._policy(config)
        self.config = config
        self.bearers, self.signer, self.requester = bearers, signer, requester
        self.profiles.configure(config.profiles)
        self.pipeline = self._pipeline()
        self.handler.policy = policy
        self.engine.limits = _limits(config)
        self.client.timeouts = config.timeouts
        # an upstream connection takes these when it is opened (an exchange in flight, or a kept-alive
        # connection, keeps its own); a WebSocket handshake and each response head read them as they start
        pool, timeouts = self.pool, config.timeouts
        pool.connect_timeout_s, pool.read_timeout_s = timeouts.connect_s, timeouts.read_s
        pool.max_head_bytes = config.limits.max_response_header_bytes
        if self.relay is not None:  # its policy, label, signer and Signature-Agent: not its start-up ones
            self.relay.reload(config, signer)
        logging.getLogger("signing_proxy").setLevel(config.log.level.upper())
        return pending

    # --- background work ---
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the pipeline ---
    def _pipeline(self) -> SigningPipeline:
        """The agent's signing pipeline from the live parts (rebuilt whole on a reload)."""
        return SigningPipeline(
            self.config, self.signer, self.bearers, self.requester, self.transactions, self.profiles
        )

    def _learn(self, target: Target) -> bool:
        """An Accept-Signature challenge from ``target``'s origin asked for web-bot-auth (kept when
        profiles.learn)."""
        return self.profiles.learn(target.host, WEB_BOT_AUTH, target.scheme, target.port)

    async def prepare(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        framed: bool,
        retry: RetryPlan | None = None,
    ) -> Outgoing:
        """Run the pipeline of this proxy's mode; raises ProxyError instead of forwarding unsigned."""
        if self.relay is not None:
            return await self.relay.prepare(method, target, lines, body, framed=framed)
        if self.gateway is not None:
            return await self.gateway.prepare(method, target, lines, body, framed=framed)
        if self.keys.blocking:  # a key on a token (PKCS#11): its signature is made off the loop
            return await self.pipeline.prepare_off_loop(
                method, target, lines, body, framed=framed, retry=retry
            )
        return self.pipeline.prepare(method, target, lines, body, framed=framed, retry=retry)

    async def signed_fetch(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
        truncate: bool = False,
        egress: bool = False,
    ) -> FetchedResponse:
        """One request of the proxy's own (a manifest, DiscoverResources), signed like the agent's.

        ``egress``: a URL named by a remote party (``discovery``): the live ``egress`` section's policy
        applies (``EgressError``) and ``egress.fetch_timeout_s`` bounds the whole fetch.
        """
        section = self.config.egress
        return await self.client.fetch(
            method,
            url,
            body=body,
            headers=headers,
            max_bytes=max_bytes,
            truncate=truncate,
            total_s=section.fetch_timeout_s if egress else None,
            prepare=self.prepare,
            egress=EgressPolicy.from_config(section) if egress else None,
        )

    def readiness(self) -> tuple[int, dict[str, object]]:
        """(status, document) for ``/readyz``: a valid signing key, the CA if intercepting, config loaded."""
        key = self.keys.current(self.clock())
        checks: dict[str, object] = {"config": "ok"}
        details: dict[str, object] = {}
        if self.gateway is None:  # a gateway verifies only: it has no key to sign with
            said = "no-valid-signing-key" if key is None else self.keys.unavailable() or "ok"
            if said.startswith(NEXT_KEY_PREFIX):  # the key signing now signs: a warning ahead, never unready
                details["next_signing_key"], said = said.removeprefix(NEXT_KEY_PREFIX), "ok"
            checks["signing_key"] = said
        store = self.gateway.store_check() if self.gateway is not None else None
        if store is not None:  # "unavailable": every request needing the replay/quota store gets 503
            checks["counter_store"] = store
        ca_check = self.interception.ca_check()
        if ca_check is not None:
            checks["interception_ca"] = ca_check
        if self.requester is not None and self.requester.config.delegation is not None:
            checks["delegation"] = self.requester.check()
            details["delegation_key"] = self.requester.key_status()  # a warning ahead, never unready
        ready = all(v == "ok" for v in checks.values())
        doc = {"status": "ready" if ready else "not-ready", "checks": checks, **details}
        return (200 if ready else 503), doc

    # --- lifecycle ---
    async def start(self) -> list[tuple[str, int]]:
        """Bind the proxy port; return the bound addresses (port 0 picks one)."""
        host, port = parse_host_port(self.config.listen, "listen")
        loop = asyncio.get_running_loop()
        if self.config.admin.listen is not None:
            self.admin_address = await self._start_admin(self.config.admin.listen)
        server = await loop.create_server(
            self.engine.protocol,
            host,
            port,
            backlog=1024,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )
        self._servers.append(server)
        self.access_writer.start()
        # log records on stderr go through the writer too: a stalled pipe drops, never blocks the loop
        self._unroute_logging = route_logging(logging.getLogger("signing_proxy"), self.access_writer)
        self.spawn(self._watch_token_file())
        if self.gateway is not None and self.gateway.watcher is not None:
            self.spawn(self.gateway.watcher.run())  # spec rule 7: providers' manifests
        if self.gateway is not None and self.gateway.store_checked:
            self.spawn(self.gateway.watch_store())  # /readyz's counter_store check, kept fresh
        return [sock.getsockname()[:2] for sock in server.sockets]

    async def _watch_token_file(self) -> None:
        """Pick up a reissued delegation token file: read off the event loop, so no request waits on disk."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_INTERVAL_S)
            requester = self.requester
            if requester is not None and requester.config.delegation is not None:
                try:
                    await asyncio.to_thread(requester.reload)
                except Exception:  # a bug: keep the running delegation and keep watching
                    log.exception("reloading the delegation token file failed")

    async def _start_admin(self, listen: str) -> tuple[str, int]:
        # aiohttp only in a process that runs the admin listener (service/admin_app.py says why)
        from .admin_app import build_admin_app, start_admin_listener  # noqa: PLC0415

        host, port = parse_host_port(listen, "admin.listen")
        app = build_admin_app(
            self.readiness,
            self.metrics.render,
            allow_clients=self.config.admin.allow_clients,
            providers=self.gateway.provider_states if self.gateway is not None else None,
        )
        self._admin_runner, bound = await start_admin_listener(app, host, port, reuse_port=self.reuse_port)
        return bound

    def cut_drain(self) -> bool:
        """``stop`` waits no longer for exchanges in flight (nor starts to): they are closed with the
        rest, each closing step still run once. True when some were in flight and awaited."""
        cutting = not self._waited and self.engine.busy()
        self._cut.set()
        return cutting

    async def stop(self, drain_s: float = 5.0) -> None:
        """Stop accepting, let in-flight exchanges finish up to ``drain_s``, then close everything."""
        self.draining = True
        for server in self._servers:  # first: the drain starts now, whatever the admin listener holds
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        if self._admin_runner is not None:
            runner, self._admin_runner = self._admin_runner, None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runner.cleanup(), max(drain_s, 1.0))
        while self._tasks and loop.time() < deadline and not self._cut.is_set():
            if not self.engine.busy():
                break
            await asyncio.sleep(0.05)  # polled: in-flight exchanges share no one event to wait on
        self._waited = True
        self.engine.close_all()
        self.interception.close()
        self.handler.close_pipes()  # their lines (event=websocket) are written before the writer closes
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for server in self._servers:
            await server.wait_closed()
        await self.client.close()
        self.pool.close()
        if self.relay is not None:
            await self.relay.close()
        if self.gateway is not None:
            await self.gateway.close()
        # last: every line of the drained requests and closed tunnels is queued by now
        self._unroute_logging()  # what is logged from here on goes to stderr directly, as before start
        await self.access_writer.aclose(CLOSE_WAIT_S)


def restart_merge(running: Config, new: Config) -> tuple[Config, list[str]]:
    """``new`` with what applies only at a restart as ``running`` has it, and the paths it changed:
    what a reload applies, and what a worker restarted after one is built from (its siblings run
    that; built from ``running`` first, it failed when a file named there was gone since)."""
    restart_only: tuple[str, ...] = ProxyApp.RESTART_ONLY
    if running.mode == "relay":
        restart_only += RelayPipeline.RESTART_ONLY
    elif running.mode == "gateway":
        restart_only += ProxyApp.RESTART_ONLY_GATEWAY
    return _kept(running, new, restart_only)


def _kept(old: Config, new: Config, paths: Sequence[str]) -> tuple[Config, list[str]]:
    """``new`` with the value of each path (``section`` or ``section.key``) as in ``old``, and the
    paths whose value ``new`` changed: a reload applies none of them, and names them."""
    changed = []
    for path in paths:
        name, _, key = path.partition(".")
        was, now = getattr(old, name), getattr(new, name)
        if key and getattr(was, key) != getattr(now, key):
            new = dataclasses.replace(new, **{name: dataclasses.replace(now, **{key: getattr(was, key)})})
        elif not key and was != now:
            new = dataclasses.replace(new, **{name: was})
        else:
            continue
        changed.append(path)
    return new, changed
