"""``signing-proxy delegate issue|extend|inspect|verify``: delegation chains for operators.

An owner issues the authority JWT to a principal's key; the principal extends it, narrowing only,
to the key that signs requests — for an agent behind this proxy, the proxy's own key, named with
``--holder-config`` (or ``--data-dir``) so no private key is ever copied. ``inspect`` decodes a
chain and checks what can be checked without the owner's key; ``verify`` does what an exchange
does (spec "Delegation verification"), with the owner's JWK Set as the only trust anchor. Chains
are printed on stdout, one line, ready for ``requester.delegation.token_file``. A chain argument
is the chain itself, ``@FILE`` or ``@-`` (stdin). Bad input exits 2 with one line; a refused chain
exits 1 with ``DENIAL_REASON_DELEGATION_INVALID: <sub-reason>: <detail>``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any, Final

from ..core.delegation import (
    NUMERIC_DATE_MAX,
    NUMERIC_DATE_MIN,
    THUMBPRINT_URI_PREFIX,
    check_chain,
    extend_chain,
    inspect_chain,
    issue_authority,
    split_chain,
    verify_chain,
)
from ..core.errors import DelegationError
from ..core.jwk import PRIVATE_JWK_MEMBERS, PublicKey, public_key_from_jwk
from ..core.jws import parse_jwt
from ..core.keys import format_rfc3339
from ..core.pkcs11_uri import NOT_SHOWN
from ..errors import CliError
from .common import duration, signing_key_file
from .delegate_inputs import (
    caps_args,
    expires_at,
    holder_jkt,
    now_arg,
    print_notes,
    read_chain,
    read_owner_keys,
    scopes_arg,
)

__all__ = ["add_parsers"]

CHAIN_HELP: Final = "the chain (compact JWSs joined with ~), @FILE to read it from a file, or @- from stdin"

# What each narrowing refusal means, for the one-line error of `delegate extend`.
RULES: Final = {
    "scope-widened": "a delegation may only narrow its parent's scope",
    "cap-raised": "a delegation may not raise, drop or re-period its parent's caps",
    "outlives-parent": "a delegation may not outlive its parent",
    "signer-not-named-by-parent": "--principal-key must be the key the chain's last link names (cnf.jkt)",
    "expired": "the chain (or the requested exp) is already expired",
}
# What a NumericDate may be (core: delegation_claims), as the operator writes it.
DATE_RANGE: Final = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z"
FAILED: Final = frozenset({"bad", "broken", "no-key", "expired", "bad-type", "out-of-range"})  # exit 1


def _refusal(exc: DelegationError) -> str:
    rule = RULES.get(exc.reason)
    prefix = f"refused ({rule}): " if rule else "refused: "
    return f"{prefix}{exc.denial_reason}: {exc.reason}: {exc.detail}"


def _now(args: argparse.Namespace) -> float:
    """``--now`` (default: the clock), in the range a NumericDate has once its offset is applied."""
    now = now_arg(args)
    if not NUMERIC_DATE_MIN <= now <= NUMERIC_DATE_MAX:
        raise CliError(f"--now: {args.now!r} is outside {DATE_RANGE} once its offset is applied")
    return now


# --- commands ---------------------------------------------------------------------------------------


def cmd_issue(args: argparse.Namespace) -> int:
    now = time.time()
    owner = signing_key_file(args.owner_key, "--owner-key")
    notes: list[str] = []
    holder = holder_jkt(args, now, notes)
    spend, accesses, period = caps_args(args)
    try:
        token = issue_authority(
            owner,
            iss=args.iss,
            holder_jkt=holder,
            now=now,
            scope=scopes_arg(args.scope),
            exp=expires_at(args.expires, now),
            max_spend_cents=spend,
            max_accesses=accesses,
            quota_period_s=period,
            iat=math.floor(now),
        )
    except DelegationError as exc:
        raise CliError(_refusal(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(token)
    print_notes(notes)
    return 0


def cmd_extend(args: argparse.Namespace) -> int:
    now = time.time()
    chain = read_chain(args.chain)
    principal = signing_key_file(args.principal_key, "--principal-key")
    try:
        parent = check_chain(chain, now=now)[-1]
    except DelegationError as exc:
        raise CliError(
            f"the chain to extend is refused: {exc.denial_reason}: {exc.reason}: {exc.detail}"
        ) from None
    notes: list[str] = []
    holder = holder_jkt(args, now, notes)
    spend, accesses, period = caps_args(args)
    # A child restates its parent's limits (absent means none): default to them, narrowed only by flags.
    spend = spend if spend is not None else parent.caps.max_spend_cents
    accesses = accesses if accesses is not None else parent.caps.max_accesses
    period = period if period is not None else parent.caps.quota_period_s
    scope = scopes_arg(args.scope)
    if scope is None and parent.scope is not None:
        scope = list(parent.scope)
    if args.expires is not None:
        exp: int | None = expires_at(args.expires, now)
    else:
        exp = None if parent.exp is None else math.floor(parent.exp)
    try:
        extended = extend_chain(
            chain,
            principal,
            holder_jkt=holder,
            now=now,
            scope=scope,
            exp=exp,
            max_spend_cents=spend,
            max_accesses=accesses,
            quota_period_s=period,
            iss=args.iss,
        )
    except DelegationError as exc:
        raise CliError(_refusal(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(extended)
    print_notes(notes)
    return 0


def _link_status(
    entry: dict[str, Any], parent: dict[str, Any] | None, owner_keys: list[PublicKey] | None, now: float
) -> dict[str, Any]:
    """Per-link checks that need no other link (signature, expiry) or only its parent (linkage)."""
    header, claims = entry["header"], entry["claims"]
    status: dict[str, Any] = {}
    signer: str | None = entry["signer_jkt"]
    if parent is None:
        status["linkage"] = "anchor"
        if owner_keys is None:
            status["signature"] = "not-checked"
        else:
            jws = parse_jwt(entry["token"]).jws
            match = next((k for k in owner_keys if k.verify(jws.signature, jws.signing_input)), None)
            status["signature"] = "ok" if match is not None else "bad"
            signer = match.thumbprint if match is not None else None
    else:
        jwk = header.get("jwk")
        if signer is None or not isinstance(jwk, dict):
            status["signature"], status["linkage"] = "no-key", "broken"
        else:
            jws = parse_jwt(entry["token"]).jws
            key = public_key_from_jwk(jwk)
            status["signature"] = "ok" if key.verify(jws.signature, jws.signing_input) else "bad"
            status["linkage"] = "ok" if signer == _cnf_jkt(parent["claims"]) else "broken"
    exp = claims.get("exp")
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        in_range = NUMERIC_DATE_MIN <= exp < NUMERIC_DATE_MAX + 1  # shown as RFC 3339 below
        status["expiry"] = ("expired" if now >= exp else "ok") if in_range else "out-of-range"
    else:
        status["expiry"] = "no-exp" if exp is None else "bad-type"
    entry["signer_jkt"] = signer
    return status


def _cnf_jkt(claims: dict[str, Any]) -> str | None:
    cnf = claims.get("cnf")
    jkt = cnf.get("jkt") if isinstance(cnf, dict) else None
    return jkt if isinstance(jkt, str) else None


# An object with any of these is shown as a key would be (a leaked one may lack kty: its d is secret).
_KEY_MEMBERS: Final = frozenset({"kty", "crv", "x", "n"})


def _hide_private_keys(value: Any, in_jwk: bool = False) -> list[str]:
    """Replace, in place, the value of every private JWK member (``PRIVATE_JWK_MEMBERS``) of every
    object under a ``jwk`` member or that looks like a key (``_KEY_MEMBERS``: a leaked key may lack
    ``kty``) in ``value`` with NOT_SHOWN; the names replaced. A private key is never printed."""
    hidden: list[str] = []
    if isinstance(value, dict):
        if in_jwk or not _KEY_MEMBERS.isdisjoint(value):
            for name in sorted(PRIVATE_JWK_MEMBERS.intersection(value)):
                value[name] = NOT_SHOWN
                hidden.append(name)
        for key, member in value.items():
            hidden += _hide_private_keys(member, in_jwk or key == "jwk")
    elif isinstance(value, list):
        for item in value:
            hidden += _hide_private_keys(item, in_jwk)
    return hidden


def cmd_inspect(args: argparse.Namespace) -> int:
    chain = read_chain(args.chain)
    now = _now(args)
    notes: list[str] = []
    owner_keys = None
    if args.owner_jwks is not None:
        owner_keys = read_owner_keys(Path(args.owner_jwks).expanduser(), now, args.issuer_grace, notes)
    try:
        tokens = split_chain(chain)
        entries = inspect_chain(chain)
    except DelegationError as exc:
        raise CliError(f"not a delegation chain: {exc.reason}: {exc.detail}") from None
    parent: dict[str, Any] | None = None
    for entry, token in zip(entries, tokens, strict=True):
        entry["token"] = token
        entry["status"] = _link_status(entry, parent, owner_keys, now)
        parent = entry
    result: dict[str, Any] = {"ok": True, "anchored": owner_keys is not None}
    try:
        if owner_keys is not None:
            final_jkt = _cnf_jkt(entries[-1]["claims"]) or ""
            verify_chain(chain, owner_keys=owner_keys, holder_jkt=final_jkt, now=now)
        else:
            check_chain(chain, now=now)
    except DelegationError as exc:
        result = {**result, "ok": False, "reason": exc.reason, "detail": exc.detail}
    failed = not result["ok"] or any(v in FAILED for e in entries for v in e["status"].values())
    for entry in entries:
        del entry["token"]
        hidden = _hide_private_keys(entry["header"]) + _hide_private_keys(entry["claims"])
        if hidden:
            failed = True
            notes.append(
                f"warning: link {entry['index']} carries a private key ({', '.join(sorted(set(hidden)))}; "
                "not shown): whoever saw this chain has it; replace that key and issue a new chain"
            )
    if args.json:
        doc = {"checked_at": format_rfc3339(now), "links": entries, "result": result}
        print(json.dumps(doc, indent=2))
    else:
        _print_inspection(entries, result, now)
    print_notes(notes)
    return 1 if failed else 0


_SHOWN: Final = {
    "ok": "ok",
    "bad": "BAD",
    "broken": "BROKEN",
    "no-key": "BROKEN (no usable public jwk header)",
    "anchor": "authority: trusted only through the owner's key",
    "not-checked": "not checked (needs the owner's key: --owner-jwks)",
    "expired": "EXPIRED",
    "no-exp": "no exp (no expiry)",
    "bad-type": "BAD (exp is not a NumericDate)",
    "out-of-range": f"BAD (exp is outside {DATE_RANGE})",
}


def _print_inspection(entries: list[dict[str, Any]], result: dict[str, Any], now: float) -> None:
    print(f"chain: {len(entries)} link(s), authority first; checked at {format_rfc3339(now)}")
    for entry in entries:
        claims, status = entry["claims"], entry["status"]
        role = "authority" if entry["index"] == 0 else "delegation"
        print(f"link {entry['index']} ({role})")
        print(f"  header:    {json.dumps(entry['header'], separators=(',', ':'))}")
        print(f"  claims:    {json.dumps(claims, separators=(',', ':'))}")
        print(f"  signer:    {entry['signer_jkt'] or '-'}")
        print(f"  signature: {_SHOWN[status['signature']]}")
        print(f"  linkage:   {_SHOWN[status['linkage']]}")
        exp = claims.get("exp")
        when = ""
        if status["expiry"] in ("ok", "expired"):
            when = f", exp {format_rfc3339(exp)} ({'in' if exp > now else 'since'} {abs(int(exp - now))} s)"
        print(f"  expiry:    {_SHOWN[status['expiry']]}{when}")
        print(f"  holder:    cnf.jkt {_cnf_jkt(claims) or '-'}")
    if result["ok"]:
        scope = "" if result["anchored"] else " (except the authority's signature: pass --owner-jwks)"
        print(f"result: ok{scope}")
    else:
        print(f"result: DENIAL_REASON_DELEGATION_INVALID: {result['reason']}: {result['detail']}")


def cmd_verify(args: argparse.Namespace) -> int:
    chain = read_chain(args.chain)
    now = _now(args)
    notes: list[str] = []
    owner_keys = read_owner_keys(Path(args.owner_jwks).expanduser(), now, args.issuer_grace, notes)
    holder = holder_jkt(args, now, notes)
    try:
        verified = verify_chain(
            chain,
            owner_keys=owner_keys,
            holder_jkt=holder,
            now=now,
            leeway_s=args.leeway,
            audience=args.audience,
        )
    except DelegationError as exc:
        print(f"{exc.denial_reason}: {exc.reason}: {exc.detail}")
        print_notes(notes)
        return 1
    except ValueError as exc:
        raise CliError(str(exc)) from None
    caps = verified.caps
    doc: dict[str, Any] = {
        "valid": True,
        "links": len(verified.links),
        "issuer": verified.issuer,
        "owner_jkt": verified.owner_jkt,
        "holder_jkt": verified.holder_jkt,
        "scope": None if verified.scope is None else list(verified.scope),
        "max_spend_cents": caps.max_spend_cents,
        "max_accesses": caps.max_accesses,
        "quota_period": None if caps.quota_period_s is None else f"{caps.quota_period_s}s",
        "expires_at": None if verified.expires_at is None else format_rfc3339(verified.expires_at),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        print_notes(notes)
        return 0
    print(f"ok: {doc['links']} link(s), owner key {doc['owner_jkt']}, holder {doc['holder_jkt']}")
    print(f"issuer:          {doc['issuer']}")
    scope = "unrestricted (no scope claim)" if doc["scope"] is None else " ".join(doc["scope"])
    print(f"scope:           {scope}")
    print(f"max_spend_cents: {_or(doc['max_spend_cents'], 'no cap')}")
    print(f"max_accesses:    {_or(doc['max_accesses'], 'no cap')}")
    print(f"quota_period:    {_or(doc['quota_period'], 'lifetime')}")
    print(f"expires_at:      {_or(doc['expires_at'], 'never (no exp)')}")
    print_notes(notes)
    return 0


def _or(value: object, absent: str) -> str:
    return absent if value is None else str(value)


# --- parser -----------------------------------------------------------------------------------------


def _holder_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("holder (exactly one)")
    group.add_argument(
        "--holder-key", metavar="PATH", help="the holder's key: public (PEM/JWK) or private file"
    )
    group.add_argument(
        "--holder-jkt",
        metavar="JKT",
        help="the holder key's RFC 7638 thumbprint (write --holder-jkt=JKT when it starts with '-')",
    )
    group.add_argument(
        "--holder-config",
        metavar="FILE",
        help="the proxy's config: bind to the key it signs with now (signing.key or its key store)",
    )
    group.add_argument("--data-dir", metavar="DIR", help="the proxy's data directory (its key store)")
    group.add_argument("--agent", metavar="NAME", help="whose key store (default: signing.agent)")


def _grant_flags(parser: argparse.ArgumentParser, *, child: bool) -> None:
    inherit = " (default: the parent's)" if child else ""
    parser.add_argument(
        "--scope", action="append", metavar="SCOPE", help=f"a granted scope; repeat for more{inherit}"
    )
    parser.add_argument(
        "--expires",
        required=not child,
        metavar="DURATION|RFC3339",
        help=f"exp: a duration from now (12h, 30d) or an RFC 3339 time{inherit}",
    )
    parser.add_argument("--max-spend-cents", type=int, metavar="N", help=f"svc_max_spend_cents{inherit}")
    parser.add_argument("--max-accesses", type=int, metavar="N", help=f"svc_max_accesses{inherit}")
    period_default = "the parent's" if child else "lifetime"
    parser.add_argument(
        "--quota-period",
        metavar="DURATION",
        help=f"svc_quota_period, e.g. 86400s or 30d (default: {period_default})",
    )


def add_parsers(sub: Any) -> None:
    """Add ``delegate issue|extend|inspect|verify`` to the top-level subcommands."""
    delegate = sub.add_parser(
        "delegate",
        help="delegation chains: issue, extend, inspect, verify",
        description="Holder-bound delegation chains (spec: Delegation). A chain argument is the chain, "
        "@FILE or @- (stdin).",
    ).add_subparsers(dest="delegate_command", metavar="ACTION")

    issue = delegate.add_parser(
        "issue",
        help="sign an authority JWT with the owner's key",
        description="Print the authority JWT: the owner grants scopes and caps to the holder's key.",
    )
    issue.add_argument("--owner-key", required=True, metavar="PATH", help="the owner's private key (0600)")
    issue.add_argument("--iss", required=True, metavar="ISS", help="iss: who grants it (the owner)")
    _holder_flags(issue)
    _grant_flags(issue, child=False)
    issue.set_defaults(func=cmd_issue)

    extend = delegate.add_parser(
        "extend",
        help="append a narrower delegation JWT signed by the chain's holder",
        description="Print the chain extended by one JWT signed with --principal-key (the key the last "
        "link names), carrying its public key in the header. Scope, caps and exp default to the "
        "parent's and may only narrow: widening is refused.",
    )
    extend.add_argument("chain", metavar="CHAIN|@FILE", help=CHAIN_HELP)
    extend.add_argument("--principal-key", required=True, metavar="PATH", help="the principal's private key")
    extend.add_argument(
        "--iss", metavar="ISS", help=f"iss (default: {THUMBPRINT_URI_PREFIX}<principal thumbprint>)"
    )
    _holder_flags(extend)
    _grant_flags(extend, child=True)
    extend.set_defaults(func=cmd_extend)

    inspect = delegate.add_parser(
        "inspect",
        help="decode a chain and check what can be checked without the owner's key",
        description="Show each link's header, claims, signer thumbprint and status (signature, linkage, "
        "expiry). Exit 0 when every check passes, 1 otherwise, 2 when it is not a chain.",
    )
    inspect.add_argument("chain", metavar="CHAIN|@FILE", help=CHAIN_HELP)
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--now", metavar="RFC3339", help="check as of this time (default: now)")
    inspect.add_argument("--owner-jwks", metavar="FILE", help="also check the authority's signature")
    inspect.add_argument(
        "--issuer-grace",
        type=duration,
        default=0,
        metavar="DURATION",
        help="with --owner-jwks: accept an owner key this long after its not_after (rotation grace; "
        "default 0s)",
    )
    inspect.set_defaults(func=cmd_inspect)

    verify = delegate.add_parser(
        "verify",
        help="verify a chain as an exchange does",
        description="Verify offline with the owner's JWK Set as the only trust anchor and bind the chain "
        "to the holder. Exit 0 with the effective scope and caps, or 1 with "
        "DENIAL_REASON_DELEGATION_INVALID: <sub-reason>: <detail>.",
    )
    verify.add_argument("chain", metavar="CHAIN|@FILE", help=CHAIN_HELP)
    verify.add_argument(
        "--owner-jwks",
        required=True,
        metavar="FILE",
        help='the owner\'s public keys, a JWK Set {"keys": [...]}; not_before/not_after optional',
    )
    _holder_flags(verify)
    verify.add_argument("--now", metavar="RFC3339", help="verify as of this time (default: now)")
    verify.add_argument(
        "--issuer-grace",
        type=duration,
        default=0,
        metavar="DURATION",
        help="accept an owner key this long after its not_after (rotation grace; default 0s)",
    )
    verify.add_argument(
        "--leeway", type=int, default=0, metavar="SECONDS", help="clock leeway on exp/nbf, 0-300 (default 0)"
    )
    verify.add_argument("--audience", metavar="AUD", help="this verifier's name, when tokens carry aud")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(func=cmd_verify)
