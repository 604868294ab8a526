"""Delegation chains on the wire and the claims of one link: split, decode, type-check, narrow.

A chain is the authority JWT, signed by the resource owner, followed by zero or more delegation
JWTs, each carrying its signer's public key in its ``jwk`` header; on the wire the compact JWSs are
joined with ``~``, authority first (``split_chain``, ``inspect_chain``). ``read_claims`` type-checks
every claim of one link into a ``VerifiedLink`` and fails closed (spec "Delegation token claims"
rules 2-4): an ``svc_`` claim outside the registry or a custom claim neither understood nor listed in
``advisory`` refuses the token. ``check_time`` and ``check_narrows`` are the rules a link obeys
against ``now`` and against its parent (scope, caps, lifetime may only narrow; absent is no
constraint). Every refusal is a DelegationError whose ``reason`` is one of ``REASONS``. Walking and
verifying a chain is ``delegation_verify``, issuing and extending ``delegation``; import the public
names from ``delegation``.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from .b64 import b64url_decode
from .errors import DelegationError, KeyFormatError
from .jwk import PublicKey, public_key_from_jwk
from .jws import MAX_JWS_CHARS, ParsedJwt, parse_jwt
from .scopes import narrows, parse_scope_list

__all__ = [
    "ADVISORY_CLAIM",
    "CHAIN_SEPARATOR",
    "DURATION_MAX_S",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_CHAIN_LINKS",
    "MAX_LEEWAY_S",
    "NUMERIC_DATE_MAX",
    "NUMERIC_DATE_MIN",
    "REASONS",
    "REGISTERED_CLAIMS",
    "SVC_CLAIMS",
    "SVC_PREFIX",
    "THUMBPRINT_URI_PREFIX",
    "Caps",
    "VerifiedLink",
    "check_narrows",
    "check_time",
    "header_key",
    "inspect_chain",
    "link_error",
    "parse_link",
    "read_claims",
    "split_chain",
]

CHAIN_SEPARATOR = "~"  # DESIGN.md section 4: compact JWSs joined with "~", authority JWT first
MAX_CHAIN_LINKS = 8  # our bound (spec: not shown); the owner's grant plus seven hops of re-delegation
MAX_LEEWAY_S = 300  # RFC 7519 section 4.1.4: leeway "usually no more than a few minutes"
INT64_MAX = 2**63 - 1  # spec "Limits": max_spend_cents is int64
INT32_MAX = 2**31 - 1  # spec "Limits": max_accesses is int32
DURATION_MAX_S = 315_576_000_000  # google.protobuf.Duration: at most 10,000 years
JKT_CHARS = 43  # RFC 7638 + RFC 9449 section 6.1: base64url SHA-256 thumbprint, no padding
SVC_PREFIX = "svc_"  # spec "Delegation token claims" rule 2: reserved for the registry
ADVISORY_CLAIM = "advisory"  # our convention for rule 3 (the spec names no mechanism)
THUMBPRINT_URI_PREFIX = "urn:ietf:params:oauth:jwk-thumbprint:sha-256:"  # RFC 9278: default child iss

# RFC 7519 section 4.1, RFC 7800 section 3.1 (cnf), RFC 8693 section 4.2 (scope).
REGISTERED_CLAIMS = frozenset({"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "cnf", "scope"})
# spec "Delegation token claims": the svc_ registry.
SVC_CLAIMS = frozenset({"svc_max_spend_cents", "svc_max_accesses", "svc_quota_period"})

REASONS = frozenset(
    {
        "malformed-chain",  # the ~-joined wire form: empty, an empty link, too many links
        "malformed-token",  # a link is not a strict EdDSA JWT, or its jwk header is not a public OKP key
        "unsupported-algorithm",  # header alg is not EdDSA
        "unsupported-critical-header",  # header crit (or RFC 7797 b64) we cannot honour
        "untrusted-issuer-key",  # the authority JWT verifies under none of the owner keys
        "chain-linkage-broken",  # a child's jwk is missing or its thumbprint is not the parent's cnf.jkt
        "signer-not-named-by-parent",  # a child is not signed by the key its parent named
        "missing-claim",  # iss or cnf.jkt absent
        "bad-claim-type",  # a claim with the wrong JSON type or encoding
        "bad-claim-value",  # a well-typed claim out of range (negative cap, int32 overflow, bad jkt...)
        "reserved-claim",  # an svc_* claim outside the registry
        "unrecognized-claim",  # a claim we cannot evaluate and the issuer did not mark advisory
        "audience-mismatch",  # aud present and not naming the verifier
        "expired",  # now is on or after exp (plus leeway)
        "not-yet-valid",  # now is before nbf (minus leeway)
        "scope-widened",  # a child scope not covered by the parent's, or scope dropped
        "cap-raised",  # a child cap above the parent's, dropped, or its period changed
        "outlives-parent",  # a child exp later than the parent's, or dropped
        "holder-mismatch",  # the final cnf.jkt is not the request signer's thumbprint
    }
)

_INT64_STRING = re.compile(r"-?(?:0|[1-9][0-9]*)")  # proto3 JSON int64: decimal string, no exponent
_DURATION_STRING = re.compile(r"(?:0|[1-9][0-9]*)s")  # spec: "<seconds>s", whole seconds
# digits past which a decimal string is out of range anyway (int() refuses past 4,300 of them)
_INT64_DIGITS = len(str(INT64_MAX))
_DURATION_DIGITS = len(str(DURATION_MAX_S))
# NumericDates are shown as RFC 3339 (inspect, verify, the Delegation message's expires_at), which has
# four-digit years: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z. No date of use is outside it.
NUMERIC_DATE_MIN = -62_135_596_800
NUMERIC_DATE_MAX = 253_402_300_799
_JWK_MEMBERS = frozenset({"kty", "crv", "x"})  # spec rule 5: the child jwk carries exactly these


@dataclass(frozen=True)
class Caps:
    """Spend and access caps of a grant (``None`` = no cap) and their reset period (``None`` = lifetime)."""

    max_spend_cents: int | None = None
    max_accesses: int | None = None
    quota_period_s: int | None = None

    @property
    def capped(self) -> bool:
        """True if either counter is capped."""
        return self.max_spend_cents is not None or self.max_accesses is not None


@dataclass(frozen=True)
class VerifiedLink:
    """One verified JWT of a chain: what it grants, to whom, and who signed it."""

    iss: str
    scope: tuple[str, ...] | None
    exp: float | None
    cnf_jkt: str
    caps: Caps
    signer_jkt: str
    sub: str | None = None
    aud: tuple[str, ...] | None = None
    nbf: float | None = None
    iat: float | None = None
    jti: str | None = None
    advisory: tuple[str, ...] = ()
    extra_claims: dict[str, Any] = field(default_factory=dict)


def link_error(reason: str, index: int, detail: str) -> DelegationError:
    """The refusal of link ``index`` (0 = the authority JWT) for ``reason``, one of ``REASONS``."""
    return DelegationError(reason, f"link {index}: {detail}")


def _name(claim: str) -> str:
    # Claim names come from the token: bound what we echo into logs.
    return repr(claim[:64])


def split_chain(chain: str) -> list[str]:
    """Split the ``~``-joined wire form into compact JWSs (authority first)."""
    if not isinstance(chain, str) or not chain:
        raise DelegationError("malformed-chain", "a delegation chain is a non-empty string")
    if len(chain) > MAX_CHAIN_LINKS * (MAX_JWS_CHARS + 1):
        raise DelegationError("malformed-chain", "the delegation chain is too long")
    tokens = chain.split(CHAIN_SEPARATOR)
    if len(tokens) > MAX_CHAIN_LINKS:
        raise DelegationError("malformed-chain", f"at most {MAX_CHAIN_LINKS} links are accepted")
    if not all(tokens):
        raise DelegationError("malformed-chain", "a delegation chain has no empty links")
    return tokens


def parse_link(token: str, index: int) -> ParsedJwt:
    """Decode link ``index`` as a strict EdDSA JWT; its signature is not checked here."""
    try:
        return parse_jwt(token)
    except DelegationError as exc:
        raise link_error(exc.reason, index, exc.detail) from exc


def header_key(header: Mapping[str, Any], index: int) -> PublicKey:
    """The public key a child's ``jwk`` header names."""
    if "jwk" not in header:
        raise link_error(
            "chain-linkage-broken", index, "a delegation JWT carries its signer's key as header jwk"
        )
    jwk = header["jwk"]
    if not isinstance(jwk, dict) or set(jwk) != _JWK_MEMBERS:
        # Never echo the members: a jwk carrying "d" would put a private key in our logs.
        raise link_error("malformed-token", index, "header jwk must be an object with exactly kty, crv, x")
    try:
        return public_key_from_jwk(jwk)
    except KeyFormatError as exc:
        raise link_error("malformed-token", index, f"header jwk: {exc.reason}") from exc


