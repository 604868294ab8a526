"""Discovery: an upstream ``403`` with ``X-Content-Rules`` becomes the way to the publisher's exchanges.

Spec "What the service does" 5-6: an agent that crawls a publisher directly is refused by the edge
with 403 and ``X-Content-Rules``, and continues through the publisher's manifest
(``/.well-known/svc.json``) to an authorized exchange. In ``follow`` mode the proxy holds such a
refusal before any byte of it reaches the agent (``net.forward``'s ``hold``), resolves the manifest
address (the header value when it is an http(s) URL, else ``{origin}/.well-known/svc.json``; never
plain HTTP for an HTTPS origin) and fetches it signed through the pipeline (the ``fetch`` it is
given): on the refusing origin itself (same scheme, host and port) as the agent's own request would
go; on any other origin only with ``allow_cross_site``, and then through the egress policy
(``net.egress``: https, public addresses unless allow-listed, no userinfo or fragment, no redirects,
bounded size and time). It validates the manifest (``core.manifest``), caches it for its
``Cache-Control`` lifetime clamped to ``[cache_min_s, cache_max_s]``, optionally calls
DiscoverResources at the first DIRECT exchange (always through the egress policy; the answer is
shown only when it is a 200 JSON object), and answers the agent: status 403 and the edge's fields
kept, ``Link: <manifest>; rel="describedby"`` added, and an ``application/problem+json`` body with
reason ``content-rules`` listing the authorized exchanges (or why the manifest was refused). A
refused or failed fetch shows a stable reason and a generic detail; the full cause goes to the log.
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
from http import HTTPStatus
from typing import Any, Protocol

from ..config import DiscoveryConfig
from ..core.errors import Error, FieldError, ManifestError, ProtocolError
from ..core.json_bounds import loads_bounded
from ..core.manifest import (
    MANIFEST_MEDIA_TYPE,
    AuthorizedExchange,
    ProviderRelationship,
    Role,
    WellKnownManifest,
    manifest_address,
    parse_manifest,
)
from ..core.requester import REQUESTER_TYPE_DELEGATED
from ..core.uri import Target, parse_absolute_uri
from ..errors import EgressError, ProxyError, problem_body
from ..net.client import FetchedResponse
from ..net.framing import HOP_BY_HOP
from ..net.upstream import ResponseHead
from ..verify.directory import ttl_from_cache_control
from .manifest_cache import ManifestCache

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
    "same_origin_as",
]

log = logging.getLogger("signing_proxy.discovery")

CONTENT_RULES = "x-content-rules"  # spec: Errors ("Status 403 with header X-Content-Rules")
DISCOVER_RESOURCES_PATH = "/svc.v1.ExchangeService/DiscoverResources"  # spec: Endpoints
ENVELOPE_VERSION = "1.0"  # spec: Endpoints (request body ``ver``) and Versioning 1
LINK_REL = "describedby"  # RFC 8288 registry: "a resource providing information about the link's context"
PROBLEM_REASON = "content-rules"
DISCOVER_MAX_BYTES = 1024 * 1024  # our choice: the spec gives no body-size limit for offers
MAX_SHOWN_DEPTH = 64  # our choice: a DiscoverResources answer nested deeper is not shown
NEGATIVE_TTL_S = 30.0  # our choice: a refused or unreachable manifest is retried after this (or cache_min_s)

# What the agent is told when a fetch fails: a stable reason and one of these generic details. The
# cause (an address class, a socket error, a certificate name) goes to the log only (DESIGN.md 7).
_EGRESS_DETAIL = {
    "egress-scheme": "only https:// is fetched here (plain http:// only from egress.allow_private)",
    "egress-userinfo": "a URL with userinfo (user:password@) is not fetched",
    "egress-fragment": "a URL with a fragment ('#') is not fetched",
    "egress-query": "an exchange endpoint is a base URL: it may not carry a query ('?')",
    "egress-host": "the host is not a valid DNS name or IP address",
    "egress-url": "the URL is too long or has characters not allowed in a URL",
    "egress-address": "the host is not a public address and not in egress.allow_private",
    "egress-unresolvable": "the host name does not resolve",
}
_FETCH_FAILED = "the fetch failed; the cause is in the proxy's log"

# Fields describing the edge's body, which discovery replaces; framing and hop-by-hop go as always.
_REPLACED = frozenset(
    name.encode()
    for name in (
        *HOP_BY_HOP,
        *(f"content-{n}" for n in ("length", "type", "encoding", "language", "location", "range")),
        *("content-digest", "repr-digest", "digest", "content-md5", "etag", "last-modified"),
        *("accept-ranges", "cache-control", "expires"),
    )
)


class Fetch(Protocol):
    """A signed fetch through the proxy's pipeline and its one client; ``ProxyError`` with a reason.

    ``egress=True``: a URL named by a remote party, so the egress policy (``EgressError``) and its
    time bound apply; otherwise the request goes as the agent's own would.
    """

    async def __call__(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        max_bytes: int,
        egress: bool = False,
    ) -> FetchedResponse: ...


class RequesterSource(Protocol):
    """The proxy's requester injection (``proxy.requester``): the proto-JSON Requester for exchange calls."""

    def document(self, *, delegation: bool = True) -> dict[str, Any]: ...

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
        # keyed by (egress, url): what the agent's origin served is not an answer for a stranger's naming
        self.cache = ManifestCache()
        self._inflight: dict[tuple[bool, str], asyncio.Future[WellKnownManifest | ManifestError]] = {}
        self.fetches = 0  # manifest fetches sent (cache misses)

    @property
    def config(self) -> DiscoveryConfig:
        """The live ``discovery`` section (a configuration reload applies to the next refusal)."""
        return self._config()

    # --- in the response path, at the head of every 403 (synchronous) ---
    def holds(self, head: ResponseHead, target: Target) -> bool:
        """True when ``follow`` takes this 403 over; ``passthrough`` adds its Link to ``head`` instead.
        Any other status passes untouched: ``X-Content-Rules`` means discovery on a 403 only (spec
        Errors: "Status 403 with header X-Content-Rules")."""
        if head.status != HTTPStatus.FORBIDDEN:
            return False
        mode = self.config.mode
        rules = content_rules(head) if mode != "off" else None
        if rules is None:
            return False
        if mode == "follow":
            return True
        try:
            url = self.address(rules, target)
        except (ManifestError, EgressError, ValueError) as exc:
            log.info("not linking the manifest of %s: %s", target.host, getattr(exc, "reason", exc))
            return False
        head.headers.append((b"Link", link_value(url).encode("latin-1")))
        return False

    # --- the steps ---
    def address(self, x_content_rules: str, target: Target) -> str:
        """The manifest URL for a refusal of ``target``; ManifestError (or EgressError) when refused."""
        url = manifest_address(x_content_rules, target.uri)
        if target.scheme == "https" and not url.startswith("https://"):
            raise ManifestError("manifest-insecure", f"{url}: the manifest of an https origin needs https")
        if same_origin_as(url, target):
            return url
        if not self.config.allow_cross_site:
            raise ManifestError(
                "manifest-cross-site",
                f"{url} is not on the refusing origin {target.scheme}://{target.authority} "
                "(discovery.allow_cross_site is false)",
            )
        # manifest_address drops these; a stranger's URL that carries them is refused, not repaired
        named = _unquoted(x_content_rules)
        authority = named.partition("://")[2].split("/", 1)[0].split("?", 1)[0]
        if "@" in authority:
            raise EgressError("egress-userinfo", _EGRESS_DETAIL["egress-userinfo"])
        if "#" in named:
            raise EgressError("egress-fragment", _EGRESS_DETAIL["egress-fragment"])
        return url

    async def manifest(self, url: str, *, same_origin: bool = False) -> WellKnownManifest:
        """The validated publisher manifest at ``url``, cached; raises ManifestError with its reason.

        ``same_origin``: ``url`` is on the refusing origin, fetched as the agent's request would be;
        otherwise (the default) it is a stranger's URL and goes through the egress policy.
        """
        key = (not same_origin, url)
        entry = self.cache.fresh(key, self.clock())
        if entry is not None:
            self._count("manifest_hits")
            if entry.manifest is not None:
                return entry.manifest
            assert entry.error is not None
            raise ManifestError(entry.error.reason, entry.error.detail)
        inflight = self._inflight.get(key)
        if inflight is not None:  # one fetch per URL at a time; concurrent refusals share it
            shared = await asyncio.shield(inflight)  # a failure comes as a value: one error raised
            if isinstance(shared, ManifestError):  # by all, its traceback would tie their frames to
                raise ManifestError(shared.reason, shared.detail)  # the future they hold, a cycle
            return shared
        future: asyncio.Future[WellKnownManifest | ManifestError] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            manifest = await self._fetch(url, egress=not same_origin)
        except ManifestError as exc:
            future.set_result(ManifestError(exc.reason, exc.detail))
            raise
        except BaseException:
            future.set_result(ManifestError("manifest-fetch-failed", f"{url}: the fetch was cancelled"))
            raise
        else:
            future.set_result(manifest)
            return manifest
        finally:
            del self._inflight[key]

    def _count(self, counter: str) -> None:
        if self._counter is not None:
            self._counter(counter)

    async def _fetch(self, url: str, *, egress: bool) -> WellKnownManifest:
        self.fetches += 1
        self._count("manifest_fetches")
        limit = self.config.max_manifest_bytes
        try:
            answer = await self._fetch_signed(
                "GET", url, headers=(("Accept", MANIFEST_MEDIA_TYPE),), max_bytes=limit, egress=egress
            )
        except (ProxyError, EgressError) as exc:
            log.info("manifest %s not fetched: %s (%s)", url, exc.reason, exc.detail)
            if exc.reason == "response-too-large":
                error = ManifestError("manifest-too-large", f"{url}: larger than {limit} bytes")
            elif isinstance(exc, EgressError):  # its own stable reason: egress-address, egress-scheme, ...
                error = ManifestError(*_failure(exc))
            else:
                reason, detail = _failure(exc)
                error = ManifestError("manifest-fetch-failed", f"{url}: {reason} ({detail})")
        else:
            if answer.status != 200:
                error = ManifestError("manifest-fetch-failed", f"{url} answered {_status(answer.status)}")
            else:
                try:
                    manifest = parse_manifest(
                        answer.body, served_host=parse_absolute_uri(url).host, max_bytes=limit
                    )
                    if manifest.role is not Role.ROLE_PUBLISHER:
                        raise ManifestError(
                            "manifest-not-publisher", f"{url} is a {manifest.role.name} manifest"
                        )
                except ManifestError as exc:  # a copy: its traceback holds this frame, which would hold it
                    error = ManifestError(exc.reason, exc.detail)
                else:
                    ttl = ttl_from_cache_control(
                        answer.header("cache-control"), self.config.cache_min_s, self.config.cache_max_s
                    )
                    manifest = self.cache.keep((egress, url), manifest, self.clock() + ttl, len(answer.body))
                    log.info(
                        "manifest %s: %d authorized exchanges, cached %gs", url, len(manifest.exchanges), ttl
                    )
                    return manifest
        log.info("manifest %s refused: %s", url, error.reason)
        negative_ttl = min(NEGATIVE_TTL_S, float(self.config.cache_min_s))
        self.cache.refuse((egress, url), error, self.clock() + negative_ttl)
        raise ManifestError(error.reason, error.detail)  # not ``error``: this frame holds it (a cycle)

    async def discover_resources(self, manifest: WellKnownManifest, uri: str) -> dict[str, object]:
        """POST DiscoverResources for ``uri`` at the first DIRECT exchange; its answer or why not.

        The endpoint is a stranger's URL: it goes through the egress policy, and the answer is shown
        only when it is a DiscoverResources response (status 200, a JSON object, within the bound).
        """
        direct = ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT
        exchange = next((x for x in manifest.exchanges if x.relationship is direct), None)
        if exchange is None:
            return {
                "error": {"reason": "no-direct-exchange", "detail": "the manifest lists no DIRECT exchange"}
            }
        url = exchange.endpoint.rstrip("/") + DISCOVER_RESOURCES_PATH
        out: dict[str, object] = {"exchange": exchange.domain, "url": url}
        if "?" in exchange.endpoint:  # the path would land in the query: ``/admin?x=`` + the method path
            log.info("DiscoverResources at %s not sent: egress-query (the endpoint has a query)", url)
            out["error"] = {"reason": "egress-query", "detail": _EGRESS_DETAIL["egress-query"]}
            return out
        body: dict[str, object] = {"ver": ENVELOPE_VERSION, "exchange": exchange.domain}
        source = self._requester()
        if source is None:
            out["requester"] = "not-configured"
            out["note"] = "no requester is configured: DiscoverResources was sent without one"
        elif not source.is_exchange_call("POST", parse_absolute_uri(url)):
            # the spec sends the Requester in every request; its delegation goes only where the
            # operator sends it (requester.exchanges)
            body["requester"] = requester = source.document(delegation=False)
            if requester.get("type") == REQUESTER_TYPE_DELEGATED:  # the spec's "Delegation token
                # missing": refused by every exchange; the agent's name and scopes would go for nothing
                out["requester"] = "not-sent"
                detail = f"{exchange.endpoint} is not in requester.exchanges: a delegated requester needs it"
                out["error"] = {"reason": "delegation-not-sent", "detail": detail}
                return out
            out["requester"] = "sent-without-delegation"
            out["note"] = (
                f"{exchange.endpoint} is not in requester.exchanges: the Requester was sent without "
                "its delegation"
            )
        else:
            try:
                body["requester"] = source.document()
                out["requester"] = "sent"
            except (ProtocolError, ProxyError, ValueError) as exc:  # e.g. 503 delegation expired
                reason = getattr(exc, "reason", "requester-unavailable")  # nothing leaves: the pipeline
                out["requester"] = "unavailable"  # would put the requester back in, and refuse
                out["error"] = {"reason": reason, "detail": "the requester cannot be sent now; not sent"}
                return out
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
                egress=True,
            )
        except (ProxyError, EgressError) as exc:
            log.info("DiscoverResources at %s failed: %s (%s)", url, exc.reason, exc.detail)
            reason, detail = _failure(exc)
            out["error"] = {"reason": reason, "detail": detail}
            return out
        out["status"] = answer.status
        try:  # shown to the agent inside our problem document: finite numbers, nesting bounded
            response = loads_bounded(answer.body, max_depth=MAX_SHOWN_DEPTH)
        except ValueError:  # UnicodeDecodeError included
            response = None
        if not isinstance(response, dict):
            out["error"] = {  # whatever else it is, it is not shown (an internal page, ...)
                "reason": "discover-resources-malformed",
                "detail": f"the answer is not a JSON object (finite numbers, depth {MAX_SHOWN_DEPTH})",
            }
            return out
        if answer.status != 200:  # an error document is not a DiscoverResources response: not shown
            out["error"] = {
                "reason": "discover-resources-refused",
                "detail": f"{exchange.domain} answered {_status(answer.status)}",
            }
            return out
        out["response"] = response
        return out

    async def find(self, x_content_rules: str, target: Target) -> Finding:
        """Everything discovery learns from one refusal of ``target``; never raises for the manifest."""
        doc: dict[str, object] = {"uri": target.uri, "x_content_rules": x_content_rules}
        try:
            url = self.address(x_content_rules, target)
        except (ManifestError, EgressError, ValueError, FieldError) as exc:
            doc["manifest_error"] = _error_json(exc)
            return Finding(None, None, doc)
        doc["manifest_url"] = url
        try:
            manifest = await self.manifest(url, same_origin=same_origin_as(url, target))
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
        dropped = _REPLACED | head.connection_named  # and what the edge's Connection names (RFC 9110 7.6.1)
        lines.extend(n + b": " + v for n, v in head.headers if n.lower() not in dropped)
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


