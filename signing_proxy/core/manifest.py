"""The participant manifest served at ``/.well-known/svc.json`` (message WellKnownManifest), sans-IO.

``parse_manifest`` reads ``ver`` before any other member (spec "Versioning" 2): an absent,
malformed or unknown-major ``ver`` refuses the manifest whatever else is wrong, and any minor of
major 1 is accepted. It then checks role, domain (against the host that served it), the publisher's
authorized exchanges and catalog contributors, and keeps members it does not know (such as the
exchange-only capability fields) uninterpreted in ``extra``. Every refusal is a ``ManifestError``
with a stable ``manifest-*`` reason. ``manifest_address`` turns an ``X-Content-Rules`` value into
the address to fetch, and ``render_agent_manifest`` emits our own three-member agent manifest.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from .errors import FieldError, ManifestError
from .uri import parse_absolute_uri, parse_authority

__all__ = [
    "MANIFEST_MAX_BYTES",
    "MANIFEST_MAX_ENTRIES",
    "MANIFEST_MEDIA_TYPE",
    "MANIFEST_PATH",
    "MANIFEST_VERSION",
    "AuthorizedExchange",
    "CatalogContributor",
    "ProviderRelationship",
    "Role",
    "WellKnownManifest",
    "manifest_address",
    "parse_manifest",
    "render_agent_manifest",
    "same_site",
]

MANIFEST_PATH = "/.well-known/svc.json"  # spec: Manifest
MANIFEST_VERSION = "1.0"  # spec: Versioning 1
MANIFEST_MEDIA_TYPE = "application/json"  # spec: Resources ("Wire encoding ... is proto-JSON (JSON)")
MANIFEST_MAX_BYTES = 64 * 1024  # our choice: the spec gives no body-size limit
MANIFEST_MAX_ENTRIES = 1024  # our choice: bound on exchanges and on catalog_contributors
_SUPPORTED_MAJOR = 1  # spec: Versioning 2 (a recognised major is accepted whatever the minor)

# MAJOR.MINOR in ASCII digits, no sign, no leading zeros (one spelling per version), bounded length.
_VERSION = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_KNOWN = ("ver", "role", "domain", "contact", "exchanges", "catalog_contributors", "ext")
_AGENT_MEMBERS = frozenset({"ver", "role", "domain"})


class Role(IntEnum):
    """Participant role (spec "Manifest", enum Role)."""

    ROLE_UNSPECIFIED = 0
    ROLE_AGENT = 1
    ROLE_EXCHANGE = 2
    ROLE_BROKER = 3
    ROLE_PUBLISHER = 4


class ProviderRelationship(IntEnum):
    """A publisher's relationship with an authorized exchange; JSON ``DIRECT`` or ``RESELLER``."""

    PROVIDER_RELATIONSHIP_UNSPECIFIED = 0
    PROVIDER_RELATIONSHIP_DIRECT = 1
    PROVIDER_RELATIONSHIP_RESELLER = 2

    @property
    def json_value(self) -> str:
        """The spec's JSON value: ``DIRECT`` or ``RESELLER``."""
        return self.name.removeprefix("PROVIDER_RELATIONSHIP_")


@dataclass(frozen=True)
class AuthorizedExchange:
    """An exchange the publisher authorizes to sell its resources."""

    domain: str
    endpoint: str
    relationship: ProviderRelationship


@dataclass(frozen=True)
class CatalogContributor:
    """A third party authorized to push catalog metadata; ``relationship`` is free text."""

    domain: str
    relationship: str


@dataclass(frozen=True)
class WellKnownManifest:
    """A parsed manifest; ``ext`` is the ``ext`` Struct, ``extra`` every member we do not interpret."""

    ver: str
    role: Role
    domain: str
    contact: str | None = None
    exchanges: tuple[AuthorizedExchange, ...] = ()
    catalog_contributors: tuple[CatalogContributor, ...] = ()
    ext: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def version(self) -> tuple[int, int]:
        """``(major, minor)`` of ``ver``."""
        major, minor = self.ver.split(".")
        return int(major), int(minor)

    def authorizes(self, exchange_domain: str) -> AuthorizedExchange | None:
        """The entry authorizing this exchange domain (case-insensitive), if any."""
        wanted = _host_key(exchange_domain)
        return next((x for x in self.exchanges if _host_key(x.domain) == wanted), None)


