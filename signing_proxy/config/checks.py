"""Value checks shared by the configuration sections; each refusal is a ConfigError naming the key path."""

from __future__ import annotations

import ipaddress
import math
import re
from functools import lru_cache

from ..core.errors import FieldError
from ..core.uri import directory_base, ipv6_text, is_host_name, parse_absolute_uri, parse_authority
from ..errors import ConfigError

__all__ = [
    "AGENT_NAME_RE",
    "check_agent_name",
    "check_directory_base",
    "check_host_pattern",
    "check_origin",
    "check_parsed_url",
    "check_url",
    "host_form",
    "host_matches",
    "is_loopback",
    "parse_host_port",
    "positive",
    "shown",
]

AGENT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # one safe path segment, in files and URLs


def parse_host_port(value: str, path: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:8080``) -> (host, port); port 0 picks a free port. HOST is a
    host name or an IP address, nothing else: a listen address is also written into shell lines
    (``signing-proxy env``) and URLs, where anything more could be read as more than a host."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise ConfigError(f"{path}: must be HOST:PORT, got {shown(value)}")
    if not 0 <= int(port) < 65536:
        raise ConfigError(f"{path}: the port must be 1-65535 (0: any free port), got {shown(value)}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not _listen_host(bare, bracketed=bare is not host):
        raise ConfigError(
            f"{path}: HOST must be a host name or an IP address (IPv6 in brackets), got {shown(value)}"
        )
    return bare, int(port)


_ZONE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # an IPv6 zone: an interface name or number (ipaddress takes any)


def _listen_host(host: str, *, bracketed: bool) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return not bracketed and is_host_name(host)
    zone = host.partition("%")[2]
    return bracketed == (address.version == 6) and (not zone or _ZONE.fullmatch(zone) is not None)


def check_agent_name(name: str, path: str) -> None:
    """Refuse an agent name that is not one safe lower-case path segment."""
    if not AGENT_NAME_RE.fullmatch(name):
        raise ConfigError(f"{path}: agent names are 1-63 of a-z 0-9 . _ - starting with a letter or digit")


def check_url(url: str | None, path: str, *, query: bool = True) -> None:
    """Refuse a set value that is not an absolute http(s) URL without a fragment or userinfo (never
    sent: ``user:password@`` was dropped silently, and a refusal quoting it showed the password);
    ``query=False`` refuses a query too (a URL published for others to fetch as it is)."""
    if url is None:
        return
    http = url.startswith(("https://", "http://"))
    if http and "@" in url.split("/", 3)[2]:
        raise ConfigError(f"{path}: an http(s) URL without user:password@ (userinfo is never sent)")
    if (
        not http
        or not url.split("/", 3)[2]
        or not url.isascii()
        or any(c.isspace() or c in '"\\<>#' or (c == "?" and not query) for c in url)
    ):
        raise ConfigError(
            f"{path}: must be an absolute http(s) URL{'' if query else ', no query'}, got {shown(url)}"
        )


def check_origin(url: str | None, path: str) -> None:
    """Refuse a set value that is not an http(s) origin (``https://exchange.example[:port]``, a
    trailing ``/`` allowed): ``check_url``'s rules, then a host and port that parse, and no path.
    A bad port or host passed start-up before, then every request was refused malformed-target."""
    if url is None:
        return
    check_url(url, path, query=False)
    scheme, _, rest = url.partition("://")
    authority, _, tail = rest.partition("/")
    try:
        parse_authority(authority, scheme.lower())
    except FieldError as exc:
        raise ConfigError(f"{path}: an http(s) origin, got {shown(url)} ({exc.detail})") from None
    if tail:
        raise ConfigError(f"{path}: an origin, without a path, got {shown(url)}")


def check_parsed_url(url: str | None, path: str, *, query: bool = True) -> None:
    """Refuse a set value ``check_url`` refuses, or one ``parse_absolute_uri`` does (a port out of
    range, a bad host, a bad ``%`` escape): what the publication listener binds its directory proofs
    to, and what a verifier fetches. ``publish.public_url: https://dir.example:99999`` passed
    ``config check``, then ``run`` died with a traceback (exit 1) building the listener."""
    if url is None:
        return
    check_url(url, path, query=query)
    try:
        parse_absolute_uri(url)
    except FieldError as exc:
        raise ConfigError(f"{path}: an http(s) URL that parses, got {shown(url)} ({exc.detail})") from None


def check_directory_base(url: str | None, path: str) -> None:
    """Refuse a set value no verifier of ours takes as a key directory's base: ``directory_base``,
    where ``parse_signature_agent`` ends (a port out of range, a query, a ``.`` or ``..`` segment, a
    bad ``%`` escape). Such a ``signing.signature_agent`` passed start-up and went out on every
    request, each one then refused ``malformed-signature-agent``. Empty (none sent) is fine."""
    if not url:
        return
    try:
        directory_base(url)
    except FieldError as exc:
        raise ConfigError(
            f"{path}: not a key directory's base URL a verifier accepts, got {shown(url)} ({exc.detail})"
        ) from None


def shown(url: str) -> str:
    """``url`` as a refusal may quote it: never one with an ``@`` (it may hold ``user:password``)."""
    return repr(url) if "@" not in url else "a value not shown (it has an '@')"


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def positive(value: float, path: str, maximum: float | None = None) -> None:
    """Refuse a value that is not a positive finite number (not a bool), or above ``maximum``."""
    # not `value <= 0`: NaN compares false every way, and passed as positive (so did infinity)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        kind = "integer" if isinstance(value, int) else "finite number"
        raise ConfigError(f"{path}: must be a positive {kind}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{path}: must be at most {maximum}")


def check_host_pattern(pattern: str, path: str) -> None:
    """Refuse a host pattern that is neither ``host`` nor ``*.domain``: no port (a pattern names a
    host on every port; ``host:8443`` matched nothing), an IPv6 address only as itself."""
    body = pattern[2:] if pattern.startswith("*.") else pattern
    if (
        not body
        or any(c in body for c in "*/ @?#")
        or ((":" in body or "[" in body) and (pattern.startswith("*.") or _ipv6_pattern(body) is None))
    ):
        shape = "'host' or '*.domain' (no port; an IPv6 address as [::1])"
        raise ConfigError(f"{path}: host patterns are {shape}, got {pattern!r}")


def host_matches(pattern: str, host: str) -> bool:
    """``*.example.com`` matches any subdomain (not the apex); other patterns match exactly. Both in
    the form targets take: lower case, no root dot (``a.example.`` is ``a.example``), an IPv6 literal
    bracketed and canonical (``::1``, ``[0:0::1]`` and ``[::1]`` are one)."""
    pattern = _pattern_form(pattern)
    host = host.lower().removesuffix(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def host_form(host: str) -> str:
    """A host (or a ``*.domain`` pattern) as a target spells its host: lower case, no root dot, an
    IPv6 address, bare or bracketed, in brackets in its one text form (``[0:0::1]`` is ``[::1]``)."""
    host = host.lower().removesuffix(".")
    if ":" in host or "[" in host:
        return _ipv6_pattern(host) or host
    return host


_pattern_form = lru_cache(maxsize=1024)(host_form)  # a configuration's patterns, asked on every request


def _ipv6_pattern(body: str) -> str | None:
    """``body`` (``::1`` or ``[::1]``) as a target's host spells it, or None when it is no IPv6 address."""
    address = body[1:-1] if body.startswith("[") and body.endswith("]") else body
    try:
        return f"[{ipv6_text(address)}]"
    except ValueError:
        return None
