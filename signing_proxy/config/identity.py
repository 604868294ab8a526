"""Configuration sections that say who the proxy is: signing, publication, the Requester and its Delegation.

Frozen dataclasses whose defaults are the embedded defaults; ``_check(path)`` refuses an impossible
value with a ConfigError naming its key path (``config/build.py`` calls it once a section is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ..core.errors import FieldError, KeyFormatError, ManifestError
from ..core.keys import parse_rfc3339
from ..core.manifest import render_agent_manifest
from ..core.requester import (
    REQUESTER_TYPE_DELEGATED,
    TOKEN_FORMAT_JWT,
    check_ext,
    parse_duration_s,
    requester_type_name,
)
from ..core.scopes import scope_segments
from ..core.uri import parse_absolute_uri
from ..errors import ConfigError
from .checks import (
    check_agent_name,
    check_directory_base,
    check_parsed_url,
    check_url,
    parse_host_port,
    positive,
)
from .masking import section
from .pkcs11 import Pkcs11Config, check_pkcs11_key

__all__ = [
    "DEFAULT_REVOCATION_PATH",
    "DIRECTORY_MAX_AGE_RANGE_S",
    "DelegationConfig",
    "PublishConfig",
    "RequesterConfig",
    "SigningConfig",
]

DEFAULT_REVOCATION_PATH = "/.well-known/http-message-signatures-revocations.json"  # our choice
DIRECTORY_MAX_AGE_RANGE_S = (60, 86_400)  # spec: Limits ("minutes to hours")


@section
class SigningConfig:
    # PEM or private JWK file, or a pkcs11: URI; None: the key store <data_dir>/keys/<agent>/
    key: str | None = None
    label: str = "agent"
    signature_agent: str = ""  # directory base URL; "" sends an empty Signature-Agent
    validity_s: int = 300
    agent: str = "default"  # whose key store signs (and is published at the root of publish.listen)
    key_lifetime_s: int = 90 * 86_400  # window of a key the store creates (first run, `keys rotate`)
    pkcs11: Pkcs11Config = field(default_factory=Pkcs11Config)  # module and PIN of token-held keys

    def _check(self, path: str) -> None:
        check_pkcs11_key(self.key, f"{path}.key")
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
        if self.signature_agent:  # sent with every request, and fetched by verifiers: no user:password@
            check_url(self.signature_agent, f"{path}.signature_agent")
            check_directory_base(self.signature_agent, f"{path}.signature_agent")  # as verifiers read it
        positive(self.validity_s, f"{path}.validity_s", maximum=86_400)
        check_agent_name(self.agent, f"{path}.agent")
        positive(self.key_lifetime_s, f"{path}.key_lifetime_s", maximum=3650 * 86_400)
        if self.key_lifetime_s < 3600:
            raise ConfigError(f"{path}.key_lifetime_s: must be at least 3600 (one hour)")


@section
class PublishConfig:
    """The publication listener (directory, svc.json, revocation list); see ``service/publish.py``."""

    listen: str | None = None  # HOST:PORT; None: not served (``signing-proxy publish --out`` still works)
    domain: str | None = None  # the manifest's domain; required to publish
    public_url: str | None = None  # where verifiers reach this listener; None: https://<domain>
    directory_max_age_s: int = 3600  # Cache-Control max-age of the directory and svc.json
    revocation_path: str = DEFAULT_REVOCATION_PATH
    revocation_url: str | None = None  # put in the root directory; None: <public_url><revocation_path>
    agents: tuple[str, ...] = ()  # registry host: these agents' stores served under /agents/<name>/

    def _check(self, path: str) -> None:
        if self.listen is not None:
            parse_host_port(self.listen, f"{path}.listen")
            if self.domain is None:
                raise ConfigError(f"{path}.domain: required when {path}.listen is set (svc.json's domain)")
        if self.domain is not None:
            try:
                render_agent_manifest(self.domain)
            except ManifestError:
                raise ConfigError(f"{path}.domain: must be a domain name, got {self.domain!r}") from None
        for name in ("public_url", "revocation_url"):  # published as they are: no user:password@
            check_parsed_url(getattr(self, name), f"{path}.{name}", query=False)  # and fetched
        low, high = DIRECTORY_MAX_AGE_RANGE_S
        positive(self.directory_max_age_s, f"{path}.directory_max_age_s", maximum=high)
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
            check_agent_name(agent, f"{path}.agents[{i}]")
        if len(set(self.agents)) != len(self.agents):
            raise ConfigError(f"{path}.agents: an agent is listed twice")


@section
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
        check_url(self.revocation_uri, f"{path}.revocation_uri")
        if self.issuer is not None and not self.issuer.strip():
            raise ConfigError(f"{path}.issuer: must be non-empty when set")


@section
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
        for name, what in (("id", "the unique requester identifier"), ("domain", "the requester's domain")):
            if not getattr(self, name).strip():
                raise ConfigError(f"{path}.{name}: required ({what})")
        if any(c.isspace() or c in "/:@?#" for c in self.domain) or not self.domain.isascii():
            raise ConfigError(f"{path}.domain: a domain name such as agent.example, got {self.domain!r}")
        if self.type == "":
            raise ConfigError(f"{path}.type: required (a RequesterType such as REQUESTER_TYPE_AGENT, or 1-5)")
        try:
            kind = requester_type_name(self.type)
        except ValueError as exc:
            raise ConfigError(f"{path}.type: {exc}") from None
        if kind == REQUESTER_TYPE_DELEGATED and self.delegation is None:
            raise ConfigError(f"{path}.delegation: required with type {kind} (the chain it acts under)")
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
            check_url(base, f"{path}.exchanges[{i}]")
            try:
                target = parse_absolute_uri(base)
            except FieldError as exc:
                raise ConfigError(f"{path}.exchanges[{i}]: {exc.detail}: {base!r}") from None
            if "?" in target.path_query:
                raise ConfigError(f"{path}.exchanges[{i}]: a base URL has no query, got {base!r}")
        if len(set(self.exchanges)) != len(self.exchanges):
            raise ConfigError(f"{path}.exchanges: an exchange is listed twice")
