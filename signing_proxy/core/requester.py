"""The Requester and Delegation messages in proto-JSON, and how one is added to an exchange call.

Spec "Resources and their fields": every exchange call carries a ``requester`` (``id``, ``domain``,
``type`` and optionally ``name``, ``scopes``, ``delegation``, ``ext``, ``ext_critical``) and the wire
encoding is proto-JSON with the field names of the spec's tables, written exactly (snake_case).
proto-JSON fixes the encodings: an enum by its name, ``int64`` as a decimal string, ``int32`` as a
JSON number, ``bytes`` as standard base64, a Timestamp as RFC 3339 and a Duration as
``"<seconds>s"``; unset optional and empty repeated fields are omitted. ``insert_member`` adds one
member to a JSON object body without re-serializing anything else: the original bytes stay as they
were, so the rest of the body is not just semantically but byte-for-byte the agent's. Sans-IO.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .b64 import b64_encode
from .keys import format_rfc3339

__all__ = [
    "EXCHANGE_SERVICE",
    "REQUESTER_MEMBER",
    "REQUESTER_TYPES",
    "REQUESTER_TYPE_DELEGATED",
    "TOKEN_FORMAT_JWT",
    "DelegationDoc",
    "RequesterDoc",
    "check_ext",
    "format_duration",
    "insert_member",
    "parse_duration_s",
    "requester_type_name",
]

EXCHANGE_SERVICE = (
    "svc.v1.ExchangeService"  # spec "Endpoints": POST {base_url}/svc.v1.ExchangeService/<Method>
)
REQUESTER_MEMBER = "requester"  # spec "Endpoints": the body member holding the Requester
TOKEN_FORMAT_JWT = "jwt"  # noqa: S105  # spec "Versioning" 4: the sole token format
# spec "RequesterType": number -> name; 0 is "rejected at ingest".
REQUESTER_TYPES: Mapping[int, str] = {
    0: "REQUESTER_TYPE_UNSPECIFIED",
    1: "REQUESTER_TYPE_AGENT",
    2: "REQUESTER_TYPE_HUMAN_TOOL",
    3: "REQUESTER_TYPE_SERVICE",
    4: "REQUESTER_TYPE_DELEGATED",
    5: "REQUESTER_TYPE_RESEARCH",
}
# "Agent acting on behalf of a user": its delegation is required (spec Errors: "Delegation token missing")
REQUESTER_TYPE_DELEGATED = REQUESTER_TYPES[4]
_TYPE_NUMBERS = {name: number for number, name in REQUESTER_TYPES.items()}
_DURATION = re.compile(r"([0-9]{1,12})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
DURATION_MAX_S = 315_576_000_000  # google.protobuf.Duration: at most 10,000 years
_JSON_WS = " \t\n\r"  # RFC 8259 section 2: the only insignificant whitespace


def requester_type_name(value: object) -> str:
    """A RequesterType given by name or number -> its name; ValueError for unknown or UNSPECIFIED."""
    if isinstance(value, bool):
        raise ValueError("a RequesterType is a name such as REQUESTER_TYPE_AGENT or its number")
    if isinstance(value, int):
        name = REQUESTER_TYPES.get(value)
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        name = REQUESTER_TYPES.get(int(value))
    elif isinstance(value, str):
        name = value if value in _TYPE_NUMBERS else None
    else:  # an object, an array, null, a float: never hashed (a dict or list would raise TypeError)
        name = None
    if name is None:
        known = ", ".join(f"{n} ({i})" for i, n in REQUESTER_TYPES.items() if i)
        raise ValueError(f"unknown RequesterType {value!r}; one of {known}")
    if name == REQUESTER_TYPES[0]:
        raise ValueError(
            "REQUESTER_TYPE_UNSPECIFIED is rejected at ingest (spec RequesterType); "
            "use e.g. REQUESTER_TYPE_AGENT"
        )
    return name


def parse_duration_s(text: str) -> int:
    """``86400s`` (the proto-JSON form), ``30m``, ``24h`` or ``30d`` -> whole seconds, at least 1."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 86400s, 30m, 24h or 30d")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if not 1 <= seconds <= DURATION_MAX_S:
        raise ValueError(f"{text!r}: a duration is between 1s and {DURATION_MAX_S}s")
    return seconds


def format_duration(seconds: int) -> str:
    """proto-JSON Duration of whole seconds: ``"<seconds>s"`` (spec "Delegation": quota_period)."""
    return f"{seconds}s"


