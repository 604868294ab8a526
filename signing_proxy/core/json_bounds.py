"""A stranger's JSON read to be shown again inside ours: finite numbers and bounded nesting.

``json.loads`` accepts what ``json.dumps`` then cannot write back as JSON: ``1e999`` reads as
infinity (written ``Infinity``), and a document nested just under the recursion limit reads, but
fails to be written once it sits a few levels deeper inside another document.

``loads_strict`` reads the files an operator hands us (key files, JWK Sets, the key store's index):
every fault, a duplicate member or nesting too deep for the parser included, is one ValueError.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "MAX_KEY_FILE_DEPTH",
    "finite_float",
    "loads_bounded",
    "loads_strict",
    "no_constant",
    "refuse_lone_surrogates",
    "unique_members",
]

# Our choice: a JWK is one level deep, a JWK Set or the key store's index three; room to spare.
MAX_KEY_FILE_DEPTH = 32


def loads_bounded(data: bytes | str, *, max_depth: int) -> Any:
    """``json.loads(data)``; ValueError for a non-finite number or more than ``max_depth`` levels of
    arrays and objects (also for what ``json.loads`` refuses, and a RecursionError)."""
    try:
        value = json.loads(data, parse_constant=no_constant, parse_float=finite_float)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not _nested_at_most(value, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def loads_strict(data: bytes | str, *, max_depth: int = MAX_KEY_FILE_DEPTH) -> Any:
    """Strict JSON: UTF-8, no duplicate member name (never "last wins"), finite numbers only (no
    ``NaN``/``Infinity``), no unpaired surrogate, at most ``max_depth`` levels of arrays and objects.

    Every fault is a ValueError whose message says what is wrong, never quoting a value: a document
    nested too deep for the parser (a RecursionError) too, so a caller that handles malformed
    JSON handles it."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    try:
        value = json.loads(
            text, object_pairs_hook=unique_members, parse_constant=no_constant, parse_float=finite_float
        )
    except RecursionError:
        raise ValueError("nested too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    if not _nested_at_most(value, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    refuse_lone_surrogates(text, value)
    return value


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook``: a member name given twice is refused (ValueError naming it), never
    "last wins" (RFC 7515 section 5.2, RFC 7519 section 4)."""
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            raise ValueError(f"member {name[:64]!r} appears twice")
        obj[name] = value
    return obj


def refuse_lone_surrogates(text: str, value: object) -> None:
    """ValueError when ``value``, parsed from ``text``, holds an unpaired surrogate: only an escape
    (``\\ud800`` alone) makes one, and no UTF-8 can carry it (RFC 7493 section 2.1)."""
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("an unpaired surrogate escape") from None


def no_constant(name: str) -> object:
    """A ``parse_constant`` hook: ``NaN``, ``Infinity`` and ``-Infinity`` are refused (ValueError)."""
    raise ValueError(f"{name} is not JSON")


def finite_float(text: str) -> float:
    """A ``parse_float`` hook: a number too large for a float (``1e999``) is refused (ValueError)."""
    value = float(text)
    if math.isinf(value):  # 1e999
        raise ValueError("a number out of range")
    return value


def _nested_at_most(value: object, depth: int) -> bool:
    """Whether ``value`` nests at most ``depth`` arrays and objects (level by level, no recursion)."""
    level: list[object] = [value]
    for _ in range(depth):
        inner: list[object] = []
        for item in level:
            if isinstance(item, dict):
                inner.extend(item.values())
            elif isinstance(item, list):
                inner.extend(item)
        if not inner:
            return True
        level = inner
    return not any(isinstance(item, dict | list) for item in level)
