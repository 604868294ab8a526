"""A stranger's JSON read to be shown again inside ours: finite numbers and bounded nesting.

``json.loads`` accepts what ``json.dumps`` then cannot write back as JSON: ``1e999`` reads as
infinity (written ``Infinity``), and a document nested just under the recursion limit reads, but
fails to be written once it sits a few levels deeper inside another document.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["finite_float", "loads_bounded", "no_constant", "refuse_lone_surrogates"]


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
