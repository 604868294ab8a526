"""A listen address's HOST is a host name or an IP address (IPv6 in brackets), nothing else: it is
also written into shell lines (``signing-proxy env``) and URLs, and ``x$(touch F)y:8080`` was taken
as a host (``env``'s quoting now holds whatever the host is; this refuses it at the source)."""

from __future__ import annotations

import pytest

from signing_proxy.config import parse_config
from signing_proxy.config.checks import parse_host_port
from signing_proxy.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("[::]:8080", ("::", 8080)),
        ("[::1]:80", ("::1", 80)),
        ("localhost:8080", ("localhost", 8080)),
        ("admin.internal:9090", ("admin.internal", 9090)),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ],
)
def test_a_host_name_or_an_ip_address_is_taken(value: str, parsed: tuple[str, int]) -> None:
    assert parse_host_port(value, "listen") == parsed


@pytest.mark.parametrize(
    "value",
    [
        "x$(touch /tmp/marker)y:8080",
        "a b:80",
        "`id`:80",
        "::1:8080",
        "[127.0.0.1]:80",
        "[name]:80",
        "h;x:80",
        "[fe80::1%$(id)]:80",  # ipaddress takes any zone after %
        "[::1%a b]:80",
    ],
)
def test_anything_else_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"listen": value})
    assert str(caught.value).startswith(
        "listen: HOST must be a host name or an IP address (IPv6 in brackets)"
    )


def test_a_value_with_an_at_sign_is_not_quoted_back() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_host_port("user:secret@host:80", "listen")
    assert "secret" not in str(caught.value)
