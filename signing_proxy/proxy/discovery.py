"""Discovery: an upstream ``403`` with ``X-Content-Rules`` becomes the way to the publisher's exchanges.

Spec "What the service does" 5-6: an agent that crawls a publisher directly is refused by the edge
with 403 and ``X-Content-Rules``, and continues through the publisher's manifest
(``/.well-known/svc.json``) to an authorized exchange. In ``follow`` mode the proxy holds such a
refusal before any byte of it reaches the agent (``net.forward``'s ``hold``), resolves the manifest
address (the header value when it is an http(s) URL, else ``{origin}/.well-known/svc.json``; on the
refusing origin's site unless ``allow_cross_site``; never plain HTTP for an HTTPS origin), fetches
it signed through the pipeline (the ``fetch`` it is given), validates it (``core.manifest``),
caches it for its ``Cache-Control`` lifetime clamped to ``[cache_min_s, cache_max_s]``, optionally calls
DiscoverResources at the first DIRECT exchange, and answers the agent: status 403 and the edge's
fields kept, ``Link: <manifest>; rel="describedby"`` added, and an ``application/problem+json`` body
with reason ``content-rules`` listing the authorized exchanges (or why the manifest was refused).
``passthrough`` only adds the ``Link`` to the edge's own answer; ``off`` (and relay mode, where the
agent's own proxy discovers) leaves the 403 alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import DiscoveryConfig
from ..core.errors import FieldError, ManifestError, ProtocolError
from ..core.manifest import (
    MANIFEST_MEDIA_TYPE,
    AuthorizedExchange,
    ProviderRelationship,
    Role,
    WellKnownManifest,
    manifest_address,
    parse_manifest,
    same_site,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError, problem_body
from ..net.client import FetchedResponse
from ..net.framing import HOP_BY_HOP
from ..net.upstream import ResponseHead
from ..verify.directory import ttl_from_cache_control

__all__ = [
    "CONTENT_RULES",
    "DISCOVER_RESOURCES_PATH",
    "LINK_REL",
    "PROBLEM_REASON",
    "Discovery",
    "Fetch",
    "Finding",
    "RequesterSource",
    "content_rules",
    "exchange_json",
    "link_value",
]

log = logging.getLogger("signing_proxy.discovery")

CONTENT_RULES = "x-content-rules"  # spec: Errors ("Status 403 with header X-Content-Rules")
DISCOVER_RESOURCES_PATH = "/svc.v1.ExchangeService/DiscoverResources"  # spec: Endpoints
ENVELOPE_VERSION = "1.0"  # spec: Endpoints (request body ``ver``) and Versioning 1
LINK_REL = "describedby"  # RFC 8288 registry: "a resource providing information about the link's context"
PROBLEM_REASON = "content-rules"
DISCOVER_MAX_BYTES = 1024 * 1024  # our choice: the spec gives no body-size limit for offers
NEGATIVE_TTL_S = 30.0  # our choice: a refused or unreachable manifest is retried after this (or cache_min_s)
MAX_CACHED_MANIFESTS = 1024  # our choice: bound on the manifest cache (oldest entry dropped)

# Fields describing the edge's body, which discovery replaces; framing and hop-by-hop go as always.
_REPLACED = frozenset(
    name.encode()
    for name in (
        *HOP_BY_HOP,
        "content-length",
        "content-type",
        "content-encoding",
        "content-language",
        "content-location",
        "content-range",
        "content-digest",
        "repr-digest",
        "digest",
        "content-md5",
        "etag",
        "last-modified",
        "accept-ranges",
        "cache-control",
        "expires",
    )
)


class Fetch(Protocol):
    """A signed fetch through the proxy's pipeline and its one client; ``ProxyError`` with a reason."""

    async def __call__(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
    ) -> FetchedResponse: ...


class RequesterSource(Protocol):
    """The proxy's requester injection (``proxy.requester``): the proto-JSON Requester for exchange calls."""

    def document(self) -> dict[str, Any]: ...

    def is_exchange_call(self, method: str, target: Target) -> bool: ...


