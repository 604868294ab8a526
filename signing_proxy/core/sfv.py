"""A narrow, typed door to http-sf (RFC 8941/9651 structured fields) for the few shapes we use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import http_sf
from http_sf.innerlist import ser_item_or_inner_list
from http_sf.types import Token

__all__ = ["is_token", "parse_dictionary", "parse_item", "serialize_member"]


def is_token(value: object, name: str) -> bool:
    """True when a parsed bare item is the Token ``name`` (a String with the same text is not)."""
    return isinstance(value, Token) and str(value) == name


def parse_dictionary(value: str, on_duplicate: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """Parse a Dictionary; members are ``(value, params)`` or ``([(item, params), ...], params)``.

    Raises ValueError (or UnicodeEncodeError for non-ASCII input) when the field is malformed.
    """
    parsed: Any = http_sf.parse(value.encode("ascii"), tltype="dictionary", on_duplicate_key=on_duplicate)
    return dict(parsed)


def parse_item(value: str) -> tuple[Any, dict[str, Any]]:
    """Parse an Item as ``(bare value, params)``; raises ValueError when malformed."""
    parsed: Any = http_sf.parse(value.encode("ascii"), tltype="item")
    return parsed[0], dict(parsed[1])


def serialize_member(member: Any) -> str:
    """Strict re-serialization of one Dictionary member value (an Item or an Inner List, with params)."""
    return str(ser_item_or_inner_list(member))
