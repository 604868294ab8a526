"""Configuration: YAML in, frozen dataclasses out; every mistake refused with its key path.

The dataclass defaults below (and in ``identity.py``) *are* the embedded default configuration;
``config/default.yaml`` spells out the same values with comments (a test keeps the two identical).
Unknown keys, wrong types and impossible values raise ``ConfigError("limits.max_body_bytes: must
be a positive integer")`` — never a silent default. Loading a file is ``loading.py``'s.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, cast

from ..core.profiles import member_refusal
from ..core.rotation import ROTATION_MARGIN_S
from ..core.signature_verify import MAX_HOPS, MAX_SKEW_S
from ..core.uri import parse_authority
from ..errors import ConfigError, FieldError
from .build import build, to_plain
from .checks import check_host_pattern, check_url, host_form, is_loopback, parse_host_port, positive, shown
from .gateway import GatewayConfig, TrustedIssuer
from .identity import DelegationConfig, PublishConfig, RequesterConfig, SigningConfig
from .masking import ENV_NAME, secret, section
from .profiles import ProfilesConfig

__all__ = [
    "DISCOVERY_CACHE_MAX_S",
    "AccessConfig",
    "AdminConfig",
    "Config",
    "CredentialRule",
    "DelegationConfig",
    "DiscoveryConfig",
    "EgressConfig",
    "GatewayConfig",
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
    "TrustedIssuer",
    "UpstreamConfig",
    "VerifyConfig",
]


@section
class LimitsConfig:
    """Bounds on what a stranger can make the proxy hold (checked while reading, never after)."""

    max_body_bytes: int = 10 * 1024 * 1024  # one request body (buffered to be digested and signed)
    max_header_bytes: int = 64 * 1024  # one request head: request line and fields together (431)
    max_request_line_bytes: int = 8 * 1024  # the request line's target (414 URI Too Long)
    max_header_fields: int = 256  # field lines in one head, trailers included (431)
    max_response_header_bytes: int = 64 * 1024  # one upstream response head (502 above it)
    max_connections: int = 2048  # client connections at once; above it: 503 and close
    max_buffered_bytes: int = 128 * 1024 * 1024  # request bodies buffered at once, all connections (503)

    def _check(self, path: str) -> None:
        for name in (
            "max_body_bytes",
            "max_header_bytes",
            "max_request_line_bytes",
            "max_header_fields",
            "max_response_header_bytes",
            "max_connections",
            "max_buffered_bytes",
        ):
            positive(getattr(self, name), f"{path}.{name}")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ConfigError(f"{path}.max_buffered_bytes: must be at least limits.max_body_bytes")


MAX_TIMEOUT_S = 86_400  # our choice: a day; a drain or a silence longer than that is a typo


@section
class TimeoutsConfig:
    connect_s: float = 10.0
    read_s: float = 60.0
    client_idle_s: float = 75.0
    drain_s: float = 10.0  # on SIGTERM: stop accepting, let in-flight exchanges finish this long

    def _check(self, path: str) -> None:
        for name in ("connect_s", "read_s", "client_idle_s", "drain_s"):  # read_s: silence, not a
            positive(getattr(self, name), f"{path}.{name}", maximum=MAX_TIMEOUT_S)  # transfer's length


@section
class UpstreamConfig:
    ca_file: str | None = None  # extra CAs trusted for upstream TLS, on top of the system store
    pin_ca_files: Mapping[str, str] = field(default_factory=dict)  # host -> only this CA (``pinned``)
    pool_max_idle_per_host: int = 256  # idle keep-alive connections per origin (each closes after 30 s idle)
    pool_max_idle: int = 1024  # ... and in all: clients choose the origins, so their number is theirs
    next_hop: str | None = None  # a relay every request is sent to, in absolute form (http:// or https://)

    def _check(self, path: str) -> None:
        positive(self.pool_max_idle_per_host, f"{path}.pool_max_idle_per_host")
        positive(self.pool_max_idle, f"{path}.pool_max_idle")
        self.pinned(f"{path}.pin_ca_files")
        if self.next_hop is not None:
            check_url(self.next_hop, f"{path}.next_hop")  # user:password@ would be dropped, never sent
            scheme, sep, rest = self.next_hop.partition("://")
            if not sep or scheme not in ("http", "https") or not rest.strip("/") or "/" in rest.strip("/"):
                raise ConfigError(
                    f"{path}.next_hop: must be http(s)://HOST[:PORT] of a relay, got {shown(self.next_hop)}"
                )

    def pinned(self, path: str = "upstream.pin_ca_files") -> dict[str, str]:
        """``pin_ca_files`` keyed by ``host_form``. ConfigError naming a key that is not one host (a port,
        a pattern, a URL, userinfo, no valid name or address), or two keys for one host (ambiguous)."""
        named: dict[str, str] = {}  # host -> the key naming it
        for key in self.pin_ca_files:
            where = f"{path}[{key!r}]" if "@" not in key else f"{path}[a key with an '@', not shown]"
            text = f"[{key}]" if key.count(":") > 1 and not key.startswith("[") else key  # bare IPv6
            try:
                host = parse_authority(text, "https")[0] if not set("*@/?#") & set(key) else ""
            except FieldError:
                host = ""
            if not host or ":" in (text.partition("]")[2] if text.startswith("[") else text):
                raise ConfigError(
                    f"{where}: must be one host name or IP address (IPv6 as [::1]), pinned on every port: "
                    "no ':PORT', no '*.domain' pattern, no URL, path or userinfo"
                )
            if (host := host_form(host)) in named:
                raise ConfigError(f"{where}: {path}[{named[host]!r}] pins {host} too: keep one")
            named[host] = key
        return {host: self.pin_ca_files[key] for host, key in named.items()}


@section
class VerifyConfig:
    """How every verifier of the package (relay, verify-origin, middleware, gateway) treats strangers."""

    max_validity_s: int = 3600  # our choice (spec silent): expires - created above this is refused
    skew_s: int = 5  # tolerated for a created in the future only, never after expires
    directory_cache_entries: int = 1024  # directories kept (least recently used dropped, pollers with them)
    directory_cache_bytes: int = 8 * 1024 * 1024  # and at most this many bytes of them (memory, as charged)
    negative_cache_entries: int = 4096  # failed fetches remembered (with their reason only)
    keyid_refetch_s: int = 30  # an unknown keyid re-fetches its directory at most this often (rotation)
    # fetches that requests may cause (a directory not cached, a keyid re-fetch), per second and in a
    # burst; past them a request is refused 503 verifier-busy. 0: unbounded (strangers set the rate)
    fetches_per_s: float = 20
    fetch_burst: int = 100
    web_bot_auth: bool | Literal["auto"] = "auto"  # also accept the IETF web-bot-auth profile

    def accepts_web_bot_auth(self, *, gateway: bool) -> bool:
        """Whether a verifier accepts web-bot-auth labels, which bind the authority only, not the
        method, target or body (``web_bot_auth``; ``"auto"``: all but the gateway mode, whose
        backends rely on what it checked: its default is the spec's five components)."""
        return not gateway if self.web_bot_auth == "auto" else self.web_bot_auth

    def _check(self, path: str) -> None:
        for name in ("max_validity_s", "directory_cache_entries", "directory_cache_bytes"):
            positive(getattr(self, name), f"{path}.{name}")
        for name in ("negative_cache_entries", "keyid_refetch_s"):
            positive(getattr(self, name), f"{path}.{name}")
        _check_skew(self.skew_s, f"{path}.skew_s")
        if not 0 <= self.fetches_per_s < float("inf"):
            raise ConfigError(f"{path}.fetches_per_s: must be zero (unbounded) or more")
        positive(self.fetch_burst, f"{path}.fetch_burst")


@section
class EgressConfig:
    """Fetches made on a remote party's word: directories, revocation lists, manifests, exchange endpoints."""

    # CIDRs that may be reached although private, loopback or link-local (also over plain http)
    allow_private: tuple[str, ...] = ()
    fetch_timeout_s: float = 5.0  # the whole fetch of one document, connect included

    def _check(self, path: str) -> None:
        for i, cidr in enumerate(self.allow_private):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(f"{path}.allow_private[{i}]: {cidr!r} is not an address or CIDR") from None
        positive(self.fetch_timeout_s, f"{path}.fetch_timeout_s", maximum=MAX_TIMEOUT_S)


@section
class RelayConfig:
    """A broker hop: verify what arrives, cap the hops, stack our label (spec "Multi-hop forwarding")."""

    verify: bool = True  # never add our label to a stack we did not verify (off only for trusted meshes)
    max_hops: int | None = None  # signatures in the stack including ours; None: no cap of our own
    broker_directories: tuple[str, ...] = ()  # directory bases of brokers before us (their keys live there)
    pinned_agent_keys: tuple[str, ...] = ()  # key files: agents with empty Signature-Agent
    pinned_broker_keys: tuple[str, ...] = ()  # and brokers known by key (PEM, JWK)
    skew_s: int = 5

    def _check(self, path: str) -> None:
        if self.max_hops is not None:
            positive(self.max_hops, f"{path}.max_hops", maximum=MAX_HOPS)  # no verifier takes a longer stack
            if self.max_hops < 2:
                raise ConfigError(f"{path}.max_hops: a relay adds a second signature; must be at least 2")
        for i, base in enumerate(self.broker_directories):
            check_url(base, f"{path}.broker_directories[{i}]")  # userinfo: never fetched (egress)
        _check_skew(self.skew_s, f"{path}.skew_s")


def _check_skew(skew_s: object, path: str) -> None:
    if isinstance(skew_s, bool) or not isinstance(skew_s, int) or not 0 <= skew_s <= MAX_SKEW_S:
        raise ConfigError(f"{path}: must be an integer from 0 to {MAX_SKEW_S}")


@section
class CredentialRule:
    """Inject a bearer credential for matching targets; the secret comes from a file or the environment.

    A token goes only to ``https`` targets unless ``allow_plaintext``, and only to ``ports`` when set:
    a token sent over plain http is a token given to everyone on the path.
    """

    hosts: tuple[str, ...]
    bearer_file: str | None = None  # owner-only (0600), like key files
    bearer_env: str | None = secret(ENV_NAME, None)
    override: bool = False  # replace an Authorization the agent sent (default: keep the agent's)
    allow_plaintext: bool = False  # also send the token to http:// targets (in clear text)
    ports: tuple[int, ...] = ()  # only to these ports (explicit or the scheme's default); empty: any

    def _check(self, path: str) -> None:
        if not self.hosts:
            raise ConfigError(f"{path}.hosts: must list at least one host pattern")
        for i, pattern in enumerate(self.hosts):
            check_host_pattern(pattern, f"{path}.hosts[{i}]")
        if (self.bearer_file is None) == (self.bearer_env is None):
            raise ConfigError(f"{path}: set exactly one of bearer_file or bearer_env")
        for i, port in enumerate(self.ports):
            if not 0 < port < 65536:
                raise ConfigError(f"{path}.ports[{i}]: must be a port number 1-65535, got {port}")

    def refusal(self, scheme: str, port: int) -> str | None:
        """Why this rule's token must not go to a ``scheme`` target on ``port``; None when it may."""
        if scheme != "https" and not self.allow_plaintext:
            return f"the target is {scheme}:// and the rule does not say allow_plaintext: true"
        if self.ports and port not in self.ports:
            return f"port {port} is not in the rule's ports {list(self.ports)}"
        return None


@section
class HostsConfig:
    unsigned: tuple[str, ...] = ()  # host patterns forwarded without signing (internal services)

    def _check(self, path: str) -> None:
        for i, pattern in enumerate(self.unsigned):
            check_host_pattern(pattern, f"{path}.unsigned[{i}]")


@section
class Route:
    """A sidecar route: ``prefix`` on the proxy port maps to ``upstream`` (a base URL)."""

    prefix: str
    upstream: str

    def _check(self, path: str) -> None:
        if not self.prefix.startswith("/") or not self.prefix.endswith("/"):
            raise ConfigError(f"{path}.prefix: must start and end with '/', got {self.prefix!r}")
        check_url(self.upstream, f"{path}.upstream")  # user:password@ would be dropped, never sent
        if not self.upstream.endswith("/"):
            raise ConfigError(f"{path}.upstream: must end in '/', got {shown(self.upstream)}")


def _check_cidrs(cidrs: tuple[str, ...], path: str) -> None:
    for i, cidr in enumerate(cidrs):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"{path}[{i}]: not a CIDR: {cidr!r}") from None


