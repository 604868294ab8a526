"""Target URIs: parse what arrives, canonicalize once, and send exactly what was signed.

RFC 9421 gives ``@target-uri`` no normalization of its own: a verifier rebuilds it from the
request it receives (RFC 9112 section 3.3). So the agent's proxy canonicalizes the URI once
(lower-case scheme and host, default port omitted, empty path -> ``/``, no userinfo, no fragment)
and puts exactly that on the wire. Path and query are kept byte-for-byte: never decoded, never
re-encoded. What verifies someone else's signature takes the URI as received (``Target.received``)
and, when it forwards, sends that spelling on.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import TypeVar

from .errors import FieldError

__all__ = [
    "DEFAULT_PORTS",
    "LOOPBACK_HOSTS",
    "MISDIRECTED",
    "Target",
    "authority_end",
    "directory_base",
    "ends_in_number",
    "forwarded_target",
    "host_authority",
    "ipv6_text",
    "is_host_name",
    "parse_absolute_uri",
    "parse_authority",
    "parse_received_uri",
    "received_authority",
    "served_authority",
    "spelled",
    "valid_host_field",
]

DEFAULT_PORTS = {"http": 80, "https": 443}
# The names a verifier that builds its origin from Host answers for until it is told its own: a
# signature covers @target-uri, so one made for another origin must not verify there.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
MISDIRECTED = "misdirected-request"  # a Host outside them (RFC 9110 section 15.5.20: 421)
MAX_HOST_CHARS = 253  # RFC 1035 section 2.3.4 (a name in text form, without its trailing dot)
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?", re.IGNORECASE)

# RFC 3986 characters allowed in a request-target on the wire (percent-encoded form), plus '%'.
_TARGET_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~:/?#[]@!$&'()*+,;=%"
)
# RFC 3986 section 2.1: pct-encoded = "%" HEXDIG HEXDIG; a '%' alone makes no URI a verifier can read
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


_T = TypeVar("_T")


def _cached_when_short(max_chars: int, maxsize: int) -> Callable[[Callable[[str], _T]], Callable[[str], _T]]:
    """``functools.lru_cache`` for the calls whose argument is at most ``max_chars`` long; a longer
    one is computed each time. Strangers choose these strings: a cache of ``maxsize`` entries of any
    length could be made to hold megabytes, one of short ones holds little whatever is sent."""

    def wrap(compute: Callable[[str], _T]) -> Callable[[str], _T]:
        cached = functools.lru_cache(maxsize=maxsize)(compute)

        @functools.wraps(compute)
        def call(text: str) -> _T:
            return cached(text) if len(text) <= max_chars else compute(text)

        return call

    return wrap


@dataclass(frozen=True, slots=True)
class Target:
    """A request target in canonical form; ``path_query`` is the origin-form request-target.

    ``received``: the target URI in the spelling a client sent, when that is another spelling of
    ``uri`` (``parse_received_uri``, ``forwarded_target``; for a gateway's backend, ``spelled``: the
    backend's origin with the request target the client sent). It is what ``@target-uri`` covers
    (RFC 9421 section 2.2.2: the target URI as received) and, at a relay or a gateway, what travels
    on (``wire_uri``, ``wire_parts``), so that a signature over it verifies at the next hop as it
    did here. Spellings of one target are equal: ``received`` takes no part in ``==`` or hashing.
    """

    scheme: str
    host: str  # lower-case; IPv6 literals keep their brackets
    port: int
    path_query: str
    received: str | None = field(default=None, compare=False)

    @property
    def authority(self) -> str:
        """Host with the port only when it is not the scheme's default (RFC 9110 section 4.2.3)."""
        if DEFAULT_PORTS.get(self.scheme) == self.port:
            return self.host
        return f"{self.host}:{self.port}"

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.authority}{self.path_query}"

    @property
    def wire_uri(self) -> str:
        """The target URI in the spelling that travels: ``received``, else ``uri``."""
        return self.uri if self.received is None else self.received

    def wire_parts(self) -> tuple[str, str]:
        """The authority (``Host``) and the origin-form request target, in the spelling that travels."""
        if self.received is None:
            return self.authority, self.path_query
        rest = self.received.partition("://")[2]
        cut = authority_end(rest)
        return rest[:cut], rest[cut:]

    @property
    def path(self) -> str:
        return self.path_query.split("?", 1)[0]

    @property
    def query(self) -> str:
        """RFC 9421 ``@query``: with the leading ``?``; ``?`` alone when there is none."""
        _, sep, query = self.path_query.partition("?")
        return "?" + query if sep else "?"

    def with_path_query(self, path_query: str) -> Target:
        return Target(self.scheme, self.host, self.port, canonical_path_query(path_query))


