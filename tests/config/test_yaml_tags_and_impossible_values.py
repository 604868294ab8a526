"""Explicit YAML tags, and values PyYAML reads as an impossible date or number, are refused by line
and column, as a ConfigError that quotes neither the value nor the tag.

PyYAML's constructors raised ValueError, KeyError or AttributeError for ``pin: !!int SECRET`` (or
``!!float``, ``!!bool``, ``!!timestamp``, ``!!map``) and for ``label: 2020-13-45``: ``config check``
and ``run`` ended with status 1 and a traceback holding the value, often a PIN.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, load_config
from tests.harness import run_cli

SECRET = "MYSECRETPIN4711"
PIN_AT = "line 4, column 10"  # where the tag of the pin below stands


@pytest.mark.parametrize(
    "tag",
    ["!!int", "!!float", "!!bool", "!!timestamp", "!!map", "!!str", "!!binary", "!<tag:yaml.org,2002:int>"],
)
def test_an_explicit_tag_is_refused_by_line_without_the_value(tmp_path: Path, tag: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"signing:\n  pkcs11:\n    module: /m.so\n    pin: {tag} {SECRET}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    said = str(caught.value)
    assert "YAML tags (!!int, !!timestamp, !name) are not supported" in said
    assert PIN_AT in said
    assert SECRET not in said
    assert tag not in said.replace("(!!int, !!timestamp, !name)", "")


def test_a_tag_on_a_mapping_or_a_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("log: !!map {level: info}\naccess:\n  allow_clients: !!seq [127.0.0.0/8]\n")
    with pytest.raises(ConfigError, match=r"line 1, column 6 \(YAML tags"):
        load_config(path)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("2020-13-45", "line 2, column 10"),  # read as a date: month 13
        ("2020-02-30", "line 2, column 10"),
        ("2020-01-01 25:00:00", "line 2, column 10"),
        ("0x_", "line 2, column 10"),  # read as a hexadecimal number with no digit
        ("0b_", "line 2, column 10"),
    ],
)
def test_an_impossible_implicit_value_is_refused_by_line(tmp_path: Path, value: str, where: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"signing:\n  label: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    said = str(caught.value)
    assert f"not valid YAML at {where} (a value YAML reads as a date or a number is not a valid one" in said
    assert value not in said


def test_the_non_specific_tag_and_quoted_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        'log: ! {level: info}\ndata_dir: "2020-13-45"\n'
        'signing:\n  pkcs11:\n    module: /m.so\n    pin: "!!int 4711"\n'
    )
    config = load_config(path)
    assert config.log.level == "info"
    assert config.data_dir == "2020-13-45"
    assert config.signing.pkcs11.pin == "!!int 4711"


def test_config_check_refuses_a_tag_with_status_2_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"signing:\n  pkcs11:\n    module: /m.so\n    pin: !!int {SECRET}\n")
    done = run_cli("config", "check", str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"not valid YAML at {PIN_AT}" in done.stderr
    assert SECRET not in done.stdout + done.stderr
