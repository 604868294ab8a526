"""Configuration: YAML in, frozen dataclasses out; every mistake refused with its key path.

The dataclass defaults below *are* the embedded default configuration; ``config/default.yaml``
spells out the same values with comments (a test keeps the two identical). Unknown keys, wrong
types and impossible values raise ``ConfigError("limits.max_body_bytes: must be a positive
integer")`` — never a silent default.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..errors import ConfigError

__all__ = [
    "AccessConfig",
    "AdminConfig",
    "Config",
    "ConfigError",
    "CredentialRule",
    "DelegationConfig",
    "DiscoveryConfig",
    "HostsConfig",
    "InterceptConfig",
    "LimitsConfig",
    "LogConfig",
    "PublishConfig",
    "RelayConfig",
    "RequesterConfig",
    "RestrictionConfig",
    "Route",
    "SigningConfig",
    "TimeoutsConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
    "redacted",
]


def parse_host_port(value: str, path: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:8080``) -> (host, port); port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ConfigError(f"{path}: must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class SigningConfig:
    key: str | None = None  # PEM or private JWK: one static key; None: the key store <data_dir>/keys/<agent>/
    label: str = "agent"
    signature_agent: str = ""  # directory base URL; "" sends an empty Signature-Agent
    validity_s: int = 300
    agent: str = "default"  # whose key store signs (and is published at the root of publish.listen)
    key_lifetime_s: int = 90 * 86_400  # window of a key the store creates (first run, `keys rotate`)

    def _check(self, path: str) -> None:
        label_chars = set("abcdefghijklmnopqrstuvwxyz0123456789_-.*")
        if (
            not self.label
            or not (self.label[0].islower() or self.label[0] == "*")
            or not label_chars.issuperset(self.label)
        ):
            raise ConfigError(f"{path}.label: must be a structured-field key (lower-case, e.g. 'agent')")
        if self.signature_agent and not self.signature_agent.startswith(("https://", "http://")):
            raise ConfigError(f"{path}.signature_agent: must be an http(s) URL or empty")
        if any(c in self.signature_agent for c in ' "\\<>'):
            raise ConfigError(f"{path}.signature_agent: must not contain spaces, quotes or backslashes")
        _positive(self.validity_s, f"{path}.validity_s", maximum=86_400)
        _check_agent_name(self.agent, f"{path}.agent")
        _positive(self.key_lifetime_s, f"{path}.key_lifetime_s", maximum=3650 * 86_400)
        if self.key_lifetime_s < 3600:
            raise ConfigError(f"{path}.key_lifetime_s: must be at least 3600 (one hour)")


AGENT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # one safe path segment, in files and URLs
DEFAULT_REVOCATION_PATH = "/.well-known/http-message-signatures-revocations.json"  # our choice
DIRECTORY_MAX_AGE_RANGE_S = (60, 86_400)  # spec: Limits ("minutes to hours")


def _check_agent_name(name: str, path: str) -> None:
    if not AGENT_NAME_RE.fullmatch(name):
        raise ConfigError(f"{path}: agent names are 1-63 of a-z 0-9 . _ - starting with a letter or digit")


@dataclass(frozen=True)
class PublishConfig:
    """The publication listener (directory, svc.json, revocation list); see ``proxy/publish.py``."""

    listen: str | None = None  # HOST:PORT; None: not served (``signing-proxy publish --out`` still works)
    domain: str | None = None  # the manifest's domain; required to publish
    public_url: str | None = None  # where verifiers reach this listener; None: https://<domain>
    directory_max_age_s: int = 3600  # Cache-Control max-age of the directory and svc.json
    revocation_path: str = DEFAULT_REVOCATION_PATH
    revocation_url: str | None = None  # put in the root directory; None: <public_url><revocation_path>
    agents: tuple[str, ...] = ()  # registry host: these agents' stores served under /agents/<name>/

    def _check(self, path: str) -> None:
        from ..core.errors import ManifestError
        from ..core.manifest import render_agent_manifest

        if self.listen is not None:
            parse_host_port(self.listen, f"{path}.listen")
            if self.domain is None:
                raise ConfigError(f"{path}.domain: required when {path}.listen is set (svc.json's domain)")
        if self.domain is not None:
            try:
                render_agent_manifest(self.domain)
            except ManifestError:
                raise ConfigError(f"{path}.domain: must be a domain name, got {self.domain!r}") from None
        for name in ("public_url", "revocation_url"):
            url = getattr(self, name)
            if url is not None and (
                not url.startswith(("https://", "http://"))
                or len(url.split("/", 3)[2]) == 0
                or any(c.isspace() or c in '"\\<>?#' for c in url)
                or not url.isascii()
            ):
                raise ConfigError(f"{path}.{name}: must be an absolute http(s) URL, no query, got {url!r}")
        low, high = DIRECTORY_MAX_AGE_RANGE_S
        _positive(self.directory_max_age_s, f"{path}.directory_max_age_s", maximum=high)
        if self.directory_max_age_s < low:
            raise ConfigError(f"{path}.directory_max_age_s: must be at least {low} (minutes to hours)")
        rpath = self.revocation_path
        if (
            not rpath.startswith("/")
            or rpath.endswith("/")
            or not rpath.isascii()
            or any(c.isspace() or c in "?#%\\" for c in rpath)
            or "/../" in rpath + "/"
            or "/./" in rpath + "/"
            or "//" in rpath
            or rpath.startswith("/agents/")
            or rpath in ("/.well-known/http-message-signatures-directory", "/.well-known/svc.json")
        ):
            raise ConfigError(
                f"{path}.revocation_path: must be a plain absolute path of its own, got {rpath!r}"
            )
        for i, agent in enumerate(self.agents):
            _check_agent_name(agent, f"{path}.agents[{i}]")
        if len(set(self.agents)) != len(self.agents):
            raise ConfigError(f"{path}.agents: an agent is listed twice")


@dataclass(frozen=True)
class LimitsConfig:
    max_body_bytes: int = 10 * 1024 * 1024
    max_header_bytes: int = 64 * 1024

    def _check(self, path: str) -> None:
        _positive(self.max_body_bytes, f"{path}.max_body_bytes")
        _positive(self.max_header_bytes, f"{path}.max_header_bytes")


@dataclass(frozen=True)
class TimeoutsConfig:
    connect_s: float = 10.0
    read_s: float = 60.0
    client_idle_s: float = 75.0
    drain_s: float = 10.0  # on SIGTERM: stop accepting, let in-flight exchanges finish this long

    def _check(self, path: str) -> None:
        for name in ("connect_s", "read_s", "client_idle_s", "drain_s"):
            _positive(getattr(self, name), f"{path}.{name}")


@dataclass(frozen=True)
class UpstreamConfig:
    ca_file: str | None = None  # extra CAs trusted for upstream TLS, on top of the system store
    pin_ca_files: Mapping[str, str] = field(default_factory=dict)  # host -> CA file (only these CAs)
    pool_max_idle_per_host: int = 256  # idle keep-alive connections per origin (each closes after 30 s idle)
    next_hop: str | None = None  # a relay every request is sent to, in absolute form (http:// or https://)

    def _check(self, path: str) -> None:
        _positive(self.pool_max_idle_per_host, f"{path}.pool_max_idle_per_host")
        if self.next_hop is not None:
            scheme, sep, rest = self.next_hop.partition("://")
            if not sep or scheme not in ("http", "https") or not rest.strip("/") or "/" in rest.strip("/"):
                raise ConfigError(
                    f"{path}.next_hop: must be http(s)://HOST[:PORT] of a relay, got {self.next_hop!r}"
                )


@dataclass(frozen=True)
class RelayConfig:
    """A broker hop: verify what arrives, cap the hops, stack our label (spec "Multi-hop forwarding")."""

    verify: bool = True  # never add our label to a stack we did not verify (off only for trusted meshes)
    max_hops: int | None = None  # signatures in the stack including ours; None: no cap of our own
    broker_directories: tuple[str, ...] = ()  # directory bases of brokers before us (their keys live there)
    # public key files (PEM or JWK): agents with an empty Signature-Agent; brokers known by key
    pinned_agent_keys: tuple[str, ...] = ()
    pinned_broker_keys: tuple[str, ...] = ()
    skew_s: int = 5

    def _check(self, path: str) -> None:
        if self.max_hops is not None:
            _positive(self.max_hops, f"{path}.max_hops")
            if self.max_hops < 2:
                raise ConfigError(f"{path}.max_hops: a relay adds a second signature; must be at least 2")
        for i, base in enumerate(self.broker_directories):
            if not base.startswith(("https://", "http://")):
                raise ConfigError(f"{path}.broker_directories[{i}]: must be an http(s) URL")
        if isinstance(self.skew_s, bool) or not isinstance(self.skew_s, int) or not 0 <= self.skew_s <= 300:
            raise ConfigError(f"{path}.skew_s: must be an integer from 0 to 300")


def _check_url(url: str | None, path: str) -> None:
    if url is not None and (
        not url.startswith(("https://", "http://"))
        or not url.split("/", 3)[2]
        or not url.isascii()
        or any(c.isspace() or c in '"\\<>#' for c in url)
    ):
        raise ConfigError(f"{path}: must be an absolute http(s) URL, got {url!r}")


@dataclass(frozen=True)
class DelegationConfig:
    """The Delegation carried in the requester (spec "Delegation"); checked against the chain at start."""

    token_file: str = ""  # the ~-joined chain, authority JWT first (what `delegate extend` prints)
    principal_domain: str = ""  # required: who granted the delegation
    principal_id: str = ""  # required: the principal's identifier
    expires_at: str | None = None  # RFC 3339; None: the chain's earliest exp (never later than it)
    max_spend_cents: int | None = None  # None: the chain's cap (never above it)
    max_accesses: int | None = None  # None: the chain's cap (never above it)
    quota_period: str | None = None  # "86400s" (or 30m, 24h, 30d); None: the chain's
    revocation_uri: str | None = None
    issuer: str | None = None
    token_format: str = "jwt"  # noqa: S105  # spec: the sole format (not a secret)
    ext: Mapping[str, Any] = field(default_factory=dict)
    ext_critical: tuple[str, ...] = ()

    def _check(self, path: str) -> None:
        from ..core.errors import KeyFormatError
        from ..core.keys import parse_rfc3339
        from ..core.requester import TOKEN_FORMAT_JWT, check_ext, parse_duration_s

        for name, what in (
            ("token_file", "the delegation chain file (`signing-proxy delegate extend ... > FILE`)"),
            ("principal_domain", "who granted the delegation"),
            ("principal_id", "the principal's identifier"),
        ):
            if not getattr(self, name).strip():
                raise ConfigError(f"{path}.{name}: required ({what})")
        if self.expires_at is not None:
            try:
                parse_rfc3339(self.expires_at)
            except KeyFormatError as exc:
                raise ConfigError(f"{path}.expires_at: {exc.detail}") from None
        try:
            if self.quota_period is not None:
                parse_duration_s(self.quota_period)
        except ValueError as exc:
            raise ConfigError(f"{path}.quota_period: {exc}") from None
        try:
            check_ext(self.ext, self.ext_critical, path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name, top in (("max_spend_cents", 2**63 - 1), ("max_accesses", 2**31 - 1)):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= top:
                raise ConfigError(f"{path}.{name}: must be an integer from 0 to {top}")
        if self.token_format != TOKEN_FORMAT_JWT:
            raise ConfigError(f"{path}.token_format: must be {TOKEN_FORMAT_JWT!r} (the sole format)")
        _check_url(self.revocation_uri, f"{path}.revocation_uri")
        if self.issuer is not None and not self.issuer.strip():
            raise ConfigError(f"{path}.issuer: must be non-empty when set")


@dataclass(frozen=True)
class RequesterConfig:
    """The Requester the proxy inserts into exchange calls that lack one; see ``proxy/requester.py``."""

    id: str = ""  # required: unique requester identifier
    domain: str = ""  # required: the requester's own domain (or its registry host)
    type: str | int = ""  # required: REQUESTER_TYPE_AGENT, ... or the number (UNSPECIFIED is refused)
    name: str | None = None
    scopes: tuple[str, ...] = ()
    ext: Mapping[str, Any] = field(default_factory=dict)
    ext_critical: tuple[str, ...] = ()
    delegation: DelegationConfig | None = None  # enterprise agents: the chain bound to our signing key
    exchanges: tuple[str, ...] = ()  # base URLs: POST {base}/svc.v1.ExchangeService/<Method> gets it

    def _check(self, path: str) -> None:
        from ..core.errors import FieldError
        from ..core.requester import check_ext, requester_type_name
        from ..core.scopes import scope_segments
        from ..core.uri import parse_absolute_uri

        for name, what in (("id", "the unique requester identifier"), ("domain", "the requester's domain")):
            if not getattr(self, name).strip():
                raise ConfigError(f"{path}.{name}: required ({what})")
        if any(c.isspace() or c in "/:@?#" for c in self.domain) or not self.domain.isascii():
            raise ConfigError(f"{path}.domain: a domain name such as agent.example, got {self.domain!r}")
        if self.type == "":
            raise ConfigError(f"{path}.type: required (a RequesterType such as REQUESTER_TYPE_AGENT, or 1-5)")
        try:
            requester_type_name(self.type)
        except ValueError as exc:
            raise ConfigError(f"{path}.type: {exc}") from None
        try:
            check_ext(self.ext, self.ext_critical, path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for i, scope in enumerate(self.scopes):
            try:
                scope_segments(scope)
            except ValueError as exc:
                raise ConfigError(f"{path}.scopes[{i}]: {exc}") from None
        if not self.exchanges:
            raise ConfigError(f"{path}.exchanges: list the exchange base URLs the requester is sent to")
        for i, base in enumerate(self.exchanges):
            _check_url(base, f"{path}.exchanges[{i}]")
            try:
                target = parse_absolute_uri(base)
            except FieldError as exc:
                raise ConfigError(f"{path}.exchanges[{i}]: {exc.detail}: {base!r}") from None
            if "?" in target.path_query:
                raise ConfigError(f"{path}.exchanges[{i}]: a base URL has no query, got {base!r}")
        if len(set(self.exchanges)) != len(self.exchanges):
            raise ConfigError(f"{path}.exchanges: an exchange is listed twice")


@dataclass(frozen=True)
class CredentialRule:
    """Inject a bearer credential for matching hosts; the secret comes from a file or the environment."""

    hosts: tuple[str, ...]
    bearer_file: str | None = None
    bearer_env: str | None = None
    override: bool = False  # replace an Authorization the agent sent (default: keep the agent's)

    def _check(self, path: str) -> None:
        if not self.hosts:
            raise ConfigError(f"{path}.hosts: must list at least one host pattern")
        if (self.bearer_file is None) == (self.bearer_env is None):
            raise ConfigError(f"{path}: set exactly one of bearer_file or bearer_env")


@dataclass(frozen=True)
class HostsConfig:
    unsigned: tuple[str, ...] = ()  # host patterns forwarded without signing (internal services)

    def _check(self, path: str) -> None:
        for i, pattern in enumerate(self.unsigned):
            _check_host_pattern(pattern, f"{path}.unsigned[{i}]")


@dataclass(frozen=True)
class Route:
    """A sidecar route: ``prefix`` on the proxy port maps to ``upstream`` (a base URL)."""

    prefix: str
    upstream: str

    def _check(self, path: str) -> None:
        if not self.prefix.startswith("/") or not self.prefix.endswith("/"):
            raise ConfigError(f"{path}.prefix: must start and end with '/', got {self.prefix!r}")
        if not self.upstream.startswith(("https://", "http://")) or not self.upstream.endswith("/"):
            raise ConfigError(f"{path}.upstream: must be an http(s) URL ending in '/', got {self.upstream!r}")


@dataclass(frozen=True)
class AccessConfig:
    allow_clients: tuple[str, ...] = ()  # CIDRs; empty means loopback only
    proxy_auth_file: str | None = None  # lines of "user:password"

    def _check(self, path: str) -> None:
        for i, cidr in enumerate(self.allow_clients):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(f"{path}.allow_clients[{i}]: not a CIDR: {cidr!r}") from None


@dataclass(frozen=True)
class InterceptConfig:
    """CONNECT handling: TLS interception with a local CA, blind tunnels, and ``signing-proxy env``."""

    enabled: bool = True  # false: CONNECT is refused except for ``tunnel`` hosts
    allowed_ports: tuple[int, ...] = (443, 80)  # ports a CONNECT may name
    tunnel: tuple[str, ...] = ()  # host patterns passed through as blind TCP tunnels (never signed)
    ca_cert: str | None = None  # operator CA (PEM); None: <data_dir>/ca.pem, created on first run
    ca_key: str | None = None  # its private key (PEM, unencrypted, mode 0600)
    ca_validity_days: int = 365  # validity of a CA created on first run
    leaf_cache_size: int = 1024  # leaf certificates (TLS contexts) kept, least recently used dropped
    handshake_timeout_s: float = 10.0  # from "200 Connection Established" to a completed TLS handshake
    no_proxy: tuple[str, ...] = ()  # printed as NO_PROXY by ``signing-proxy env``

    def _check(self, path: str) -> None:
        for i, port in enumerate(self.allowed_ports):
            if not 0 < port < 65536:
                raise ConfigError(f"{path}.allowed_ports[{i}]: must be a port number 1-65535, got {port}")
        for i, pattern in enumerate(self.tunnel):
            _check_host_pattern(pattern, f"{path}.tunnel[{i}]")
        if (self.ca_cert is None) != (self.ca_key is None):
            raise ConfigError(f"{path}: set both ca_cert and ca_key (an operator CA), or neither")
        _positive(self.ca_validity_days, f"{path}.ca_validity_days", maximum=3650)
        _positive(self.leaf_cache_size, f"{path}.leaf_cache_size")
        _positive(self.handshake_timeout_s, f"{path}.handshake_timeout_s")
        for i, entry in enumerate(self.no_proxy):
            if not entry or any(c.isspace() or c in ",'\"$`" for c in entry):
                raise ConfigError(f"{path}.no_proxy[{i}]: must be one host, domain or CIDR, got {entry!r}")


@dataclass(frozen=True)
class RestrictionConfig:
    """One ``acceptable_restrictions`` entry of a DiscoverResources body (spec "Endpoints")."""

    axis: str  # e.g. RESTRICTION_KIND_FUNCTION
    values: tuple[str, ...] = ()  # e.g. SUMMARIZE, RETRIEVE

    def _check(self, path: str) -> None:
        named = [("axis", self.axis), *((f"values[{i}]", v) for i, v in enumerate(self.values))]
        for name, value in named:
            if not value or not value.isascii() or any(c.isspace() for c in value):
                raise ConfigError(f"{path}.{name}: must be a non-empty ASCII word, got {value!r}")


DISCOVERY_CACHE_MAX_S = 7 * 86_400  # our choice: spec "Limits" caches manifests "minutes to hours"


@dataclass(frozen=True)
class DiscoveryConfig:
    """Following ``403`` + ``X-Content-Rules`` into the publisher's manifest; see ``proxy/discovery.py``."""

    mode: Literal["follow", "off", "passthrough"] = "follow"  # passthrough: edge body kept, Link added
    allow_cross_site: bool = False  # accept a manifest address on another site than the refusing origin
    cache_min_s: int = 60  # floor on a manifest's Cache-Control lifetime (no-store included)
    cache_max_s: int = 21_600  # ceiling: six hours
    max_manifest_bytes: int = 65_536
    discover_resources: bool = False  # also POST DiscoverResources at the first DIRECT exchange
    acceptable_restrictions: tuple[RestrictionConfig, ...] = ()

    def _check(self, path: str) -> None:
        if self.cache_min_s < 0:
            raise ConfigError(f"{path}.cache_min_s: must be zero or a positive integer")
        _positive(self.cache_max_s, f"{path}.cache_max_s", maximum=DISCOVERY_CACHE_MAX_S)
        if self.cache_min_s > self.cache_max_s:
            raise ConfigError(f"{path}.cache_min_s: must not exceed cache_max_s ({self.cache_max_s})")
        _positive(self.max_manifest_bytes, f"{path}.max_manifest_bytes", maximum=16 * 1024 * 1024)


