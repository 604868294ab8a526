"""The ``gateway`` section: a verifying reverse proxy in front of a backend (``mode: gateway``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from ..core.errors import FieldError
from ..core.signature_verify import MAX_HOPS
from ..core.uri import LOOPBACK_HOSTS, is_host_name, parse_authority
from ..errors import ConfigError
from .checks import check_origin, check_url, positive, shown
from .masking import STORE_URL, quoted, secret, section

__all__ = ["GatewayConfig", "TrustedIssuer"]

MAX_ISSUER_KEY_GRACE_S = 30 * 86_400  # our bound: a rotated issuer key trusted at most 30 days more
MAX_STRANGER_QUOTA_ROWS = 10_000_000  # our bound on the bound: a few GB of counters
MAX_STRANGER_REPLAY_ROWS = 10_000_000  # our bound on the bound: a few GB of replay rows


def _check_provider(provider: str, path: str) -> None:
    """A provider as the manifest watcher fetches it: a base URL (``http://127.0.0.1:8443``, its
    ``/.well-known/svc.json`` fetched there), or its domain (``pub.example``, a port allowed), fetched
    over https and its manifest's ``domain`` compared with it. Anything else (``pub.example/``, a
    path, a space) never matched any manifest: each fetch failed, and the provider was never checked."""
    authority, scheme = provider, "https"
    if "://" in provider:
        check_url(provider, path, query=False)
        scheme, _, rest = provider.partition("://")
        authority, scheme = rest.split("/", 1)[0], scheme.lower()  # its host and port, checked below
    try:
        parse_authority(authority, scheme)
    except FieldError:
        valid = False
    else:
        valid = "@" not in authority  # userinfo: dropped by the parse, never meant
    if not valid:
        shape = "a provider's domain (pub.example) or base URL (https://pub.example)"
        raise ConfigError(f"{path}: {shape}, got {shown(provider)}")


@section
class TrustedIssuer:
    """One delegation issuer (keyed by its ``iss``): pinned public key files, or its directory base."""

    keys: tuple[str, ...] = ()  # public key files (PEM or JWK), always valid
    directory: str | None = None  # e.g. http://127.0.0.1:8443 (fetched through the egress policy)

    def _check(self, path: str) -> None:
        if bool(self.keys) == (self.directory is not None):
            raise ConfigError(f"{path}: give keys or directory (one of them)")
        check_url(self.directory, f"{path}.directory")


@section
class GatewayConfig:
    upstream: str | None = None  # the backend every verified request goes to: http://127.0.0.1:9000
    max_hops: int | None = None  # signatures in the stack (manifest max_intermediary_hops); None: no cap
    trusted_issuers: Mapping[str, TrustedIssuer] = field(default_factory=dict)
    trusted_issuers_only: bool = False  # true: no directory fetch for an iss not listed above
    # a rotated issuer key still anchors tokens this long after not_after (spec: "typically 24 to 48
    # hours" of rotation grace; we take the lower)
    issuer_key_grace_s: int = 86_400
    understood_extensions: tuple[str, ...] = ()  # ext_critical keys this exchange evaluates
    replay_protection: bool = False  # refuse a signature seen before within its validity
    # counters: sqlite (in data_dir), sqlite:///PATH, redis://host:6379/0 (a password: never shown)
    store: str = secret(STORE_URL, "sqlite")
    # live counters of chains whose issuer is not in trusted_issuers (measured: ~180 bytes each in
    # SQLite, ~350 in Redis: 100,000 is ~18 MB and ~35 MB); a new one past it: 503 quota-store-full
    max_stranger_quota_rows: int = 100_000
    # live replay rows (replay_protection) of requests no trusted issuer vouches for: every request
    # but those carrying a chain from trusted_issuers or signed with a pinned agent key (measured:
    # ~190 bytes each in SQLite, ~340 in Redis: 1,000,000 is ~190 MB and ~340 MB). Each lives its
    # signature's validity plus verify.skew_s: at the agents' default 300 s, 1,000,000 carries ~3,300
    # such requests a second, twice what a gateway process verifies; past it: 503 replay-store-full
    max_stranger_replay_rows: int = 1_000_000
    audience: str | None = None  # this exchange's name in a delegation token's aud
    delegation_leeway_s: int = 0  # clock difference tolerated on a link's exp/nbf
    external_origin: str | None = None  # https://exchange.example when TLS ends in front of us
    # Without external_origin, the Host names a request may carry (any port): a signature covers
    # @target-uri, and one made for another origin must not verify here. Loopback by default.
    hosts: tuple[str, ...] = LOOPBACK_HOSTS
    broker_directories: tuple[str, ...] = ()  # directory bases of the brokers whose labels we accept
    # public key files (PEM or JWK), read as relay.pinned_*_keys are: agents that send an empty
    # Signature-Agent (no key directory: DESIGN 5); brokers known by key, no directory fetch
    pinned_agent_keys: tuple[str, ...] = ()
    pinned_broker_keys: tuple[str, ...] = ()
    # spec rule 7: providers whose svc.json must keep listing exchange_domain (domains, or base URLs)
    providers: tuple[str, ...] = ()
    exchange_domain: str | None = None
    manifest_min_refresh_s: int = 60  # a manifest's max-age is clamped to [min, max]
    manifest_max_refresh_s: int = 86_400

    def _check(self, path: str) -> None:
        check_url(self.upstream, f"{path}.upstream")
        if self.max_hops is not None:
            positive(self.max_hops, f"{path}.max_hops", maximum=MAX_HOPS)  # no verifier takes more
        if not 0 <= self.issuer_key_grace_s <= MAX_ISSUER_KEY_GRACE_S:
            raise ConfigError(f"{path}.issuer_key_grace_s: must be from 0 to {MAX_ISSUER_KEY_GRACE_S}")
        if not 0 <= self.delegation_leeway_s <= 300:
            raise ConfigError(f"{path}.delegation_leeway_s: must be from 0 to 300")
        if not 0 <= self.max_stranger_quota_rows <= MAX_STRANGER_QUOTA_ROWS:
            raise ConfigError(f"{path}.max_stranger_quota_rows: must be from 0 to {MAX_STRANGER_QUOTA_ROWS}")
        if not 0 <= self.max_stranger_replay_rows <= MAX_STRANGER_REPLAY_ROWS:
            raise ConfigError(
                f"{path}.max_stranger_replay_rows: must be from 0 to {MAX_STRANGER_REPLAY_ROWS}"
            )
        store = self.store
        if store != "sqlite" and not store.startswith(("sqlite:///", "redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"{path}.store: sqlite, sqlite:///PATH or a redis:// URL, got {quoted(self, 'store')}"
            )
        check_origin(self.external_origin, f"{path}.external_origin")
        for i, host in enumerate(self.hosts):
            if not is_host_name(host):
                raise ConfigError(f"{path}.hosts[{i}]: a host name or address without a port, got {host!r}")
        for i, provider in enumerate(self.providers):
            _check_provider(provider, f"{path}.providers[{i}]")
        if self.providers and not self.exchange_domain:
            raise ConfigError(f"{path}.exchange_domain: needed to watch providers' manifests")
        positive(self.manifest_min_refresh_s, f"{path}.manifest_min_refresh_s")
        if self.manifest_max_refresh_s < self.manifest_min_refresh_s:
            raise ConfigError(f"{path}.manifest_max_refresh_s: must be at least manifest_min_refresh_s")
        for i, base in enumerate(self.broker_directories):
            check_url(base, f"{path}.broker_directories[{i}]")
