"""The egress policy: where a fetch made on a remote party's word may go.

Directories, revocation lists, discovery manifests and exchange endpoints are named by strangers
(a ``Signature-Agent``, a directory's ``revocation_url``, an ``X-Content-Rules`` value), so a verifier
that fetched whatever it was told would be a server-side request forgery tool. ``check_url`` refuses
bad shapes without any I/O: not ``https``, userinfo, a fragment (a ``#`` anywhere), a query where the
caller forbids one, a host that is not a plain DNS name or IP literal. ``vet`` resolves the name and
refuses when any address is loopback, private, link-local, shared (CGNAT), multicast, unspecified or
reserved — IPv4 embedded in IPv6 (mapped, NAT64, 6to4) included — unless it lies in ``allow_private``;
plain ``http`` only reaches addresses in ``allow_private`` (local development, tests). ``vet`` returns
the one address to connect to, so nothing resolves the name again between the check and the connect.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Final

from ..config import EgressConfig
from ..core.errors import FieldError
from ..core.uri import DEFAULT_PORTS, Target, canonical_path_query, ends_in_number
from ..errors import ConfigError, EgressError

__all__ = ["MAX_URL_CHARS", "EgressPolicy", "forbidden_class"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Spec silent. 2048 is the common practical URL limit; a directory base or revocation URL is far shorter.
MAX_URL_CHARS: Final = 2048
CHECKED_URLS_MAX: Final = 1024  # check_url's remembered answers (accepted URLs only), oldest dropped first
_MAX_HOST_CHARS: Final = 253  # RFC 1035 section 2.3.4 (255 octets on the wire, 253 as text)
_MAX_LABEL_CHARS: Final = 63  # RFC 1035 section 2.3.4
_LDH: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")  # RFC 1123 section 2.1 host names


def _v4(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def _v6(cidr: str) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network(cidr)


# IANA IPv4 Special-Purpose Address Registry (RFC 6890) plus multicast and class E: never fetched from.
_V4_FORBIDDEN: Final = (
    (_v4("0.0.0.0/8"), "unspecified"),  # "this network" (RFC 791); 0.0.0.0 reaches the local host
    (_v4("10.0.0.0/8"), "private"),  # RFC 1918
    (_v4("100.64.0.0/10"), "shared (CGNAT)"),  # RFC 6598
    (_v4("127.0.0.0/8"), "loopback"),  # RFC 1122
    (_v4("169.254.0.0/16"), "link-local"),  # RFC 3927; cloud metadata services live here
    (_v4("172.16.0.0/12"), "private"),  # RFC 1918
    (_v4("192.0.0.0/24"), "reserved"),  # RFC 6890 IETF protocol assignments
    (_v4("192.0.2.0/24"), "documentation"),  # RFC 5737 TEST-NET-1
    (_v4("192.88.99.0/24"), "reserved"),  # RFC 7526 deprecated 6to4 relay anycast
    (_v4("192.168.0.0/16"), "private"),  # RFC 1918
    (_v4("198.18.0.0/15"), "benchmarking"),  # RFC 2544
    (_v4("198.51.100.0/24"), "documentation"),  # RFC 5737 TEST-NET-2
    (_v4("203.0.113.0/24"), "documentation"),  # RFC 5737 TEST-NET-3
    (_v4("224.0.0.0/4"), "multicast"),  # RFC 5771
    (_v4("240.0.0.0/4"), "reserved"),  # RFC 1112 class E, with 255.255.255.255 (broadcast)
)
# IANA IPv6 Special-Purpose Address Registry (RFC 6890), first match wins; the catch-all is below.
_V6_FORBIDDEN: Final = (
    (_v6("::/128"), "unspecified"),  # RFC 4291
    (_v6("::1/128"), "loopback"),  # RFC 4291
    (_v6("::/96"), "reserved"),  # RFC 4291 section 2.5.5.1 IPv4-compatible: deprecated, never used
    (_v6("::ffff:0:0:0/96"), "reserved"),  # RFC 2765 IPv4-translated (SIIT)
    (_v6("64:ff9b:1::/48"), "private"),  # RFC 8215 local-use NAT64
    (_v6("100::/64"), "reserved"),  # RFC 6666 discard-only
    (_v6("2001:db8::/32"), "documentation"),  # RFC 3849
    (_v6("2001::/23"), "reserved"),  # RFC 2928 IETF protocol assignments: Teredo, ORCHID, benchmarking
    (_v6("3fff::/20"), "documentation"),  # RFC 9637
    (_v6("fc00::/7"), "private"),  # RFC 4193 unique local
    (_v6("fe80::/10"), "link-local"),  # RFC 4291
    (_v6("fec0::/10"), "private"),  # RFC 3879 deprecated site-local
    (_v6("ff00::/8"), "multicast"),  # RFC 4291
)
_V6_GLOBAL_UNICAST: Final = _v6("2000::/3")  # RFC 4291 section 2.4: the rest is unassigned or reserved
_NAT64: Final = _v6("64:ff9b::/96")  # RFC 6052 well-known prefix: the last 32 bits are an IPv4 address


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address carries to its destination (mapped, NAT64, 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    return None


def forbidden_class(ip: IPAddress) -> str | None:
    """Why ``ip`` is never fetched from ("loopback", "private", …), or None for a public address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return next((name for net, name in _V4_FORBIDDEN if ip in net), None)
    embedded = _embedded_v4(ip)
    if embedded is not None:
        kind, v4 = embedded
        inner = forbidden_class(v4)
        return f"{kind} {inner}" if inner is not None else None
    for net, name in _V6_FORBIDDEN:
        if ip in net:
            return name
    return None if ip in _V6_GLOBAL_UNICAST else "reserved"