def _numeric_date(claims: Mapping[str, Any], name: str, index: int) -> float | None:
    if name not in claims:
        return None
    value = claims[name]
    # RFC 7519 section 2: NumericDate is a JSON number; bool is an int in Python, not in JSON.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise link_error("bad-claim-type", index, f"{name} is a JSON number (NumericDate)")
    # The whole second is what is shown: 9999-12-31T23:59:59.5Z is still in range.
    if not NUMERIC_DATE_MIN <= value < NUMERIC_DATE_MAX + 1:
        raise link_error(
            "bad-claim-value",
            index,
            f"{name} is out of range (a NumericDate from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z)",
        )
    return value


def _optional_string(claims: Mapping[str, Any], name: str, index: int) -> str | None:
    if name not in claims:
        return None
    value = claims[name]
    if not isinstance(value, str):
        raise link_error("bad-claim-type", index, f"{name} is a string")
    return value


def _read_advisory(claims: Mapping[str, Any], index: int) -> tuple[str, ...]:
    if ADVISORY_CLAIM not in claims:
        return ()
    names = claims[ADVISORY_CLAIM]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise link_error("bad-claim-type", index, f"{ADVISORY_CLAIM} is a JSON array of claim names")
    for name in names:
        # Only custom claims can be waived: registered and svc_ claims are binding by definition.
        if not name or name in REGISTERED_CLAIMS or name.startswith(SVC_PREFIX) or name == ADVISORY_CLAIM:
            raise link_error("bad-claim-value", index, f"{ADVISORY_CLAIM} may not name {_name(name)}")
    return tuple(names)


