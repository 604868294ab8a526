"""Gateway mode: a verifying reverse proxy in front of one backend (``gateway.upstream``).

Every request arrives in origin-form, is routed to the backend by the engine's ``Routes`` and
reaches ``GatewayPipeline.prepare``, which rebuilds the URI the client signed (``http://`` + Host,
or ``gateway.external_origin`` when TLS ends in front of us), runs ``verify.gateway`` (signatures,
requester ingest, delegation, quota, replay) and forwards only a verified request. The backend
gets the request as it arrived — minus any ``X-Verified-*`` field the client sent — plus the
gateway's own ``X-Verified-*`` fields, which it may trust. A refusal is a problem+json answer with
the step's status and stable reason; nothing refused reaches the backend.

Each call of ``prepare`` is a check. A request is checked once all the same: when the engine sends
it again (a pooled backend connection reset before any answer, ``net.forward``), it sends the
verified bytes again (``proxy.exchange``: a resend re-signs only what this proxy signs). A second
check would find the client's own signature already seen (``signature-replayed``) and count its
accesses twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from ..config import Config, GatewayConfig
from ..core.errors import FieldError
from ..core.fields import Fields
from ..core.jwk import PublicKey
from ..core.manifest import MANIFEST_MAX_BYTES
from ..core.uri import Target, parse_absolute_uri, served_authority
from ..errors import ConfigError, KeyFileError, ProxyError, http_status
from ..logline import exception_kind
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from ..net.framing import Outgoing, drop_hop_by_hop, outgoing
from ..storage.keyfile import load_public_key_file
from ..verify.counters import CounterStore
from ..verify.directory import http_fetcher
from ..verify.gateway import HEADER_PREFIX, GatewayPolicy, GatewayRefusal
from ..verify.gateway_build import build_gateway_verifier, load_pinned_keys
from ..verify.issuers import IssuerAnchor
from ..verify.manifest_watch import ManifestWatcher
from ..verify.stores import open_counter_store
from ..verify.verifier import VerifierPolicy

__all__ = ["STORE_PROBE_INTERVAL_S", "STORE_PROBE_TIMEOUT_S", "GatewayPipeline", "gateway_upstream"]

log = logging.getLogger("signing_proxy.gateway")

STORE_PROBE_INTERVAL_S = 1.0  # the counter_store readiness check is at most this old (plus the timeout)
STORE_PROBE_TIMEOUT_S = 0.5  # a store slower than this to answer a PING is reported unavailable


def gateway_upstream(section: GatewayConfig) -> str:
    """The backend's origin (the one route of a gateway)."""
    assert section.upstream is not None  # Config._check: mode gateway has one
    try:
        target = parse_absolute_uri(section.upstream)
    except FieldError as exc:  # a port out of range, a bad IPv6 literal: named, not a traceback
        raise ConfigError(f"gateway.upstream: {exc.detail}") from None
    if target.path_query not in ("", "/"):
        raise ConfigError("gateway.upstream: an origin only (http://host:port), without a path")
    return f"{target.scheme}://{target.authority}"


def _anchors(section: GatewayConfig) -> dict[str, IssuerAnchor]:
    anchors = {}
    for iss, entry in section.trusted_issuers.items():
        keys: list[PublicKey] = []
        for path in entry.keys:
            try:
                keys.append(load_public_key_file(Path(path).expanduser()))
            except KeyFileError as exc:  # a pkcs11: URI given for a file: its PIN is not shown
                raise ConfigError(
                    f"gateway.trusted_issuers.{iss}: {exc.shown()}", reason="pinned-key-unusable"
                ) from None
        anchors[iss] = IssuerAnchor(tuple(keys), entry.directory)
    return anchors


