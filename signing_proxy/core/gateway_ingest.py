"""What a verifying gateway reads from an exchange call's body, checked before anything trusts it.

Spec "Endpoints": an exchange call is ``POST {base_url}/svc.v1.ExchangeService/<Method>`` with a
proto-JSON body holding the envelope ``ver`` and the ``requester``. ``ingest_requester`` applies
the ingest rules (a ``requester`` with ``id``, ``domain`` and ``type``; UNSPECIFIED and unknown
types rejected; every ``ext_critical`` key understood; envelope ``ver`` of major 1) and returns the
parsed ``Requester`` with its raw ``delegation`` member. ``read_delegation`` reads that member,
``check_mirror`` holds its mirrored fields to the verified token's claims (which are
authoritative: a mirror may be narrower, never wider), ``check_declared_scopes`` holds the
requester's declared scopes to the chain's, and ``quota_counters`` names the counters of a chain.
Proto-JSON as its mapping reads it: ``null`` is an absent member, ``bytes`` either base64 alphabet
with or without padding. Sans-IO: values and ``now`` in, results or errors out.

Errors: ``IngestError`` (a ``ProtocolError``; the gateway answers 400) and ``DelegationError``
(403, ``DENIAL_REASON_DELEGATION_INVALID``).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

from .b64 import b64url_decode
from .delegation_verify import VerifiedDelegation
from .errors import DelegationError, KeyFormatError, ProtocolError
from .json_bounds import refuse_lone_surrogates
from .jws import unique_members
from .keys import parse_rfc3339
from .requester import (
    EXCHANGE_SERVICE,
    REQUESTER_MEMBER,
    REQUESTER_TYPES,
    TOKEN_FORMAT_JWT,
    requester_type_name,
)
from .scopes import scope_segments, scopes_cover

__all__ = [
    "ENDLESS_QUOTA_WINDOW_S",
    "ENVELOPE_MAJOR",
    "DelegationIn",
    "IngestError",
    "IngestedRequester",
    "QuotaCounter",
    "check_declared_scopes",
    "check_mirror",
    "exchange_method",
    "ingest_requester",
    "quota_counters",
    "read_delegation",
]

ENVELOPE_MAJOR = 1  # spec "Versioning": the request envelope ver is 1.0; our rule: any 1.x is read
_VERSION = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")
_METHOD = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")


class IngestError(ProtocolError):
    """An exchange call refused at ingest (spec "Requester": rejected at ingest); answered 400."""


@dataclass(frozen=True)
class IngestedRequester:
    """The requester as declared in the body: claims, not credentials (layer 1 says who signed)."""

    id: str
    domain: str
    type: str
    scopes: tuple[str, ...]
    delegation: Mapping[str, Any] | None


@dataclass(frozen=True)
class DelegationIn:
    """The Delegation message as received; only ``token`` is verified, the rest are mirrors."""

    token: str
    principal_domain: str
    principal_id: str
    expires_at: int
    scopes: tuple[str, ...]
    max_accesses: int | None
    max_spend_cents: int | None
    quota_period_s: int | None
    issuer: str | None


def exchange_method(method: str, path: str) -> str | None:
    """``<Method>`` of ``POST …/svc.v1.ExchangeService/<Method>``, else None (not an exchange call).

    The path is read percent-decoded, as a backend routes it: ``…/Discover%52esources`` is
    DiscoverResources, and gets every check of an exchange call. A path that names the service in
    any other spelling a backend may route to the same handler (a trailing ``/``, ``;v=1``, ``.``,
    ``..`` or empty segments, another case, another method than POST) is refused
    (``IngestError`` ``malformed-exchange-call``): read as no exchange call, it skipped every check."""
    decoded = unquote(path.split("?", 1)[0])
    if _SERVICE_FOLDED not in _folded(decoded):
        return None
    segments = decoded.split("/")
    head, name = segments[:-1], segments[-1]
    if (
        method != "POST"
        or head[-1:] != [EXCHANGE_SERVICE]
        or not _METHOD.fullmatch(name)
        or segments[0] != ""
        or any(segment in _ODD_SEGMENTS or ";" in segment for segment in segments[1:])
    ):
        raise IngestError(
            "malformed-exchange-call",
            f"an exchange call is POST …/{EXCHANGE_SERVICE}/<Method>, with no empty, '.' or '..' "
            "segment and no ';'",
        )
    return name


_SERVICE_FOLDED = EXCHANGE_SERVICE.casefold()


def _folded(text: str) -> str:
    """``text`` as any case-insensitive router may compare it: compatibility forms (fullwidth
    letters) made plain, then upper-cased and case-folded. ``casefold`` alone keeps the dotless i
    (U+0131, ``ExchangeServ%C4%B1ce``), which ``upper`` makes an ``I``. ASCII, the common path, is
    folded once."""
    if text.isascii():
        return text.casefold()
    return unicodedata.normalize("NFKC", text).upper().casefold()


_ODD_SEGMENTS = frozenset({"", ".", ".."})


def _string(doc: Mapping[str, Any], name: str, where: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value:
        raise IngestError("requester-field-missing", f"{where}.{name} is required (a non-empty string)")
    return value


# Field names are exact (spec "Resources and their fields"), but a backend's proto-JSON parser also
# reads a field by its lowerCamelCase name: a member checked here under one name and read there under
# the other (an ``extCritical`` the gateway never saw) must not pass, so the aliases are refused.
_REQUESTER_ALIASES = frozenset({"extCritical"})
_DELEGATION_ALIASES = frozenset(
    {
        "principalDomain",
        "principalId",
        "expiresAt",
        "maxSpendCents",
        "tokenFormat",
        "revocationUri",
        "maxAccesses",
        "quotaPeriod",
        "extCritical",
    }
)


def _alias(doc: Mapping[str, Any], aliases: frozenset[str]) -> str | None:
    return next((name for name in doc if name in aliases), None)


def _member(doc: Mapping[str, Any], name: str, default: Any) -> Any:
    """An optional member: the proto3 JSON mapping accepts ``null`` for every field and reads it as
    the field's default, so ``null`` is read as absent (a required member's ``null`` is refused by
    its own check, with the reason an absent one gets)."""
    value = doc.get(name)
    return default if value is None else value


def _critical(doc: Mapping[str, Any], where: str, understood: Container[str]) -> None:
    critical = _member(doc, "ext_critical", [])
    if not isinstance(critical, list) or not all(isinstance(c, str) for c in critical):
        raise IngestError("malformed-requester", f"{where}.ext_critical is a list of strings")
    for name in critical:
        if name not in understood:  # COSE crit: an extension we cannot evaluate is binding
            raise IngestError("unknown-critical-extension", f"{where}.ext_critical names {name!r}")


def _requester_type(value: object) -> str:
    """The proxy's own rule (``requester_type_name``: a name, or its number as a JSON number or
    digits), with the ingest reasons."""
    try:
        return requester_type_name(value)
    except ValueError as exc:
        unspecified = not isinstance(value, bool) and value in (0, "0", REQUESTER_TYPES[0])
        reason = "requester-type-unspecified" if unspecified else "requester-type-unknown"
        raise IngestError(reason, f"requester.type: {exc}") from None


def ingest_requester(body: bytes, understood_extensions: Container[str]) -> IngestedRequester:
    """The ingest rules of an exchange call's body; ``IngestError`` with a stable reason."""
    try:
        text = body.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=unique_members)
        refuse_lone_surrogates(text, doc)  # "\ud800" alone: no header or UTF-8 can carry it
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise IngestError("malformed-body", "an exchange call's body is a proto-JSON object") from None
    if not isinstance(doc, dict):
        raise IngestError("malformed-body", "an exchange call's body is a proto-JSON object")
    ver = doc.get("ver")
    if not isinstance(ver, str):
        raise IngestError("envelope-version-missing", "the envelope ver is required (1.0)")
    match = _VERSION.fullmatch(ver)
    if match is None or int(match.group(1)) != ENVELOPE_MAJOR:
        raise IngestError(
            "envelope-version-unsupported", f"envelope ver {ver[:16]!r}; this gateway reads 1.x"
        )
    requester = doc.get(REQUESTER_MEMBER)
    if not isinstance(requester, dict):
        raise IngestError("requester-missing", "an exchange call carries a requester object")
    ident = _string(requester, "id", "requester")
    domain = _string(requester, "domain", "requester")
    if requester.get("type") is None:  # absent, or null: its default (proto3 JSON), which is no type
        raise IngestError("requester-field-missing", "requester.type is required")
    kind = _requester_type(requester["type"])
    alias = _alias(requester, _REQUESTER_ALIASES)
    if alias is not None:
        raise IngestError("malformed-requester", f"requester.{alias}: field names are exact (snake_case)")
    scopes = _member(requester, "scopes", [])
    if not _scope_list(scopes):
        raise IngestError("malformed-requester", 'requester.scopes is a list of scopes (spec "Scopes")')
    _critical(requester, "requester", understood_extensions)
    delegation = requester.get("delegation")
    if delegation is not None:  # spec Errors: a delegation that cannot be used is DELEGATION_INVALID
        if not isinstance(delegation, dict):
            raise DelegationError("malformed-delegation", "requester.delegation is an object")
        try:
            _critical(delegation, "requester.delegation", understood_extensions)
        except IngestError as exc:
            raise DelegationError(exc.reason, exc.detail) from None
    return IngestedRequester(ident, domain, kind, tuple(scopes), delegation)