def _host(host: str) -> IPAddress | None:
    """Validate a lower-case URL host: an IP literal (returned) or an LDH DNS name (None); else raise."""
    if host.startswith("["):
        if not host.endswith("]") or "%" in host:  # zone identifiers name this host's interfaces
            raise EgressError("egress-host", "an IPv6 literal must be [address] without a zone")
        try:
            return ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise EgressError("egress-host", "not a valid IPv6 literal") from None
    if not host or len(host) > _MAX_HOST_CHARS:
        raise EgressError("egress-host", "the host is empty or longer than 253 characters")
    labels = host.split(".")
    for label in labels:
        if not 0 < len(label) <= _MAX_LABEL_CHARS or not _LDH.issuperset(label):
            raise EgressError(
                "egress-host", "the host must be letters, digits and hyphens in dot-separated labels of 1-63"
            )
        if label[0] == "-" or label[-1] == "-":
            raise EgressError("egress-host", "a host label may not start or end with a hyphen")
    if ends_in_number(labels[-1]):
        try:
            return ipaddress.IPv4Address(host)  # dotted-quad decimal only: no octal, hex or short forms
        except ValueError:
            raise EgressError("egress-host", "a numeric host must be a dotted-quad IPv4 address") from None
    return None


def _authority(authority: str, scheme: str) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        host, rest = (authority, "") if end < 0 else (authority[: end + 1], authority[end + 1 :])
    else:
        host, colon, port_text = authority.partition(":")
        rest = colon + port_text
    if not rest:
        return host.lower(), DEFAULT_PORTS[scheme]
    port_text = rest[1:]
    if rest[0] != ":" or not (port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536):
        raise EgressError("egress-host", "the port must be a number from 1 to 65535")
    return host.lower(), int(port_text)


