"""A ``gateway.store`` refused is quoted masked, as ``config check`` shows a valid one: ``shown`` hid
only a value holding an ``@``, and ``REDIS://...?password=`` (or the typo ``redis:/...``) was printed
whole by ``config check`` and ``run``. ``repr`` of the configuration masks a Redis password too."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from signing_proxy.config import parse_config
from signing_proxy.errors import ConfigError
from tests.harness import run_cli

SECRET = "SECRETREDIS"


@pytest.mark.parametrize(
    ("store", "quoted"),
    [
        (
            f"REDIS://127.0.0.1:6379/0?password={SECRET}",
            "'REDIS://127.0.0.1:6379/0?password=(not shown)'",
        ),
        (
            f"redis:/127.0.0.1:6379/0?password={SECRET}",
            "'redis:/127.0.0.1:6379/0?password=(not shown)'",
        ),
        (f"redis:/:{SECRET}@127.0.0.1:6379/0", "'(not shown)@127.0.0.1:6379/0'"),
        (f"REDIS://:{SECRET}@127.0.0.1:6379/0", "'REDIS://(not shown)@127.0.0.1:6379/0'"),
        (
            f"redis:/127.0.0.1/0?db=1&pasword={SECRET}",
            "'redis:/127.0.0.1/0?db=(not shown)&pasword=(not shown)'",
        ),
    ],
)
def test_a_refused_store_is_quoted_masked(store: str, quoted: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"gateway": {"store": store}})
    assert SECRET not in str(refused.value)
    assert str(refused.value).endswith(f"got {quoted}")


def test_config_check_refusing_a_store_shows_no_password(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    store = f"REDIS://127.0.0.1:6379/0?password={SECRET}"
    config.write_text(
        yaml.safe_dump({"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9", "store": store}})
    )
    done = run_cli("config", "check", str(config))
    assert done.returncode == 2, done.stderr
    assert "gateway.store" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def test_repr_of_the_configuration_masks_the_store_password() -> None:
    store = f"redis://:{SECRET}@redis.example:6379/0?password={SECRET}"
    config = parse_config({"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9", "store": store}})
    assert config.gateway.store == store  # the value itself is untouched: the store connects with it
    assert SECRET not in repr(config.gateway)
    assert SECRET not in repr(config)
    assert "store='redis://(not shown)@redis.example:6379/0?password=(not shown)'" in repr(config.gateway)
    assert "upstream='http://127.0.0.1:9'" in repr(config.gateway)  # the other fields as the dataclass's


def test_repr_of_the_configuration_masks_every_pin_value() -> None:
    """The gateway's own repr masked its pinned keys, but ``trusted_issuers.*.keys`` inside it and
    ``relay.pinned_*_keys`` were shown as written: a ``pkcs11:`` URI given for a file, PIN and all."""
    uri = "pkcs11:token=agent-keys;object=agent-1?pin-value=SECRETPIN-4711"
    config = parse_config(
        {
            "relay": {"pinned_agent_keys": [uri], "pinned_broker_keys": [uri]},
            "gateway": {
                "upstream": "http://127.0.0.1:9000",
                "trusted_issuers": {"urn:owner": {"keys": [uri]}},
            },
        }
    )
    shown = repr(config)
    assert "SECRETPIN-4711" not in shown
    assert shown.count("pin-value=(not shown)") == 3