@dataclass(frozen=True)
class AdminConfig:
    """``/healthz``, ``/readyz``, ``/metrics`` on a port of their own (probes, scraping)."""

    listen: str | None = None

    def _check(self, path: str) -> None:
        if self.listen is not None:
            parse_host_port(self.listen, f"{path}.listen")


@dataclass(frozen=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    access_log: bool = True


@dataclass(frozen=True)
class Config:
    mode: Literal["agent", "relay"] = "agent"
    listen: str = "127.0.0.1:8080"
    data_dir: str = "~/.local/share/signing-proxy"
    signing: SigningConfig = field(default_factory=SigningConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    credentials: tuple[CredentialRule, ...] = ()
    hosts: HostsConfig = field(default_factory=HostsConfig)
    routes: tuple[Route, ...] = ()
    access: AccessConfig = field(default_factory=AccessConfig)
    intercept: InterceptConfig = field(default_factory=InterceptConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    requester: RequesterConfig | None = None  # None: exchange calls are forwarded as the agent wrote them
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def _check(self, path: str) -> None:
        host, _port = parse_host_port(self.listen, "listen")
        prefixes = [r.prefix for r in self.routes]
        if len(set(prefixes)) != len(prefixes):
            raise ConfigError("routes: two routes have the same prefix")
        for reserved in ("/healthz", "/readyz", "/metrics"):
            for i, prefix in enumerate(prefixes):
                if reserved.startswith(prefix.rstrip("/")) or prefix.startswith(reserved + "/"):
                    raise ConfigError(
                        f"routes[{i}].prefix: {prefix!r} collides with the proxy's own {reserved}"
                    )
        if not _is_loopback(host) and not self.access.allow_clients and not self.access.proxy_auth_file:
            raise ConfigError(
                f"listen: {self.listen} is not a loopback address; set access.allow_clients or "
                "access.proxy_auth_file so the proxy is not open to anyone who can reach it"
            )
        if self.requester is not None and self.mode != "agent":
            raise ConfigError("requester: only in mode agent (a relay must not change the body it forwards)")
        if self.publish.listen is not None:
            if self.signing.key:
                raise ConfigError(
                    "publish.listen: publishing needs the key store (key windows, rotation); "
                    "unset signing.key, or publish that key elsewhere"
                )
            if self.publish.listen == self.listen and not self.listen.endswith(":0"):
                raise ConfigError("publish.listen: must differ from listen (the proxy port)")

    @property
    def data_path(self) -> Path:
        return Path(os.path.expanduser(self.data_dir))

    def with_overrides(self, **changes: Any) -> Config:
        """A copy with top-level or dotted (``signing.key``) values replaced, then validated again."""
        raw = to_plain(self)
        for dotted, value in changes.items():
            node = raw
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node[part]
            node[leaf] = value
        return parse_config(raw)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _positive(value: float, path: str, maximum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        kind = "integer" if isinstance(value, int) else "number"
        raise ConfigError(f"{path}: must be a positive {kind}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{path}: must be at most {maximum}")


def _check_host_pattern(pattern: str, path: str) -> None:
    body = pattern[2:] if pattern.startswith("*.") else pattern
    if not body or any(c in body for c in "*/ @?#"):
        raise ConfigError(f"{path}: host patterns are 'host' or '*.domain', got {pattern!r}")


def host_matches(pattern: str, host: str) -> bool:
    """``*.example.com`` matches any subdomain (not the apex); other patterns match exactly."""
    pattern, host = pattern.lower(), host.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


# --- the generic YAML -> dataclass loader -------------------------------------------------------


def _build(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for candidate in inner[:-1]:  # str | int: the first type the value is
            try:
                return _build(candidate, value, path)
            except ConfigError:
                continue
        return _build(inner[-1], value, path)
    if origin is Literal:
        if value is False and "off" in args:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value not in args:
            raise ConfigError(f"{path}: must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path or 'config'}: must be a mapping")
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - known)
        if unknown:
            where = f"{path}." if path else ""
            raise ConfigError(f"{where}{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        kwargs = {k: _build(hints[k], v, f"{path}.{k}" if path else k) for k, v in value.items()}
        try:
            obj = typing.cast(Any, tp)(**kwargs)
        except TypeError as exc:  # a required member is missing
            raise ConfigError(f"{path or 'config'}: {exc}") from None
        check = getattr(obj, "_check", None)
        if check is not None:
            check(path)
        return obj
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list")
        return tuple(_build(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a mapping")
        return types.MappingProxyType({str(k): _build(args[1], v, f"{path}.{k}") for k, v in value.items()})
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: must be a number")
        return float(value)
    if tp is Any:  # a Struct (ext): JSON data only
        _check_json(value, path)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: must be a string")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug in this module, not in the file


def _check_json(value: Any, path: str) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{path}: JSON member names are strings, got {k!r}")
            _check_json(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise ConfigError(f"{path}: must be JSON data (quote dates and other YAML types), got {value!r}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number")


def parse_config(raw: Any) -> Config:
    """Build a validated Config from parsed YAML (``None`` or ``{}`` gives the defaults)."""
    return typing.cast(Config, _build(Config, raw or {}, ""))


def load_config(path: Path | None) -> Config:
    """Load and validate a YAML file; ``None`` gives the embedded defaults."""
    if path is None:
        return parse_config({})
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    return parse_config(raw)


def to_plain(obj: Any) -> Any:
    """A Config as plain YAML-ready data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def redacted(config: Config) -> dict[str, Any]:
    """The effective configuration with secret-bearing values masked (for ``config check``)."""
    plain: dict[str, Any] = to_plain(config)
    for rule in plain["credentials"]:
        if rule.get("bearer_env"):
            rule["bearer_env"] = f"{rule['bearer_env']} (value not shown)"
    return plain
