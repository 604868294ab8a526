"""A configuration secret is declared once, on its field (``masking.secret``), and that declaration
masks it on every path that shows a value: the section's repr (a log line, a traceback), the view
``config check`` prints (``redacted``) and a refusal quoting it (``quoted``). Every field declared
anywhere in the configuration is put through all three with a secret in it; a section declaring a
secret but keeping the dataclass's own repr fails here, not in a log."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest
import yaml

from signing_proxy.config import Config, parse_config, redacted, to_plain
from signing_proxy.config.masking import (
    ENV_NAME,
    PIN,
    STORE_URL,
    Secret,
    masked_repr,
    quoted,
    secret,
    secret_kind,
)

SECRET = "S3CRET-4711"
# kind -> (a value holding SECRET, what the redacted view shows of it); ENV_NAME's value names the
# variable that holds the secret: shown, said to be a name
SAMPLES: dict[Secret, tuple[str, str]] = {
    PIN: (SECRET, "(not shown)"),
    ENV_NAME: ("TOKEN_VAR", "TOKEN_VAR (value not shown)"),
    STORE_URL: (f"redis://gw:{SECRET}@redis.example:6379/0", "redis://(not shown)@redis.example:6379/0"),
}
# a pkcs11: URI carrying its PIN (RFC 7512), as it may be written into any string of the configuration
PIN_VALUE = (f"pkcs11:token=t;object=k?pin-value={SECRET}", "pkcs11:token=t;object=k?pin-value=(not shown)")
# every secret the configuration holds, by where it is declared
DECLARED = {
    ("Pkcs11Config", "pin"): PIN,
    ("Pkcs11Config", "pin_env"): ENV_NAME,
    ("CredentialRule", "bearer_env"): ENV_NAME,
    ("GatewayConfig", "store"): STORE_URL,
}


def _sections(tp: Any, found: dict[str, type[Any]]) -> dict[str, type[Any]]:
    """Every dataclass a configuration holds, ``tp`` and all it nests (tuples, mappings, unions)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp.__name__ not in found:
            found[tp.__name__] = tp
            for hint in typing.get_type_hints(tp).values():
                _sections(hint, found)
    elif typing.get_origin(tp) is not None or isinstance(tp, types.UnionType):
        for arg in typing.get_args(tp):
            _sections(arg, found)
    return found


SECTIONS = _sections(Config, {})


def _with(cls: type[Any], name: str, value: Any) -> Any:
    """An instance of section ``cls``: ``name`` set to ``value``, the rest its defaults (None when it
    has none); built around ``__init__`` and ``_check``, which would refuse a secret-shaped value."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.name == name:
            default = value
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        object.__setattr__(obj, f.name, default)
    return obj


def _leaks(cls: type[Any]) -> list[str]:
    """What shows a declared secret of ``cls``: ``Class.field`` and the path, for each that does."""
    leaks = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = secret_kind(f)
        if kind is None:
            continue
        assert kind in SAMPLES, f"{cls.__name__}.{f.name}: a new kind of secret: give it a sample here"
        sample, view = SAMPLES[kind]
        is_tuple = typing.get_origin(hints[f.name]) is tuple
        obj = _with(cls, f.name, (sample,) if is_tuple else sample)
        shown = {
            "repr": repr(obj),
            "redacted": yaml.safe_dump(redacted(obj)),
            "refusal": quoted(obj, f.name),
        }
        leaks += [f"{cls.__name__}.{f.name} in {path}" for path, text in shown.items() if SECRET in text]
        if redacted(obj)[f.name] != ([view] if is_tuple else view):
            leaks.append(f"{cls.__name__}.{f.name} in redacted: {redacted(obj)[f.name]!r}")
    return leaks


def test_every_secret_field_is_declared_where_expected() -> None:
    """The declarations are the one list: a secret field dropped from it is shown everywhere."""
    declared = {
        (name, f.name): secret_kind(f)
        for name, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if secret_kind(f) is not None
    }
    assert declared == DECLARED


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_declared_secret_is_masked_on_every_path(name: str) -> None:
    assert _leaks(SECTIONS[name]) == []


def _strings(hint: Any) -> str | None:
    """ "str" for a field holding a string (or None), "tuple" for a tuple of strings, else None."""
    args = set(typing.get_args(hint)) - {type(None)} if isinstance(hint, types.UnionType) else {hint}
    if args == {str}:
        return "str"
    if (
        len(args) == 1
        and typing.get_origin(arg := args.pop()) is tuple
        and typing.get_args(arg)[:1] == (str,)
    ):
        return "tuple"
    return None


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_pin_value_in_any_string_of_any_section_is_masked_by_repr_and_the_view(name: str) -> None:
    """RFC 7512 lets any URI carry a ``pin-value``: one written into any string (a key reference, a
    module path, a CA key) is masked by every section's repr and by ``config check``, declared or not."""
    cls = SECTIONS[name]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        shape = _strings(hints[f.name])
        if shape is None or secret_kind(f) is not None:
            continue
        sample, view = PIN_VALUE
        obj = _with(cls, f.name, (sample,) if shape == "tuple" else sample)
        assert SECRET not in repr(obj), f"{name}.{f.name}"
        assert redacted(obj)[f.name] == ([view] if shape == "tuple" else view), f"{name}.{f.name}"


