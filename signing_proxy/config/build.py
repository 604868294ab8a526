"""The generic YAML -> frozen dataclass builder: types from annotations, every mistake named by key path.

``build`` walks a dataclass's type hints (unions, ``Literal``, tuples, mappings, nested sections)
and calls each section's ``_check(path)`` once it is built; ``to_plain`` goes back to YAML-ready data.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import ConfigError

__all__ = ["build", "check_json", "to_plain"]


def build(tp: Any, value: Any, path: str) -> Any:
    """``value`` (parsed YAML) as type ``tp``, checked; ConfigError names the key path of a mistake."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for candidate in inner[:-1]:  # str | int: the first type the value is
            try:
                return build(candidate, value, path)
            except ConfigError:
                continue
        try:
            return build(inner[-1], value, path)
        except ConfigError:
            if len(inner) == 1 or not all(a is bool or typing.get_origin(a) is Literal for a in inner):
                raise
            # bool | Literal["auto"]: every value it takes, not the last type's alone
            raise ConfigError(f"{path}: must be {' or '.join(map(_shown, inner))}, got {value!r}") from None
    if origin is Literal:
        if value is False and "off" in args:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value not in args:
            raise ConfigError(f"{path}: must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path or 'config'}: must be a mapping")
        _check_keys(value, path)
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - known)
        if unknown:
            where = f"{path}." if path else ""
            raise ConfigError(f"{where}{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        kwargs = {k: build(hints[k], v, f"{path}.{k}" if path else k) for k, v in value.items()}
        try:
            obj = typing.cast(Any, tp)(**kwargs)
        except TypeError as exc:  # a required member is missing
            raise ConfigError(f"{path or 'config'}: {exc}") from None
        check = getattr(obj, "_check", None)
        if check is not None:
            check(path)
        return obj
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list")
        return tuple(build(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a mapping")
        _check_keys(value, path)  # str(k) made `1` and "1" one key, and a YAML `null` key "None"
        return types.MappingProxyType({k: build(args[1], v, f"{path}.{k}") for k, v in value.items()})
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: must be a number")
        try:
            number = float(value)
        except OverflowError:  # an integer past float's range
            number = math.inf
        if not math.isfinite(number):  # YAML's .nan and .inf: NaN passed every `<= 0` check
            raise ConfigError(f"{path}: must be a finite number")
        return number
    if tp is Any:  # a Struct (ext): JSON data only
        check_json(value, path)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: must be a string")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug in a section, not in the file


def _check_keys(value: Mapping[Any, Any], path: str) -> None:
    """Refuse a key that is not a string (YAML reads ``1``, ``null``, ``on`` or a date as another
    type): sorting mixed keys raised TypeError, a traceback instead of the key path."""
    for key in value:
        if not isinstance(key, str):
            # a number, bool or null shown as YAML read it; anything else (a date, the bytes of a
            # !!binary key) by its type only
            shown = "null " if key is None else f"{key!r} " if isinstance(key, int | float) else ""
            kind = "null" if key is None else type(key).__name__
            raise ConfigError(
                f"{path or 'config'}: the key {shown}is not a string (YAML read it as {kind}); "
                "quote it or remove it"
            )


def _shown(tp: Any) -> str:
    """What a bool or a Literal of a union takes, as an error says it."""
    return "true or false" if tp is bool else " or ".join(map(str, typing.get_args(tp)))


def check_json(value: Any, path: str) -> None:
    """Refuse anything but JSON data (a Struct such as ``ext``): string keys, finite numbers."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{path}: JSON member names are strings, got {k!r}")
            check_json(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, f"{path}[{i}]")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise ConfigError(f"{path}: must be JSON data (quote dates and other YAML types), got {value!r}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number")


def to_plain(obj: Any) -> Any:
    """A Config (or any section) as plain YAML-ready data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
