"""A ``pkcs11:`` URI carrying its PIN (``pin-value=``), given where a key FILE is read, is quoted with
the PIN masked, wherever it is refused (``keys show`` without ``--pkcs11``, ``verify-origin
--pinned-key``, ``delegate verify --owner-jwks``, ``relay.pinned_agent_keys``,
``gateway.trusted_issuers.*.keys``) and in ``config check``'s view of the configuration. Each quoted
``str(KeyFileError)``, which names the path as given: the PIN was printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.errors import ConfigError
from signing_proxy.verify.build import load_pinned_keys
from tests.harness import run_cli

SECRET = "SECRETPIN-4711"
URI = f"pkcs11:token=agent-keys;object=agent-1?pin-value={SECRET}"
MASKED = "pkcs11:token=agent-keys;object=agent-1?pin-value=(not shown)"


def refused(*args: str) -> str:
    """The refusal's line (exit status 2: the last line, after any start-up line), the PIN masked."""
    done = run_cli(*args, timeout_s=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert SECRET not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    line = done.stderr.splitlines()[-1]
    assert line.startswith("signing-proxy: ")
    assert MASKED in line
    return line


def config_file(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), **config}))
    return str(path)


def test_keys_show_given_a_pkcs11_uri_without_the_flag(tmp_path: Path) -> None:
    line = refused("keys", "show", URI)
    assert line == f"signing-proxy: {MASKED}: key file does not exist"


def test_config_check_masks_the_pin_in_pinned_key_entries(tmp_path: Path) -> None:
    relay = config_file(
        tmp_path, {"mode": "relay", "relay": {"pinned_agent_keys": [URI], "pinned_broker_keys": [URI]}}
    )
    done = run_cli("config", "check", relay)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    view = yaml.safe_load(done.stdout[done.stdout.index("mode:") :])
    assert view["relay"]["pinned_agent_keys"] == [MASKED]
    assert view["relay"]["pinned_broker_keys"] == [MASKED]


def test_config_check_masks_the_pin_in_a_gateways_key_entries(tmp_path: Path) -> None:
    gateway = config_file(
        tmp_path,
        {
            "mode": "gateway",
            "gateway": {
                "upstream": "http://127.0.0.1:9",
                "pinned_agent_keys": [URI],
                "pinned_broker_keys": [URI],
                "trusted_issuers": {"https://owner.example": {"keys": [URI]}},
            },
        },
    )
    done = run_cli("config", "check", gateway)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert done.stdout.count(MASKED) == 3


def test_run_refusing_a_relays_pinned_key(tmp_path: Path) -> None:
    refused(
        "run", "--config", config_file(tmp_path, {"mode": "relay", "relay": {"pinned_agent_keys": [URI]}})
    )


def test_run_refusing_a_trusted_issuers_key(tmp_path: Path) -> None:
    gateway = {
        "upstream": "http://127.0.0.1:9",
        "trusted_issuers": {"https://owner.example": {"keys": [URI]}},
    }
    refused("run", "--config", config_file(tmp_path, {"mode": "gateway", "gateway": gateway}))


def test_verify_origin_pinned_key() -> None:
    refused("verify-origin", "--listen", "127.0.0.1:0", "--pinned-key", URI)


def test_delegate_verify_owner_jwks() -> None:
    refused("delegate", "verify", "x.y.z", "--owner-jwks", URI)


def test_load_pinned_keys_masks_the_pin() -> None:
    with pytest.raises(ConfigError) as refusal:
        load_pinned_keys([URI], "gateway.pinned_broker_keys")
    assert refusal.value.reason == "pinned-key-unusable"
    assert str(refusal.value).startswith(f"gateway.pinned_broker_keys: {MASKED}: ")