def _scope_list(value: object) -> bool:
    """A JSON list of well-formed scopes: a stranger's malformed one is refused here, at ingest, not
    met later as an error where scopes are matched or written into the backend's headers."""
    if not isinstance(value, list):
        return False
    try:
        for scope in value:
            scope_segments(scope)
    except ValueError:
        return False
    return True


def _invalid(detail: str) -> DelegationError:
    return DelegationError("malformed-delegation", detail)


def _optional_int(doc: Mapping[str, Any], name: str, *, bits: int) -> int | None:
    """A non-negative int32 or int64 member: a JSON number, or (proto-JSON accepts both for either
    type, and writes int64 so) a decimal string."""
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"0|[1-9][0-9]{0,18}", value):
        value = int(value)
    if not isinstance(value, bool) and isinstance(value, int) and 0 <= value < 1 << (bits - 1):
        return value
    raise _invalid(f"delegation.{name} is not a valid count")


def read_delegation(doc: Mapping[str, Any]) -> DelegationIn:
    """The Delegation message; ``DelegationError`` (DENIAL_REASON_DELEGATION_INVALID) when unusable."""
    alias = _alias(doc, _DELEGATION_ALIASES)
    if alias is not None:
        raise _invalid(f"delegation.{alias}: field names are exact (snake_case)")
    if _member(doc, "token_format", TOKEN_FORMAT_JWT) != TOKEN_FORMAT_JWT:
        raise DelegationError("unsupported-token-format", "token_format jwt is the sole format")
    raw = doc.get("token")
    if not isinstance(raw, str) or not raw:
        raise _invalid("delegation.token is required")
    try:
        token = _proto_bytes(raw).decode("ascii")
    except ValueError:  # invalid base64, or bytes that are not ASCII
        raise _invalid("delegation.token is base64 of the ~-joined compact JWS chain") from None
    for name in ("principal_domain", "principal_id"):
        if not isinstance(doc.get(name), str) or not doc[name]:
            raise _invalid(f"delegation.{name} is required")
    try:
        expires_at = parse_rfc3339(doc.get("expires_at"))
    except (KeyFormatError, ValueError, TypeError):
        raise _invalid("delegation.expires_at is a required RFC 3339 timestamp") from None
    scopes = _member(doc, "scopes", [])
    if not _scope_list(scopes):
        raise _invalid('delegation.scopes is a list of scopes (spec "Scopes")')
    period = doc.get("quota_period")
    if period is not None and (not isinstance(period, str) or not re.fullmatch(r"[1-9][0-9]{0,11}s", period)):
        raise _invalid('delegation.quota_period is a Duration "<seconds>s"')
    issuer = doc.get("issuer")
    return DelegationIn(
        token=token,
        principal_domain=doc["principal_domain"],
        principal_id=doc["principal_id"],
        expires_at=expires_at,
        scopes=tuple(scopes),
        max_accesses=_optional_int(doc, "max_accesses", bits=32),  # int32
        max_spend_cents=_optional_int(doc, "max_spend_cents", bits=64),  # int64
        quota_period_s=int(period[:-1]) if period is not None else None,
        issuer=issuer if isinstance(issuer, str) else None,
    )


