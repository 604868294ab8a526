"""A narrow, typed door to http-sf (RFC 8941/9651 structured fields) for the few shapes we use.

``Signature-Input`` and ``Signature`` are parsed on every verified request (relay, gateway,
middleware), and a label's inner list is re-serialized for its ``@signature-params``. http-sf reads
one character at a time; the common shape of these two fields (members of an inner list of plain
Strings, or of a Byte Sequence, with String and Integer parameters) is read here by a few regular
expressions instead, in about a tenth of the time. Anything else (escapes, Tokens, Booleans,
Decimals, duplicate keys, odd whitespace, a malformed field) goes to http-sf, so every verdict and
every value is http-sf's own: ``tests/core/test_sfv.py`` holds the two to the same answers.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any

import http_sf
from http_sf.innerlist import ser_item_or_inner_list
from http_sf.types import Token

__all__ = ["is_string", "is_token", "parse_dictionary", "parse_item", "serialize_member"]

_KEY = r"[a-z*][a-z0-9_\-.*]*"
_PLAIN = r"[\x20\x21\x23-\x5b\x5d-\x7e]*"  # String characters that need no escape
_STRING = rf'"{_PLAIN}"'
_INTEGER = r"-?[0-9]{1,15}"  # RFC 8941 section 3.3.1: at most 15 digits
_PARAM = rf";({_KEY})=({_STRING}|{_INTEGER})"
_PARAMS = rf"(?:;{_KEY}=(?:{_STRING}|{_INTEGER}))*"
_ITEM = rf"{_STRING}{_PARAMS}"
_MEMBER = re.compile(
    rf"({_KEY})=(\((?:{_ITEM}(?: {_ITEM})*)?\)|:[A-Za-z0-9+/]*=*:)({_PARAMS})((?:[ \t]*,[ \t]*)?)"
)
_PARAM_RE = re.compile(_PARAM)
_ITEM_RE = re.compile(rf"({_STRING})({_PARAMS})")
_PLAIN_RE = re.compile(_PLAIN)
_KEY_RE = re.compile(_KEY)
_MAX_INTEGER = 999_999_999_999_999


def is_string(value: object, text: str) -> bool:
    """True when a parsed bare item is the String ``text`` (a Token with the same text is not: http-sf's
    Token equals its text, and RFC 9421 section 2.3 has ``tag`` and ``alg`` be Strings)."""
    return value.__class__ is str and value == text


def is_token(value: object, name: str) -> bool:
    """True when a parsed bare item is the Token ``name`` (a String with the same text is not)."""
    return isinstance(value, Token) and str(value) == name


def parse_dictionary(value: str, on_duplicate: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """Parse a Dictionary; members are ``(value, params)`` or ``([(item, params), ...], params)``.

    Raises ValueError (or UnicodeEncodeError for non-ASCII input) when the field is malformed.
    """
    fast = _parse_common_dictionary(value)
    if fast is not None:
        return fast
    parsed: Any = http_sf.parse(value.encode("ascii"), tltype="dictionary", on_duplicate_key=on_duplicate)
    return dict(parsed)


def parse_item(value: str) -> tuple[Any, dict[str, Any]]:
    """Parse an Item as ``(bare value, params)``; raises ValueError when malformed."""
    parsed: Any = http_sf.parse(value.encode("ascii"), tltype="item")
    return parsed[0], dict(parsed[1])


def serialize_member(member: Any) -> str:
    """Strict re-serialization of one Dictionary member value (an Item or an Inner List, with params)."""
    fast = _serialize_common_member(member)
    return fast if fast is not None else str(ser_item_or_inner_list(member))


def _parse_common_dictionary(value: str) -> dict[str, Any] | None:
    """The Dictionary in ``value`` when it has the common shape (see the module docstring), else None."""
    members: dict[str, Any] = {}
    pos, end = 0, len(value)
    if not end:
        return None
    while pos < end:
        match = _MEMBER.match(value, pos)
        if match is None:
            return None
        key, bare, raw_params, separator = match.groups()
        if key in members:
            return None  # http-sf reports the duplicate to on_duplicate
        params = _params(raw_params)
        if params is None:
            return None
        if bare[0] == "(":
            items = []
            for raw_item, raw_item_params in _ITEM_RE.findall(bare, 1, len(bare) - 1):
                item_params = _params(raw_item_params)
                if item_params is None:
                    return None
                items.append((raw_item[1:-1], item_params))
            members[key] = (items, params)
        else:
            decoded = _canonical_base64(bare[1:-1])
            if decoded is None:
                return None
            members[key] = (decoded, params)
        pos = match.end()
        if bool(separator) != (pos < end):  # a trailing comma, or two members without one
            return None
    return members


def _params(raw: str) -> dict[str, Any] | None:
    params: dict[str, Any] = {}
    for key, raw_value in _PARAM_RE.findall(raw):
        if key in params:
            return None  # the last one wins in http-sf; not worth a second rule here
        params[key] = raw_value[1:-1] if raw_value[0] == '"' else int(raw_value)
    return params


def _canonical_base64(text: str) -> bytes | None:
    """The bytes of padded, canonical base64 ``text``; None for anything http-sf should judge."""
    if len(text) % 4:
        return None
    try:
        decoded = base64.b64decode(text, validate=True)
    except binascii.Error:
        return None
    return decoded if base64.b64encode(decoded).decode("ascii") == text else None


def _serialize_common_member(member: Any) -> str | None:
    """``member`` serialized, when it holds only plain Strings, Integers and Byte Sequences."""
    if not (isinstance(member, tuple) and len(member) == 2):
        return None
    value, params = member
    serialized_params = _serialize_params(params)
    if serialized_params is None:
        return None
    if isinstance(value, list):
        items = []
        for entry in value:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                return None
            item, item_params = entry
            if type(item) is not str or _PLAIN_RE.fullmatch(item) is None:
                return None
            serialized_item_params = _serialize_params(item_params)
            if serialized_item_params is None:
                return None
            items.append(f'"{item}"{serialized_item_params}')
        return f"({' '.join(items)}){serialized_params}"
    if type(value) is bytes:
        return f":{base64.b64encode(value).decode('ascii')}:{serialized_params}"
    return None


def _serialize_params(params: Any) -> str | None:
    if not isinstance(params, dict):
        return None
    out = []
    for key, value in params.items():
        if type(key) is not str or _KEY_RE.fullmatch(key) is None:
            return None
        if type(value) is str and _PLAIN_RE.fullmatch(value) is not None:
            out.append(f';{key}="{value}"')
        elif type(value) is int and -_MAX_INTEGER <= value <= _MAX_INTEGER:
            out.append(f";{key}={value}")
        else:
            return None
    return "".join(out)
