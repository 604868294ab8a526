"""Layer-1 verification for exchanges, publishers and relays: cheap checks, resolve keys, verify purely.

``RequestVerifier.verify`` first applies every rule that needs no I/O (``core.signature_verify.
check_stack``: parse, hop cap, components, ``alg``, ``keyid`` shape, window, lifetime, digest) and
vets the ``Signature-Agent`` URL against the egress policy, so a request that fails them causes no
network traffic. Then it resolves each label's key — the first label's in the directory named by
``Signature-Agent`` (or pinned keys when it is empty), later labels' in the directories of known
brokers, asked at once (``ConfiguredDirectories``: one that hangs holds no request another broker
relayed) — re-fetching a cached directory once for an unknown ``keyid`` (rotation), checks the key
against the revoked set of the directory that published it (and only that one), and hands
everything to ``verify_checked`` with the current time. The result is a frozen ``VerifiedStack``; a
refusal is a ``VerificationError`` with a stable reason and a generic detail (causes go to the log).
No aiohttp here: ``verify.middleware`` mounts it on an aiohttp application in one line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar

from ..core.errors import FieldError, VerificationError
from ..core.fields import Fields
from ..core.jwk import PublicKey
from ..core.keys import Directory, DirectoryKey
from ..core.pkcs11_uri import NOT_SHOWN
from ..core.profiles import WEB_BOT_AUTH
from ..core.signature_verify import (
    DEFAULT_MAX_VALIDITY_S,
    check_stack,
    verify_checked,
)
from ..core.signatures import (
    DEFAULT_SKEW_S,
    Message,
    SignatureEntry,
    VerificationKey,
    VerifiedStack,
)
from ..core.uri import parse_received_uri
from ..errors import VERIFIER_BUSY, EgressError, Error, http_status
from ..net.egress import EgressPolicy
from ..ratelog import RateGate
from .directory import DirectoryError, DirectoryResolver, directory_url, each_directory_once
from .revocation import RevocationPoller

__all__ = [
    "PINNED",
    "SIGNATURE_CHALLENGE",
    "RequestVerifier",
    "VerifierPolicy",
    "refusal_answer",
    "stack_summary",
]

log = logging.getLogger("signing_proxy.verifier")

PINNED = "pinned"  # the key source of pinned keys (no directory)
# Every 401 for a signature names the scheme it wants (RFC 9110 section 11.6.1; the spec names none)
SIGNATURE_CHALLENGE = ("WWW-Authenticate", 'Signature realm="signing-proxy"')
BUSY_RETRY_AFTER = ("Retry-After", "1")  # verifier-busy: the fetch budget refills within a second


def refusal_answer(exc: Error) -> tuple[int, tuple[tuple[str, str], ...]]:
    """Status and headers of a refused request's answer, the same in every verifier: 401 with the
    Signature challenge, 503 with ``Retry-After`` when the verifier had no budget left to fetch
    the key directory the request needs (``verifier-busy``: nothing is wrong with the signature), or
    421 for a name it does not answer for (``misdirected-request``)."""
    status = http_status(exc)
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        return status, (BUSY_RETRY_AFTER,)
    return status, (() if status == HTTPStatus.MISDIRECTED_REQUEST else (SIGNATURE_CHALLENGE,))


_FOREVER = (0, 2**62)
BROKER_WARN_EVERY_S = 60.0  # "broker directory ... unavailable": at most one line a minute per directory


@dataclass(frozen=True)
class VerifierPolicy:
    """What a verifier accepts beyond the spec's fixed rules."""

    skew_s: int = DEFAULT_SKEW_S  # for a created in the future only, never past expires
    max_validity_s: int = DEFAULT_MAX_VALIDITY_S  # expires - created above this is refused
    # RequestConstraints.max_hops / max_intermediary_hops, counted as labels; at most MAX_HOPS (16)
    # whatever is set, and that is the cap when none is
    max_hops: int | None = None
    broker_directories: tuple[str, ...] = ()  # directory bases where later labels' keys are looked up
    pinned_agent_keys: tuple[PublicKey, ...] = ()  # for agents that send an empty Signature-Agent
    pinned_broker_keys: tuple[PublicKey, ...] = ()  # brokers known by key, no directory fetch
    web_bot_auth: bool = True  # also accept stacks signed under the web-bot-auth profile (their rules)


