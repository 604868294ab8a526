"""Delegation chain verification: walk the links in order, each authenticated before it is read.

Verification is offline (spec "Delegation verification"): the owner's published keys are the only
trust anchors for the authority JWT, every later signer is trusted only because its parent named it
in ``cnf.jkt`` (its ``jwk`` header must have that thumbprint and verify its signature), each link's
claims must pass ``read_claims``, ``check_time`` against ``now`` and ``check_narrows`` against its
parent, ``aud`` must name the verifier, and the final ``cnf.jkt`` must be the key that signed the
request. ``verify_chain`` returns a frozen ``VerifiedDelegation``; ``check_chain`` runs every rule a
holder can run without the owner's keys. Import the public names from ``delegation``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from .delegation_claims import (
    MAX_LEEWAY_S,
    Caps,
    VerifiedLink,
    check_narrows,
    check_time,
    header_key,
    link_error,
    parse_link,
    read_claims,
    split_chain,
)
from .jwk import PublicKey
from .jws import ParsedJwt

__all__ = ["VerifiedDelegation", "check_chain", "verify_chain"]


@dataclass(frozen=True)
class VerifiedDelegation:
    """A verified chain; trust only these values, never the raw token or the Delegation mirror fields."""

    links: tuple[VerifiedLink, ...]
    scope: tuple[str, ...] | None
    caps: Caps
    holder_jkt: str
    expires_at: float | None
    owner_jkt: str

    @property
    def issuer(self) -> str:
        """The authority JWT's ``iss``: who granted the delegation."""
        return self.links[0].iss


class _Everything:
    """A container holding every name: check_chain (so extend_chain) leaves custom claims to the verifier."""

    def __contains__(self, item: object) -> bool:
        return True


def _check_audience(link: VerifiedLink, index: int, audience: str | None) -> None:
    # RFC 7519 section 4.1.3: a verifier not named in aud MUST reject.
    if link.aud is not None and (audience is None or audience not in link.aud):
        raise link_error("audience-mismatch", index, "aud does not name this verifier")


def _walk(
    tokens: Sequence[str],
    *,
    verify_root: Callable[[ParsedJwt], str],
    now: float,
    leeway_s: float,
    audience: str | None,
    check_audience: bool,
    understood: Container[str],
) -> list[VerifiedLink]:
    """Verify the links in order; each is authenticated before any of its claims is evaluated."""
    links: list[VerifiedLink] = []
    for index, token in enumerate(tokens):
        jwt = parse_link(token, index)
        if index == 0:
            signer_jkt = verify_root(jwt)
        else:
            parent = links[-1]
            key = header_key(jwt.header, index)
            if key.thumbprint != parent.cnf_jkt:
                raise link_error(
                    "chain-linkage-broken", index, "thumbprint of header jwk is not the parent's cnf.jkt"
                )
            if not key.verify(jwt.jws.signature, jwt.jws.signing_input):
                raise link_error(
                    "signer-not-named-by-parent", index, "not signed by the key the parent named"
                )
            signer_jkt = key.thumbprint
        link = read_claims(jwt.claims, index, signer_jkt, understood)
        check_time(link, index, now, leeway_s)
        if check_audience:
            _check_audience(link, index, audience)
        if links:
            check_narrows(link, links[-1], index)
        links.append(link)
    return links


def _check_leeway(leeway_s: float) -> None:
    if not 0 <= leeway_s <= MAX_LEEWAY_S:
        raise ValueError(f"leeway_s is between 0 and {MAX_LEEWAY_S}")


def _min_or_none(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def verify_chain(
    chain: str,
    *,
    owner_keys: Sequence[PublicKey],
    holder_jkt: str,
    now: float,
    leeway_s: int = 0,
    audience: str | None = None,
    understood_claims: Iterable[str] = (),
) -> VerifiedDelegation:
    """Verify a chain offline against the owner's keys and bind it to the request signer's thumbprint.

    ``owner_keys`` are the only trust anchors (several: current and recently rotated keys).
    ``understood_claims`` names custom claims the caller evaluates itself; they become binding
    instead of refused and are returned in each link's ``extra_claims``.
    """
    _check_leeway(leeway_s)
    anchors = tuple(owner_keys)

    def verify_root(jwt: ParsedJwt) -> str:
        # The authority header's jwk, if any, is never consulted: only the owner keys are anchors.
        for key in anchors:
            if key.verify(jwt.jws.signature, jwt.jws.signing_input):
                return key.thumbprint
        raise link_error("untrusted-issuer-key", 0, "the authority JWT verifies under none of the owner keys")

    links = _walk(
        split_chain(chain),
        verify_root=verify_root,
        now=now,
        leeway_s=leeway_s,
        audience=audience,
        check_audience=True,
        understood=frozenset(understood_claims),
    )
    # Spec step 3: the request's signing key must be the one the last link named. Mandatory.
    if links[-1].cnf_jkt != holder_jkt:
        raise link_error(
            "holder-mismatch", len(links) - 1, "cnf.jkt is not the thumbprint of the request signer"
        )
    final = links[-1]
    exps = [link.exp for link in links if link.exp is not None]
    return VerifiedDelegation(
        links=tuple(links),
        scope=final.scope,
        caps=Caps(
            max_spend_cents=_min_or_none(link.caps.max_spend_cents for link in links),
            max_accesses=_min_or_none(link.caps.max_accesses for link in links),
            quota_period_s=final.caps.quota_period_s,
        ),
        holder_jkt=holder_jkt,
        expires_at=min(exps) if exps else None,
        owner_jkt=links[0].signer_jkt,
    )


def check_chain(chain: str, *, now: float, leeway_s: int = 0) -> list[VerifiedLink]:
    """Check what a holder can check without the owner's keys; the result is NOT verified.

    Every rule of ``verify_chain`` except the authority JWT's signature (``signer_jkt`` of link 0
    is ``""``), the holder binding and the audience: later links' linkage and signatures, claim
    types, narrowing and every ``exp``/``nbf`` against ``now``. Custom claims are not judged (the
    verifier who understands them does). For ``delegate inspect`` and the proxy's start-up check.
    """
    _check_leeway(leeway_s)
    return _walk(
        split_chain(chain),
        verify_root=lambda jwt: "",
        now=now,
        leeway_s=leeway_s,
        audience=None,
        check_audience=False,
        understood=_Everything(),
    )
