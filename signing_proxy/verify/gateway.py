"""The gateway's verdict on one request: the five steps of a verifying exchange, in order.

``GatewayVerifier.check`` runs, each step only if the previous one passed:

1. **Signatures** (``RequestVerifier``: every label, each later one covering the previous one, keys
   from each signer's directory, revocation, windows, ``Content-Digest``, the hop cap). 401 (503
   ``verifier-busy`` with ``Retry-After`` when a new key directory is past ``verify.fetches_per_s``).
2. **Requester ingest** for exchange calls (``core.gateway_ingest``). 400.
3. **Delegation** when ``requester.delegation`` is present: the chain verified offline against the
   issuer's keys (``IssuerKeys``, grace included), bound to the terminal holder (the agent, or a
   broker the agent delegated to by a child JWT: spec "Multi-hop forwarding" rule 5), mirrors never
   wider than the claims, every declared scope covered by the chain's. 403
   ``DENIAL_REASON_DELEGATION_INVALID`` when the token is judged: invalid, or its issuer's directory
   was read and holds no usable key. Not judged, 503 with ``Retry-After``: ``verifier-busy`` when the
   issuer's directory would need the exhausted fetch budget, ``issuer-directory-unavailable`` when
   it (or its revocation list) cannot be fetched now.
4. **Quota**: each capped link's ``max_accesses`` within its ``quota_period`` (lifetime when
   absent), counted atomically in the ``CounterStore`` per chain up to that link. 429
   ``DENIAL_REASON_QUOTA_EXCEEDED`` with ``Retry-After`` at the window's end. A chain whose
   authority issuer is not in ``trusted_issuers`` may create counters only while fewer than
   ``GatewayPolicy.max_stranger_quota_rows`` of such chains' counters are live: past it, 503
   ``quota-store-full`` with ``Retry-After`` (nothing counted, nothing admitted uncounted).
5. **Replay** (optional): the agent's signature seen before within its validity is refused. 401
   ``signature-replayed``. Checked just before the count of step 4 (its ``now`` taken then, after
   the keys were awaited), so that a replayed request never spends an access of the chain. A
   request that is not vouched for (no chain from a ``trusted_issuers`` issuer, no pinned agent key)
   records its signature only while fewer than ``GatewayPolicy.max_stranger_replay_rows`` such
   records are live: past it, 503 ``replay-store-full`` with ``Retry-After`` (nothing recorded).

A refusal is a ``GatewayRefusal`` (status, stable reason, headers); the result is a frozen
``GatewayVerdict`` whose ``headers()`` are what a backend may trust.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import quote

from ..config import GatewayConfig
from ..core.delegation import verify_chain
from ..core.delegation_claims import parse_link
from ..core.delegation_verify import VerifiedDelegation
from ..core.errors import DelegationError, Error, VerificationError
from ..core.fields import Fields
from ..core.gateway_ingest import (
    DelegationIn,
    IngestedRequester,
    IngestError,
    check_declared_scopes,
    check_mirror,
    exchange_method,
    ingest_requester,
    quota_counters,
    read_delegation,
)
from ..core.jwk import PublicKey
from ..core.requester import REQUESTER_TYPE_DELEGATED
from ..core.scopes import format_scope_list
from ..core.signatures import SignatureEntry, VerifiedStack
from ..errors import VERIFIER_BUSY, DirectoryError
from ..logline import exception_kind
from ..ratelog import RateGate
from .counters import CounterStore, ReplayRowsFull, StrangerRowsFull
from .issuers import ISSUER_DIRECTORY_UNAVAILABLE, IssuerKeys
from .verifier import PINNED, SIGNATURE_CHALLENGE, RequestVerifier, refusal_answer

__all__ = [
    "DELEGATION_INVALID",
    "HEADER_PREFIX",
    "QUOTA_EXCEEDED",
    "GatewayPolicy",
    "GatewayRefusal",
    "GatewayVerdict",
    "GatewayVerifier",
]

log = logging.getLogger("signing_proxy.gateway")

DELEGATION_INVALID = "DENIAL_REASON_DELEGATION_INVALID"  # spec "Failure handling"
QUOTA_EXCEEDED = "DENIAL_REASON_QUOTA_EXCEEDED"  # spec "Failure handling"
HEADER_PREFIX = "x-verified-"  # every header the gateway sets; client-sent copies are dropped
# quota-store-full: no stranger's counter frees on demand (each lasts its window), so a fixed pause
STORE_FULL_RETRY_AFTER_S = 60
WARN_EVERY_S = 60.0  # a warning strangers can cause (a store full or failing): at most one a minute per kind
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '%",')  # percent-encode the rest


class GatewayRefusal(Error):
    """A request the gateway answers itself: status, stable reason, extra header fields."""

    def __init__(self, status: int, reason: str, detail: str = "", headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(reason, detail)
        self.status = status
        self.headers = headers


@dataclass(frozen=True)
class GatewayPolicy:
    understood_extensions: frozenset[str] = frozenset()
    replay_protection: bool = False
    audience: str | None = None  # this exchange's name in a token's aud
    leeway_s: int = 0  # tolerated clock difference on exp/nbf of delegation links
    # live counters of chains whose authority issuer is not in trusted_issuers (one default: gateway.*)
    max_stranger_quota_rows: int = GatewayConfig.max_stranger_quota_rows
    # live replay rows of requests no trusted issuer vouches for (one default: gateway.*)
    max_stranger_replay_rows: int = GatewayConfig.max_stranger_replay_rows


@dataclass(frozen=True)
class GatewayVerdict:
    """What the gateway verified; ``headers()`` is what it forwards to the backend."""

    stack: VerifiedStack
    requester: IngestedRequester | None = None
    delegation: VerifiedDelegation | None = None
    terminal_holder: str | None = None  # "agent" or "broker"
    remaining_accesses: int | None = None

    @property
    def scopes(self) -> tuple[str, ...] | None:
        """The effective scopes, what the exchange filters its catalog by: the declared ones (with a
        delegation each is covered by the chain's final scope, or the request was refused), else the
        chain's final scope. None or ``()`` only when neither names one: the default policy is then
        what is meant. A verified chain's scope is None or not empty (``parse_scope_list``)."""
        declared = self.requester.scopes if self.requester is not None else None
        if self.delegation is not None and not declared:
            return self.delegation.scope
        return declared

    def headers(self) -> list[tuple[str, str]]:
        """``X-Verified-*`` header fields; values from the request body are percent-encoded."""
        sigs = self.stack.signatures
        out = [
            ("X-Verified-Hops", str(self.stack.hops)),
            ("X-Verified-Keyid", ", ".join(s.keyid for s in sigs)),
            ("X-Verified-Directory", ", ".join(_safe(s.key_source or "pinned") for s in sigs)),
        ]
        if self.requester is not None:
            out.append(("X-Verified-Requester-Id", _safe(self.requester.id)))
            out.append(("X-Verified-Requester-Domain", _safe(self.requester.domain)))
            out.append(("X-Verified-Requester-Type", self.requester.type))
        chain = self.delegation
        if chain is not None:
            root = chain.links[0]
            out.append(("X-Verified-Delegation-Issuer", _safe(root.iss)))
            out.append(("X-Verified-Principal-Key", root.cnf_jkt))
            if root.sub is not None:
                out.append(("X-Verified-Principal", _safe(root.sub)))
            out.append(("X-Verified-Holder", self.terminal_holder or "agent"))
        scopes = self.scopes
        if scopes is not None and (chain is not None or scopes):
            out.append(("X-Verified-Scopes", _safe(format_scope_list(scopes)) if scopes else ""))
        if self.remaining_accesses is not None:
            out.append(("X-Verified-Remaining-Accesses", str(self.remaining_accesses)))
        spend = chain.caps.max_spend_cents if chain is not None else None
        if spend is not None:  # the chain's narrowest spend cap: the backend prices, so it enforces
            out.append(("X-Verified-Max-Spend-Cents", str(spend)))
        return out


def _safe(value: str) -> str:
    return quote(value, safe=_SAFE + " ")


@dataclass
class GatewayVerifier:
    """Steps 1 to 5 over a ``RequestVerifier``, the issuers' keys and a counter store."""

    verifier: RequestVerifier
    issuers: IssuerKeys
    store: CounterStore | None = None  # needed for quotas and replay protection
    policy: GatewayPolicy = field(default_factory=GatewayPolicy)
    clock: Callable[[], float] = time.time
    _lines: RateGate = field(default_factory=lambda: RateGate(WARN_EVERY_S), init=False, repr=False)

    async def check(
        self,
        method: str,
        target_uri: str,
        fields: Fields,
        body: bytes,
        *,
        entries: tuple[SignatureEntry, ...] | None = None,
    ) -> GatewayVerdict:
        """The verdict, or ``GatewayRefusal`` with the status and stable reason of the step that refused.
        ``entries``: the stack as the caller parsed it already (``RequestVerifier.verify``)."""
        try:
            stack = await self.verifier.verify(method, target_uri, fields, body, entries=entries)
        except VerificationError as exc:
            where = f" (label {exc.label!r})" if exc.label else ""
            status, headers = refusal_answer(exc)
            raise GatewayRefusal(status, exc.reason, f"{exc.detail}{where}", headers) from None
        path = target_uri.split("://", 1)[-1]
        path = "/" + path.split("/", 1)[1] if "/" in path else "/"
        verdict = GatewayVerdict(stack)
        mirror: DelegationIn | None = None
        try:
            exchange_call = exchange_method(method, path) is not None
        except IngestError as exc:  # a spelling a backend may route as an exchange call: not forwarded
            raise GatewayRefusal(400, exc.reason, exc.detail) from None
        if exchange_call:
            verdict, mirror = await self._exchange_call(stack, body)
        # Replay before the count: a replayed request never spends one of the chain's accesses.
        if self.policy.replay_protection:
            await self._check_replay(stack, self._vouched(verdict))
        if mirror is not None and verdict.delegation is not None:
            remaining = await self._take_quota(mirror, verdict.delegation, self.clock())
            verdict = replace(verdict, remaining_accesses=remaining)
        return verdict

    async def close(self) -> None:
        """Close the verifier (pollers, fetches, an owned client) and the counter store."""
        await self.verifier.close()
        if self.store is not None:
            await self.store.close()

    async def _exchange_call(
        self, stack: VerifiedStack, body: bytes
    ) -> tuple[GatewayVerdict, DelegationIn | None]:
        try:
            requester = ingest_requester(body, self.policy.understood_extensions)
        except IngestError as exc:
            raise GatewayRefusal(400, exc.reason, exc.detail) from None
        except DelegationError as exc:  # a delegation member that is no usable Delegation
            log.info("delegation refused at ingest: %s %s", exc.reason, exc.detail)
            raise GatewayRefusal(403, DELEGATION_INVALID, f"{exc.reason}: {exc.detail}") from None
        if requester.delegation is None:
            if requester.type == REQUESTER_TYPE_DELEGATED:  # spec Errors: "Delegation token missing"
                detail = "delegation-missing: an agent acting on behalf of a user carries the delegation"
                raise GatewayRefusal(403, DELEGATION_INVALID, detail)
            return GatewayVerdict(stack, requester), None
        try:
            mirror = read_delegation(requester.delegation)
            chain, holder, now = await self._verify_chain(mirror, stack)
            check_mirror(mirror, chain, now, self.policy.leeway_s)  # at the time the chain was judged
            check_declared_scopes(requester.scopes, chain)
        except DelegationError as exc:
            log.info("delegation refused: %s %s", exc.reason, exc.detail)
            raise GatewayRefusal(403, DELEGATION_INVALID, f"{exc.reason}: {exc.detail}") from None
        except DirectoryError as exc:  # no budget, or no directory to read: the token is not judged
            detail = "the delegation issuer's key directory cannot be fetched right now; retry shortly"
            if exc.reason == VERIFIER_BUSY:
                status, headers = refusal_answer(exc)
                raise GatewayRefusal(status, exc.reason, detail, headers) from None
            retry = (("Retry-After", str(self.issuers.retry_after_s)),)
            raise GatewayRefusal(503, ISSUER_DIRECTORY_UNAVAILABLE, detail, retry) from None
        return GatewayVerdict(stack, requester, chain, holder), mirror

    async def _verify_chain(
        self, mirror: DelegationIn, stack: VerifiedStack
    ) -> tuple[VerifiedDelegation, str, float]:
        """The chain, its terminal holder, and the time it was judged at. That time is read after
        the issuer's keys were fetched (which may take seconds), as a signature's window is checked
        when its keys are used: a chain whose ``exp`` passed during the fetch is refused ``expired``."""
        root = parse_link(mirror.token.split("~", 1)[0], 0)  # read iss only to choose the anchors
        iss = root.claims.get("iss")
        if not isinstance(iss, str):
            raise DelegationError("missing-claim", "link 0: iss is required")
        anchors = await self.issuers.keys_for(iss, self.clock)
        now = self.clock()
        try:
            return (*self._judge(mirror, stack, anchors, now), now)
        except DelegationError as exc:
            if exc.reason != "untrusted-issuer-key":
                raise
            # under none of the keys its cached directory lists: one the issuer rotated in since?
            fresh = await self.issuers.keys_for(iss, self.clock, refetch=True)
            if not fresh:
                raise
        now = self.clock()
        return (*self._judge(mirror, stack, fresh, now), now)

    def _judge(
        self, mirror: DelegationIn, stack: VerifiedStack, anchors: tuple[PublicKey, ...], now: float
    ) -> tuple[VerifiedDelegation, str]:
        """The chain verified under ``anchors``, bound to its terminal holder (the agent, or a broker
        the agent delegated to)."""
        if not anchors:
            raise DelegationError("untrusted-issuer-key", "no usable key of the token's issuer")
        agent = stack.agent.keyid

        def verify(holder: str) -> VerifiedDelegation:
            return verify_chain(
                mirror.token,
                owner_keys=anchors,
                holder_jkt=holder,
                now=now,
                leeway_s=self.policy.leeway_s,
                audience=self.policy.audience,
            )

        try:
            return verify(agent), "agent"
        except DelegationError as exc:
            if exc.reason != "holder-mismatch" or stack.hops < 2:
                raise
            mismatch = exc
        # Rule 5: a broker is the terminal holder only if the agent delegated to its key by a child JWT.
        for signature in stack.signatures[1:]:
            try:
                chain = verify(signature.keyid)
            except DelegationError as exc:
                if exc.reason != "holder-mismatch":
                    raise
                continue
            if len(chain.links) >= 2 and chain.links[-2].cnf_jkt == agent:
                return chain, "broker"
        raise mismatch

    async def _take_quota(self, mirror: DelegationIn, chain: VerifiedDelegation, now: float) -> int | None:
        counters = quota_counters(mirror.token, chain, now, self.policy.leeway_s)
        if not counters:
            return None
        if self.store is None:  # fail closed: a cap nobody counts is not a cap
            raise GatewayRefusal(503, "quota-store-unavailable", "no counter store is configured")
        # a chain any https issuer may sign: the counters it creates are within a bound (strangers')
        trusted = chain.links[0].iss in self.issuers.trusted
        bound = None if trusted else self.policy.max_stranger_quota_rows
        try:
            index, taken = await self.store.take_all(counters, now, bound)
        except StrangerRowsFull as exc:
            self._log_full(exc)
            retry = (("Retry-After", str(STORE_FULL_RETRY_AFTER_S)),)
            detail = "too many counters of untrusted issuers' chains are live; this chain's cannot be kept"
            raise GatewayRefusal(503, exc.reason, detail, retry) from None
        except Exception as exc:  # the store's client errors: answered 503, a line a minute in the log
            self._log_failed(exc)
            raise GatewayRefusal(
                503, "quota-store-unavailable", "the access counter is unavailable"
            ) from None
        limit = counters[index].limit
        if not taken.allowed:
            headers: tuple[tuple[str, str], ...] = ()
            if taken.reset_at is not None:  # from the clock now: the take may have waited for a lock
                headers = (("Retry-After", str(max(1, math.ceil(taken.reset_at - self.clock())))),)
            raise GatewayRefusal(429, QUOTA_EXCEEDED, f"{limit} accesses used in this quota period", headers)
        return limit - taken.count

    def _log_full(self, exc: StrangerRowsFull) -> None:
        self._warn_at_most(
            "quota-full",
            "new capped chains of untrusted issuers refused (503 quota-store-full): %s "
            "(gateway.max_stranger_quota_rows; list an issuer in gateway.trusted_issuers to exempt it)",
            exc.detail,
        )

    def _log_failed(self, exc: Exception) -> None:
        """While the store fails every request is refused, a stranger's too: a line each would let
        anyone fill the log, so one a minute (the readiness probe logs when it fails and recovers)."""
        self._warn_at_most(
            "store-failed",
            "counter store failed: %s (requests that need it are answered 503; logged at most once a minute)",
            exception_kind(exc),
        )

    def _log_replay_full(self, exc: ReplayRowsFull) -> None:
        self._warn_at_most(
            "replay-full",
            "new signatures of requests not vouched for refused (503 replay-store-full): %s "
            "(gateway.max_stranger_replay_rows; trusted issuers' chains, pinned agent keys exempt)",
            exc.detail,
        )

    def _warn_at_most(self, kind: str, message: str, *args: object) -> None:
        """A warning of ``kind`` at most once per ``WARN_EVERY_S`` (strangers can cause one per request)."""
        if self._lines.due(kind, self.clock()) is not None:
            log.warning(message, *args)

    def _vouched(self, verdict: GatewayVerdict) -> bool:
        """Whether the configuration vouches for the request: its chain's authority issuer is in
        ``trusted_issuers`` (as for quota rows), or the agent signed with a pinned key. Any other
        request's replay row counts against ``max_stranger_replay_rows``."""
        chain = verdict.delegation
        if chain is not None and chain.links[0].iss in self.issuers.trusted:
            return True
        return verdict.stack.agent.key_source == PINNED

    async def _check_replay(self, stack: VerifiedStack, vouched: bool) -> None:
        if self.store is None:
            raise GatewayRefusal(503, "replay-store-unavailable", "no counter store is configured")
        agent = stack.agent
        now = self.clock()
        key = hashlib.sha256(f"{agent.keyid}\n{agent.signature_base}".encode()).hexdigest()
        ttl = max(1.0, agent.expires - now + self.verifier.policy.skew_s)
        bound = None if vouched else self.policy.max_stranger_replay_rows
        try:
            fresh = await self.store.first_seen(key, ttl, now, bound)
        except ReplayRowsFull as exc:
            self._log_replay_full(exc)
            retry = (("Retry-After", str(STORE_FULL_RETRY_AFTER_S)),)
            detail = "too many signatures of requests not vouched for are remembered; retry later"
            raise GatewayRefusal(503, exc.reason, detail, retry) from None
        except Exception as exc:  # the store's client errors: answered 503, a line a minute in the log
            self._log_failed(exc)
            raise GatewayRefusal(503, "replay-store-unavailable", "the replay store is unavailable") from None
        if not fresh:
            raise GatewayRefusal(
                401, "signature-replayed", "this signature was already accepted", (SIGNATURE_CHALLENGE,)
            )
