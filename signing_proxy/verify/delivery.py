"""The delivery side of a bound retrieval URL (spec "Bound retrieval URLs" 3): is this fetch its holder's?

``DeliveryVerifier.verify`` checks a retrieval request, cheap checks first and I/O last:

1. the URL is a bound retrieval URL (``core.retrieval``: ``agent_id``, ``expires``, the exchange's
   ``keyid`` and ``sig``) and has not expired;
2. the fetcher presents its key (``Signature-Key``, ``core.signature_key``) for the first label of
   the signature stack (the fetcher signs first; a relay's later label is not checked here), and
   thumbprint(presented key) == ``agent_id``;
3. that label's RFC 9421 signature verifies with the presented key, covering the spec's five
   components and ``signature-key``, inside its window, with the body's ``Content-Digest``;
4. the URL's signature verifies with the exchange key ``keyid``: a pinned key, or one found in a
   configured exchange directory (cached, re-fetched for an unknown ``keyid``, its window and the
   directory's revocation list checked). Every configured directory is looked at, all at once: a
   ``keyid`` that more than one lists is refused ``ambiguous-key`` (as a broker's is), since the
   first to list it would otherwise hide another's revocation of it (one still fetching is waited
   for only where its answer can change that: ``verifier.ConfiguredDirectories``).

The fetches of 4 may take seconds: then the clock is read again and what is bound in time is
judged again at that time (the URL's ``expires``, the fetcher signature's window through
``verify_checked``, as ``RequestVerifier`` does, and the exchange key's window), so that a URL or
signature that expired while its exchange key was fetched is refused.

The fetcher's directory is never fetched. A refusal is a ``VerificationError`` with a stable reason
(``verify.middleware.refusal`` answers it with 401); the result, ``VerifiedRetrieval``, is the only
thing a handler should trust.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ..config import VerifyConfig
from ..core.b64 import b64_encode
from ..core.errors import FieldError, VerificationError
from ..core.fields import Fields
from ..core.jwk import PublicKey
from ..core.keys import Directory, DirectoryKey
from ..core.retrieval import RetrievalUrl, parse_retrieval_url
from ..core.signature_key import RETRIEVAL_COMPONENTS, SIGNATURE_KEY, parse_presented_key
from ..core.signature_verify import DEFAULT_MAX_VALIDITY_S, check_not_expired, check_stack, verify_checked
from ..core.signatures import (
    DEFAULT_SKEW_S,
    Message,
    SignatureEntry,
    VerificationKey,
    VerifiedSignature,
    parse_signature_stack,
)
from ..core.uri import LOOPBACK_HOSTS, parse_received_uri
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from .build import build_verifier
from .directory import DirectoryError, directory_url
from .middleware import Hosts, as_received, served_hosts
from .verifier import PINNED, ConfiguredDirectories, RequestVerifier, VerifierPolicy, at_once

__all__ = [
    "PRESENTED",
    "DeliveryPolicy",
    "DeliveryVerifier",
    "VerifiedRetrieval",
    "build_delivery_verifier",
    "verify_delivery_request",
]

log = logging.getLogger("signing_proxy.delivery")

PRESENTED = "presented"  # the key source of the fetcher's key: the request itself


@dataclass(frozen=True)
class DeliveryPolicy:
    """Whose retrieval URLs this delivery endpoint serves, and the fetcher signature's limits."""

    exchange_directories: tuple[str, ...] = ()  # directory bases of the exchanges that sign our URLs
    pinned_exchange_keys: tuple[PublicKey, ...] = ()  # exchange keys known without a directory
    skew_s: int = DEFAULT_SKEW_S  # for the fetcher signature's created only
    max_validity_s: int = DEFAULT_MAX_VALIDITY_S


@dataclass(frozen=True, slots=True)
class VerifiedRetrieval:
    """A verified bound fetch: which URL, bound to which key, signed by which exchange key."""

    url: str  # canonical form, as the exchange signed it
    agent_id: str  # the transaction's key: the presented key's thumbprint
    url_expires: int
    exchange_keyid: str
    exchange_source: str  # the exchange directory base that published the key, or "pinned"
    signature: VerifiedSignature  # the fetcher's RFC 9421 signature


