"""The publication listener: our key directory, agent manifest and revocation list, over HTTP.

A verifier finds our key only through ``{Signature-Agent}/.well-known/http-message-signatures-directory``
(spec "Key lookup"), so this listener may face the public: it serves three documents per agent and
nothing else, never a private member, and refuses (503) to serve a directory in which no key is
valid (spec "Key lookup" 2). The agent named by ``signing.agent`` is served at the root; the agents
listed in ``publish.agents`` under ``/agents/<name>`` (spec "Key publication, rotation and
revocation" 5: a registry host for agents without a domain). ``render_publication`` produces the
bytes both for the listener and for ``signing-proxy publish --out``, so the two are identical. The
listener records in each agent's store folder, at start and every ``SERVED_WRITE_INTERVAL_S``, the
max-age it serves (``storage/served.py``): ``keys rotate`` waits for the copies it served, not for
the max-age of the configuration the command reads (``publish`` changes only with a restart). Its
connections pass ``gate.py``'s gate, every client allowed: at most ``PUBLISH_MAX_CONNECTIONS`` open at
once, each sending a request head within ``PUBLISH_IDLE_S`` (strangers' idle connections would
otherwise take the descriptors the proxy port, in the same process, needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web

from ..config import Config, parse_host_port
from ..config.checks import shown
from ..core.directory_proof import WEB_DIRECTORY_MEDIA_TYPE
from ..core.errors import FieldError, KeyFormatError
from ..core.keys import (
    DIRECTORY_MEDIA_TYPE,
    DIRECTORY_PATH,
    REVOCATION_LIST_MAX_AGE_S,
    REVOCATION_LIST_MEDIA_TYPE,
    render_directory,
    render_revocation_list,
)
from ..core.manifest import MANIFEST_PATH, render_agent_manifest
from ..core.uri import parse_absolute_uri
from ..errors import ConfigError, TokenError, problem_body
from ..storage.keystore import StoreState, StoreWatcher
from ..storage.served import SERVED_NAME, SERVED_WRITE_INTERVAL_S, renew_served
from .directory_proofs import FAILURE_HOLD_S, ProofCache
from .gate import Gate, start_gated

__all__ = [
    "AGENTS_PREFIX",
    "MANIFEST_MEDIA_TYPE",
    "PUBLISH_IDLE_S",
    "PUBLISH_MAX_CONNECTIONS",
    "Publication",
    "PublishServer",
    "prefers_web_directory",
    "publications",
    "render_publication",
]

log = logging.getLogger("signing_proxy.publish")

AGENTS_PREFIX: Final = "/agents/"  # registry host: /agents/<name>/.well-known/...
MANIFEST_MEDIA_TYPE: Final = "application/json"  # spec: proto-JSON
PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
REVOCATION_CACHE_CONTROL: Final = f"max-age={REVOCATION_LIST_MAX_AGE_S}"  # spec: Limits (60 s or no-store)
_ALLOWED_METHODS: Final = "GET, HEAD"
SERVER_HEADER: Final = "signing-proxy"  # our choice: a public listener does not announce versions
# our choice: verifiers fetch a few documents and cache them for max-age; per process (each of
# `run --workers` has its own), well under a 1024-descriptor limit, so the proxy port keeps the rest
PUBLISH_MAX_CONNECTIONS: Final = 256
PUBLISH_IDLE_S: Final = 10.0  # our choice: a fetcher sends its head at once; a pooled one reconnects


@dataclass(frozen=True)
class Publication:
    """What one agent publishes, under one base path (``""`` for the root)."""

    agent: str
    base: str
    domain: str
    revocation_url: str
    revocation_path: str  # absolute path on this listener, base included

    @property
    def directory_path(self) -> str:
        return self.base + DIRECTORY_PATH

    @property
    def manifest_path(self) -> str:
        return self.base + MANIFEST_PATH


def publications(config: Config) -> list[Publication]:
    """The root agent (``signing.agent``), then each of ``publish.agents`` under ``/agents/<name>``."""
    pub = config.publish
    if pub.domain is None:
        raise ValueError("publish.domain is required to publish (the manifest's domain)")
    public_url = (pub.public_url or f"https://{pub.domain}").rstrip("/")
    out = [
        Publication(
            config.signing.agent,
            "",
            pub.domain,
            pub.revocation_url or public_url + pub.revocation_path,
            pub.revocation_path,
        )
    ]
    for agent in pub.agents:
        base = AGENTS_PREFIX + agent
        path = base + pub.revocation_path
        out.append(Publication(agent, base, pub.domain, public_url + path, path))
    return out


def render_publication(publication: Publication, state: StoreState, now: float) -> dict[str, bytes]:
    """Path -> exact body of the directory, the manifest and the revocation list of one agent.

    Raises ``KeyFormatError("no-valid-key")`` when no published key is valid at ``now``.
    """
    return {
        publication.directory_path: render_directory(
            state.directory(now, publication.revocation_url), now=now
        ),
        publication.manifest_path: render_agent_manifest(publication.domain),
        publication.revocation_path: render_revocation_list(state.revocations),
    }


def _public_authority(config: Config) -> str:
    """The authority of ``publish.public_url`` (else ``https://<publish.domain>``), which directory
    proofs bind. The configuration refuses one that does not parse; a ``Config`` built around those
    checks is refused here as a ConfigError naming the setting (``run`` exits 2 saying so), never a
    FieldError's traceback."""
    pub = config.publish
    setting = "publish.public_url" if pub.public_url else "publish.domain"
    url = pub.public_url or f"https://{pub.domain}"
    try:
        return parse_absolute_uri(url.rstrip("/") + "/").authority
    except FieldError as exc:
        raise ConfigError(f"{setting}: an http(s) URL that parses, got {shown(url)} ({exc.detail})") from None


class PublishServer:
    """An aiohttp listener serving ``publications`` from their key-store watchers (GET and HEAD)."""

    def __init__(
        self,
        config: Config,
        watchers: Mapping[str, StoreWatcher],
        *,
        clock: Callable[[], float] = time.time,
        served_interval_s: float = SERVED_WRITE_INTERVAL_S,
        max_connections: int = PUBLISH_MAX_CONNECTIONS,
        idle_s: float = PUBLISH_IDLE_S,
    ) -> None:
        """``max_connections``, ``idle_s``: the listener's gate (``gate.py``); for tests."""
        self.config = config
        self.clock = clock
        self.max_age_s = config.publish.directory_max_age_s
        self.authority = _public_authority(config)  # what proofs bind
        self._proofs = ProofCache(self.authority, self.max_age_s, clock)
        self._warned: set[str] = set()  # agents whose directory was refused since last served: logged
        self._routes: dict[str, tuple[str, Publication, StoreWatcher]] = {}
        self._served_folders: dict[str, Path] = {}  # agent -> its store folder, where served.json goes
        self._served_id = secrets.token_hex(8)  # names this listener's entry there (no secret)
        self._served_interval_s = served_interval_s
        self._served_failing: set[str] = set()  # agents whose record could not be written: logged
        self._served_task: asyncio.Task[None] | None = None
        for publication in publications(config):
            watcher = watchers[publication.agent]
            self._served_folders[publication.agent] = watcher.store.path
            self._routes[publication.directory_path] = ("directory", publication, watcher)
            self._routes[publication.manifest_path] = ("manifest", publication, watcher)
            self._routes[publication.revocation_path] = ("revocations", publication, watcher)
        self._runner: web.AppRunner | None = None
        self._max_connections, self._idle_s = max_connections, idle_s

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        route = self._routes.get(request.rel_url.raw_path)
        if route is None:
            return _problem(404, "not-found", "only key directories, manifests and revocation lists are here")
        if request.method not in ("GET", "HEAD"):
            return _problem(405, "method-not-allowed", "use GET or HEAD", Allow=_ALLOWED_METHODS)
        kind, publication, watcher = route
        now = self.clock()
        if kind == "manifest":
            return _document(
                render_agent_manifest(publication.domain), MANIFEST_MEDIA_TYPE, f"max-age={self.max_age_s}"
            )
        state = watcher.state()
        if kind == "revocations":
            body = render_revocation_list(state.revocations)
            return _document(body, REVOCATION_LIST_MEDIA_TYPE, REVOCATION_CACHE_CONTROL)
        directory = state.directory(now, publication.revocation_url)
        # an agent of publish.agents (under /agents/<name>) gets the spec's directory whatever it asks:
        # protocol-02 has a directory's Signature-Agent be an origin (its directory at the root), so a
        # path is no web-bot-auth directory, and we hold no private key of these agents to prove its
        # keys with (a draft client ignores every key without a proof)
        spec = bool(publication.base) or not prefers_web_directory(request.headers.get("Accept"))
        try:  # the drafts' body is the one the proofs' Content-Digest covers
            body = render_directory(directory, now=now, jose_alg=spec)
        except KeyFormatError as exc:
            if publication.agent not in self._warned:  # once until it is served again, not per request
                self._warned.add(publication.agent)
                log.warning("not serving the directory of agent %s: %s", publication.agent, exc.detail)
            return _problem(
                503, "no-valid-key", "no key of this agent is valid now; see `signing-proxy keys list`"
            )
        self._warned.discard(publication.agent)
        cache = f"max-age={self.max_age_s}"
        if spec:
            return _document(body, DIRECTORY_MEDIA_TYPE, cache, Vary="Accept")
        # the drafts' signed directory: one possession proof per published key whose private key we
        # hold, bound to our public authority (never the Host asked: a proof for any name would bind
        # our keys to a stranger's domain); made once and shared, never a signature round per request.
        # A key whose token does not sign goes without its proof (a retiring key's token taken offline
        # leaves the key signing now served); refused only without the signing key's proof, or any
        keys = [state.private[k.thumbprint] for k in directory.keys if k.thumbprint in state.private]
        try:
            proofs = await self._proofs.proofs(publication.agent, state, body, keys, now)
        except TokenError:  # logged once per round by the cache, not once per request
            return _problem(
                503,
                "token-unavailable",
                "the signing key's token cannot sign the directory's proofs now",
                **{"Retry-After": str(FAILURE_HOLD_S)},
            )
        # the proofs expire max-age after they were made: a response shared later is cached less long
        remaining = f"max-age={max(0, proofs.expires - int(now))}"
        return _document(body, WEB_DIRECTORY_MEDIA_TYPE, remaining, Vary="Accept", **dict(proofs.fields))

    def record_served(self) -> None:
        """Renew this listener's entry in ``served.json`` in each published agent's store folder: its
        max-age, renewed again within ``SERVED_RENEW_S``. Blocking (run off the loop). A failure is
        logged once per agent until a write succeeds, and never stops serving."""
        now = self.clock()
        for agent, folder in self._served_folders.items():
            try:
                ignored = renew_served(folder, self._served_id, self.max_age_s, now)
            except Exception as exc:  # the folder read-only, full, locked: the next renewal tries again
                if agent not in self._served_failing:
                    self._served_failing.add(agent)
                    why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
                    log.warning(
                        "cannot record the max-age served for agent %s in %s: %s (`keys rotate` then "
                        "waits for publish.directory_max_age_s of its own configuration)",
                        agent,
                        folder / SERVED_NAME,
                        why,
                    )
                continue
            self._served_failing.discard(agent)
            if ignored is not None:
                log.warning("%s; replaced by a new record of what this listener serves", ignored)

    async def _renew_served(self) -> None:
        while True:
            await asyncio.sleep(self._served_interval_s)
            await asyncio.to_thread(self.record_served)

    async def start(self, *, reuse_port: bool = False) -> list[tuple[str, int]]:
        """Bind ``publish.listen``; return the bound addresses (port 0 picks one). The max-age served
        is recorded before the first request can be served, then renewed until ``stop``."""
        assert self.config.publish.listen is not None
        host, port = parse_host_port(self.config.publish.listen, "publish.listen")
        await asyncio.to_thread(self.record_served)
        gate = Gate(max_connections=self._max_connections, idle_s=self._idle_s)  # every client allowed
        try:
            runner = await start_gated(
                self.build_app(), gate, host, port, reuse_port=reuse_port, reuse_address=True
            )
        except BaseException:
            await self.stop()
            raise
        self._runner = runner
        self._served_task = asyncio.get_running_loop().create_task(self._renew_served())
        return [(str(addr[0]), int(addr[1])) for addr in runner.addresses]

    async def stop(self) -> None:
        if self._served_task is not None:
            task, self._served_task = self._served_task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._proofs.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def _document(body: bytes, media_type: str, cache_control: str, **headers: str) -> web.Response:
    return web.Response(
        body=body,
        headers={
            "Content-Type": media_type,
            "Cache-Control": cache_control,
            "X-Content-Type-Options": "nosniff",
            "Server": SERVER_HEADER,
            **headers,
        },
    )


def prefers_web_directory(accept: str | None) -> bool:
    """True when ``Accept`` asks for the drafts' directory media type at least as much as the
    spec's ``application/jwk-set+json`` (the default: a client that names neither gets the spec's)."""
    if not accept:
        return False
    weights: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[media.lower()] = max(q, weights.get(media.lower(), 0.0))
    web_q = weights.get(WEB_DIRECTORY_MEDIA_TYPE, 0.0)
    return web_q > 0 and web_q >= weights.get(DIRECTORY_MEDIA_TYPE, 0.0)


def _problem(status: int, reason: str, detail: str, **headers: str) -> web.Response:
    return web.Response(
        status=status,
        body=problem_body(status, reason, detail),
        headers={
            "Content-Type": PROBLEM_MEDIA_TYPE,
            "Cache-Control": "no-store",
            "Server": SERVER_HEADER,
            **headers,
        },
    )