def content_rules(head: ResponseHead) -> str | None:
    """The ``X-Content-Rules`` value of a response (lines joined with ``", "``), or None."""
    values = [v.decode("latin-1").strip() for n, v in head.headers if n.lower() == b"x-content-rules"]
    return ", ".join(values) if values else None


def link_value(manifest_url: str) -> str:
    """The ``Link`` field value pointing at a manifest."""
    return f'<{manifest_url}>; rel="{LINK_REL}"; type="{MANIFEST_MEDIA_TYPE}"'


def exchange_json(exchange: AuthorizedExchange) -> dict[str, str]:
    """An authorized exchange as the problem body and ``discover --json`` show it."""
    return {
        "domain": exchange.domain,
        "endpoint": exchange.endpoint,
        "relationship": exchange.relationship.json_value,
    }


@dataclass(frozen=True)
class Finding:
    """What discovery found for one refusal; ``doc`` becomes members of the problem body."""

    manifest_url: str | None  # None: no address passed the site rules (no Link)
    manifest: WellKnownManifest | None
    doc: dict[str, object]

    @property
    def usable(self) -> bool:
        """A valid manifest that lists at least one authorized exchange."""
        return self.manifest is not None and bool(self.manifest.exchanges)


@dataclass
class _Entry:
    manifest: WellKnownManifest | None
    error: ManifestError | None
    expires_at: float