# --------------------------------------------------------------------------------------------
# Helpers


class _Obj(dict[str, Any]):
    """A JSON object that remembers member names it saw more than once."""

    dups: tuple[str, ...] = ()


def _load_json(body: bytes, max_bytes: int) -> tuple[Any, bool]:
    """UTF-8 JSON without NaN/Infinity; returns the value and whether any object repeated a name.

    Duplicate names are reported, not raised, so that ``ver`` can still be judged first.
    """
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ManifestError("manifest-malformed", "manifest body must be bytes")
    if len(body) > max_bytes:
        raise ManifestError("manifest-too-large", f"manifest is larger than {max_bytes} bytes")
    seen_dup = False

    def pairs(items: list[tuple[str, Any]]) -> _Obj:
        nonlocal seen_dup
        out = _Obj()
        dups: list[str] = []
        for name, value in items:
            if name in out:
                dups.append(name)
            out[name] = value
        if dups:
            seen_dup = True
            out.dups = tuple(dups)
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        doc = json.loads(bytes(body).decode("utf-8"), object_pairs_hook=pairs, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError("manifest-malformed", "manifest is not UTF-8 JSON") from exc
    return doc, seen_dup


def _host_key(value: str) -> str | None:
    """Lower-case ASCII host, port and one trailing dot removed; None when not a host name or IP."""
    if not isinstance(value, str) or not value or "@" in value or any(c.isspace() for c in value):
        return None
    try:
        host, _port = parse_authority(value, "https")
    except FieldError:
        return None
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        return host
    host = host.removesuffix(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.split(".")):
        return None
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _http_url(value: object) -> str | None:
    """The canonical form of an absolute http(s) URL, or None."""
    if not isinstance(value, str) or not value.isascii() or any(c.isspace() for c in value):
        return None
    try:
        return parse_absolute_uri(value).uri
    except FieldError:
        return None


def _parse_version(doc: Mapping[str, Any]) -> str:
    if "ver" not in doc:
        raise ManifestError("manifest-version-missing", "member 'ver' is required and is read first")
    ver = doc["ver"]
    if "ver" in getattr(doc, "dups", ()):
        raise ManifestError("manifest-version-malformed", "member 'ver' appears more than once")
    if not isinstance(ver, str):
        raise ManifestError("manifest-version-malformed", f"ver must be a string such as '1.0', not {ver!r}")
    match = _VERSION.fullmatch(ver)
    if match is None:
        raise ManifestError("manifest-version-malformed", f"ver {ver!r} is not MAJOR.MINOR")
    if int(match.group(1)) != _SUPPORTED_MAJOR:
        raise ManifestError("manifest-version-unsupported", f"major version of {ver!r} is not 1")
    return ver


def _parse_role(value: object) -> Role:
    if isinstance(value, bool):
        raise ManifestError("manifest-unknown-role", f"role {value!r}")
    if isinstance(value, int):
        try:
            role = Role(value)
        except ValueError:
            raise ManifestError("manifest-unknown-role", f"role {value!r}") from None
    elif isinstance(value, str):
        if value not in Role.__members__:
            raise ManifestError("manifest-unknown-role", f"role {value!r}")
        role = Role[value]
    elif value is None:
        role = Role.ROLE_UNSPECIFIED
    else:
        raise ManifestError("manifest-unknown-role", f"role {value!r}")
    if role is Role.ROLE_UNSPECIFIED:
        raise ManifestError("manifest-missing-role", "role is required and must not be ROLE_UNSPECIFIED")
    return role


def _parse_relationship(value: object, where: str) -> ProviderRelationship:
    rel: ProviderRelationship | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        if value in tuple(ProviderRelationship):
            rel = ProviderRelationship(value)
    elif isinstance(value, str):
        name = value if value.startswith("PROVIDER_RELATIONSHIP_") else "PROVIDER_RELATIONSHIP_" + value
        if name in ProviderRelationship.__members__:
            rel = ProviderRelationship[name]
    elif value is None:
        rel = ProviderRelationship.PROVIDER_RELATIONSHIP_UNSPECIFIED
    if rel is None:
        raise ManifestError("manifest-unknown-relationship", f"{where}: relationship {value!r}")
    if rel is ProviderRelationship.PROVIDER_RELATIONSHIP_UNSPECIFIED:
        raise ManifestError("manifest-bad-exchange", f"{where}: relationship is required")
    return rel


def _entries(doc: Mapping[str, Any], name: str, max_entries: int) -> list[Any]:
    value = doc.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError("manifest-malformed", f"member {name!r} must be an array")
    if len(value) > max_entries:
        raise ManifestError("manifest-too-large", f"more than {max_entries} entries in {name!r}")
    return value


def _parse_exchange(entry: object, where: str) -> AuthorizedExchange:
    if not isinstance(entry, Mapping):
        raise ManifestError("manifest-bad-exchange", f"{where} must be an object")
    domain, endpoint = entry.get("domain"), entry.get("endpoint")
    if not isinstance(domain, str) or _host_key(domain) is None:
        raise ManifestError("manifest-bad-exchange", f"{where}.domain must be a domain name")
    if not isinstance(endpoint, str) or _http_url(endpoint) is None:
        raise ManifestError("manifest-bad-exchange", f"{where}.endpoint must be an absolute http(s) URL")
    return AuthorizedExchange(domain, endpoint, _parse_relationship(entry.get("relationship"), where))


def _parse_contributor(entry: object, where: str) -> CatalogContributor:
    if not isinstance(entry, Mapping):
        raise ManifestError("manifest-bad-catalog-contributor", f"{where} must be an object")
    domain, relationship = entry.get("domain"), entry.get("relationship")
    if not isinstance(domain, str) or _host_key(domain) is None:
        raise ManifestError("manifest-bad-catalog-contributor", f"{where}.domain must be a domain name")
    if not isinstance(relationship, str) or not relationship:
        raise ManifestError("manifest-bad-catalog-contributor", f"{where}.relationship is required")
    return CatalogContributor(domain, relationship)


# --------------------------------------------------------------------------------------------
# Parse and render


def parse_manifest(
    body: bytes,
    *,
    served_host: str | None,
    max_bytes: int = MANIFEST_MAX_BYTES,
    max_entries: int = MANIFEST_MAX_ENTRIES,
    strict_agent: bool = False,
) -> WellKnownManifest:
    """Parse and check a manifest; ``served_host`` is the host it was fetched from (None: unchecked).

    An agent manifest's members other than ``ver``, ``role``, ``domain`` go to ``extra`` unread, or
    are refused with ``manifest-agent-extra-fields`` when ``strict_agent`` is set.
    """
    doc, duplicates = _load_json(body, max_bytes)
    if not isinstance(doc, dict):
        raise ManifestError("manifest-malformed", "a manifest is a JSON object")
    ver = _parse_version(doc)  # spec: Versioning 2 -- before any other member
    if duplicates:
        raise ManifestError("manifest-malformed", "a member name appears more than once in one object")

    role = _parse_role(doc.get("role"))
    domain = doc.get("domain")
    if domain is None or domain == "":
        raise ManifestError("manifest-missing-domain", "member 'domain' is required")
    if not isinstance(domain, str) or _host_key(domain) is None:
        raise ManifestError("manifest-bad-domain", f"domain {domain!r} is not a domain name")
    if served_host is not None:
        served = _host_key(served_host)
        if served is None:
            raise ValueError(f"served_host {served_host!r} is not a host")
        if _host_key(domain) != served:
            raise ManifestError("manifest-domain-mismatch", f"domain {domain!r} but served by {served!r}")

    if role is Role.ROLE_AGENT:
        others = {k: v for k, v in doc.items() if k not in _AGENT_MEMBERS}
        if others and strict_agent:
            raise ManifestError("manifest-agent-extra-fields", f"an agent manifest carries {sorted(others)}")
        return WellKnownManifest(ver, role, domain, extra=MappingProxyType(others))

    contact = doc.get("contact")
    if contact is not None and not isinstance(contact, str):
        raise ManifestError("manifest-malformed", "member 'contact' must be a string")
    exchanges = tuple(
        _parse_exchange(e, f"exchanges[{i}]") for i, e in enumerate(_entries(doc, "exchanges", max_entries))
    )
    if role is Role.ROLE_PUBLISHER and not exchanges:
        raise ManifestError("manifest-missing-exchanges", "a publisher manifest must list its exchanges")
    contributors = tuple(
        _parse_contributor(c, f"catalog_contributors[{i}]")
        for i, c in enumerate(_entries(doc, "catalog_contributors", max_entries))
    )
    ext = doc.get("ext")
    if ext is not None and not isinstance(ext, dict):
        raise ManifestError("manifest-malformed", "member 'ext' must be an object")
    extra = {k: v for k, v in doc.items() if k not in _KNOWN}
    return WellKnownManifest(
        ver=ver,
        role=role,
        domain=domain,
        contact=contact or None,
        exchanges=exchanges,
        catalog_contributors=contributors,
        ext=MappingProxyType(dict(ext or {})),
        extra=MappingProxyType(extra),
    )


def render_agent_manifest(domain: str) -> bytes:
    """Our agent manifest: exactly ``ver``, ``role``, ``domain`` in that order, compact JSON."""
    if _host_key(domain) is None:
        raise ManifestError("manifest-bad-domain", f"domain {domain!r} is not a domain name")
    doc = {"ver": MANIFEST_VERSION, "role": Role.ROLE_AGENT.name, "domain": domain}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii")


# --------------------------------------------------------------------------------------------
# Discovery


def manifest_address(x_content_rules: str, origin: str) -> str:
    """Where to fetch the manifest after a 403: the header value when it is an absolute http(s) URL
    (bare, in double quotes or in angle brackets), otherwise ``{origin}/.well-known/svc.json``."""
    value = x_content_rules.strip()
    if len(value) >= 2 and (value[0], value[-1]) in (('"', '"'), ("<", ">")):
        value = value[1:-1].strip()
    url = _http_url(value)
    if url is not None:
        return url
    try:
        target = parse_absolute_uri(origin)
    except FieldError as exc:
        raise ValueError(f"origin {origin!r} is not an absolute http(s) URL") from exc
    return f"{target.scheme}://{target.authority}{MANIFEST_PATH}"


def same_site(url_a: str, url_b: str) -> bool:
    """Approximate "same registrable domain" without a public-suffix list: the hosts are equal, or
    one host lies within (or equals) the other's parent domain when that parent has at least two
    labels (``a.pub.example`` ~ ``b.pub.example`` ~ ``pub.example``). IP literals match only
    themselves; scheme and port are ignored."""
    host_a = _host_key(_url_host(url_a))
    host_b = _host_key(_url_host(url_b))
    if host_a is None or host_b is None:
        return False
    if host_a == host_b:
        return True
    if _is_ip(host_a) or _is_ip(host_b):
        return False
    return _within_parent(host_a, host_b) or _within_parent(host_b, host_a)


def _url_host(url: str) -> str:
    try:
        return parse_absolute_uri(url).host
    except FieldError:
        return ""


def _within_parent(host: str, other: str) -> bool:
    labels = other.split(".")
    if len(labels) < 3:
        return False
    parent = ".".join(labels[1:])
    return host == parent or host.endswith("." + parent)
