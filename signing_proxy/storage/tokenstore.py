"""A key store whose entries may name keys on a PKCS#11 token (``"pkcs11": URI`` in the index).

``TokenStoreKeyProvider`` is the store's key provider that also knows about token keys: it signs
off the event loop whenever the store holds one (``blocking``), reports a failing token for
``/readyz`` (``unavailable``) and tries a failed token again (``probe``, off the loop). With file
keys only it behaves exactly like ``StoreKeyProvider`` (``blocking`` False: the in-line hot path).
"""

from __future__ import annotations

import time

from .keystore import KeyStore, StoreKeyProvider, StoreState
from .pkcs11 import TokenKey

__all__ = ["TokenStoreKeyProvider"]


class TokenStoreKeyProvider(StoreKeyProvider):
    """``StoreKeyProvider`` for a store that may hold token keys beside file keys."""

    def __init__(self, store: KeyStore) -> None:
        super().__init__(store)
        self.blocking = _holds_tokens(self.state())

    def _install(self, state: StoreState) -> None:
        # ``blocking`` is True whenever the state served may hold a token key: set before a state
        # holding one is served (a request that reads it in between would sign on the event loop),
        # cleared only once the state that held one is gone. Under the reload lock: one at a time.
        tokens = _holds_tokens(state)
        self.blocking = self.blocking or tokens
        super()._install(state)
        self.blocking = tokens

    def unavailable(self) -> str | None:
        key = self.current(time.time())
        return key.slot.failure if isinstance(key, TokenKey) else None

    def probe(self) -> None:
        """Try each failed token again (blocking: call it off the event loop), through the signing
        key first: a token is probed once, and the key ``unavailable`` reports on is the one that
        says whether it is ready (another key of the token may no longer be on it: key mismatch)."""
        tried: set[int] = set()
        for key in (self.current(time.time()), *self.state().private.values()):
            if isinstance(key, TokenKey) and key.slot.failure is not None and id(key.slot) not in tried:
                tried.add(id(key.slot))
                key.probe()


def _holds_tokens(state: StoreState) -> bool:
    return any(isinstance(key, TokenKey) for key in state.private.values())
