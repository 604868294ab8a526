"""Issue 16, item 7 ("Smaller holes") in the configuration: what may listen off loopback.

``listen`` off loopback needs ``access.allow_clients`` (``proxy_auth_file`` adds authentication to
the allow-list, never replaces it); ``admin.listen`` off loopback needs ``admin.allow_clients``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, apply_env_overrides, parse_config


def test_smaller_holes_listen_off_loopback_with_only_proxy_auth_file_is_refused(tmp_path: Path) -> None:
    users = str(tmp_path / "users")
    with pytest.raises(ConfigError) as err:
        parse_config({"listen": "0.0.0.0:8080", "access": {"proxy_auth_file": users}})
    message = str(err.value)
    assert message.startswith("listen: 0.0.0.0:8080 is not a loopback address; set access.allow_clients")
    assert "proxy_auth_file adds authentication to it, never replaces it" in message
    # the allow-list admits the networks; proxy auth is checked on top of it
    config = parse_config(
        {
            "listen": "0.0.0.0:8080",
            "access": {"allow_clients": ["0.0.0.0/0", "::/0"], "proxy_auth_file": users},
        }
    )
    assert config.access.allow_clients == ("0.0.0.0/0", "::/0")
    parse_config({"listen": "127.0.0.1:8080", "access": {"proxy_auth_file": users}})  # loopback: as before


def test_smaller_holes_admin_listen_off_loopback_needs_admin_allow_clients() -> None:
    for listen in ("0.0.0.0:9090", "[::]:9090", "10.1.2.3:9090", "admin.internal:9090"):
        with pytest.raises(ConfigError) as err:
            parse_config({"admin": {"listen": listen}})
        assert str(err.value).startswith(
            f"admin.listen: {listen} is not a loopback address; set admin.allow_clients"
        )
    with pytest.raises(ConfigError, match=r"^admin\.allow_clients\[1\]: not a CIDR"):
        parse_config({"admin": {"listen": "0.0.0.0:9090", "allow_clients": ["10.0.0.0/8", "nowhere"]}})
    config = parse_config({"admin": {"listen": "0.0.0.0:9090", "allow_clients": ["10.0.0.0/8"]}})
    assert config.admin.allow_clients == ("10.0.0.0/8",)
    for listen in ("127.0.0.1:9090", "[::1]:9090", "localhost:9090"):
        assert parse_config({"admin": {"listen": listen}}).admin.allow_clients == ()  # loopback only


def test_smaller_holes_admin_allow_clients_from_the_environment() -> None:
    base = parse_config({})
    with pytest.raises(
        ConfigError, match=r"^SIGNING_PROXY_ADMIN_LISTEN \(admin\.listen: 0\.0\.0\.0:9090 is not"
    ):
        apply_env_overrides(base, {"SIGNING_PROXY_ADMIN_LISTEN": "0.0.0.0:9090"})
    config = apply_env_overrides(
        base,
        {
            "SIGNING_PROXY_ADMIN_LISTEN": "0.0.0.0:9090",
            "SIGNING_PROXY_ADMIN_ALLOW_CLIENTS": "10.0.0.0/8, 192.168.0.0/16",
        },
    )
    assert config.admin.allow_clients == ("10.0.0.0/8", "192.168.0.0/16")