def check_ext(ext: Mapping[str, Any], critical: Sequence[str], where: str) -> None:
    """``ext`` must be a JSON object (a Struct) and every ``ext_critical`` name one of its keys.

    COSE ``crit`` (RFC 9052 section 3.1): a critical label names a parameter that is present.
    """
    try:
        json.dumps(dict(ext), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}.ext: must be JSON data (a Struct): {exc}") from None
    for i, name in enumerate(critical):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.ext_critical[{i}]: must be a non-empty string")
        if name not in ext:
            raise ValueError(f"{where}.ext_critical[{i}]: {name!r} is not a key of {where}.ext")
    if len(set(critical)) != len(critical):
        raise ValueError(f"{where}.ext_critical: a key is listed twice")


@dataclass(frozen=True)
class DelegationDoc:
    """The Delegation message (spec "Delegation"); ``token`` is the ``~``-joined compact JWS chain."""

    principal_domain: str
    principal_id: str
    expires_at: float
    token: str
    scopes: tuple[str, ...] = ()
    max_spend_cents: int | None = None
    token_format: str = TOKEN_FORMAT_JWT
    revocation_uri: str | None = None
    max_accesses: int | None = None
    quota_period_s: int | None = None
    issuer: str | None = None
    ext: Mapping[str, Any] = field(default_factory=dict)
    ext_critical: tuple[str, ...] = ()

    def proto_json(self) -> dict[str, Any]:
        """proto-JSON, members in the order of the spec's table; unset fields omitted."""
        doc: dict[str, Any] = {
            "principal_domain": self.principal_domain,
            "principal_id": self.principal_id,
        }
        if self.scopes:
            doc["scopes"] = list(self.scopes)
        doc["expires_at"] = format_rfc3339(math.floor(self.expires_at))
        if self.max_spend_cents is not None:
            doc["max_spend_cents"] = str(self.max_spend_cents)  # int64: a decimal string
        doc["token"] = b64_encode(self.token.encode("ascii"))  # bytes: standard base64, padded
        doc["token_format"] = self.token_format
        if self.revocation_uri is not None:
            doc["revocation_uri"] = self.revocation_uri
        if self.max_accesses is not None:
            doc["max_accesses"] = self.max_accesses  # int32: a JSON number
        if self.quota_period_s is not None:
            doc["quota_period"] = format_duration(self.quota_period_s)
        if self.issuer is not None:
            doc["issuer"] = self.issuer
        if self.ext:
            doc["ext"] = json.loads(json.dumps(dict(self.ext)))
        if self.ext_critical:
            doc["ext_critical"] = list(self.ext_critical)
        return doc


@dataclass(frozen=True)
class RequesterDoc:
    """The Requester message (spec "Requester"); ``type`` is a RequesterType name."""

    id: str
    domain: str
    type: str
    name: str | None = None
    scopes: tuple[str, ...] = ()
    delegation: DelegationDoc | None = None
    ext: Mapping[str, Any] = field(default_factory=dict)
    ext_critical: tuple[str, ...] = ()

    def proto_json(self) -> dict[str, Any]:
        """proto-JSON, members in the order of the spec's table; unset fields omitted."""
        doc: dict[str, Any] = {"id": self.id, "domain": self.domain, "type": self.type}
        if self.name is not None:
            doc["name"] = self.name
        if self.scopes:
            doc["scopes"] = list(self.scopes)
        if self.delegation is not None:
            doc["delegation"] = self.delegation.proto_json()
        if self.ext:
            doc["ext"] = json.loads(json.dumps(dict(self.ext)))
        if self.ext_critical:
            doc["ext_critical"] = list(self.ext_critical)
        return doc


class _Duplicate(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate("duplicate member name")
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def insert_member(body: bytes, name: str, value_json: str) -> bytes | None:
    """``body`` with ``"name":value_json`` as the first member of its top-level object, or None.

    None (leave the body alone) when the body is not strict UTF-8 JSON (no BOM, no NaN, no
    duplicate member names, whose meaning would be ambiguous), is not an object, or already has
    ``name``. Nothing else is re-encoded: the bytes after the opening brace are kept as they were.
    """
    try:
        text = body.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or name in doc:
        return None
    start = len(text) - len(text.lstrip(_JSON_WS))  # json.loads accepted it: text[start] is "{"
    rest = text[start + 1 :]
    empty = rest.lstrip(_JSON_WS).startswith("}")
    member = json.dumps(name) + ":" + value_json + ("" if empty else ",")
    return (text[: start + 1] + member + rest).encode("utf-8")
