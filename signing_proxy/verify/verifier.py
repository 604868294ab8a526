"""Layer-1 verification for exchanges, publishers and relays: resolve keys, then verify purely.

``RequestVerifier.verify`` parses the signature stack, resolves each label's key — the first
label's in the directory named by ``Signature-Agent`` (or pinned keys when it is empty), later
labels' in the directories of known brokers — folds in the revocation lists, and hands everything
to ``core.signatures.verify_stack`` with the current time. The result is a frozen
``VerifiedStack``; a refusal is a ``VerificationError`` with a stable reason.
``signature_middleware`` mounts it on an aiohttp application in one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

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
from ..errors import problem_body
from .directory import DirectoryError, DirectoryResolver, RevocationPoller

__all__ = ["SIGNATURE", "RequestVerifier", "VerifierPolicy", "signature_middleware", "verify_aiohttp_request"]

log = logging.getLogger("signing_proxy.verifier")

PINNED = "pinned"
SIGNATURE = web.RequestKey("signature", VerifiedStack)  # request[SIGNATURE]: the verified result
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


async def verify_aiohttp_request(
    verifier: RequestVerifier, request: web.Request, *, external_origin: str | None = None
) -> VerifiedStack:
    """Verify an aiohttp request as received (raw header lines, raw path, exact body).

    ``external_origin`` (``https://exchange.example``) is the origin clients used when a TLS-terminating
    load balancer sits in front (RFC 9421 section 7.4.3); otherwise scheme and Host of the request.
    """
    body = await request.read()
    lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
    origin = external_origin.rstrip("/") if external_origin else f"{request.scheme}://{request.host}"
    return await verifier.verify(request.method, origin + request.raw_path, Fields(lines), body)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def signature_middleware(
    verifier: RequestVerifier, *, external_origin: str | None = None, exempt_paths: Sequence[str] = ()
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """aiohttp middleware: refuse unverified requests with 401 problem+json; else put the
    ``VerifiedStack`` in ``request[SIGNATURE]`` for the handler (trust only that)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in exempt_paths:
            return await handler(request)
        try:
            request[SIGNATURE] = await verify_aiohttp_request(
                verifier, request, external_origin=external_origin
            )
        except VerificationError as exc:
            return refusal(exc)
        return await handler(request)

    return middleware


def refusal(exc: VerificationError) -> web.Response:
    """401 problem+json carrying the refusal reason (and the label it concerns)."""
    extra: dict[str, object] = {"label": exc.label} if exc.label else {}
    return web.Response(
        status=401,
        body=problem_body(401, exc.reason, exc.detail, **extra),
        content_type="application/problem+json",
        headers={"WWW-Authenticate": 'Signature realm="signing-proxy"'},
    )