_STANDARD_ONLY = frozenset("+/")
_URL_SAFE_ONLY = frozenset("-_")
_TO_URL_SAFE = str.maketrans("+/", "-_")


def _proto_bytes(text: str) -> bytes:
    """A proto-JSON ``bytes`` value. The proto3 JSON mapping writes standard base64 with padding
    (the proxy does) but accepts "either standard or URL-safe base64 encoding with/without
    paddings": another implementation's valid token must not be refused. Still strict: one alphabet,
    no character outside it, padding absent or exactly what the length needs, the last character's
    unused bits zero; ValueError otherwise. The spellings decode to one chain, and only the decoded
    chain is used (verified, and hashed into the quota keys)."""
    data = text.rstrip("=")
    padding = len(text) - len(data)
    if padding and padding != -len(data) % 4:
        raise ValueError("incorrect base64 padding")
    if not (_URL_SAFE_ONLY.isdisjoint(data) or _STANDARD_ONLY.isdisjoint(data)):
        raise ValueError("base64 mixing the standard and URL-safe alphabets")
    return b64url_decode(data.translate(_TO_URL_SAFE))  # the alphabet, the length, the trailing bits


def _wider(mirror: int | None, claim: int | None) -> bool:
    # an absent mirror mirrors nothing (the token decides); a present one must not exceed the claim
    return mirror is not None and (claim is None or mirror > claim)


