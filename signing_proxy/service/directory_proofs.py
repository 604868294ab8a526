"""The signed directory's possession proofs, made once and shared by every request that asks.

The publication listener faces strangers, and each proof is a signature by a published key: a key on
a token signs on the PKCS#11 module's one thread, where the proxy's own request signatures wait. So a
request for the drafts' directory must not cost a signature round of its own. ``ProofCache`` keeps,
per agent, the proofs last made: served again while the key store serves the same state and the body
is the same, for ``PROOF_CACHE_S`` at most (a small part of the proofs' validity,
``publish.directory_max_age_s``). Requests that come while a round is signing await that round.

Each key signs its proof on its own: a key whose token does not sign is left without a proof (the
drafts: a proof per key is RECOMMENDED and clients SHOULD ignore a key without one; it stays listed,
as the keys of ``publish.agents`` we hold no private key of are) and the others are served, so a
retiring key's token taken offline does not block the directory of the key that signs now. A round
fails only when the key signing now, or every key asked, did not sign: it is answered from memory for
``FAILURE_HOLD_S`` (the ``Retry-After`` sent) and tried again only after it.

A key that does not sign now is asked for its proof only where the call cannot hold up a key that
signs, now or from an activation (``storage.tokenstore.holds_up_none``, the rule the probe follows):
a module takes one call at a time and a call into it cannot be cut short, so a key waiting (or
retiring) on a token out of reach, on another token of the signing key's module, held up the round
and then every request signature (the module stalled on the hung call: token-unavailable) until
the call returned. Such a key is listed without its proof, as one whose token did not sign; a key
on another module than those keys, or on their very token (it meets that token's hang anyway), is
asked as before, and a file key always. Each of the three log lines is written per round, not per
request, at most once every ``WARN_EVERY_S`` per agent (with the number of rounds since).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

from ..core.directory_proof import directory_proof_bases, directory_proof_fields
from ..core.jwk import SigningKey
from ..core.rotation import CLOCK_MARGIN_S
from ..errors import TokenError
from ..ratelog import RateGate
from ..storage.keystore import StoreState
from ..storage.pkcs11 import TokenKey
from ..storage.tokenstore import holds_up_none

__all__ = ["FAILURE_HOLD_S", "PROOF_CACHE_S", "WARN_EVERY_S", "ProofCache", "SignedProofs"]

log = logging.getLogger("signing_proxy.publish")

PROOF_CACHE_S: Final = 60  # our choice: proofs reused this long at most, and a quarter of max-age
FAILURE_HOLD_S: Final = 5  # a failed round is answered (503, Retry-After) this long before the next try
WARN_EVERY_S: Final = 60  # our choice: a token that keeps failing is logged once a minute, with a count


@dataclass(frozen=True, slots=True)
class SignedProofs:
    """The proofs of one directory body, made at ``signed_at`` from ``state``, valid until ``expires``."""

    state: StoreState
    body: bytes
    signed_at: float
    expires: int
    fields: tuple[tuple[str, str], ...]  # Content-Digest, Signature-Input, Signature


@dataclass(frozen=True, slots=True)
class _Failed:
    state: StoreState
    body: bytes
    until: float
    error: TokenError


@dataclass(frozen=True, slots=True)
class _Round:
    state: StoreState
    body: bytes
    task: asyncio.Task[SignedProofs]


class ProofCache:
    """Per agent, the directory proofs last made (or the failure of the last round), and the round
    signing now. Bounded by the agents configured (``publications``): one entry of each kind per agent.
    """

    def __init__(self, authority: str, max_age_s: int, clock: Callable[[], float]) -> None:
        self.authority = authority  # what proofs bind: our public authority, never the Host asked
        self.max_age_s = max_age_s
        self.ttl_s = min(PROOF_CACHE_S, max_age_s // 4)
        self.clock = clock  # the listener's: when a round ended (a token may take timeout_s to fail)
        self._made: dict[str, SignedProofs | _Failed] = {}
        self._rounds: dict[str, _Round] = {}
        self._failed = RateGate(WARN_EVERY_S)  # rounds that failed: no directory served
        self._left_out = RateGate(WARN_EVERY_S)  # rounds served with a key left without its proof
        self._held_back = RateGate(
            WARN_EVERY_S
        )  # rounds served with a key not asked, lest it hold up a signer

    async def proofs(
        self, agent: str, state: StoreState, body: bytes, keys: Sequence[SigningKey], now: float
    ) -> SignedProofs:
        """Proofs of ``body`` by ``keys`` (the published keys of ``state`` we hold), made now or
        shared; a key whose token did not sign, or that does not sign now and could hold up one that
        does, is left without one. TokenError when the key signing now, or every key asked, did not
        sign (this round, or one that failed just before)."""
        made = self._made.get(agent)
        if made is not None and made.state is state and made.body == body:
            if isinstance(made, _Failed):
                if made.until - FAILURE_HOLD_S <= now < made.until:
                    raise made.error
            elif made.signed_at <= now < made.signed_at + self.ttl_s:
                return made
        current = self._rounds.get(agent)
        if current is None or current.state is not state or current.body != body:
            # a task of its own: a waiter that goes away (a client disconnect) cancels no one else's
            task = asyncio.get_running_loop().create_task(self._sign(agent, state, body, keys, now))
            current = self._rounds[agent] = _Round(state, body, task)
            task.add_done_callback(partial(self._done, agent, current))
        try:
            return await asyncio.shield(current.task)
        except asyncio.CancelledError:
            running = asyncio.current_task()
            if current.task.cancelled() and not (running is not None and running.cancelling()):
                raise TokenError("token-unavailable", "the listener is closing") from None
            raise

    async def close(self) -> None:
        """Cancel the rounds signing now (their waiters get TokenError)."""
        tasks = [r.task for r in self._rounds.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _sign(
        self, agent: str, state: StoreState, body: bytes, keys: Sequence[SigningKey], now: float
    ) -> SignedProofs:
        created = int(now)
        expires = created + self.max_age_s
        digest, planned = directory_proof_bases(
            body,
            self.authority,
            [k.thumbprint for k in keys],
            # behind our clock: a verifier refuses a created in the future, and its clock may be
            # a few seconds behind ours (core.rotation.CLOCK_MARGIN_S)
            created=created - CLOCK_MARGIN_S,
            expires=expires,
        )
        signing = state.signing_record(now)
        made: list[tuple[tuple[str, bytes], bytes]] = []  # (plan, signature) of the keys that signed
        left_out: list[tuple[str, TokenError]] = []
        held_back: list[TokenKey] = []  # not asked: a hang on their token would hold up a signer
        for key, plan in zip(keys, planned, strict=True):
            signs = signing is not None and key.thumbprint == signing.thumbprint
            if isinstance(key, TokenKey) and not signs and not holds_up_none(key, state, now):
                held_back.append(key)
                continue
            try:  # a key on a token signs on the token's thread, bounded: a stranger never stalls the loop
                signature = await key.sign_async(plan[1]) if isinstance(key, TokenKey) else key.sign(plan[1])
            except TokenError as exc:
                if signs:
                    self._round_failed(agent, exc, now)  # no directory without the signing key's proof
                    raise
                left_out.append((key.thumbprint, exc))
                continue
            made.append((plan, signature))
        if left_out and not made:  # not one proof: nothing a client would take
            self._round_failed(agent, left_out[0][1], now)
            raise left_out[0][1]
        if left_out:
            rounds = self._left_out.due(agent, now)
            if rounds is not None:
                log.warning(
                    "signed directory of agent %s served without the proof of %s: its token did not "
                    "sign (%s; %d round(s) since the last warning)",
                    agent,
                    ", ".join(f"key {thumbprint}" for thumbprint, _ in left_out),
                    ", ".join(exc.reason for _, exc in left_out),
                    rounds,
                )
        if held_back:
            self._log_held_back(agent, held_back, now)
        fields = directory_proof_fields(digest, [p for p, _ in made], [sig for _, sig in made])
        return SignedProofs(state, body, now, expires, tuple(fields))

    def _round_failed(self, agent: str, exc: TokenError, now: float) -> None:
        """Log a round that failed: per round, not per request, and at most every ``WARN_EVERY_S``."""
        rounds = self._failed.due(agent, now)
        if rounds is not None:
            log.warning(
                "no signed directory for agent %s: a token did not sign (%s; %d round(s) failed)",
                agent,
                exc.reason,
                rounds,
            )

    def _log_held_back(self, agent: str, held_back: Sequence[TokenKey], now: float) -> None:
        """Say which keys went without their proof, not asked (per round, at most every ``WARN_EVERY_S``)."""
        rounds = self._held_back.due(agent, now)
        if rounds is not None:
            log.info(
                "signed directory of agent %s served without the proof of %s: not asked, as another "
                "token of its PKCS#11 module holds a key that signs now or waits to (a token out of reach "
                "would hold up that key's signatures); %d round(s) since the last line",
                agent,
                ", ".join(
                    f"key {k.thumbprint} ({k.uri.describe()}, module {k.slot.module.path})" for k in held_back
                ),
                rounds,
            )

    def _done(self, agent: str, round_: _Round, task: asyncio.Task[SignedProofs]) -> None:
        if self._rounds.get(agent) is round_:
            del self._rounds[agent]
        else:  # a newer round (another state or body) replaced it: its outcome is stale
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning when every waiter left
            return
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._made[agent] = task.result()
        elif isinstance(error, TokenError):
            # held from when it ended: a token that hangs fails only after timeout_s
            self._made[agent] = _Failed(round_.state, round_.body, self.clock() + FAILURE_HOLD_S, error)
