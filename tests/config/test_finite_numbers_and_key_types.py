"""Every number setting is finite, and every key a string, or the configuration is refused by key path.

YAML's ``.nan`` passed every ``positive()`` check (``nan <= 0`` is false): ``timeouts.read_s: .nan``
by SIGHUP broke every connection, ``drain_s: .nan`` crashed SIGTERM, ``.inf`` made the drain
unbounded. A mapping whose keys YAML read as several types (``1:`` beside ``foo:``) failed in
``sorted`` with a TypeError: a traceback from ``config check`` instead of the key path.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import Config, ConfigError, load_config, parse_config
from signing_proxy.config.checks import positive


def float_keys(tp: Any, prefix: str = "") -> Iterator[str]:
    """The dotted paths of the schema's ``float`` settings, through nested sections (optional ones
    too); sections inside lists and mappings are left out (each entry needs its own required keys)."""
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        union = typing.get_origin(hint) in (types.UnionType, typing.Union)
        for candidate in [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]:
            if candidate is float:
                yield path
            elif dataclasses.is_dataclass(candidate):
                yield from float_keys(candidate, f"{path}.")


FLOAT_KEYS = sorted(set(float_keys(Config)))


def nested(path: str, value: object) -> dict[str, Any]:
    name, _, rest = path.partition(".")
    return {name: nested(rest, value) if rest else value}


def test_the_float_keys_are_found_in_the_schema() -> None:
    # the walk reaches the sections of the findings, and an optional one (signing.pkcs11)
    assert {
        "timeouts.read_s",
        "timeouts.drain_s",
        "egress.fetch_timeout_s",
        "signing.pkcs11.timeout_s",
    } <= set(FLOAT_KEYS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("path", FLOAT_KEYS)
def test_every_float_setting_must_be_finite(path: str, value: float) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(nested(path, value))
    assert str(refused.value) == f"{path}: must be a finite number"


TIMEOUTS = [
    "timeouts.connect_s",
    "timeouts.read_s",
    "timeouts.client_idle_s",
    "timeouts.drain_s",
    "egress.fetch_timeout_s",
    "intercept.handshake_timeout_s",
]


@pytest.mark.parametrize("path", TIMEOUTS)
def test_a_timeout_is_at_most_a_day(path: str) -> None:
    """Finite but absurd (a drain of a year, a read timeout in milliseconds typed as seconds)."""
    parse_config(nested(path, 86_400))
    with pytest.raises(ConfigError, match=rf"^{path}: must be at most 86400$"):
        parse_config(nested(path, 86_401))


@pytest.mark.parametrize("text", [".nan", ".NaN", ".inf", "-.inf", "+.inf", "1" + "0" * 400])
def test_a_file_with_a_non_finite_timeout_is_refused_by_key_path(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"timeouts:\n  drain_s: {text}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == f"{path}: timeouts.drain_s: must be a finite number"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -1])
def test_positive_refuses_what_is_not_a_positive_finite_number(value: float) -> None:
    with pytest.raises(ConfigError, match=r"^x\.y: must be a positive"):
        positive(value, "x.y")


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("signing:\n  1: x\n  foo: y\n", "signing: the key 1 is not a string (YAML read it as int)"),
        ("1: x\nfoo: y\n", "config: the key 1 is not a string (YAML read it as int)"),
        (
            "signing:\n  ? null\n  : x\n  label: a\n",
            "signing: the key null is not a string (YAML read it as null)",
        ),
        ("signing:\n  on: x\n", "signing: the key True is not a string (YAML read it as bool)"),
        ("signing:\n  2024-01-01: x\n", "signing: the key is not a string (YAML read it as date)"),
        ("routes:\n  - {prefix: /a, 7: b}\n", "routes[0]: the key 7 is not a string (YAML read it as int)"),
        # a mapping setting: str(key) made 1 the host "1", and `1` beside "1" one key
        (
            "upstream:\n  pin_ca_files:\n    1: /ca.pem\n    '1': /other.pem\n",
            "upstream.pin_ca_files: the key 1 is not a string (YAML read it as int)",
        ),
    ],
    ids=["mixed", "top-level", "null", "bool", "date", "list-entry", "mapping-setting"],
)
def test_a_key_that_is_not_a_string_is_refused_by_key_path(
    tmp_path: Path, yaml_text: str, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == f"{path}: {message}; quote it or remove it"


def test_a_binary_key_is_named_by_its_type_only() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"signing": {b"secret-bytes": "x"}})
    assert (
        str(refused.value)
        == "signing: the key is not a string (YAML read it as bytes); quote it or remove it"
    )
    assert "secret" not in str(refused.value)