def _read_spend(value: Any, index: int) -> int:
    name = "svc_max_spend_cents"
    # proto3 JSON writes int64 as a decimal string and parsers accept a JSON integer too; so do we.
    if isinstance(value, str) and _INT64_STRING.fullmatch(value):
        if len(value.lstrip("-")) > _INT64_DIGITS:
            raise link_error("bad-claim-value", index, f"{name} is between 0 and {INT64_MAX}")
        cents = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        cents = value
    else:
        raise link_error("bad-claim-type", index, f"{name} is an int64: a decimal string or a JSON integer")
    if not 0 <= cents <= INT64_MAX:
        raise link_error("bad-claim-value", index, f"{name} is between 0 and {INT64_MAX}")
    return cents


def _read_accesses(value: Any, index: int) -> int:
    name = "svc_max_accesses"
    # proto3 JSON writes int32 as a JSON number; a string here would be a second, non-canonical form.
    if isinstance(value, bool) or not isinstance(value, int):
        raise link_error("bad-claim-type", index, f"{name} is an int32 JSON integer")
    if not 0 <= value <= INT32_MAX:
        raise link_error("bad-claim-value", index, f"{name} is between 0 and {INT32_MAX}")
    return value


def _read_period(value: Any, index: int) -> int:
    name = "svc_quota_period"
    if not isinstance(value, str) or not _DURATION_STRING.fullmatch(value):
        raise link_error(
            "bad-claim-type", index, f'{name} is a Duration string of whole seconds, "<seconds>s"'
        )
    if len(value) - 1 > _DURATION_DIGITS:
        raise link_error("bad-claim-value", index, f"{name} is between 1s and {DURATION_MAX_S}s")
    seconds = int(value[:-1])
    # A zero period would reset the counters continuously, i.e. no cap at all.
    if not 1 <= seconds <= DURATION_MAX_S:
        raise link_error("bad-claim-value", index, f"{name} is between 1s and {DURATION_MAX_S}s")
    return seconds


def _read_cnf(claims: Mapping[str, Any], index: int) -> str:
    if "cnf" not in claims:
        raise link_error("missing-claim", index, "cnf (holder binding) is required")
    cnf = claims["cnf"]
    if not isinstance(cnf, dict):
        raise link_error("bad-claim-type", index, "cnf is a JSON object")
    if "jkt" not in cnf:
        raise link_error("missing-claim", index, "cnf.jkt is required")
    # Another confirmation method beside jkt would be a binding we do not evaluate.
    if set(cnf) != {"jkt"}:
        raise link_error("bad-claim-value", index, "cnf carries only jkt")
    jkt = cnf["jkt"]
    if not isinstance(jkt, str):
        raise link_error("bad-claim-type", index, "cnf.jkt is a string")
    try:
        valid = len(jkt) == JKT_CHARS and len(b64url_decode(jkt)) == 32
    except ValueError:
        valid = False
    if not valid:
        raise link_error("bad-claim-value", index, "cnf.jkt is a base64url SHA-256 JWK thumbprint (43 chars)")
    return jkt


def _read_aud(claims: Mapping[str, Any], index: int) -> tuple[str, ...] | None:
    if "aud" not in claims:
        return None
    aud = claims["aud"]
    if isinstance(aud, str):
        return (aud,)
    if isinstance(aud, list) and aud and all(isinstance(a, str) for a in aud):
        return tuple(aud)
    raise link_error("bad-claim-type", index, "aud is a string or a non-empty array of strings")