class ConfiguredDirectories:
    """The key directories the configuration names (brokers', exchanges'), asked together for one
    request's ``keyid`` values, each one's last answer remembered (bounded by the configuration).

    All are asked at once, not one after another: one that hung held a request signed by another's
    key for its whole fetch timeout, and again each time its failure memory ran out. A request waits
    for a fetch in flight only where its answer can change the verdict: that directory never answered
    (nothing to judge it by), its last answer lists one of the ``keyid`` values (is it still listed? a
    key two list is refused ``ambiguous-key``), or some ``keyid`` is listed by none that answered
    (is it there?). Otherwise its word is still its last answer (a failure, or a copy without those
    keys), as a directory that failed recently is no one's to wait for; its fetch goes on in the
    resolver (shared, bounded by ``fetch_timeout_s``, cancelled by its ``close``) for later requests.
    """

    def __init__(self, resolver: DirectoryResolver, on_failure: Callable[[str, str], None]) -> None:
        self.resolver = resolver
        self.on_failure = on_failure  # (base, reason) of a directory that could not be fetched
        self._last: dict[str, Directory | None] = {}  # base -> its last answer (None: it failed)

    async def answers(
        self,
        bases: Sequence[str],
        keyids: Collection[str],
        *,
        web: bool = False,
        known: Directory | None = None,
    ) -> list[tuple[str, Directory]]:
        """(base, directory) of each of ``bases`` (the policy's, read per request; each directory
        once, whatever its spellings: ``each_directory_once``) that answered, in their order, once
        the others cannot change what ``keyids`` resolve to; ``known``: keys held without a fetch
        (pinned), found like a directory's; ``web``: ``Directory.lookup``'s."""
        bases = each_directory_once(tuple(bases))
        if any(base not in bases for base in self._last):  # a policy replaced: only what it names
            self._last = {base: last for base, last in self._last.items() if base in bases}
        answers = await at_once(  # the first wait also lets a directory without a fetch answer
            [self._ask(base) for base in bases],
            lambda answers: self._settled(zip(bases, answers, strict=True), keyids, web, known),
        )
        return [(base, d) for base, d in zip(bases, answers, strict=True) if isinstance(d, Directory)]

    async def _ask(self, base: str) -> Directory | None:
        try:
            directory = await self.resolver.get(base, budgeted=False)  # configured, not a stranger's
        except DirectoryError as exc:
            self._last[base] = None
            self.on_failure(base, exc.reason)
            return None
        self._last[base] = directory
        return directory

    def _settled(
        self,
        answers: Iterable[tuple[str, object]],
        keyids: Collection[str],
        web: bool,
        known: Directory | None,
    ) -> bool:
        """Whether the directories still fetching (``PENDING``) can no longer change what ``keyids``
        resolve to."""
        answers = list(answers)
        answered = [d for _base, d in answers if isinstance(d, Directory)]
        if known is not None:
            answered.append(known)
        if not all(any(d.lookup(k, web=web) is not None for d in answered) for k in keyids):
            return False
        for base, answer in answers:
            if answer is not PENDING:
                continue
            if base not in self._last:
                return False
            last = self._last[base]
            if last is not None and any(last.lookup(k, web=web) is not None for k in keyids):
                return False
        return True


PENDING = object()  # ``at_once``: still running when the others settled it
T = TypeVar("T")