def canonical_path_query(path_query: str) -> str:
    """Drop a fragment and a bare trailing ``?``; empty path -> ``/``; refuse bytes not allowed on a wire."""
    path_query = path_query.split("#", 1)[0]
    if path_query.endswith("?") and path_query.find("?") == len(path_query) - 1:
        path_query = path_query[:-1]  # libraries disagree on an empty query; never send one
        # (only an empty one: the "?" that ends "a=1?" is part of the query a handler reads)
    if not path_query.startswith("/"):
        if path_query.startswith("?") or not path_query:
            path_query = "/" + path_query
        else:
            raise FieldError("malformed-target", "request-target must start with '/'")
    if not _TARGET_CHARS.issuperset(path_query):
        raise FieldError("malformed-target", "request-target has characters that must be percent-encoded")
    if "%" in path_query and _LONE_PERCENT.search(path_query):
        raise FieldError("malformed-target", "request-target has a '%' not followed by two hex digits")
    return path_query


def parse_authority(authority: str, scheme: str) -> tuple[str, int]:
    """Split ``host[:port]`` (IPv6 in brackets) into a lower-case host and a port."""
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]  # userinfo is never sent (RFC 9110 section 4.2.4)
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise FieldError("malformed-target", "unterminated IPv6 literal")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise FieldError("malformed-target", "junk after IPv6 literal")
        port_text = rest[1:]
    else:
        host, _, port_text = authority.partition(":")
    if not _valid_host(host):
        raise FieldError("malformed-target", "missing or invalid host")
    if host.startswith("["):
        host = f"[{ipv6_text(host[1:-1])}]"
    if port_text:
        # leading zeros are digits too (RFC 3986 section 3.2.3): int() reads what follows them, and
        # only five (it refuses more than 4,300 digits with a ValueError, not our FieldError)
        digits = port_text.lstrip("0")
        if (
            not (port_text.isascii() and port_text.isdigit() and len(digits) <= 5)
            or not 0 < int(digits or "0") < 65536
        ):
            raise FieldError("malformed-target", "invalid port")
        port = int(digits)
    else:
        default = DEFAULT_PORTS.get(scheme)
        if default is None:
            raise FieldError("malformed-target", f"no default port for scheme {scheme!r}")
        port = default
    return host.lower(), port


def ipv6_text(address: str) -> str:
    """An IPv6 address (a valid one) in the one text form (RFC 5952 section 4): lower case, no
    leading zeros, the longest run of two or more zero groups as ``::`` (the first of equal runs),
    and in hex throughout, as WHATWG URLs write it (not RFC 5952's dotted IPv4 tail): the form the
    web's verifiers rebuild ``@authority`` in (``[2001:DB8:0:0:0:0:0:1]`` is ``[2001:db8::1]``)."""
    packed = ipaddress.IPv6Address(address).packed
    groups = [packed[i] << 8 | packed[i + 1] for i in range(0, 16, 2)]
    start, length, run = -1, 1, 0  # the longest run of zero groups, if longer than one
    for i, group in enumerate(groups):
        run = run + 1 if group == 0 else 0
        if run > length:
            start, length = i - run + 1, run
    text = [f"{group:x}" for group in groups]
    if start < 0:
        return ":".join(text)
    return ":".join(text[:start]) + "::" + ":".join(text[start + length :])


def received_authority(target: Target) -> str:
    """RFC 9421 ``@authority`` (section 2.2.3) of a target as received (``Target.received``): its
    authority as it arrived in lower case, without userinfo, and without the port when that is the
    scheme's default however it was written (``:443``, ``:0443``: RFC 9110 section 4.2.3); nothing
    else changed (an IPv6 literal stays as the client wrote it)."""
    if target.received is None:
        return target.authority
    authority = target.wire_parts()[0].rpartition("@")[2].lower()
    if target.port == DEFAULT_PORTS[target.scheme]:
        colon = authority.find(":", authority.rfind("]") + 1)  # after an IPv6 literal's brackets
        if colon >= 0:
            authority = authority[:colon]
    return authority


