"""One way to assemble a verifier that faces strangers, for the relay, verify-origin and exchanges.

``build_verifier`` wires a ``RequestVerifier`` the same way everywhere: directories (64 KiB) and
revocation lists (4 MiB) fetched through the package's one client under an ``EgressPolicy`` (default:
public https only), each bounded by ``egress.fetch_timeout_s``; caches, pollers and the fetches that
requests may cause bounded by ``verify.*``; revocation lists polled every 300 s +/-10 % while their
directory is cached, and failing closed until first fetched. Close it with ``await verifier.close()``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ..config import VerifyConfig
from ..core.jwk import PublicKey
from ..core.keys import MAX_DIRECTORY_BYTES
from ..errors import ConfigError, KeyFileError
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from ..storage.keyfile import load_public_key_file
from .cache import TokenBucket
from .directory import FETCH_TIMEOUT_S, DirectoryResolver, http_fetcher
from .revocation import MAX_REVOCATION_LIST_BYTES, RevocationPoller
from .verifier import RequestVerifier, VerifierPolicy

__all__ = ["build_verifier", "load_pinned_keys", "policy_from_config"]


def policy_from_config(limits: VerifyConfig, *, gateway: bool = False) -> VerifierPolicy:
    """A policy with ``verify.skew_s``, ``verify.max_validity_s`` and ``verify.web_bot_auth`` (no
    pinned keys, no brokers); ``gateway``: for a gateway, whose default is the spec's profile only."""
    return VerifierPolicy(
        skew_s=limits.skew_s,
        max_validity_s=limits.max_validity_s,
        web_bot_auth=limits.accepts_web_bot_auth(gateway=gateway),
    )


def load_pinned_keys(paths: Sequence[str], where: str) -> tuple[PublicKey, ...]:
    """The public keys in ``paths`` (PEM or JWK files, ``~`` expanded); ConfigError naming ``where``
    (``relay.pinned_agent_keys``, ``gateway.pinned_agent_keys``, ...), reason
    ``pinned-key-unusable``, for one that cannot be read."""
    try:
        return tuple(load_public_key_file(Path(p).expanduser()) for p in paths)
    except KeyFileError as exc:  # a pkcs11: URI given for a file (a token key is never pinned): PIN masked
        raise ConfigError(f"{where}: {exc.shown()}", reason="pinned-key-unusable") from None


def build_verifier(
    policy: VerifierPolicy | None = None,
    *,
    client: HttpClient | None = None,
    egress: EgressPolicy | None = None,
    limits: VerifyConfig | None = None,
    fetch_timeout_s: float = FETCH_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    monotonic: Callable[[], float] = time.monotonic,
) -> RequestVerifier:
    """A verifier fetching through ``client`` (default: a standalone one, closed with the verifier).

    ``policy`` defaults to ``limits``' skew and lifetime; ``clock`` (wall) judges signature windows and
    directory proofs, ``sleep`` and ``rand`` drive the revocation schedule, ``monotonic`` the fetch
    budget and every cache lifetime, failure memory and re-fetch spacing (tests inject them).
    """
    limits = limits if limits is not None else VerifyConfig()
    policy = policy if policy is not None else policy_from_config(limits)
    egress = egress if egress is not None else EgressPolicy()
    own = client is None
    http = client if client is not None else HttpClient.standalone()
    resolver = DirectoryResolver(
        http_fetcher(http, egress=egress, max_bytes=MAX_DIRECTORY_BYTES, timeout_s=fetch_timeout_s),
        clock=clock,
        monotonic=monotonic,  # a wall clock stepped back would hold failures and entries that long
        max_entries=limits.directory_cache_entries,
        max_bytes=limits.directory_cache_bytes,
        negative_entries=limits.negative_cache_entries,
        keyid_refetch_s=limits.keyid_refetch_s,
        fetch_budget=(
            # a monotonic clock: a wall clock stepped back would stop the refill for as long
            TokenBucket(limits.fetches_per_s, limits.fetch_burst, monotonic) if limits.fetches_per_s else None
        ),
        fetch_timeout_s=fetch_timeout_s,
        skew_s=policy.skew_s,
    )
    poller = RevocationPoller(
        http_fetcher(http, egress=egress, max_bytes=MAX_REVOCATION_LIST_BYTES, timeout_s=fetch_timeout_s),
        clock=clock,
        monotonic=monotonic,
        sleep=sleep,
        rand=rand,
        fetch_timeout_s=fetch_timeout_s,
    )
    verifier = RequestVerifier(resolver, policy, revocations=poller, clock=clock, egress=egress)
    if own:
        verifier.closers.append(http.close)
    return verifier