async def at_once(
    asked: Sequence[Awaitable[T]], settled: Callable[[list[T | object]], bool]
) -> list[T | object]:
    """``asked`` run at once, waited for until ``settled`` (given each one's result so far, or
    ``PENDING``) holds or all are done: their results in order, ``PENDING`` for those not done. Those
    are waiters only, cancelled (the fetches they wait for are the resolver's, shared and bounded):
    one after the other, a configured directory that hung held every request for its fetch timeout."""
    tasks = [asyncio.ensure_future(one) for one in asked]
    pending = set(tasks)
    try:
        while pending:
            _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if settled(_results(tasks)):
                break
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    return _results(tasks)


def _results(tasks: Sequence[asyncio.Future[T]]) -> list[T | object]:
    return [task.result() if task.done() and not task.cancelled() else PENDING for task in tasks]


@dataclass(frozen=True, slots=True)
class _Source:
    base: str  # the key source reported: a directory base, or PINNED
    url: str | None  # the directory URL (None: pinned keys, no revocation list)
    directory: Directory


@dataclass
class RequestVerifier:
    """Verifies requests against published directories, their revocation lists and pinned keys.

    Without ``revocations``, one is made on the resolver's fetcher: no verifier skips revocation.
    ``egress`` vets ``Signature-Agent`` before any fetch (default: public https only).
    """

    resolver: DirectoryResolver
    policy: VerifierPolicy = field(default_factory=VerifierPolicy)
    revocations: RevocationPoller | None = None
    clock: Callable[[], float] = time.time
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run by ``close``
    _poller: RevocationPoller = field(init=False, repr=False)
    _broker_lines: RateGate = field(
        default_factory=lambda: RateGate(BROKER_WARN_EVERY_S), init=False, repr=False
    )
    _brokers: ConfiguredDirectories = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.revocations is None:
            self.revocations = RevocationPoller(self.resolver.fetch, clock=self.clock)
        self._poller = self.revocations
        self._poller.attach(self.resolver)
        self._poller.configure(directory_url(base) for base in self.policy.broker_directories)
        self._brokers = ConfiguredDirectories(self.resolver, self._warn_broker_unavailable)

    async def verify(
        self,
        method: str,
        target_uri: str,
        fields: Fields,
        body: bytes,
        *,
        entries: tuple[SignatureEntry, ...] | None = None,
    ) -> VerifiedStack:
        """Verify every label of the request; raise VerificationError with the reason of a refusal.

        ``entries``: the stack as ``parse_signature_stack(fields)`` returned it, when the caller has
        parsed it already (the relay reads the labels before verifying): it is not parsed twice.
        """
        try:
            return await self._verify(method, target_uri, fields, body, entries)
        except VerificationError:
            raise
        except Exception:  # every request gets an answer; the cause goes to the log only
            log.exception("verifying %s %.200r failed unexpectedly", method, target_uri)
            raise VerificationError("verification-failed", "the request could not be verified") from None

    async def close(self) -> None:
        """Stop the revocation pollers and fetches in flight; run ``closers`` (an owned client)."""
        await self._poller.close()
        await self.resolver.close()
        for closer in self.closers:
            await closer()

    async def _verify(
        self,
        method: str,
        target_uri: str,
        fields: Fields,
        body: bytes,
        entries: tuple[SignatureEntry, ...] | None,
    ) -> VerifiedStack:
        now = self.clock()
        try:
            message = Message(method, parse_received_uri(target_uri), fields)
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from None
        policy = self.policy
        checked = check_stack(
            message,
            body,
            now=now,
            skew_s=policy.skew_s,
            max_validity_s=policy.max_validity_s,
            max_hops=policy.max_hops,
            allow_web=policy.web_bot_auth,
            entries=entries,
        )
        web = checked.profile == WEB_BOT_AUTH.name
        agent = await self._agent_sources(checked.directory)
        entry, keyid, *_ = checked.entries[0]  # the agent's directory is a stranger's word: budgeted
        keys = [await self._key_for(entry, keyid, agent, budgeted=True, web=web)]
        if keys[0] is not None and len(checked.entries) > 1:  # without it the first label refuses:
            later = {keyid for _entry, keyid, *_rest in checked.entries[1:]}  # no broker directory
            brokers = await self._broker_sources(later, web)  # is looked at for a stranger
            keys += [
                await self._key_for(entry, keyid, brokers, budgeted=False, web=web)  # configured
                for entry, keyid, *_rest in checked.entries[1:]
            ]
        else:
            keys += [None] * (len(checked.entries) - 1)
        if keys[0] is None and checked.directory is None:  # say why, not only that: a first set-up's slip
            entry, keyid, *_ = checked.entries[0]
            raise VerificationError(
                "unknown-keyid",
                f"no key for keyid {keyid!r}: the request names no key directory this verifier uses "
                "(its Signature-Agent is empty, absent, or a member it ignores) and no pinned agent key "
                "has that thumbprint",
                entry.label,
            )
        # the keys' and the signatures' windows at the time the keys are used, after their fetches
        stack = verify_checked(checked, lambda _entry, index: keys[index], now=self.clock())
        if agent and agent[0].url is not None:
            self.resolver.vouch(agent[0].url)
        return stack

    async def _agent_sources(self, base: str | None) -> list[_Source]:
        if base is None:
            keys = tuple(DirectoryKey(k, *_FOREVER) for k in self.policy.pinned_agent_keys)
            return [_Source(PINNED, None, Directory(keys))] if keys else []
        if not self.resolver.is_pinned(base):
            try:
                self.egress.check_url(base, allow_query=False)
            except (EgressError, ValueError) as exc:
                why = exc.reason if isinstance(exc, EgressError) else "egress-host"
                raise VerificationError(
                    "signature-agent-refused",
                    f"Signature-Agent names a URL this verifier does not fetch ({why})",
                ) from None
        try:
            directory = await self.resolver.get(base)
        except DirectoryError as exc:
            if exc.reason == VERIFIER_BUSY:
                raise _busy() from None
            log.debug("key directory of %.200r unavailable: %s", base, exc.reason)
            raise VerificationError(
                "directory-unavailable", "the key directory named by Signature-Agent is unavailable"
            ) from None
        return [_Source(base, directory_url(base), directory)]

    async def _broker_sources(self, keyids: set[str], web: bool) -> list[_Source]:
        """Pinned broker keys, then every broker directory that answered for ``keyids``."""
        found = []
        pinned = None
        if self.policy.pinned_broker_keys:
            pinned = Directory(tuple(DirectoryKey(k, *_FOREVER) for k in self.policy.pinned_broker_keys))
            found.append(_Source(PINNED, None, pinned))
        answered = await self._brokers.answers(self.policy.broker_directories, keyids, web=web, known=pinned)
        found += [_Source(base, directory_url(base), directory) for base, directory in answered]
        return found

    def _warn_broker_unavailable(self, base: str, reason: str) -> None:
        """One line a minute per broker directory (a configured one: the keys are bounded): asked for
        every stacked request while it is down, a line each let any sender fill the log."""
        if self._broker_lines.due(base) is not None:
            log.warning("broker directory %s unavailable: %s (logged at most once a minute)", base, reason)

    async def _key_for(
        self, entry: SignatureEntry, keyid: str, sources: list[_Source], *, budgeted: bool, web: bool
    ) -> VerificationKey | None:
        """The key for ``keyid`` in ``sources``; one published in the drafts' form (no spec window)
        only for a web-bot-auth label (``web``)."""
        found = _listing(sources, keyid, web, entry.label)
        if not found:  # a key rotated in since we cached the directories: each re-fetched, rate-limited
            found = await self._refetched_listing(sources, keyid, budgeted, web, entry.label)
        if not found:
            return None
        keys = [await self._verification_key(entry, key, source) for source, key in found]
        return next((key for key in keys if key.revoked), keys[0])  # revoked where it is listed

    async def _refetched_listing(
        self, sources: list[_Source], keyid: str, budgeted: bool, web: bool, label: str | None
    ) -> list[tuple[_Source, DirectoryKey]]:
        """``_listing`` of ``sources`` fetched again, at once: the first fresh copies listing ``keyid``
        (two: ``ambiguous-key``). One still fetching then is not waited for, its cached copy having
        listed no such key (``ConfiguredDirectories``' rule): one after the other, a broker's rotated
        key waited for another broker's hanging directory."""

        def fresh(answers: list[object]) -> list[tuple[_Source, DirectoryKey]]:
            return _listing([a for a in answers if isinstance(a, _Source)], keyid, web, label)

        asked = [self._refetched(source, budgeted, label) for source in sources if source.url is not None]
        return fresh(await at_once(asked, lambda answers: bool(fresh(answers))))

    async def _refetched(self, source: _Source, budgeted: bool, label: str | None) -> _Source | None:
        """``source``'s directory fetched again for a keyid it did not list, or None (failed, or
        fetched too recently: ``verify.keyid_refetch_s``)."""
        try:
            fresh = await self.resolver.refetch_for_keyid(source.base, budgeted=budgeted)
        except DirectoryError as exc:
            if exc.reason == VERIFIER_BUSY:
                raise _busy(label) from None
            return None
        return None if fresh is None else _Source(source.base, source.url, fresh)

    async def _verification_key(
        self, entry: SignatureEntry, key: DirectoryKey, source: _Source
    ) -> VerificationKey:
        revoked = False
        if source.url is not None:  # in this directory's sets only
            try:
                revoked_set = await self._poller.revoked_by(source.url, source.directory.revocation_url)
            except DirectoryError:
                raise VerificationError(
                    "revocation-unavailable",
                    "the revocation list of the key's directory has not been fetched",
                    entry.label,
                ) from None
            revoked = key.thumbprint in revoked_set
        return VerificationKey(key.public, key.not_before, key.not_after, revoked, source.base)