def test_a_section_that_keeps_the_dataclass_repr_is_caught() -> None:
    """The check above holds for a section added later: one declaring a secret but not taking
    ``masked_repr`` shows it in its repr, and only there; with ``masked_repr`` it shows it nowhere."""

    @dataclasses.dataclass(frozen=True)
    class Plain:
        password: str | None = secret(PIN, None)
        user: str = "gw"

    @dataclasses.dataclass(frozen=True)
    class Masked:
        password: str | None = secret(PIN, None)
        user: str = "gw"
        __repr__ = masked_repr

    assert _leaks(Plain) == ["Plain.password in repr"]
    assert _leaks(Masked) == []
    assert repr(Masked(password=SECRET)) == "Masked(user='gw')"  # left out, as field(repr=False) did
    assert redacted(Masked(password=SECRET)) == {"password": "(not shown)", "user": "gw"}


def test_a_configuration_without_secrets_is_shown_as_it_is() -> None:
    """The redacted view is ``to_plain``'s where there is nothing to mask; so is a repr."""
    config = parse_config({"credentials": [{"hosts": ["a.example"], "bearer_file": "/run/token"}]})
    assert redacted(config) == to_plain(config)
    assert (
        repr(config.signing.pkcs11) == "Pkcs11Config(module=None, pin_env=None, pin_file=None, timeout_s=5.0)"
    )


def test_the_whole_configuration_masks_each_declared_secret() -> None:
    """Through ``parse_config``, the values as an operator writes them: repr and ``config check``."""
    uri = PIN_VALUE[0]
    config = parse_config(
        {
            "signing": {"key": uri, "pkcs11": {"pin": SECRET}},
            "credentials": [{"hosts": ["a.example"], "bearer_env": "TOKEN_VAR"}],
            "relay": {"pinned_agent_keys": [uri], "pinned_broker_keys": [uri]},
            "gateway": {
                "store": SAMPLES[STORE_URL][0],
                "pinned_agent_keys": [uri],
                "pinned_broker_keys": [uri],
                "trusted_issuers": {"urn:owner": {"keys": [uri]}},
            },
        }
    )
    view = redacted(config)
    assert SECRET not in repr(config)
    assert SECRET not in yaml.safe_dump(view)
    assert view["signing"]["pkcs11"]["pin"] == "(not shown)"
    assert view["credentials"][0]["bearer_env"] == "TOKEN_VAR (value not shown)"
    assert view["gateway"]["store"] == SAMPLES[STORE_URL][1]
    assert view["gateway"]["trusted_issuers"]["urn:owner"]["keys"] == [PIN_VALUE[1]]


def test_a_mistyped_pin_value_in_signing_key_is_masked_in_config_check_too() -> None:
    """repr() masked ``pin_value=`` (a mistyped ``pin-value=``) in a key taken for a path, but the
    redacted view masked only ``pin-value=``: it now masks what the repr does."""
    key = f"pkcs11;token=t;object=k?pin_value={SECRET}"
    config = parse_config({"signing": {"key": key}})
    assert redacted(config)["signing"]["key"] == "pkcs11;token=t;object=k?pin_value=(not shown)"
    assert SECRET not in repr(config.signing)


def test_a_pin_value_in_a_field_not_declared_secret_is_masked_by_repr_and_the_view() -> None:
    """RFC 7512 lets any URI carry a ``pin-value``: one written into a field that holds no secret (a
    module path given as a URI) is masked by the section's repr and by ``config check`` all the same."""
    module = f"/opt/hsm/lib.so?pin-value={SECRET}"
    config = parse_config({"signing": {"key": "pkcs11:token=t;object=k", "pkcs11": {"module": module}}})
    assert SECRET not in repr(config.signing.pkcs11)
    assert SECRET not in repr(config.signing)
    assert redacted(config)["signing"]["pkcs11"]["module"] == "/opt/hsm/lib.so?pin-value=(not shown)"
