"""A ``pin-value`` holding ``;`` or ``?`` (RFC 7512 section 2.3 lets ``?`` into a query value, and
the parser takes ``;`` there too) is one PIN, ``AB;SECRETTAIL``: ``mask_pin_value`` stopped at
either and showed the tail, in ``config check``, the configuration's repr, the ``keys list`` note and
every refusal naming a mistyped key path. Only ``&`` ends a query value (``#`` and a space are
refused in one), so the mask runs to the first of those."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import yaml

from signing_proxy.cli.delegate_inputs import proxy_holder_jkt
from signing_proxy.cli.main import main
from signing_proxy.config import parse_config, redacted
from signing_proxy.core.pkcs11_uri import mask_pin_value, parse_pkcs11_uri
from signing_proxy.errors import CliError, ConfigError
from signing_proxy.service.keys import file_key_provider

TAIL = "SECRETTAIL"
PINS = [f"AB;{TAIL}", f"AB?{TAIL}", f"A;b?c/d|e:f[g]h@i!j$k'l(m)n*o+p,q{TAIL}"]
# a mistyped URI is a path, whose "PIN" may hold what a URI refuses: "#", a space, ": " (as messages do)
MISTYPED_PINS = [*PINS, f"12#{TAIL}", f"my pin: {TAIL}", f"a b {TAIL}"]


@pytest.mark.parametrize("pin", PINS)
def test_the_parser_takes_the_whole_value_as_the_pin(pin: str) -> None:
    assert parse_pkcs11_uri(f"pkcs11:object=a?pin-value={pin}&module-path=/m.so").pin_value == pin


@pytest.mark.parametrize("pin", PINS)
def test_mask_pin_value_hides_all_of_a_pin_with_query_characters(pin: str) -> None:
    masked = mask_pin_value(f"pkcs11:object=a?pin-value={pin}&module-path=/m.so")
    assert masked == "pkcs11:object=a?pin-value=(not shown)&module-path=/m.so"
    assert mask_pin_value(f"pkcs11:object=a?pin-value={pin}") == "pkcs11:object=a?pin-value=(not shown)"
    assert mask_pin_value(f"pkcs11;object=a?pin_value:{pin} #x y") == (
        "pkcs11;object=a?pin_value:(not shown)"  # a value alone: a mistyped PIN hidden to its end
    )


@pytest.mark.parametrize("pin", PINS)
def test_the_configuration_never_shows_the_tail_of_the_pin(pin: str) -> None:
    config = parse_config({"signing": {"key": f"pkcs11:object=a?pin-value={pin}"}})
    assert redacted(config)["signing"]["key"] == "pkcs11:object=a?pin-value=(not shown)"  # config check
    for shown in (repr(config), repr(config.signing), str(config.signing)):
        assert TAIL not in shown
        assert "pin-value=(not shown)" in shown


def write_config(tmp_path: Path, key: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "signing": {"key": key}}))
    return path


@pytest.mark.parametrize("pin", PINS)
def test_config_check_and_the_keys_note_never_show_the_tail_of_the_pin(
    pin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, f"pkcs11:object=a?pin-value={pin}")
    assert main(["config", "check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert TAIL not in out + err
    assert "key: pkcs11:object=a?pin-value=(not shown)\n" in out
    main(["keys", "list", "--config", str(config)])  # the note comes first, whatever the store says
    out, err = capsys.readouterr()
    assert TAIL not in out + err
    assert "note: signing.key is set (pkcs11:object=a?pin-value=(not shown));" in err


@pytest.mark.parametrize("pin", MISTYPED_PINS)
def test_a_mistyped_uri_taken_for_a_key_path_is_refused_without_the_tail_of_the_pin(
    pin: str, tmp_path: Path
) -> None:
    key = f"pkcs11;object=a?pin-value={pin}"  # ";" for ":": a file path, not a token key
    with pytest.raises(ConfigError) as refused:
        file_key_provider(key)  # run's signing.key
    assert TAIL not in str(refused.value)
    assert "pin-value=(not shown)" in str(refused.value)
    args = argparse.Namespace(holder_config=str(write_config(tmp_path, key)), data_dir=None, agent=None)
    with pytest.raises(CliError) as holder:
        proxy_holder_jkt(args, time.time())  # delegate verify/extend --holder-config
    assert TAIL not in str(holder.value)
    assert "pin-value=(not shown)" in str(holder.value)
    assert str(refused.value).endswith(": key file does not exist")  # the reason still said