def _listing(
    sources: Sequence[_Source], keyid: str, web: bool, label: str | None
) -> list[tuple[_Source, DirectoryKey]]:
    """Each of ``sources`` listing ``keyid``, with its key. ``ambiguous-key`` when two directories
    do: the spec finds a broker's key "in the broker's own directory"; one two list is no one's
    own, and either could hide the other's revocation of it (cached, or both just fetched again)."""
    found = [
        (source, key) for source in sources if (key := source.directory.lookup(keyid, web=web)) is not None
    ]
    if sum(1 for source, _ in found if source.url is not None) > 1:
        raise VerificationError("ambiguous-key", "more than one broker directory lists this keyid", label)
    return found


def _busy(label: str | None = None) -> VerificationError:
    return VerificationError(
        VERIFIER_BUSY, "too many new key directories to fetch right now; retry shortly", label
    )


def _shown(base: str) -> str:
    """A signature base with its ``authorization`` line's value not shown: a bearer credential."""
    return "\n".join(
        f"{_AUTHORIZATION_LINE}{NOT_SHOWN}"
        if line.startswith(_AUTHORIZATION_LINE) and line != _AUTHORIZATION_LINE  # empty: nothing to hide
        else line
        for line in base.split("\n")
    )


_AUTHORIZATION_LINE = '"authorization": '  # RFC 9421 section 2.5: the component's line, non-empty


def stack_summary(stack: VerifiedStack) -> dict[str, object]:
    """The verdict as JSON-ready data (labels, keyids, key sources, signature bases, each without
    the value of a covered ``Authorization``)."""
    return {
        "verified": True,
        "profile": stack.profile,
        "hops": stack.hops,
        "signature_agent": stack.signature_agent,
        "directory": stack.directory,
        "labels": [
            {
                "label": s.label,
                "keyid": s.keyid,
                "key_source": s.key_source,
                "created": s.created,
                "expires": s.expires,
                "components": list(s.components),
                "signature_base": _shown(s.signature_base),
            }
            for s in stack.signatures
        ],
    }