def _first_label_only(fields: Fields) -> tuple[Fields, str]:
    """The fields with only the first label of the stack in ``Signature-Input``/``Signature``."""
    first = parse_signature_stack(fields)[0]
    kept = Fields((n, v) for n, v in fields if n.lower() not in ("signature", "signature-input"))
    kept.add("Signature-Input", f"{first.label}={first.params_value}")
    kept.add("Signature", f"{first.label}=:{b64_encode(first.signature)}:")
    return kept, first.label


class DeliveryVerifier:
    """Checks retrieval fetches against ``policy``; exchange directories through ``verifier``'s
    resolver and revocation poller (``build_delivery_verifier`` makes both)."""

    def __init__(self, verifier: RequestVerifier, policy: DeliveryPolicy) -> None:
        self.verifier = verifier
        self.policy = policy
        self.clock: Callable[[], float] = verifier.clock
        assert verifier.revocations is not None  # RequestVerifier makes one when none is given
        verifier.revocations.configure(directory_url(base) for base in policy.exchange_directories)
        self._exchanges = ConfiguredDirectories(verifier.resolver, _unavailable)

    async def close(self) -> None:
        await self.verifier.close()

    async def verify(self, method: str, url: str, fields: Fields, body: bytes) -> VerifiedRetrieval:
        """Verify one fetch of ``url`` (absolute, as the client addressed it); VerificationError if not."""
        try:
            return await self._verify(method, url, fields, body)
        except VerificationError:
            raise
        except Exception:  # every request gets an answer; the cause goes to the log only
            log.exception("verifying a retrieval of %.200r failed unexpectedly", url)
            raise VerificationError("verification-failed", "the request could not be verified") from None

    async def _verify(self, method: str, url: str, fields: Fields, body: bytes) -> VerifiedRetrieval:
        now = self.clock()
        try:
            target = parse_received_uri(url)
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from None
        bound = parse_retrieval_url(target.uri)
        _check_url_expires(bound, now)
        reduced, label = _first_label_only(fields)
        presented = parse_presented_key(fields.combined(SIGNATURE_KEY), label)
        if presented.thumbprint != bound.agent_id:
            raise VerificationError(
                "presented-key-mismatch", "the presented key is not the one the URL is bound to", label
            )
        checked = check_stack(
            Message(method, target, reduced),
            body,
            now=now,
            skew_s=self.policy.skew_s,
            max_validity_s=self.policy.max_validity_s,
            max_hops=1,
            required=RETRIEVAL_COMPONENTS,  # the spec's profile only: the URL, the body and the key
        )
        key = VerificationKey(presented, source=PRESENTED)

        def lookup(entry: SignatureEntry, _index: int) -> VerificationKey | None:
            return key if entry.keyid == presented.thumbprint else None

        # verified before any fetch (a bad signature costs none), its window judged again after
        fetcher = verify_checked(checked, lookup, now=now).signatures[0]
        source, listed = await self._check_url_signature(bound, now)
        now = self.clock()  # the fetches may take seconds: what is bound in time, again at this time
        _check_url_expires(bound, now)
        check_not_expired(fetcher.expires, now, fetcher.label)  # the window verify_checked judged, now
        if listed is not None:
            _check_key_window(bound, listed, now)
        return VerifiedRetrieval(target.uri, bound.agent_id, bound.expires, bound.keyid, source, fetcher)

    async def _check_url_signature(self, bound: RetrievalUrl, now: float) -> tuple[str, DirectoryKey | None]:
        """Verify the URL with the exchange key it names; return where that key came from, and the
        directory's entry for it (None for a pinned key, which has no window), whose window the
        caller checks again after the fetches."""
        for pinned in self.policy.pinned_exchange_keys:
            if pinned.thumbprint == bound.keyid:
                return self._verified(bound, pinned, PINNED), None
        found, none_fetched = await self._listings(bound.keyid)
        if len(found) > 1:
            # the key of one exchange is in that exchange's own directory; one that two configured
            # directories list is no one's own, and either could hide the other's revocation of it
            raise VerificationError("ambiguous-key", "more than one exchange directory lists the URL's keyid")
        if not found:
            if none_fetched:
                raise VerificationError("directory-unavailable", "no exchange directory could be fetched")
            raise VerificationError(
                "retrieval-url-unknown-key", "no trusted exchange publishes the URL's keyid"
            )
        base, directory, key = found[0]
        _check_key_window(bound, key, now)  # before the revocation list is asked for
        poller = self.verifier.revocations
        assert poller is not None  # RequestVerifier always has one
        try:
            revoked = await poller.revoked_by(directory_url(base), directory.revocation_url)
        except DirectoryError:
            raise VerificationError(
                "revocation-unavailable", "the exchange's revocation list has not been fetched"
            ) from None
        if key.thumbprint in revoked:
            raise VerificationError("retrieval-url-key-revoked", f"key {bound.keyid} is revoked")
        return self._verified(bound, key.public, base), key

    async def _listings(self, keyid: str) -> tuple[list[tuple[str, Directory, DirectoryKey]], bool]:
        """Every configured exchange directory that lists ``keyid`` (base, directory, key), each
        directory looked at once whatever its spellings (one still fetching only where its answer
        can change the verdict: ``ConfiguredDirectories``), and whether none could be fetched. Only
        when none lists it are they re-fetched for it (a key rotated in since we cached them;
        rate-limited per directory)."""
        resolver = self.verifier.resolver
        directories = await self._exchanges.answers(self.policy.exchange_directories, (keyid,))
        none_fetched = bool(self.policy.exchange_directories) and not directories
        found = [(base, d, key) for base, d in directories if (key := d.lookup(keyid)) is not None]
        if found:
            return found, none_fetched

        async def refetched(base: str) -> Directory | None:
            try:
                return await resolver.refetch_for_keyid(base, budgeted=False)
            except DirectoryError as exc:
                log.debug("exchange directory %.200r unavailable: %s", base, exc.reason)
                return None

        def listing(answers: list[object]) -> list[tuple[str, Directory, DirectoryKey]]:
            return [
                (base, d, key)
                for (base, _), d in zip(directories, answers, strict=True)
                if isinstance(d, Directory) and (key := d.lookup(keyid)) is not None
            ]

        # at once, and the first listing it taken with any other back by then: one after the other,
        # a key rotated into one exchange's directory waited for another's hanging re-fetch (whose
        # cached copy did not list it: ``ConfiguredDirectories``' rule)
        asked = [refetched(base) for base, _ in directories]
        return listing(await at_once(asked, lambda answers: bool(listing(answers)))), none_fetched

    @staticmethod
    def _verified(bound: RetrievalUrl, key: PublicKey, source: str) -> str:
        if not bound.verify(key):
            raise VerificationError("retrieval-url-bad-signature", "the URL's signature does not verify")
        return source


