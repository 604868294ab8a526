"""A key store whose entries may name keys on a PKCS#11 token (``"pkcs11": URI`` in the index).

``TokenStoreKeyProvider`` is the store's key provider that also knows about token keys: it signs
off the event loop whenever the store holds one (``blocking``), reports a failing token for
``/readyz`` (``unavailable``) and tries a failed token again (``probe``, off the loop). With file
keys only it behaves exactly like ``StoreKeyProvider`` (``blocking`` False: the in-line hot path).

The store opens a token key lazily (its public key comes from the index), so ``probe`` also proves
each token key that signs now or is published to sign later (the token signs a random challenge
that must verify: ``TokenKey.probe``) as soon as it sees one, not when it must first sign, and a
key waiting for its activation again every ``PENDING_PROOF_S``. A wrong PIN, a token out of reach or
another key under the URI is then logged at once and reported while the key signing now still works
(``next-key-<reason>`` for a key not yet activated), not first at its activation, when every request
would get 503 although the old key stays valid for the whole grace. A refused PIN is never sent again
(the token counts wrong PINs): a restart with the right one, or revoking the key, clears it.

A key that does not sign now is proved only where its proof cannot hold up a key that signs, now or
from an activation: a module takes one call at a time and a call into it cannot be cut short, so a
token out of reach holds up every other token of its module for as long as the call hangs. Such a
key is proved ahead only when every other key that signs now or waits to sign on its module is on
its own token (it meets that token's hang anyway); a key waiting on another token of such a module
is first proved when it starts signing. Its failure never marks the token failed for the key signing
now (but a refused PIN: the token's word on the PIN they share, never sent again). A key this
process cannot open at all (no ``signing.pkcs11``, no PIN, a key file gone bad) is reported from
the store's reload (``StoreKeyProvider.unavailable``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Final

from ..core.jwk import SigningKey
from ..core.keys import format_rfc3339
from .keystore import KeyStore, StoreKeyProvider, StoreState
from .pkcs11 import TokenKey
from .storewatch import NEXT_KEY_PREFIX

__all__ = ["NEXT_KEY_PREFIX", "PENDING_PROOF_S", "TokenStoreKeyProvider", "holds_up_none"]

log = logging.getLogger("signing_proxy.keys")

PENDING_PROOF_S: Final = 30.0  # our choice: a key waiting for its activation is proved again this often
# failures of the one key, not of its token: the slot (shared by the token's keys) is left as it was
_KEY_ONLY: Final = frozenset({"token-key-mismatch", "token-key-missing", "token-key-unsupported"})
_PIN_REFUSED: Final = "token-pin-incorrect"  # the slot's PIN, never sent again whichever key met it


@dataclass(frozen=True, slots=True)
class _Proof:
    """The outcome of proving ``key`` (a reload makes new key objects: they are proved again)."""

    key: TokenKey
    failure: str | None  # None: the token signed the challenge and it verified
    at: float  # time.monotonic() of the proof


class TokenStoreKeyProvider(StoreKeyProvider):
    """``StoreKeyProvider`` for a store that may hold token keys beside file keys."""

    def __init__(self, store: KeyStore) -> None:
        super().__init__(store)
        self.blocking = _holds_tokens(self.state())
        # thumbprint -> last proof, of the keys that sign now or later: written by the probe thread
        # (replaced whole), read by ``unavailable`` on the loop
        self._proofs: dict[str, _Proof] = {}
        self._held_back: frozenset[str] = frozenset()  # keys not proved ahead (logged once each)

    def _install(self, state: StoreState) -> None:
        # ``blocking`` is True whenever the state served may hold a token key: set before a state
        # holding one is served (a request that reads it in between would sign on the event loop),
        # cleared only once the state that held one is gone. Under the reload lock: one at a time.
        tokens = _holds_tokens(state)
        self.blocking = self.blocking or tokens
        super()._install(state)
        self.blocking = tokens

    def unavailable(self) -> str | None:
        """The token failure of the key signing now; else ``next-key-<reason>`` when a key published
        to sign later failed its proof (requests would get 503 from its activation)."""
        now = time.time()
        state = self.state()
        key = state.signing_key(now)
        if isinstance(key, TokenKey):
            failure = key.slot.failure or self._failure_of(key)
            if failure is not None:
                return failure
        for later in _watched(state, now).values():
            failure = None if later is key else self._failure_of(later)
            if failure is not None:
                return NEXT_KEY_PREFIX + failure
        return super().unavailable()  # a key published to sign later that this process cannot open

    def probe(self) -> None:
        """Try each failed token again (blocking: call it off the event loop), through the signing
        key first: a token is probed once, and the key ``unavailable`` reports on is the one that
        says whether it is ready (another key of the token may no longer be on it: key mismatch).
        Then prove each token key that signs now or later and was not proved yet, the signing key
        again while it fails, a key waiting for its activation every ``PENDING_PROOF_S``. A key that
        does not sign now is called only when it cannot hold up one that signs (``_alone``)."""
        now = time.time()
        state = self.state()
        signing = state.signing_key(now)
        watched = _watched(state, now)
        proofs = {t: p for t, p in self._proofs.items() if t in watched}  # bounded: the store's keys
        held_back = frozenset(t for t, k in watched.items() if k is not signing and not _alone(k, watched))
        self._log_held_back(state, watched, held_back)
        tried: set[int] = set()
        for key in (signing, *state.private.values()):
            if not isinstance(key, TokenKey) or key.slot.failure is None or id(key.slot) in tried:
                continue
            if key is signing or _alone(key, watched):  # not: its hang would hold up a key that signs
                tried.add(id(key.slot))
                if watched.get(key.thumbprint) is key:
                    proofs[key.thumbprint] = self._prove(key, state, proofs.get(key.thumbprint), signing)
                else:
                    key.probe()
        for thumbprint, key in watched.items():
            last = proofs.get(thumbprint)
            if thumbprint in held_back:
                due = False  # proved at its activation, when it is the key that signs
            elif last is None or last.key is not key:
                due = True  # never proved: at once, not at its first signature
            elif key is signing:
                due = last.failure is not None and id(key.slot) not in tried
            else:  # a token that goes away before the activation is noticed ahead of it
                due = time.monotonic() >= last.at + PENDING_PROOF_S and id(key.slot) not in tried
            if due:
                proofs[thumbprint] = self._prove(key, state, last, signing)
        self._proofs = proofs

    def _prove(
        self, key: TokenKey, state: StoreState, last: _Proof | None, signing: SigningKey | None
    ) -> _Proof:
        """Prove ``key`` on its token now (blocking) and log a change of its outcome since ``last``
        (by thumbprint: a reload that brings the same key again logs nothing)."""
        before = key.slot.failure
        ok = key.probe()  # a refused PIN stays refused: the slot never sends it again
        failure = None if ok else (key.slot.failure or "token-unavailable")
        shared = isinstance(signing, TokenKey) and signing.slot is key.slot
        own = failure in _KEY_ONLY or (shared and failure not in (None, _PIN_REFUSED))
        if own and key is not signing and key.slot.failure == failure:
            # the slot is the token's, maybe the key signing now's too: that key's readiness is its
            # own (its signatures and proofs say it), never set by a key that does not sign yet
            key.slot.failure = before
        was = None if last is None else last.failure
        if failure is not None and failure != was:
            record = state.record(key.thumbprint)
            activation = "" if record is None else format_rfc3339(record.activation)
            log.error(
                "token key %s of agent %s (%s) cannot sign: %s; %s",
                key.thumbprint,
                state.agent,
                key.uri.describe(),
                failure,
                "requests get 503 until its token answers"
                if key is signing
                else f"it signs from {activation}: requests get 503 from then unless its token answers "
                "(a refused PIN needs a restart with the right one)",
            )
        elif failure is None and was is not None:
            log.info("token key %s of agent %s signs again", key.thumbprint, state.agent)
        return _Proof(key, failure, time.monotonic())

    def _failure_of(self, key: TokenKey) -> str | None:
        proof = self._proofs.get(key.thumbprint)
        return proof.failure if proof is not None and proof.key is key else None

    def _log_held_back(
        self, state: StoreState, watched: dict[str, TokenKey], held_back: frozenset[str]
    ) -> None:
        """Say once per key that it is not proved ahead, and why (on the probe thread only)."""
        for thumbprint in sorted(held_back - self._held_back):
            key = watched[thumbprint]
            log.info(
                "token key %s of agent %s (%s) is proved at its activation, not ahead: another token "
                "of its module %s holds a key that signs now or waits to (a token out of reach there "
                "would hold up that key's signatures)",
                thumbprint,
                state.agent,
                key.uri.describe(),
                key.slot.module.path,
            )
        self._held_back = held_back


def _holds_tokens(state: StoreState) -> bool:
    return any(isinstance(key, TokenKey) for key in state.private.values())


def holds_up_none(key: TokenKey, state: StoreState, now: float) -> bool:
    """Whether a call for ``key``, a key that does not sign at ``now``, holds up no key that signs now
    or waits to sign (``_alone`` over ``_watched``): the one rule for which such keys the probe proves
    ahead and which the signed directory asks for a possession proof (``service.directory_proofs``)."""
    return _alone(key, _watched(state, now))


def _alone(key: TokenKey, watched: dict[str, TokenKey]) -> bool:
    """Whether a call for ``key`` holds up no key that signs now or waits to sign: each of those is
    on ``key``'s own token (it meets that token's hang anyway) or on another module (a module takes
    one call at a time, and a call into it cannot be cut short)."""
    return all(
        other.slot is key.slot or other.slot.module is not key.slot.module for other in watched.values()
    )


def _watched(state: StoreState, now: float) -> dict[str, TokenKey]:
    """The token keys that sign at ``now`` or are published to sign later (not yet activated), in
    index order; a retiring key no longer decides whether requests can be signed."""
    signing = state.signing_record(now)
    waiting = state.waiting_records(now)
    records = [r for r in state.records if r == signing or r in waiting]  # in index order
    return {r.thumbprint: k for r in records if isinstance(k := state.private.get(r.thumbprint), TokenKey)}