class EgressPolicy:
    """Decides whether, and at which address, a URL named by a remote party may be fetched."""

    __slots__ = ("_checked", "allow_private")

    def __init__(self, allow_private: Sequence[str] = ()) -> None:
        if isinstance(allow_private, str):
            raise ConfigError("allow_private: a list of CIDRs, not a single string")
        nets: list[Network] = []
        for i, cidr in enumerate(allow_private):
            try:
                nets.append(ipaddress.ip_network(cidr, strict=False))  # as config/schema.py accepts them
            except (TypeError, ValueError):
                raise ConfigError(f"allow_private[{i}]: {cidr!r} is not an address or CIDR") from None
        self.allow_private: tuple[Network, ...] = tuple(nets)
        # check_url is a pure function of the URL under a fixed policy: a verifier asks it about the
        # same Signature-Agent on every request, so accepted URLs are remembered (bounded)
        self._checked: dict[tuple[str, bool], Target] = {}

    @classmethod
    def from_config(cls, config: EgressConfig) -> EgressPolicy:
        """The policy of an ``egress:`` configuration section."""
        return cls(config.allow_private)

    def __repr__(self) -> str:
        return f"EgressPolicy(allow_private={[str(n) for n in self.allow_private]!r})"

    def listed(self, ip: IPAddress) -> bool:
        """Whether ``ip`` (or the IPv4 address it maps, ``::ffff:a.b.c.d``) lies in ``allow_private``."""
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return any(ip in net or (mapped is not None and mapped in net) for net in self.allow_private)

    def check_url(self, url: str, *, allow_query: bool = True) -> Target:
        """The canonical target of ``url`` if its shape may be fetched (no I/O); raises ``EgressError``.

        ``allow_query=False`` is for ``Signature-Agent`` bases, to which a suffix is appended.
        """
        known = self._checked.get((url, allow_query)) if isinstance(url, str) else None
        if known is not None:
            return known
        target = self._check_url(url, allow_query)
        checked = self._checked
        if len(checked) >= CHECKED_URLS_MAX:
            del checked[next(iter(checked))]
        checked[url, allow_query] = target
        return target

    def _check_url(self, url: str, allow_query: bool) -> Target:
        if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
            raise EgressError("egress-url", f"the URL must be a string of at most {MAX_URL_CHARS} characters")
        if "#" in url:  # '…/role#' would turn the appended well-known suffix into a fragment
            raise EgressError("egress-fragment", "the URL may not contain '#'")
        if not (url.isascii() and url.isprintable()) or " " in url:  # "!" to "~" only, in C
            raise EgressError("egress-url", "the URL has whitespace, control or non-ASCII characters")
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in DEFAULT_PORTS:
            raise EgressError("egress-scheme", "only https:// URLs are fetched")
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority, path_query = rest[:cut], rest[cut:]
        if "@" in authority:
            raise EgressError("egress-userinfo", "the URL may not carry userinfo (user:password@)")
        host, port = _authority(authority, scheme)
        ip = _host(host)
        if "?" in path_query and not allow_query:
            raise EgressError("egress-query", "this URL may not carry a query ('?')")
        try:
            target = Target(scheme, host, port, canonical_path_query(path_query))
        except FieldError as exc:
            raise EgressError(
                "egress-url", f"the path is not a valid request-target ({exc.detail})"
            ) from None
        if ip is not None:
            self._admit(target, (ip,), literal=True)
        elif scheme == "http" and not self.allow_private:
            raise EgressError("egress-scheme", _HTTP_ONLY_LISTED)  # no address can be listed: no I/O needed
        return target

    async def vet(self, target: Target) -> str:
        """Resolve ``target.host`` and return the address to connect to; raises ``EgressError``.

        Every resolved address must pass (one bad address refuses the name); the first in resolver order
        is returned, and the caller connects to it only, never resolving the name again.
        """
        if target.scheme not in DEFAULT_PORTS:
            raise EgressError("egress-scheme", "only https:// URLs are fetched")
        ip = _host(target.host)
        if ip is not None:
            self._admit(target, (ip,), literal=True)
            return str(ip)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (OSError, UnicodeError, ValueError):
            raise EgressError("egress-unresolvable", f"{target.host}: the name does not resolve") from None
        texts = list(
            dict.fromkeys(
                str(sockaddr[0])
                for family, *_, sockaddr in infos
                if family in (socket.AF_INET, socket.AF_INET6)
            )
        )
        if not texts:
            raise EgressError("egress-unresolvable", f"{target.host}: the name has no IPv4 or IPv6 address")
        try:
            ips = [ipaddress.ip_address(text) for text in texts]
        except ValueError:
            raise EgressError("egress-address", f"{target.host}: resolves to an unusable address") from None
        self._admit(target, ips, literal=False)
        return texts[0]

    def _admit(self, target: Target, ips: Iterable[IPAddress], *, literal: bool) -> None:
        """Refuse forbidden addresses not listed, then plain http to any address not listed."""
        ips = tuple(ips)
        for ip in ips:
            kind = None if self.listed(ip) else forbidden_class(ip)
            if kind is not None:
                # the class, never the address list: callers may show details to the remote party
                verb = "is" if literal else "resolves to"
                raise EgressError(
                    "egress-address", f"{target.host} {verb} a {kind} address not in allow_private"
                )
        if target.scheme == "http" and not all(self.listed(ip) for ip in ips):
            raise EgressError("egress-scheme", _HTTP_ONLY_LISTED)


_HTTP_ONLY_LISTED: Final = "plain http:// is fetched only from addresses in allow_private; use https://"