def host_authority(values: Sequence[str]) -> str:
    """The one ``Host`` field value of a request (``values``: every Host line it carries), stripped,
    when it is exactly ``uri-host [ ":" port ]`` (RFC 9110 section 7.2); FieldError ``malformed-host``
    for anything else. A verifier that builds the target URI from Host needs this: a ``/``, ``?``,
    ``#`` or ``@`` riding in it would move the path the signature covers away from the one the
    request goes to."""
    if len(values) != 1:
        raise FieldError("malformed-host", "a request carries one Host")
    authority = values[0].strip(" \t")  # OWS only: str.strip() also took U+00A0 and U+0085
    if not authority or not valid_host_field(authority):
        raise FieldError("malformed-host", "Host must be host[:port]")
    return authority


def served_authority(values: Sequence[str], hosts: AbstractSet[str] | None, setting: str) -> str:
    """The authority of a request's one ``Host`` (``host_authority``: FieldError ``malformed-host``)
    when its name is one of ``hosts`` (lower case; None: any), else FieldError ``misdirected-request``
    naming ``setting``, what tells a verifier its names (never the names themselves)."""
    authority = host_authority(values)
    if hosts is not None and (host := parse_authority(authority, "http")[0]) not in hosts:
        raise FieldError(MISDIRECTED, f"this server does not answer for {host!r} (set {setting})")
    return authority


def is_host_name(host: str) -> bool:
    """Whether ``host`` is a host name or address alone, as a list of the names a verifier answers for
    holds them: no port, no userinfo, not empty (IPv6 in brackets)."""
    try:  # parse_authority drops a port and userinfo, and refuses ""
        return parse_authority(host, "http")[0] == host.lower()
    except FieldError:
        return False


@_cached_when_short(MAX_HOST_CHARS + 8, 256)  # a host and ":port": one per origin a client names
def valid_host_field(value: str) -> bool:
    """Whether a ``Host`` field value is ``uri-host [ ":" port ]``, or empty (RFC 9112 section 3.2:
    what a client sends for a target without an authority); userinfo is no part of it."""
    value = value.strip(" \t")
    if not value:
        return True
    if "@" in value:
        return False
    try:
        parse_authority(value, "http")
    except FieldError:
        return False
    return True


def _valid_host(host: str) -> bool:
    """An IPv6 literal, or a DNS name / IPv4 address: labels of letters, digits, ``-`` and ``_``, none
    empty, at most 63 characters each and 253 in all (RFC 1035 section 2.3.4; the IDNA step of a
    connect refuses anything else, so it is refused here, answered, before any I/O)."""
    if host.startswith("["):
        if "%" in host:  # a zone identifier (Python reads fe80::1%eth0): never meaningful to a peer
            return False
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > MAX_HOST_CHARS:
        return False
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    if ends_in_number(labels[-1]):  # read as IPv4 by the resolver (2130706433, 127.1, 0177.0.0.1 are
        try:  # 127.0.0.1; 010.0.0.1 is 8.0.0.1): only a dotted-quad in decimal names what it says
            ipaddress.IPv4Address(name)
        except ValueError:
            return False
    return True


def ends_in_number(label: str) -> bool:
    """Whether a host's last label "ends in a number" (WHATWG URL): browsers and ``inet_aton`` (the
    resolver) read such a host as an IPv4 address, in decimal, octal or hex, whole or in parts."""
    if label.isdigit():
        return True
    return label[:2].lower() == "0x" and all(c in _HEX_DIGITS for c in label[2:].lower())


_HEX_DIGITS = frozenset("0123456789abcdef")


def authority_end(rest: str) -> int:
    """Where the authority of ``rest`` (a URI after its ``://``) ends: at its first ``/``, ``?`` or ``#``."""
    cut = len(rest)
    for ch in "/?#":
        pos = rest.find(ch)
        if 0 <= pos < cut:
            cut = pos
    return cut


def _parse(uri: str) -> Target:
    """Parse an absolute-form ``http://`` or ``https://`` URI into its canonical Target."""
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in DEFAULT_PORTS:
        raise FieldError("unsupported-scheme", "only absolute http:// and https:// targets are proxied")
    cut = authority_end(rest)
    host, port = parse_authority(rest[:cut], scheme)
    return Target(scheme, host, port, canonical_path_query(rest[cut:]))