def read_claims(
    claims: Mapping[str, Any], index: int, signer_jkt: str, understood: Container[str]
) -> VerifiedLink:
    """Type-check every claim and refuse the ones we cannot evaluate (spec rules 2-4)."""
    advisory = _read_advisory(claims, index)
    extra: dict[str, Any] = {}
    for name in claims:
        if name in REGISTERED_CLAIMS or name in SVC_CLAIMS or name == ADVISORY_CLAIM:
            continue
        if name.startswith(SVC_PREFIX):
            raise link_error("reserved-claim", index, f"{_name(name)} uses the reserved svc_ prefix")
        if name not in advisory and name not in understood:
            raise link_error("unrecognized-claim", index, f"{_name(name)} is neither understood nor advisory")
        extra[name] = claims[name]

    iss = _optional_string(claims, "iss", index)
    if iss is None:
        raise link_error("missing-claim", index, "iss is required")
    if not iss:
        raise link_error("bad-claim-value", index, "iss is a non-empty string")
    cnf_jkt = _read_cnf(claims, index)

    scope: tuple[str, ...] | None = None
    if "scope" in claims:
        raw_scope = claims["scope"]
        if not isinstance(raw_scope, str):
            raise link_error("bad-claim-type", index, "scope is a space-delimited string")
        try:
            scope = parse_scope_list(raw_scope)
        except ValueError as exc:
            raise link_error("bad-claim-value", index, f"scope: {exc}") from exc

    caps = Caps(
        max_spend_cents=_read_spend(claims["svc_max_spend_cents"], index)
        if "svc_max_spend_cents" in claims
        else None,
        max_accesses=_read_accesses(claims["svc_max_accesses"], index)
        if "svc_max_accesses" in claims
        else None,
        quota_period_s=_read_period(claims["svc_quota_period"], index)
        if "svc_quota_period" in claims
        else None,
    )
    return VerifiedLink(
        iss=iss,
        scope=scope,
        exp=_numeric_date(claims, "exp", index),
        cnf_jkt=cnf_jkt,
        caps=caps,
        signer_jkt=signer_jkt,
        sub=_optional_string(claims, "sub", index),
        aud=_read_aud(claims, index),
        nbf=_numeric_date(claims, "nbf", index),
        iat=_numeric_date(claims, "iat", index),
        jti=_optional_string(claims, "jti", index),
        advisory=advisory,
        extra_claims=extra,
    )


def check_time(link: VerifiedLink, index: int, now: float, leeway_s: float) -> None:
    """Refuse a link whose ``exp`` has passed or whose ``nbf`` is still ahead of ``now``."""
    # RFC 7519 section 4.1.4: reject on or after exp, so exp == now is already expired.
    if link.exp is not None and now >= link.exp + leeway_s:
        raise link_error("expired", index, "exp is not after the current time")
    if link.nbf is not None and now + leeway_s < link.nbf:
        raise link_error("not-yet-valid", index, "nbf is after the current time")


def check_narrows(child: VerifiedLink, parent: VerifiedLink, index: int) -> None:
    """A child may only narrow its parent: scope, caps and lifetime (spec step 2, "Limits")."""
    if parent.scope is not None:
        if child.scope is None:
            raise link_error(
                "scope-widened", index, "the parent has a scope; a child without one is unrestricted"
            )
        wider = narrows(child.scope, parent.scope)
        if wider:
            raise link_error("scope-widened", index, f"scopes not covered by the parent: {wider[:8]}")

    for name in ("max_spend_cents", "max_accesses"):
        parent_cap = getattr(parent.caps, name)
        child_cap = getattr(child.caps, name)
        if parent_cap is not None and (child_cap is None or child_cap > parent_cap):
            raise link_error("cap-raised", index, f"svc_{name} exceeds the parent's (absent means no cap)")
    # Same cap over a shorter or shifted window allows more in total; lifetime is always narrower.
    if (
        parent.caps.capped
        and child.caps.quota_period_s is not None
        and child.caps.quota_period_s != parent.caps.quota_period_s
    ):
        raise link_error(
            "cap-raised", index, "svc_quota_period must equal the parent's or be absent (lifetime)"
        )

    if parent.exp is not None and (child.exp is None or child.exp > parent.exp):
        raise link_error("outlives-parent", index, "exp is later than the parent's (absent means no expiry)")


def inspect_chain(chain: str) -> list[dict[str, Any]]:
    """Decode every link WITHOUT verifying anything (for display, e.g. ``delegate inspect``)."""
    out: list[dict[str, Any]] = []
    for index, token in enumerate(split_chain(chain)):
        jwt = parse_link(token, index)
        entry: dict[str, Any] = {
            "index": index,
            "header": jwt.header,
            "claims": jwt.claims,
            "signer_jkt": None,
        }
        if index > 0:
            try:
                entry["signer_jkt"] = header_key(jwt.header, index).thumbprint
            except DelegationError:
                entry["signer_jkt"] = None  # shown as unknown; verify_chain would refuse this link
        out.append(entry)
    return out