def _unavailable(base: str, reason: str) -> None:
    log.debug("exchange directory %.200r unavailable: %s", base, reason)


def _check_url_expires(bound: RetrievalUrl, now: float) -> None:
    if now >= bound.expires:  # exclusive: the URL is dead at its expires
        raise VerificationError("retrieval-url-expired", "the retrieval URL has expired")


def _check_key_window(bound: RetrievalUrl, key: DirectoryKey, now: float) -> None:
    if not key.valid_at(now):
        raise VerificationError(
            "retrieval-url-key-outside-window", f"key {bound.keyid} is outside its window"
        )


def build_delivery_verifier(
    policy: DeliveryPolicy,
    *,
    client: HttpClient | None = None,
    egress: EgressPolicy | None = None,
    limits: VerifyConfig | None = None,
    clock: Callable[[], float] = time.time,
) -> DeliveryVerifier:
    """A delivery verifier whose exchange directories are fetched like every verifier's
    (``build_verifier``: one client, egress policy, bounded caches, revocation polling)."""
    inner = build_verifier(
        VerifierPolicy(skew_s=policy.skew_s, max_validity_s=policy.max_validity_s),
        client=client,
        egress=egress,
        limits=limits,
        clock=clock,
    )
    return DeliveryVerifier(inner, policy)


async def verify_delivery_request(
    verifier: DeliveryVerifier,
    request: web.Request,
    *,
    external_origin: str | None = None,
    hosts: Hosts = LOOPBACK_HOSTS,
) -> VerifiedRetrieval:
    """Verify an aiohttp request as received (raw header lines, raw path, exact body).

    ``external_origin`` (``https://cdn.example``): the origin clients used when a TLS-terminating
    load balancer sits in front; otherwise scheme and Host of the request, a name in ``hosts``
    (VerificationError ``misdirected-request`` for another: ``middleware.as_received``).
    """
    return await verifier.verify(*await as_received(request, external_origin, served_hosts(hosts)))