# Agents call the same few endpoints, and a Target is immutable: the parses of URIs up to 2,048
# characters are kept, 1,024 at most. A longer URI (a request target may reach
# limits.max_request_line_bytes) is parsed each time, so what the cache holds stays under about
# 5 MiB whatever strangers send and however far the limits are raised.
parse_absolute_uri = _cached_when_short(2048, 1024)(_parse)


def parse_received_uri(uri: str) -> Target:
    """The target of a target URI a verifier received (``scheme://`` + ``Host`` + the request target,
    as they arrived), canonical, carrying ``uri`` as ``received`` when that is another spelling:
    what ``@target-uri`` covers. FieldError as ``parse_absolute_uri``, and ``malformed-target`` for a
    fragment, which no request target carries (RFC 9112 section 3.2)."""
    if "#" in uri:
        raise FieldError("malformed-target", "a request target carries no fragment")
    target = parse_absolute_uri(uri)
    return target if uri == target.uri else replace(target, received=uri)


@_cached_when_short(2048, 1024)  # as parse_absolute_uri: a relay sees the same few URIs, spelled alike
def forwarded_target(uri: str) -> Target:
    """The target of an absolute-form request a relay received (``uri``), keeping its spelling when
    that can travel on unchanged: a lower-case scheme, no userinfo, a path. The relay verifies and
    signs that spelling and sends it on, so a signature over it verifies at the next hop as it did
    at the relay. Another spelling gives the canonical target: a signature over it is refused at
    the relay, as it would be at the next hop. FieldError as ``parse_received_uri``."""
    target = parse_received_uri(uri)
    if target.received is None:
        return target
    authority, path_query = target.wire_parts()
    if not uri.startswith(f"{target.scheme}://") or "@" in authority or not path_query.startswith("/"):
        return parse_absolute_uri(uri)  # the canonical target, already parsed and kept
    return target


def spelled(target: Target, request_target: str) -> Target:
    """``target`` (canonical, built from the origin-form ``request_target``) sent with
    ``request_target`` as received: the path and query byte-for-byte, an empty query kept. A
    fragment, which no request target carries (RFC 9112 section 3.2), leaves the target canonical."""
    if request_target == target.path_query or "#" in request_target:
        return target
    return replace(target, received=f"{target.scheme}://{target.authority}{request_target}")


# RFC 3986 section 2.3: characters a percent-encoding stands for needlessly (section 6.2.2.2)
_UNRESERVED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


# Signature-Agent names the same few directories, request after request: the spellings of bases up
# to 256 characters are kept, 1,024 at most (under 1 MiB with their results, whatever strangers send)
@_cached_when_short(256, 1024)
def directory_base(url: str) -> str:
    """A key directory's base URL (a Signature-Agent value, an issuer) in the one spelling that keys
    its cache, its revocation state and the identity a verifier reports.

    Spellings of one directory are one (RFC 3986 section 6.2.2): scheme and host in lower case, no
    default port, no trailing ``/``, a percent-encoding of an unreserved character decoded and the
    others in upper case. Otherwise ``https://AGENT.example:443`` would be a directory seen for the
    first time, with none of what ``https://agent.example``'s lists revoked (spec: "A revoked
    thumbprint stays revoked"). FieldError ``malformed-signature-agent`` for what names no directory
    base: not http(s), userinfo, a query, a fragment, or a ``.`` or ``..`` segment.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        raise FieldError("malformed-signature-agent", "a key directory's base is an http(s) URL")
    if "?" in rest or "#" in rest:
        raise FieldError("malformed-signature-agent", "a key directory's base has no query or fragment")
    slash = rest.find("/")
    if "@" in (rest if slash < 0 else rest[:slash]):
        raise FieldError("malformed-signature-agent", "a key directory's base names no user (userinfo)")
    try:
        target = _parse(url)  # not kept in the targets' cache
    except FieldError as exc:
        raise FieldError("malformed-signature-agent", f"a key directory's base: {exc.detail}") from None
    path = target.path_query
    if "%" in path:
        path = _PERCENT.sub(_normal_percent, path)
    if any(segment in (".", "..") for segment in path.split("/")):
        raise FieldError("malformed-signature-agent", "a key directory's base has a '.' or '..' segment")
    return f"{target.scheme}://{target.authority}{path}".rstrip("/")


def _normal_percent(match: re.Match[str]) -> str:
    char = chr(int(match[1], 16))
    return char if char in _UNRESERVED else f"%{match[1].upper()}"
