"""The trust anchors of delegation chains: the keys an authority JWT's issuer signs with.

An issuer listed in ``trusted_issuers`` has pinned keys (always valid) or a pinned directory base;
any other issuer whose ``iss`` is an http(s) URL publishes its keys at
``{iss}/.well-known/http-message-signatures-directory`` (spec "Participant key location"), fetched
through the resolver and its egress policy like any other directory. A directory key counts while
its window covers ``now`` or ended less than ``grace_s`` ago (spec "Delegation verification": accept
tokens signed by recently rotated issuer keys within a configurable grace period); a key revoked by
the issuer's revocation list never counts.

An issuer whose keys cannot be learnt now (its directory's fetch timed out or failed, or its
revocation list was never fetched) is not an issuer without keys: ``keys_for`` raises
``DirectoryError`` ``issuer-directory-unavailable`` (the gateway answers 503 with ``Retry-After``,
the token not judged) instead of answering none (403 ``DENIAL_REASON_DELEGATION_INVALID``, a
verdict). A directory that was read but holds no usable key, or that the egress policy refuses, has
none.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..core.jwk import PublicKey
from ..errors import VERIFIER_BUSY, DirectoryError, EgressError
from ..net.egress import EgressPolicy
from .directory import DirectoryResolver, directory_url
from .revocation import RevocationPoller

__all__ = ["ISSUER_DIRECTORY_UNAVAILABLE", "IssuerAnchor", "IssuerKeys"]

log = logging.getLogger("signing_proxy.gateway")

ISSUER_DIRECTORY_UNAVAILABLE = "issuer-directory-unavailable"
# the resolver's and the poller's reasons for "not fetched now" (a timeout, a failed connection or
# status, an unexpected failure; a list never fetched): transient. Any other reason is the document's
# (too large, malformed, no valid key) or the egress policy's: the issuer has no usable key
_UNAVAILABLE = frozenset(
    {"directory-fetch-timeout", "directory-fetch-failed", "directory-unusable", "revocation-unavailable"}
)


@dataclass(frozen=True)
class IssuerAnchor:
    """One configured issuer: pinned keys, or the directory base its keys are read from."""

    keys: tuple[PublicKey, ...] = ()
    directory: str | None = None


@dataclass
class IssuerKeys:
    """Keys an issuer may have signed an authority JWT with at ``now`` (grace included)."""

    resolver: DirectoryResolver
    revocations: RevocationPoller
    egress: EgressPolicy
    trusted: Mapping[str, IssuerAnchor] = field(default_factory=dict)
    grace_s: int = 0
    trusted_only: bool = False  # refuse issuers not in ``trusted`` instead of fetching their directory

    @property
    def retry_after_s(self) -> int:
        """How long a failed fetch of a directory or a revocation list is remembered: an
        ``issuer-directory-unavailable`` request retried sooner is refused again."""
        return max(1, math.ceil(max(self.resolver.negative_ttl_s, self.revocations.retry_s)))

    def __post_init__(self) -> None:
        named = (a.directory for a in self.trusted.values() if a.directory is not None)
        self.revocations.configure(directory_url(base) for base in named)

    async def keys_for(
        self, iss: str, clock: Callable[[], float], *, refetch: bool = False
    ) -> tuple[PublicKey, ...]:
        """The anchors of ``iss``; empty when it has none (the chain is then refused). Raises
        DirectoryError ``verifier-busy`` when its directory would be fetched but the budget is out,
        ``issuer-directory-unavailable`` when it or its revocation list cannot be fetched now.

        ``refetch``: none of the anchors given before verified the token, so its directory, cached,
        may predate a key the issuer rotated in; it is fetched again (at most once per
        ``keyid_refetch_s``, as for an agent's unknown ``keyid``). Empty when it is not fetched again
        (fixed keys, not cached, fetched again too recently). ``clock`` is read once the directory is
        here, for its keys' windows: a fetch may take seconds."""
        anchor = self.trusted.get(iss)
        if anchor is not None and anchor.keys:
            return () if refetch else anchor.keys
        if anchor is not None and anchor.directory is not None:
            base = anchor.directory
        elif self.trusted_only or not iss.startswith(("https://", "http://")):
            return ()
        else:
            base = iss.rstrip("/")
            try:
                self.egress.check_url(base, allow_query=False)
            except (EgressError, ValueError):
                log.info("issuer %.200r: its directory is not fetched (egress policy)", iss)
                return ()
        try:
            # a directory the configuration names spends none of the budget of fetches that
            # strangers' requests may cause; an issuer named only by a token spends one
            if refetch:
                again = await self.resolver.refetch_for_keyid(base, budgeted=anchor is None)
                if again is None:
                    return ()
                directory = again
            else:
                directory = await self.resolver.get(base, budgeted=anchor is None)
            revoked = await self.revocations.revoked_by(directory_url(base), directory.revocation_url)
        except DirectoryError as exc:
            if exc.reason == VERIFIER_BUSY:
                raise  # no budget to fetch it now: the caller answers "retry", not "refused"
            log.info("issuer %.200r: key directory unavailable (%s)", iss, exc.reason)
            if exc.reason in _UNAVAILABLE:  # not fetched now: the caller answers "retry", not "refused"
                raise DirectoryError(ISSUER_DIRECTORY_UNAVAILABLE, exc.reason) from None
            return ()
        now = clock()
        return tuple(
            key.public
            for key in directory.keys
            if key.not_before <= now < key.not_after + self.grace_s and key.thumbprint not in revoked
        )