@section
class AccessConfig:
    """Who may use the proxy port: ``allow_clients`` is always the gate; proxy auth is on top of it."""

    allow_clients: tuple[str, ...] = ()  # CIDRs; empty means loopback only
    proxy_auth_file: str | None = None  # lines of "user:password"; required in addition, never instead

    def _check(self, path: str) -> None:
        _check_cidrs(self.allow_clients, f"{path}.allow_clients")


@section
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
            check_host_pattern(pattern, f"{path}.tunnel[{i}]")
        if (self.ca_cert is None) != (self.ca_key is None):
            raise ConfigError(f"{path}: set both ca_cert and ca_key (an operator CA), or neither")
        positive(self.ca_validity_days, f"{path}.ca_validity_days", maximum=3650)
        positive(self.leaf_cache_size, f"{path}.leaf_cache_size")
        positive(self.handshake_timeout_s, f"{path}.handshake_timeout_s", maximum=MAX_TIMEOUT_S)
        for i, entry in enumerate(self.no_proxy):
            if not entry or any(c.isspace() or c in ",'\"$`" for c in entry):
                raise ConfigError(f"{path}.no_proxy[{i}]: must be one host, domain or CIDR, got {entry!r}")


@section
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


@section
class DiscoveryConfig:
    """Following ``403`` + ``X-Content-Rules`` into the publisher's manifest; see ``proxy/discovery.py``."""

    mode: Literal["follow", "off", "passthrough"] = "follow"  # passthrough: edge body kept, Link added
    allow_cross_site: bool = False  # a manifest on another origin (scheme, host, port), via egress policy
    cache_min_s: int = 60  # floor on a manifest's Cache-Control lifetime (no-store included)
    cache_max_s: int = 21_600  # ceiling: six hours
    max_manifest_bytes: int = 65_536
    discover_resources: bool = False  # also POST DiscoverResources at the first DIRECT exchange
    acceptable_restrictions: tuple[RestrictionConfig, ...] = ()

    def _check(self, path: str) -> None:
        if self.cache_min_s < 0:
            raise ConfigError(f"{path}.cache_min_s: must be zero or a positive integer")
        positive(self.cache_max_s, f"{path}.cache_max_s", maximum=DISCOVERY_CACHE_MAX_S)
        if self.cache_min_s > self.cache_max_s:
            raise ConfigError(f"{path}.cache_min_s: must not exceed cache_max_s ({self.cache_max_s})")
        positive(self.max_manifest_bytes, f"{path}.max_manifest_bytes", maximum=16 * 1024 * 1024)