def check_mirror(mirror: DelegationIn, verified: VerifiedDelegation, now: float, leeway_s: int = 0) -> None:
    """The mirrored fields are never wider than the verified claims, ``issuer`` is the token's
    ``iss``; expired is expired. ``principal_domain`` and ``principal_id`` mirror no claim.

    ``leeway_s`` is the clock difference the chain's ``exp`` was forgiven (``verify_chain``): the
    mirrored ``expires_at`` is required and no later than that ``exp``, so judged without it, it
    refused every chain the leeway let pass. With it, it is still never more lenient than the chain."""
    if mirror.expires_at + leeway_s <= now:
        raise DelegationError("expired", "delegation.expires_at has passed")
    if verified.expires_at is not None and mirror.expires_at > verified.expires_at:
        raise DelegationError("mirror-wider", "delegation.expires_at is later than the token's exp")
    if verified.scope is not None:
        for scope in mirror.scopes:
            if not scopes_cover(verified.scope, scope):
                raise DelegationError("mirror-wider", "delegation.scopes is wider than the token's scope")
    caps = verified.caps
    if _wider(mirror.max_accesses, caps.max_accesses) or _wider(mirror.max_spend_cents, caps.max_spend_cents):
        raise DelegationError("mirror-wider", "a mirrored cap is wider than the token's")
    if mirror.quota_period_s is not None and mirror.quota_period_s != caps.quota_period_s:
        raise DelegationError("mirror-wider", "delegation.quota_period differs from the token's")
    if mirror.issuer is not None and mirror.issuer != verified.issuer:
        raise DelegationError("mirror-mismatch", "delegation.issuer is not the token's iss")


def check_declared_scopes(declared: tuple[str, ...], verified: VerifiedDelegation) -> None:
    """With a delegation, every scope the requester declares is covered by the chain's final scope
    (``DelegationError`` ``scope-wider``): the declared scopes are then the effective ones, what the
    exchange filters its catalog by (spec "DiscoverResources"), and a grant is never widened by a
    claim in the body. A chain without a scope claim restricts none. The proxy refuses the same at
    start (``delegation-scope-mismatch``)."""
    if verified.scope is None:
        return
    wider = [scope for scope in declared if not scopes_cover(verified.scope, scope)]
    if wider:
        raise DelegationError(
            "scope-wider", f"requester.scopes {wider[:8]} not covered by the delegation's scope"
        )


# Our choice (the spec: a lifetime quota is "bounded only by expiry"): a chain none of whose links
# has exp keeps its count for a year from the first access, so that its row leaves the store some
# day. That alone bounds nothing: a stranger's chain may also carry a quota_period of up to 10,000
# years or an exp as late as the year 9999, and each new chain is a new row (request rate x window). The
# bound on strangers' rows is the store's: gateway.max_stranger_quota_rows (verify.counters).
ENDLESS_QUOTA_WINDOW_S = 366 * 86_400


class QuotaCounter(NamedTuple):
    """One access counter of a chain: ``limit`` accesses per ``window_s`` (None: never resets)."""

    key: str
    limit: int
    window_s: float | None


def quota_counters(
    token: str, chain: VerifiedDelegation, now: float, leeway_s: int = 0
) -> tuple[QuotaCounter, ...]:
    """A counter per link that caps accesses, keyed by the chain up to that link (hashed, fixed
    length): a cap counts every access made under its grant, so siblings a principal delegated to
    share their parent's count, and each also has its own when its link caps it. Each window is the
    link's ``quota_period``, else the grant's remaining life (the earliest ``exp`` of the link and
    those above it), else ``ENDLESS_QUOTA_WINDOW_S``. Never a later link's ``exp``: the holder issues
    those, and a new child would start the count of its parent's grant again."""
    parts = token.split("~")
    counters = []
    ends: float | None = None  # the grant's end: the earliest exp of this link and those above it
    for index, link in enumerate(chain.links):
        if link.exp is not None:
            ends = link.exp if ends is None else min(ends, link.exp)
        limit = link.caps.max_accesses
        if limit is None:
            continue
        period = link.caps.quota_period_s
        if period is not None:
            window = float(period)
        elif ends is not None:
            window = max(1.0, ends - now + leeway_s)  # a lifetime quota: until the grant ends
        else:  # a grant that never ends: its count is kept this long, not for ever
            window = float(ENDLESS_QUOTA_WINDOW_S)
        key = hashlib.sha256("~".join(parts[: index + 1]).encode("ascii")).hexdigest()
        counters.append(QuotaCounter(key, limit, window))
    return tuple(counters)