class Discovery:
    """Manifest lookup with a bounded cache, DiscoverResources, and the agent's 403 answer."""

    def __init__(
        self,
        config: Callable[[], DiscoveryConfig],
        fetch: Fetch,
        *,
        requester: Callable[[], RequesterSource | None] = lambda: None,
        count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._fetch_signed = fetch
        self._requester = requester
        self._counter = count
        self.clock = clock
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Future[WellKnownManifest]] = {}
        self.fetches = 0  # manifest fetches sent (cache misses)

    @property
    def config(self) -> DiscoveryConfig:
        """The live ``discovery`` section (a configuration reload applies to the next refusal)."""
        return self._config()

    # --- in the response path, at the head of every 403 (synchronous) ---
    def holds(self, head: ResponseHead, target: Target) -> bool:
        """True when ``follow`` takes this 403 over; ``passthrough`` adds its Link to ``head`` instead."""
        mode = self.config.mode
        rules = content_rules(head) if mode != "off" else None
        if rules is None:
            return False
        if mode == "follow":
            return True
        try:
            url = self.address(rules, target)
        except ManifestError as exc:
            log.info("not linking the manifest of %s: %s", target.host, exc.reason)
            return False
        head.headers.append((b"Link", link_value(url).encode("latin-1")))
        return False

    # --- the steps ---
    def address(self, x_content_rules: str, target: Target) -> str:
        """The manifest URL for a refusal of ``target``; ManifestError when the site rules refuse it."""
        url = manifest_address(x_content_rules, target.uri)
        if not self.config.allow_cross_site and not same_site(url, target.uri):
            raise ManifestError(
                "manifest-cross-site",
                f"{url} is not on the site of {target.host} (discovery.allow_cross_site is false)",
            )
        if target.scheme == "https" and not url.startswith("https://"):
            raise ManifestError("manifest-insecure", f"{url}: the manifest of an https origin needs https")
        return url

    async def manifest(self, url: str) -> WellKnownManifest:
        """The validated publisher manifest at ``url``, cached; raises ManifestError with its reason."""
        entry = self._cache.get(url)
        if entry is not None and self.clock() < entry.expires_at:
            self._count("manifest_hits")
            if entry.manifest is not None:
                return entry.manifest
            assert entry.error is not None
            raise ManifestError(entry.error.reason, entry.error.detail)
        inflight = self._inflight.get(url)
        if inflight is not None:  # one fetch per URL at a time; concurrent refusals share it
            return await asyncio.shield(inflight)
        future: asyncio.Future[WellKnownManifest] = asyncio.get_running_loop().create_future()
        self._inflight[url] = future
        try:
            manifest = await self._fetch(url)
        except ManifestError as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it too, no "never retrieved" warning
            raise
        except BaseException:
            future.set_exception(ManifestError("manifest-fetch-failed", f"{url}: the fetch was cancelled"))
            future.exception()
            raise
        else:
            future.set_result(manifest)
            return manifest
        finally:
            del self._inflight[url]

    def _count(self, counter: str) -> None:
        if self._counter is not None:
            self._counter(counter)

    async def _fetch(self, url: str) -> WellKnownManifest:
        self.fetches += 1
        self._count("manifest_fetches")
        try:
            answer = await self._fetch_signed(
                "GET",
                url,
                headers=(("Accept", MANIFEST_MEDIA_TYPE),),
                max_bytes=self.config.max_manifest_bytes,
            )
        except ProxyError as exc:
            too_large = exc.reason == "response-too-large"
            error = ManifestError(
                "manifest-too-large" if too_large else "manifest-fetch-failed",
                f"{url}: larger than {self.config.max_manifest_bytes} bytes"
                if too_large
                else f"{url}: {exc.reason} ({exc.detail})",
            )
        else:
            if answer.status != 200:
                error = ManifestError("manifest-fetch-failed", f"{url} answered {answer.status}")
            else:
                try:
                    manifest = parse_manifest(
                        answer.body,
                        served_host=parse_absolute_uri(url).host,
                        max_bytes=self.config.max_manifest_bytes,
                    )
                    if manifest.role is not Role.ROLE_PUBLISHER:
                        raise ManifestError(
                            "manifest-not-publisher", f"{url} is a {manifest.role.name} manifest"
                        )
                except ManifestError as exc:
                    error = exc
                else:
                    ttl = ttl_from_cache_control(
                        answer.header("cache-control"), self.config.cache_min_s, self.config.cache_max_s
                    )
                    self._store(url, _Entry(manifest, None, self.clock() + ttl))
                    log.info(
                        "manifest %s: %d authorized exchanges, cached %gs", url, len(manifest.exchanges), ttl
                    )
                    return manifest
        log.info("manifest %s refused: %s", url, error.reason)
        negative_ttl = min(NEGATIVE_TTL_S, float(self.config.cache_min_s))
        self._store(url, _Entry(None, error, self.clock() + negative_ttl))
        raise error

    def _store(self, url: str, entry: _Entry) -> None:
        self._cache.pop(url, None)
        while len(self._cache) >= MAX_CACHED_MANIFESTS:
            del self._cache[next(iter(self._cache))]  # the oldest insertion
        self._cache[url] = entry

    async def discover_resources(self, manifest: WellKnownManifest, uri: str) -> dict[str, object]:
        """POST DiscoverResources for ``uri`` at the first DIRECT exchange; its answer or why not."""
        direct = ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT
        exchange = next((x for x in manifest.exchanges if x.relationship is direct), None)
        if exchange is None:
            return {
                "error": {"reason": "no-direct-exchange", "detail": "the manifest lists no DIRECT exchange"}
            }
        url = exchange.endpoint.rstrip("/") + DISCOVER_RESOURCES_PATH
        out: dict[str, object] = {"exchange": exchange.domain, "url": url}
        body: dict[str, object] = {"ver": ENVELOPE_VERSION, "exchange": exchange.domain}
        source = self._requester()
        if source is None:
            out["requester"] = "not-configured"
            out["note"] = "no requester is configured: DiscoverResources was sent without one"
        elif not source.is_exchange_call("POST", parse_absolute_uri(url)):
            # the Requester (and its delegation) goes only where the operator sends it
            out["requester"] = "not-sent"
            out["note"] = (
                f"{exchange.endpoint} is not in requester.exchanges: DiscoverResources was sent without one"
            )
        else:
            try:
                body["requester"] = source.document()
                out["requester"] = "sent"
            except (ProtocolError, ProxyError, ValueError) as exc:  # e.g. 503 delegation expired
                reason = getattr(exc, "reason", "requester-unavailable")
                out["requester"] = "unavailable"
                out["note"] = f"the requester could not be built ({reason}): sent without one"
        body["uris"] = [uri]
        body["acceptable_restrictions"] = [
            {"axis": r.axis, "values": list(r.values)} for r in self.config.acceptable_restrictions
        ]
        try:
            answer = await self._fetch_signed(
                "POST",
                url,
                body=json.dumps(body, separators=(",", ":")).encode(),
                headers=(("Content-Type", "application/json"), ("Accept", "application/json")),
                max_bytes=DISCOVER_MAX_BYTES,
            )
        except ProxyError as exc:
            out["error"] = {"reason": exc.reason, "detail": exc.detail}
            return out
        out["status"] = answer.status
        try:
            out["response"] = json.loads(answer.body)
        except (UnicodeDecodeError, ValueError, RecursionError):
            out["error"] = {"reason": "discover-resources-malformed", "detail": "the answer is not JSON"}
            return out
        if answer.status != 200:
            out["error"] = {
                "reason": "discover-resources-refused",
                "detail": f"{exchange.domain} answered {answer.status}",
            }
        return out

    async def find(self, x_content_rules: str, target: Target) -> Finding:
        """Everything discovery learns from one refusal of ``target``; never raises for the manifest."""
        doc: dict[str, object] = {"uri": target.uri, "x_content_rules": x_content_rules}
        try:
            url = self.address(x_content_rules, target)
        except (ManifestError, ValueError, FieldError) as exc:
            doc["manifest_error"] = _error_json(exc)
            return Finding(None, None, doc)
        doc["manifest_url"] = url
        try:
            manifest = await self.manifest(url)
        except ManifestError as exc:
            doc["manifest_error"] = _error_json(exc)
            return Finding(url, None, doc)
        doc["manifest"] = {
            "ver": manifest.ver,
            "role": manifest.role.name,
            "domain": manifest.domain,
            **({"contact": manifest.contact} if manifest.contact else {}),
        }
        doc["exchanges"] = [exchange_json(x) for x in manifest.exchanges]
        if self.config.discover_resources:
            doc["discover_resources"] = await self.discover_resources(manifest, target.uri)
        return Finding(url, manifest, doc)

    async def refusal(self, head: ResponseHead, target: Target, *, keep_alive: bool) -> tuple[bytes, bytes]:
        """The agent's answer to a held 403: (head bytes, problem+json body)."""
        finding = await self.find(content_rules(head) or "", target)
        if finding.manifest is not None:
            detail = (
                "the origin refused this request and names its manifest (X-Content-Rules): "
                "access goes through one of the exchanges it authorizes"
            )
        else:
            error = finding.doc["manifest_error"]
            assert isinstance(error, dict)
            detail = (
                "the origin refused this request (X-Content-Rules); "
                f"its manifest is unusable: {error['reason']}"
            )
        body = problem_body(403, PROBLEM_REASON, detail, **finding.doc)
        lines = [b"HTTP/1.1 403 " + (head.reason or "Forbidden").encode("latin-1")]
        lines.extend(n + b": " + v for n, v in head.headers if n.lower() not in _REPLACED)
        if finding.manifest_url is not None:
            lines.append(b"Link: " + link_value(finding.manifest_url).encode("latin-1"))
        lines += [
            b"Content-Type: application/problem+json",
            b"Content-Length: %d" % len(body),
            b"Cache-Control: no-store",
        ]
        if not keep_alive:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n", body


def _error_json(exc: Exception) -> dict[str, str]:
    if isinstance(exc, ProtocolError):
        return {"reason": exc.reason, "detail": exc.detail}
    return {"reason": "manifest-address-invalid", "detail": str(exc)}
