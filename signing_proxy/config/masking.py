"""Secrets in the configuration: declared once, on the field, and masked alike wherever one is shown.

A field whose value is, or may carry, a secret is declared ``secret(KIND, default)``: ``PIN`` (the
value is the secret), ``ENV_NAME`` (it names the environment variable holding one) or ``STORE_URL``
(a Redis URL and its password). ``masked_repr`` (the ``__repr__`` of every section: ``section``),
``redacted`` (the view ``config check`` prints) and ``quoted`` (a value as a refusal quotes it) all
read that one declaration, and mask a ``pin-value`` in every other string they show: RFC 7512 lets
any URI carry one (a key reference, a module path).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass
from typing import Any, Final, TypeVar, cast, dataclass_transform
from urllib.parse import unquote_plus

from ..core.pkcs11_uri import NOT_SHOWN, mask_pin_value

__all__ = [
    "ENV_NAME",
    "NOT_SHOWN",
    "PIN",
    "STORE_URL",
    "Secret",
    "masked_repr",
    "quoted",
    "redacted",
    "secret",
    "secret_kind",
    "section",
]

_METADATA_KEY: Final = "signing_proxy.secret"
_T = TypeVar("_T")
_S = TypeVar("_S", bound=type[Any])


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def section(cls: _S) -> _S:
    """A configuration section: a frozen dataclass whose repr is ``masked_repr`` (kept by
    ``dataclass``, which writes no ``__repr__`` a class defines itself)."""
    cls.__repr__ = masked_repr  # type: ignore[assignment]  # a function of the section, as a method is
    return cast(_S, dataclass(frozen=True)(cls))


@dataclass(frozen=True)
class Secret:
    """One kind of secret-bearing value: how a string of it is shown where it may be shown."""

    name: str
    in_repr: Callable[[str], str] | None  # repr() of its section; None: the field is left out
    in_view: Callable[[str], str]  # the redacted view (``config check``)
    in_refusal: Callable[[str], str]  # a ConfigError quoting it


def secret(kind: Secret, default: _T) -> _T:
    """A dataclass field (``pin: str | None = secret(PIN, None)``) declared as holding ``kind``."""
    return field(default=default, metadata={_METADATA_KEY: kind})


def secret_kind(f: Field[Any]) -> Secret | None:
    """The kind of secret a field is declared to hold (``secret``); None for any other field."""
    kind = f.metadata.get(_METADATA_KEY)
    return kind if isinstance(kind, Secret) else None


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # gateway.store's URLs that may carry a password


def store_shown(store: str) -> str:
    """``gateway.store`` for display: a Redis URL's userinfo (``redis://:PASSWORD@host``, up to the
    last ``@``, since a password may hold ``/`` or ``@`` unencoded) and every query value whose name
    holds ``password`` masked: redis-py reads ``password`` there too, and ``ssl_password`` (the TLS
    client key's passphrase), each name percent-decoded; host, port and database stay. Its other query
    parameters carry no secret (``ssl_ca_data`` is public certificates, ``ssl_keyfile`` a path)."""
    if not store.lower().startswith(_REDIS_SCHEMES):
        return store
    return _masked(store, _pair_shown)


def _refused_store_shown(store: str) -> str:
    """A ``gateway.store`` refused, as its refusal quotes it: whatever it is (``REDIS://``, the typo
    ``redis:/``), masked as a Redis URL, every query value with it (a misspelt name holds a password
    too). ``shown`` hid only a value with an ``@``: ``?password=`` was printed by ``config check``
    and ``run``."""
    return _masked(store, lambda pair: f"{pair.group(1)}={NOT_SHOWN}")


def _masked(store: str, pair_shown: Callable[[re.Match[str]], str]) -> str:
    scheme, sep, rest = store.partition("://")
    if not sep:  # no "://": all of it may be userinfo and query
        scheme, rest = "", store
    if "@" in rest:
        rest = f"{NOT_SHOWN}@" + rest.rsplit("@", 1)[1]
    # every pair after a ? or an &: an @ in the query (``?db=1@x&password=...``) put its ? in the
    # userinfo masked above, and the password after it was shown
    return f"{scheme}{sep}{_QUERY_PAIR.sub(pair_shown, rest)}"


_QUERY_PAIR = re.compile(r"(?<=[?&])([^?&=]*)=[^&]*")


def _pair_shown(pair: re.Match[str]) -> str:
    name = pair.group(1)
    return f"{name}={NOT_SHOWN}" if "password" in unquote_plus(name).lower() else pair.group(0)


def _not_shown(_value: str) -> str:
    return NOT_SHOWN


def _as_is(value: str) -> str:
    return value


def _value_not_shown(name: str) -> str:
    return f"{name} (value not shown)" if name else name


# the PIN itself: out of repr() (as ``field(repr=False)`` left it), "(not shown)" anywhere else
PIN: Final = Secret("pin", None, _not_shown, _not_shown)
# the name of the environment variable holding a secret: the name shown, said to be no value
ENV_NAME: Final = Secret("env-name", _as_is, _value_not_shown, _as_is)
# gateway.store: a Redis URL's password; refused, every query value (whatever the scheme)
STORE_URL: Final = Secret("store-url", store_shown, store_shown, _refused_store_shown)


def _each(shown: Callable[[str], str], value: Any) -> Any:
    """``shown`` applied to a string, or to each of a tuple of strings; any other value as it is."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, tuple) and all(isinstance(entry, str) for entry in value):
        return tuple(shown(entry) for entry in value)
    return value


def masked_repr(section: Any) -> str:
    """A configuration section's repr (its ``__repr__``): the dataclass's own, each field declared
    ``secret`` shown as its kind says, and a ``pin-value`` masked in every other string."""
    shown = []
    for f in fields(section):
        kind = secret_kind(f)
        how = mask_pin_value if kind is None else kind.in_repr
        if f.repr and how is not None:
            shown.append(f"{f.name}={_each(how, getattr(section, f.name))!r}")
    return f"{type(section).__name__}({', '.join(shown)})"


def redacted(section: Any) -> dict[str, Any]:
    """A configuration (or a section of it) as ``to_plain`` gives it, for ``config check``: each field
    declared ``secret`` masked as its kind says, and a ``pin-value`` in every other string."""
    return {f.name: _view(getattr(section, f.name), secret_kind(f)) for f in fields(section)}


def _view(value: Any, kind: Secret | None) -> Any:
    if kind is not None:
        value = _each(kind.in_view, value)
        return list(value) if isinstance(value, tuple) else value
    if is_dataclass(value) and not isinstance(value, type):
        return redacted(value)
    if isinstance(value, tuple | list):
        return [_view(entry, None) for entry in value]
    if isinstance(value, Mapping):
        return {key: _view(entry, None) for key, entry in value.items()}
    return mask_pin_value(value) if isinstance(value, str) else value


def quoted(section: Any, name: str) -> str:
    """The field ``name`` of ``section`` as a refusal quotes it (its repr), masked as it is declared
    (``secret``), or its ``pin-value`` masked."""
    kind = secret_kind(next(f for f in fields(section) if f.name == name))
    return repr(_each(mask_pin_value if kind is None else kind.in_refusal, getattr(section, name)))