@section
class AdminConfig:
    """``/healthz``, ``/readyz``, ``/metrics`` on a port of their own (probes, scraping)."""

    listen: str | None = None
    allow_clients: tuple[str, ...] = ()  # CIDRs the admin port answers (others: 403); empty: loopback only

    def _check(self, path: str) -> None:
        _check_cidrs(self.allow_clients, f"{path}.allow_clients")
        if self.listen is None:
            return
        host, _port = parse_host_port(self.listen, f"{path}.listen")
        if not is_loopback(host) and not self.allow_clients:
            raise ConfigError(
                f"{path}.listen: {self.listen} is not a loopback address; set {path}.allow_clients (the "
                "CIDRs of the probes and scrapers) so the admin port is not open to anyone who can reach it"
            )


@section
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    access_log: bool = True


@section
class Config:
    mode: Literal["agent", "relay", "gateway"] = "agent"
    listen: str = "127.0.0.1:8080"
    data_dir: str = "~/.local/share/signing-proxy"
    signing: SigningConfig = field(default_factory=SigningConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    credentials: tuple[CredentialRule, ...] = ()
    hosts: HostsConfig = field(default_factory=HostsConfig)
    profiles: ProfilesConfig = field(default_factory=ProfilesConfig)  # signing profile per destination
    routes: tuple[Route, ...] = ()
    access: AccessConfig = field(default_factory=AccessConfig)
    intercept: InterceptConfig = field(default_factory=InterceptConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    egress: EgressConfig = field(default_factory=EgressConfig)
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
            for i, prefix in enumerate(prefixes):  # would Routes.target_for take it? (/r/ never does)
                if reserved.startswith(prefix) or reserved == prefix[:-1]:
                    raise ConfigError(
                        f"routes[{i}].prefix: {prefix!r} collides with the proxy's own {reserved}"
                    )
        if not is_loopback(host) and not self.access.allow_clients:
            # the allow-list is the gate even with proxy auth: without one only loopback is admitted
            raise ConfigError(
                f"listen: {self.listen} is not a loopback address; set access.allow_clients (the CIDRs "
                "that may connect; access.proxy_auth_file adds authentication to it, never replaces it)"
            )
        if self.requester is not None and self.mode != "agent":
            raise ConfigError("requester: only in mode agent (a relay must not change the body it forwards)")
        if self.mode == "gateway" and self.gateway.upstream is None:
            raise ConfigError(
                "gateway.upstream: mode gateway needs the backend's URL (http://127.0.0.1:9000)"
            )
        if self.publish.listen is not None:
            if self.signing.key:
                raise ConfigError(
                    "publish.listen: publishing needs the key store (key windows, rotation); "
                    "unset signing.key, or publish that key elsewhere"
                )
            if self.publish.listen == self.listen and not self.listen.endswith(":0"):
                raise ConfigError("publish.listen: must differ from listen (the proxy port)")
        agent = self.signing.signature_agent
        chooser = _web_member_chooser(self.profiles)
        if chooser is not None and member_refusal(agent) is not None:
            setting, remedy = chooser
            raise ConfigError(
                f"signing.signature_agent: {agent!r} would be sent as a web-bot-auth Signature-Agent "
                f"member {setting}, which the drafts (protocol-02) require to be an https origin "
                f"(https://agent.example) and verifiers otherwise ignore: name the origin serving your "
                f"key directory, or {remedy}"
            )
        outlives = self.publish.directory_max_age_s + ROTATION_MARGIN_S
        if self.signing.key_lifetime_s <= outlives:  # else a rotation cannot publish before use
            raise ConfigError(
                f"signing.key_lifetime_s: {self.signing.key_lifetime_s} s must exceed "
                f"publish.directory_max_age_s + {ROTATION_MARGIN_S} s ({outlives} s): a new key signs "
                "only once every cached copy of the directory holds it, and the old one must last that long"
            )

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
        return cast(Config, build(Config, raw, ""))


def _web_member_chooser(profiles: ProfilesConfig) -> tuple[str, str] | None:
    """The setting that can sign a destination web-bot-auth with a Signature-Agent Dictionary member
    (the setting, and how else to stop it), or None. An origin's challenge retried as web-bot-auth
    (always on) is not one: with no origin to name, that retry is declined (``proxy.challenges``)."""
    if profiles.default == "web-bot-auth":
        return (
            "by profiles.default: web-bot-auth",
            "sign web-bot-auth only under rules with signature_agent: string",
        )
    for i, rule in enumerate(profiles.rules):
        if rule.profile == "web-bot-auth" and rule.signature_agent == "dictionary":
            return (
                f"by profiles.rules[{i}] (web-bot-auth)",
                "give that rule signature_agent: string (the drafts' legacy form)",
            )
    if profiles.learn:
        return (
            "to the hosts profiles.learn: true switches to web-bot-auth",
            "set profiles.learn: false (such a challenge then goes back to the agent)",
        )
    return None
