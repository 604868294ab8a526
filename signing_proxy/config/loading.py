"""Loading a configuration: YAML text, then ``SIGNING_PROXY_*`` environment overrides; and its redacted view.

Precedence: the YAML file, then the environment variables, then command-line flags. A bad variable
is refused with both names, the variable's and the key path's (``SIGNING_PROXY_LISTEN (listen):
must be HOST:PORT``). ``SIGNING_PROXY_CONFIG`` names the file when ``--config`` is not given.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.pkcs11_uri import mask_pin_value
from ..errors import ConfigError
from .build import build, to_plain
from .schema import Config

__all__ = [
    "ENV_CONFIG_FILE",
    "ENV_OVERRIDES",
    "apply_env_overrides",
    "load_config",
    "parse_config",
    "redacted",
]

ENV_CONFIG_FILE = "SIGNING_PROXY_CONFIG"

# variable -> (dotted key path, is a comma-separated list)
ENV_OVERRIDES: dict[str, tuple[str, bool]] = {
    "SIGNING_PROXY_MODE": ("mode", False),
    "SIGNING_PROXY_LISTEN": ("listen", False),
    "SIGNING_PROXY_DATA_DIR": ("data_dir", False),
    "SIGNING_PROXY_KEY": ("signing.key", False),
    "SIGNING_PROXY_LABEL": ("signing.label", False),
    "SIGNING_PROXY_SIGNATURE_AGENT": ("signing.signature_agent", False),
    "SIGNING_PROXY_PUBLISH_LISTEN": ("publish.listen", False),
    "SIGNING_PROXY_PUBLISH_DOMAIN": ("publish.domain", False),
    "SIGNING_PROXY_NEXT_HOP": ("upstream.next_hop", False),
    "SIGNING_PROXY_ADMIN_LISTEN": ("admin.listen", False),
    "SIGNING_PROXY_ADMIN_ALLOW_CLIENTS": ("admin.allow_clients", True),
    "SIGNING_PROXY_ALLOW_CLIENTS": ("access.allow_clients", True),
    "SIGNING_PROXY_PROXY_AUTH_FILE": ("access.proxy_auth_file", False),
    "SIGNING_PROXY_LOG_LEVEL": ("log.level", False),
    "SIGNING_PROXY_LOG_FORMAT": ("log.format", False),
}


def parse_config(raw: Any) -> Config:
    """Build a validated Config from parsed YAML (``None`` or ``{}`` gives the defaults)."""
    return typing.cast(Config, build(Config, raw or {}, ""))


def load_config(path: Path | None) -> Config:
    """Load and validate a YAML file; ``None`` gives the embedded defaults."""
    if path is None:
        return parse_config({})
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # the position only: PyYAML's message quotes the offending line, which may hold a secret
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{path}: not valid YAML{where} ({problem or 'syntax error'})") from None
    return parse_config(raw)


def apply_env_overrides(config: Config, environ: Mapping[str, str]) -> Config:
    """``config`` with every set ``SIGNING_PROXY_*`` variable applied together (some only make sense
    in pairs, like a public ``listen`` with ``allow_clients``); ConfigError names the variable."""
    changes: dict[str, Any] = {}
    by_path: dict[str, str] = {}
    for name, (dotted, is_list) in ENV_OVERRIDES.items():
        raw = environ.get(name)
        if raw is None:
            continue
        changes[dotted] = [item.strip() for item in raw.split(",") if item.strip()] if is_list else raw
        by_path[dotted] = name
    if not changes:
        return config
    try:
        return config.with_overrides(**changes)
    except ConfigError as exc:
        message = str(exc)
        culprit = next((var for path, var in by_path.items() if message.startswith(path)), None)
        names = culprit or ", ".join(by_path.values())
        raise ConfigError(f"{names} ({message})") from None


def redacted(config: Config) -> dict[str, Any]:
    """The effective configuration with secret-bearing values masked (for ``config check``)."""
    plain: dict[str, Any] = to_plain(config)
    for rule in plain["credentials"]:
        if rule.get("bearer_env"):
            rule["bearer_env"] = f"{rule['bearer_env']} (value not shown)"
    token = plain["signing"]["pkcs11"]
    if token.get("pin") is not None:
        token["pin"] = "(not shown)"
    if token.get("pin_env"):
        token["pin_env"] = f"{token['pin_env']} (value not shown)"
    key = plain["signing"].get("key")
    if isinstance(key, str) and "pin-value=" in key.lower():  # RFC 7512 lets a URI carry the PIN
        plain["signing"]["key"] = mask_pin_value(key)
    return plain
