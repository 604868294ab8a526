"""Holder-bound delegation chains: JWTs that pass an owner's grant down, narrowing at every hop.

A chain is the authority JWT, signed by the resource owner, followed by zero or more delegation
JWTs, each signed by the key its parent named in ``cnf.jkt`` and carrying that key in its ``jwk``
header; on the wire the compact JWSs are joined with ``~``, authority first. Verification is
offline (spec "Delegation verification"): the owner's published keys are the only trust anchors,
every later signer is trusted only because its parent named it, a link may only narrow its parent
(scope, caps, lifetime), every ``exp`` must lie after ``now``, and the final ``cnf.jkt`` must be the
key that signed the request. Claims fail closed (spec "Delegation token claims" rule 3): a claim we
cannot evaluate refuses the token unless its issuer listed it in the ``advisory`` claim. Every
refusal is a DelegationError whose ``reason`` is one of ``REASONS``; the denial reason on the wire
is always DENIAL_REASON_DELEGATION_INVALID. An absent constraint is no constraint (spec rule 1), so
a child must restate every scope, cap and expiry of its parent, narrowed or equal.


This module issues and extends chains (``issue_authority``, ``extend_chain``) and is the one import
path for the whole piece: the wire form and the claims of one link live in ``delegation_claims``,
walking and verifying a chain in ``delegation_verify``, both re-exported here. Neither imports this
module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .delegation_claims import (
    ADVISORY_CLAIM,
    CHAIN_SEPARATOR,
    DURATION_MAX_S,
    INT32_MAX,
    INT64_MAX,
    MAX_CHAIN_LINKS,
    MAX_LEEWAY_S,
    NUMERIC_DATE_MAX,
    NUMERIC_DATE_MIN,
    REASONS,
    REGISTERED_CLAIMS,
    SVC_CLAIMS,
    SVC_PREFIX,
    THUMBPRINT_URI_PREFIX,
    Caps,
    VerifiedLink,
    check_narrows,
    check_time,
    inspect_chain,
    link_error,
    read_claims,
    split_chain,
)
from .delegation_verify import VerifiedDelegation, check_chain, verify_chain
from .errors import DelegationError
from .jwk import SigningKey
from .jws import sign_jwt
from .scopes import format_scope_list

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
    "VerifiedDelegation",
    "VerifiedLink",
    "check_chain",
    "extend_chain",
    "inspect_chain",
    "issue_authority",
    "split_chain",
    "verify_chain",
]

# Names the issue/extend keywords write; extra_claims must not set them behind their back.
_KEYWORD_CLAIMS = frozenset({"iss", "exp", "iat", "cnf", "scope", ADVISORY_CLAIM}) | SVC_CLAIMS


def _build_claims(
    *,
    iss: str,
    holder_jkt: str,
    scope: Iterable[str] | None,
    exp: float | None,
    max_spend_cents: int | None,
    max_accesses: int | None,
    quota_period_s: int | None,
    extra_claims: Mapping[str, Any] | None,
    advisory: Iterable[str] | None,
    iat: float | None,
) -> dict[str, Any]:
    extra = dict(extra_claims or {})
    clash = sorted(_KEYWORD_CLAIMS.intersection(extra))
    if clash:
        raise ValueError(f"set {clash} with the keyword arguments, not extra_claims")
    claims: dict[str, Any] = {"iss": iss, **extra}
    if iat is not None:
        claims["iat"] = iat
    if exp is not None:
        claims["exp"] = exp
    claims["cnf"] = {"jkt": holder_jkt}
    if scope is not None:
        claims["scope"] = format_scope_list(scope)
    # proto-JSON of the mirrored Delegation fields (spec rule 4): int64 as a string, Duration "<n>s".
    if max_spend_cents is not None:
        claims["svc_max_spend_cents"] = str(max_spend_cents)
    if max_accesses is not None:
        claims["svc_max_accesses"] = max_accesses
    if quota_period_s is not None:
        claims["svc_quota_period"] = f"{quota_period_s}s"
    if advisory is not None:
        claims[ADVISORY_CLAIM] = list(advisory)
    return claims


def issue_authority(
    owner_key: SigningKey,
    *,
    iss: str,
    holder_jkt: str,
    now: float,
    scope: list[str] | None = None,
    exp: int | None = None,
    max_spend_cents: int | None = None,
    max_accesses: int | None = None,
    quota_period_s: int | None = None,
    extra_claims: dict[str, Any] | None = None,
    advisory: list[str] | None = None,
    iat: int | None = None,
) -> str:
    """Sign the authority JWT: the owner grants ``scope`` and caps to the key ``holder_jkt``.

    ``now`` is the issuer's clock: the time check ``extend_chain`` runs on a child runs here too, so
    an ``exp`` not after ``now`` is refused (``expired``), as is an ``nbf`` still ahead of it."""
    claims = _build_claims(
        iss=iss,
        holder_jkt=holder_jkt,
        scope=scope,
        exp=exp,
        max_spend_cents=max_spend_cents,
        max_accesses=max_accesses,
        quota_period_s=quota_period_s,
        extra_claims=extra_claims,
        advisory=advisory,
        iat=iat,
    )
    # Never sign what a verifier would refuse; the issuer understands its own extra claims.
    link = read_claims(claims, 0, owner_key.thumbprint, frozenset(extra_claims or ()))
    check_time(link, 0, now, 0)
    return sign_jwt(claims, owner_key)


def extend_chain(
    chain: str,
    principal_key: SigningKey,
    *,
    holder_jkt: str,
    now: float,
    scope: list[str] | None = None,
    exp: int | None = None,
    max_spend_cents: int | None = None,
    max_accesses: int | None = None,
    quota_period_s: int | None = None,
    extra_claims: dict[str, Any] | None = None,
    advisory: list[str] | None = None,
    iss: str | None = None,
) -> str:
    """Append a child JWT, signed by the holder of the chain, that delegates to ``holder_jkt``.

    The existing links are checked as a verifier would except for the authority's signature
    (the owner keys are not needed to extend). ``iss`` defaults to the RFC 9278 thumbprint URI of
    ``principal_key``; ``iat`` is ``floor(now)``.
    """
    tokens = split_chain(chain)
    if len(tokens) >= MAX_CHAIN_LINKS:
        raise DelegationError("malformed-chain", f"at most {MAX_CHAIN_LINKS} links are accepted")
    # check_chain skips the authority's signature; verify_chain checks it with the owner keys.
    links = check_chain(chain, now=now)
    parent = links[-1]
    index = len(links)
    if principal_key.thumbprint != parent.cnf_jkt:
        raise link_error(
            "signer-not-named-by-parent", index, "principal_key is not the key the last link names"
        )
    claims = _build_claims(
        iss=iss if iss is not None else THUMBPRINT_URI_PREFIX + principal_key.thumbprint,
        holder_jkt=holder_jkt,
        scope=scope,
        exp=exp,
        max_spend_cents=max_spend_cents,
        max_accesses=max_accesses,
        quota_period_s=quota_period_s,
        extra_claims=extra_claims,
        advisory=advisory,
        iat=math.floor(now),
    )
    child = read_claims(claims, index, principal_key.thumbprint, frozenset(extra_claims or ()))
    check_time(child, index, now, 0)
    check_narrows(child, parent, index)
    token = sign_jwt(claims, principal_key, {"jwk": principal_key.public.jwk()})
    return chain + CHAIN_SEPARATOR + token