class GatewayPipeline:
    """Verify, strip client-sent ``X-Verified-*``, add ours, forward to the backend. One per gateway."""

    def __init__(self, config: Config, *, store: CounterStore | None = None) -> None:
        self.config = config
        section = config.gateway
        self.upstream = parse_absolute_uri(gateway_upstream(section))
        # the pinned key files before any client or store is opened: a refusal leaves nothing open
        pinned_agents = load_pinned_keys(section.pinned_agent_keys, "gateway.pinned_agent_keys")
        pinned_brokers = load_pinned_keys(section.pinned_broker_keys, "gateway.pinned_broker_keys")
        self.client = HttpClient.standalone(config.upstream, config.timeouts)
        try:
            self.store = store if store is not None else open_counter_store(section.store, config.data_path)
        except ValueError as exc:
            raise ConfigError(f"gateway.store: {exc}") from None
        self.verifier = build_gateway_verifier(
            VerifierPolicy(
                skew_s=config.verify.skew_s,
                max_validity_s=config.verify.max_validity_s,
                web_bot_auth=config.verify.accepts_web_bot_auth(gateway=True),
                max_hops=section.max_hops,
                broker_directories=section.broker_directories,
                pinned_agent_keys=pinned_agents,
                pinned_broker_keys=pinned_brokers,
            ),
            GatewayPolicy(
                understood_extensions=frozenset(section.understood_extensions),
                replay_protection=section.replay_protection,
                audience=section.audience,
                leeway_s=section.delegation_leeway_s,
                max_stranger_quota_rows=section.max_stranger_quota_rows,
                max_stranger_replay_rows=section.max_stranger_replay_rows,
            ),
            store=self.store,
            trusted_issuers=_anchors(section),
            trusted_issuers_only=section.trusted_issuers_only,
            issuer_key_grace_s=section.issuer_key_grace_s,
            client=self.client,
            egress=EgressPolicy.from_config(config.egress),
            limits=config.verify,
            fetch_timeout_s=config.egress.fetch_timeout_s,
        )
        self.watcher: ManifestWatcher | None = None
        if section.providers:
            assert section.exchange_domain is not None  # GatewayConfig._check
            self.watcher = ManifestWatcher(
                section.providers,
                section.exchange_domain,
                http_fetcher(
                    self.client,
                    egress=EgressPolicy.from_config(config.egress),
                    max_bytes=MANIFEST_MAX_BYTES,
                    timeout_s=config.egress.fetch_timeout_s,
                ),
                min_refresh_s=section.manifest_min_refresh_s,
                max_refresh_s=section.manifest_max_refresh_s,
            )
        self.external_origin = section.external_origin.rstrip("/") if section.external_origin else None
        self.hosts = frozenset(host.lower() for host in section.hosts)
        # /readyz's counter_store check: when replay protection needs the store on every request, or
        # a store was named (the default SQLite file serves quotas only, opened at a first count)
        self.store_checked = section.replay_protection or section.store != "sqlite"
        self.store_state = "unknown"  # "ok" or "unavailable" once probed (watch_store)

    def signed_uri(self, target: Target, lines: Sequence[tuple[str, str]]) -> str:
        """The URI the client signed: our external origin, else ``http://`` + the Host it sent; and
        the request target as it arrived (``Target.received``: the routes keep it)."""
        request_target = target.wire_parts()[1]
        if self.external_origin is not None:
            return self.external_origin + request_target
        values = [v for n, v in lines if n.lower() == "host"]
        try:
            authority = served_authority(values, self.hosts, "gateway.hosts, or gateway.external_origin")
        except FieldError as exc:
            raise ProxyError(http_status(exc), exc.reason, exc.detail) from None
        return f"http://{authority}{request_target}"

    async def prepare(
        self, method: str, target: Target, lines: Sequence[tuple[str, str]], body: bytes, *, framed: bool
    ) -> Outgoing:
        if (target.scheme, target.authority) != (self.upstream.scheme, self.upstream.authority):
            raise ProxyError(404, "no-route", "a gateway forwards only to its backend (origin-form targets)")
        uri = self.signed_uri(target, lines)
        fields = drop_hop_by_hop(lines)
        # over the end-to-end fields as they came: a label may cover Host or Content-Length, but one
        # covering a field that ends here (hop-by-hop, Connection-named) is refused, as the
        # middleware refuses it: what it vouched for would never reach the backend
        received = drop_hop_by_hop(lines, keep_regenerated=True)
        try:
            verdict = await self.verifier.check(method, uri, received, body)
        except GatewayRefusal as refusal:
            raise ProxyError(refusal.status, refusal.reason, refusal.detail, refusal.headers) from None
        # and their look-alikes: CGI, WSGI and many servers read X_Verified_Keyid as X-Verified-Keyid
        kept = [(n, v) for n, v in fields if not n.lower().replace("_", "-").startswith(HEADER_PREFIX)]
        forwarded = Fields(kept + verdict.headers())
        # keyid: the verified agent's, for the access log (a gateway adds no signature)
        agent = verdict.stack.agent.keyid
        return outgoing(method, target, forwarded, body, framed=framed, keyid=agent, via=None)

    def store_check(self) -> str | None:
        """The ``counter_store`` readiness check (the last probe's result), or None when not checked."""
        return self.store_state if self.store_checked else None

    async def watch_store(self) -> None:
        """Probe the counter store every ``STORE_PROBE_INTERVAL_S``, off the request path: /readyz reads
        the last result and never waits on the store."""
        while True:
            try:
                await asyncio.wait_for(self.store.ping(), STORE_PROBE_TIMEOUT_S)
            except Exception as exc:  # the store's client errors, or the timeout
                if self.store_state != "unavailable":
                    log.warning("counter store unreachable: %s", exception_kind(exc))
                self.store_state = "unavailable"
            else:
                if self.store_state == "unavailable":
                    log.info("counter store reachable again")
                self.store_state = "ok"
            await asyncio.sleep(STORE_PROBE_INTERVAL_S)

    def provider_states(self) -> list[dict[str, object]]:
        """The manifest watcher's states, for the admin endpoint ``/providers``."""
        return [s.as_json() for s in self.watcher.states()] if self.watcher is not None else []

    async def close(self) -> None:
        await self.verifier.close()  # and the store
        await self.client.close()
