"""Layer-1 verification for exchanges, publishers and relays: resolve keys, then verify purely.

``RequestVerifier.verify`` parses the signature stack, resolves each label's key — the first
label's in the directory named by ``Signature-Agent`` (or pinned keys when it is empty), later
labels' in the directories of known brokers — folds in the revocation lists, and hands everything
to ``core.signatures.verify_stack`` with the current time. The result is a frozen
``VerifiedStack``; a refusal is a ``VerificationError`` with a stable reason. No aiohttp here:
``verify.middleware`` mounts it on an aiohttp application in one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.errors import FieldError, VerificationError
from ..core.fields import Fields
from ..core.jwk import PublicKey
from ..core.keys import Directory, DirectoryKey
from ..core.signatures import (
    DEFAULT_SKEW_S,
    Message,
    SignatureEntry,
    VerificationKey,
    VerifiedStack,
    parse_signature_agent,
    parse_signature_stack,
    verify_stack,
)
from ..core.uri import parse_absolute_uri
from .directory import DirectoryError, DirectoryResolver
from .revocation import RevocationPoller

__all__ = ["PINNED", "RequestVerifier", "VerifierPolicy", "stack_summary"]

log = logging.getLogger("signing_proxy.verifier")

PINNED = "pinned"  # the key source of pinned keys (no directory)
_FOREVER = (0, 2**62)


@dataclass(frozen=True)
class VerifierPolicy:
    """What a verifier accepts beyond the spec's fixed rules."""

    skew_s: int = DEFAULT_SKEW_S
    max_hops: int | None = None  # RequestConstraints.max_hops / max_intermediary_hops, counted as labels
    broker_directories: tuple[str, ...] = ()  # directory bases where later labels' keys are looked up
    pinned_agent_keys: tuple[PublicKey, ...] = ()  # for agents that send an empty Signature-Agent
    pinned_broker_keys: tuple[PublicKey, ...] = ()  # brokers known by key, no directory fetch


@dataclass
class RequestVerifier:
    """Verifies requests against published directories, revocation lists and pinned keys."""

    resolver: DirectoryResolver
    policy: VerifierPolicy = field(default_factory=VerifierPolicy)
    revocations: RevocationPoller | None = None
    clock: Callable[[], float] = time.time
    start_polling: Callable[[str], object] | None = None  # called once per newly seen revocation_url
    _polled: set[str] = field(default_factory=set)

    async def verify(self, method: str, target_uri: str, fields: Fields, body: bytes) -> VerifiedStack:
        """Verify every label of the request; raise VerificationError with the reason of a refusal."""
        try:
            message = Message(method, parse_absolute_uri(target_uri), fields)
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from None
        entries = parse_signature_stack(fields)
        raw_agent = fields.combined("signature-agent")
        if raw_agent is None:
            raise VerificationError("missing-covered-header", "covered field 'signature-agent' is absent")
        try:
            agent_base = parse_signature_agent(raw_agent)
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from None
        agent_dirs = await self._agent_directories(agent_base)
        broker_dirs = await self._broker_directories() if len(entries) > 1 else []
        for _base, directory in (*agent_dirs, *broker_dirs):
            await self._ensure_revocations(directory)
        revoked = self.revocations.revoked() if self.revocations is not None else frozenset()

        def lookup(entry: SignatureEntry, index: int) -> VerificationKey | None:
            for base, directory in agent_dirs if index == 0 else broker_dirs:
                key = directory.lookup(entry.keyid or "")
                if key is not None:
                    return _verification_key(key, base, revoked)
            return None

        return verify_stack(
            message, body, lookup, now=self.clock(), skew_s=self.policy.skew_s, max_hops=self.policy.max_hops
        )

    async def _agent_directories(self, base: str | None) -> list[tuple[str, Directory]]:
        if base is None:
            keys = tuple(DirectoryKey(k, *_FOREVER) for k in self.policy.pinned_agent_keys)
            return [(PINNED, Directory(keys))] if keys else []
        try:
            return [(base, await self.resolver.get(base))]
        except DirectoryError as exc:
            raise VerificationError(
                "directory-unavailable", f"key directory of {base}: {exc.detail}"
            ) from None

    async def _broker_directories(self) -> list[tuple[str, Directory]]:
        found = []
        if self.policy.pinned_broker_keys:
            pinned = tuple(DirectoryKey(k, *_FOREVER) for k in self.policy.pinned_broker_keys)
            found.append((PINNED, Directory(pinned)))
        for base in self.policy.broker_directories:
            try:
                found.append((base, await self.resolver.get(base)))
            except DirectoryError as exc:
                log.warning("broker directory %s unavailable: %s", base, exc.reason)
        return found

    async def _ensure_revocations(self, directory: Directory) -> None:
        url = directory.revocation_url
        if url is None or self.revocations is None or url in self._polled:
            return
        self._polled.add(url)
        await self.revocations.poll_once(url)  # trust nothing from a new directory before its list
        if self.start_polling is not None:
            self.start_polling(url)


def _verification_key(key: DirectoryKey, source: str, revoked: frozenset[str]) -> VerificationKey:
    return VerificationKey(key.public, key.not_before, key.not_after, key.thumbprint in revoked, source)


def stack_summary(stack: VerifiedStack) -> dict[str, object]:
    """The verdict as JSON-ready data (labels, keyids, key sources, signature bases)."""
    return {
        "verified": True,
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
                "signature_base": s.signature_base,
            }
            for s in stack.signatures
        ],
    }