def same_origin_as(url: str, target: Target) -> bool:
    """Whether ``url`` is on ``target``'s origin: the same scheme, host and port (RFC 6454)."""
    try:
        other = parse_absolute_uri(url)
    except FieldError:
        return False
    return (other.scheme, other.host, other.port) == (target.scheme, target.host, target.port)


def _unquoted(x_content_rules: str) -> str:
    """The ``X-Content-Rules`` value without the quotes or angle brackets ``manifest_address`` drops."""
    value = x_content_rules.strip()
    if len(value) >= 2 and (value[0], value[-1]) in (('"', '"'), ("<", ">")):
        value = value[1:-1].strip()
    return value


def _status(status: int) -> str:
    return f"{status} (redirects are not followed)" if 300 <= status < 400 else str(status)


def _failure(exc: ProxyError | EgressError) -> tuple[str, str]:
    """The stable reason of a failed fetch and a generic detail (never addresses or error texts)."""
    if isinstance(exc, EgressError):
        return exc.reason, _EGRESS_DETAIL.get(exc.reason, "the egress policy refuses this URL")
    if exc.reason == "response-too-large":
        return exc.reason, "the answer is larger than the size bound"
    return exc.reason, _FETCH_FAILED


def _error_json(exc: Exception) -> dict[str, str]:
    if isinstance(exc, Error):
        return {"reason": exc.reason, "detail": exc.detail}
    return {"reason": "manifest-address-invalid", "detail": str(exc)}
