"""Who may use the proxy: client address allow-list and optional Basic proxy authentication."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from pathlib import Path

from ..config import AccessConfig
from ..errors import ConfigError, ProxyError
from .credentials import read_secret_text

__all__ = ["AccessControl"]

_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
PROXY_AUTHENTICATE = ("Proxy-Authenticate", 'Basic realm="signing-proxy", charset="UTF-8"')
MAX_AUTH_FILE_BYTES = 1024 * 1024  # our bound: a file of user:password lines


class AccessControl:
    """Allow-list by CIDR (loopback only when none is configured) and Basic credentials from a file."""

    def __init__(self, config: AccessConfig) -> None:
        nets = [ipaddress.ip_network(c, strict=False) for c in config.allow_clients]
        self._networks = tuple(nets) if nets else _LOOPBACK
        self._credentials: dict[bytes, bytes] = {}
        if config.proxy_auth_file:
            # it holds passwords: owner-only (0600) like a bearer or PIN file, ConfigError otherwise
            text = read_secret_text(
                Path(config.proxy_auth_file).expanduser(),
                "access.proxy_auth_file",
                max_bytes=MAX_AUTH_FILE_BYTES,
                reasons="proxy-auth",
            )
            for number, raw_line in enumerate(text.splitlines(), 1):
                line = raw_line.strip()
                if not line or line.startswith("#"):
                    continue
                user, sep, password = line.partition(":")
                if not sep or not user or not password:
                    raise ConfigError(
                        f"access.proxy_auth_file line {number}: expected user:password",
                        reason="proxy-auth-malformed",
                    )
                self._credentials[user.encode()] = password.encode()
            if not self._credentials:
                raise ConfigError(
                    "access.proxy_auth_file holds no credentials", reason="proxy-auth-malformed"
                )

    @property
    def requires_auth(self) -> bool:
        return bool(self._credentials)

    def client_allowed(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self._networks)

    def check_proxy_auth(self, header: str | None) -> str | None:
        """Return the authenticated user, or raise 407; a no-op when no credentials are configured."""
        if not self._credentials:
            return None
        if header:
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() == "basic":
                try:
                    user, _, password = base64.b64decode(token.strip(), validate=True).partition(b":")
                except (binascii.Error, ValueError):
                    user, password = b"", b""
                expected = self._credentials.get(user, b"\x00" * 32)
                if hmac.compare_digest(expected, password) and user in self._credentials:
                    return user.decode("utf-8", "replace")
        raise ProxyError(
            407, "proxy-auth-required", "valid proxy credentials are required", headers=(PROXY_AUTHENTICATE,)
        )
