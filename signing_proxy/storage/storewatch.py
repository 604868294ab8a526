"""A key store as a running process sees it: loaded once, served from memory, re-read when it changes.

``StoreWatcher.state()`` never touches the disk (safe on the event loop); ``reload()`` (blocking,
any thread) re-reads the store when its index changed. The index decides, whenever it can be read:
every reload whose index parses serves that index's windows, revocations and revocation list, and a
key whose private half this process cannot open (a token entry without ``signing.pkcs11``, a key
file gone bad) signs only with the copy loaded before, under the new index's window, or not at all.
A revocation seen once stays in force in this process, whatever a later index says. An index that
cannot be read keeps the last good state. A reload waits for a writer's lock at most
``RELOAD_LOCK_WAIT_S``, then tries again at the next check (a SIGHUP's forced re-read is kept).
``StoreKeyProvider`` signs with ``choose_signing_key`` evaluated at each call, so a key starts
signing at its activation and stops the moment its window closes. Each key not opened keeps its
reason until it opens: ``unavailable`` reports one published to sign later as ``next-key-<reason>``
(a warning ahead for ``/readyz``: requests would get 503 from its activation), while the key
signing now, if not opened, is no key at all (``current`` None).

A worker of ``run --workers`` holds no copy of its parent's: ``load_afresh`` reads the store from
disk, keeping nothing of the state before (forked from the parent, that is the parent's start-up copy,
keys revoked since included), and refuses an index that went back below what the parent read
(``floor``). The parent, which signs nothing, keeps no private key (``forget_private_keys``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Final, Protocol

from ..core.jwk import SigningKey
from ..core.keys import KeyProvider, RevocationList, format_rfc3339, merge_revocation_lists
from ..errors import ConfigError, KeyStoreError, TokenError
from .keyindex import StoreState

__all__ = [
    "KEY_UNOPENED",
    "NEXT_KEY_PREFIX",
    "RELOAD_LOCK_WAIT_S",
    "START_LOCK_WAIT_S",
    "STORE_BUSY",
    "STORE_ROLLED_BACK",
    "RevocationFloor",
    "StoreKeyProvider",
    "StoreWatcher",
    "WatchedStore",
]

log = logging.getLogger("signing_proxy.keys")

# our choice: how long a reload waits for a writer's lock before it tries again at the next check (a
# thread blocked in flock cannot be stopped, and an exiting interpreter waits for it: SIGTERM hung)
RELOAD_LOCK_WAIT_S: Final = 0.25
STORE_BUSY: Final = "store-busy"  # KeyStoreError's reason: the lock stayed taken for lock_wait_s
# our choice: how long a worker's start waits for a writer's lock (then it exits, and is started again)
START_LOCK_WAIT_S: Final = 2.0
# KeyStoreError's reason: the index revokes less than, or lists revocations as of before, what was read
STORE_ROLLED_BACK: Final = "store-rolled-back"
NEXT_KEY_PREFIX: Final = "next-key-"  # /readyz: the key published to sign next cannot sign (its reason)
# /readyz's reason for a key not opened, unless a token's own says more (token-pin-missing): no
# signing.pkcs11.module, a URI this configuration cannot use, a key file missing, too open or another key
KEY_UNOPENED: Final = "key-unopened"
_NOTHING_REPORTED: Final = object()  # no failed reload reported yet (None is a missing index)


class WatchedStore(Protocol):
    """What a watcher needs of a store (``keystore.KeyStore``)."""

    path: Path

    def fingerprint(self) -> tuple[int, ...] | None: ...

    def load(
        self,
        *,
        private: bool = True,
        unopened: dict[str, Exception] | None = None,
        lock_wait_s: float | None = None,
    ) -> StoreState: ...


class StoreWatcher:
    """A store loaded once and served from memory: ``state()`` never touches the disk. ``reload()``
    re-reads it when its index changed; an index that turns bad is reported and the last good state kept.
    """

    def __init__(self, store: WatchedStore, *, private: bool) -> None:
        self.store = store
        self._private = private
        self._reload_lock = threading.Lock()  # one reload at a time (the periodic check and SIGHUP)
        self._seen = store.fingerprint()  # of the index the state was loaded from
        self._state = store.load(private=private)  # a bad store at start-up is refused
        # thumbprint -> reason, of the keys not opened: each check re-reads the store; replaced whole
        # (under the reload lock), read by ``unavailable`` on the loop
        self._unopened: Mapping[str, str] = {}
        self._reported: object = _NOTHING_REPORTED
        self._force_pending = False  # a forced reload found the store locked: the next check forces
        self._busy_reported = False

    def state(self) -> StoreState:
        """The state loaded last: memory only, no file I/O (safe on the event loop)."""
        return self._state

    def reload(self, *, force: bool = False) -> bool:
        """Re-read the store when its index changed since the last load (one ``stat`` when it did not),
        or always with ``force``. Blocking: call it off the event loop; safe from any thread (the new
        state replaces the old in one reference). False when the index cannot be read (the previous
        state kept), when a writer held the lock too long (tried again at the next call), or when
        some key could not be opened (the rest of the new state is served)."""
        with self._reload_lock:
            force = force or self._force_pending
            seen = self.store.fingerprint()
            if seen == self._seen and not self._unopened and not force:
                return True
            unopened: dict[str, Exception] = {}
            wait_s = RELOAD_LOCK_WAIT_S
            try:
                state = self.store.load(private=self._private, unopened=unopened, lock_wait_s=wait_s)
            except (KeyStoreError, TokenError, ConfigError) as exc:
                if isinstance(exc, KeyStoreError) and exc.reason == STORE_BUSY:
                    self._wait_for_the_lock(force)
                elif seen != self._reported:  # once per version of the index, not once per check
                    self._reported = seen
                    log.error("key store not reloaded, keeping the keys loaded before: %s", exc)
                return False
            self._force_pending = self._busy_reported = False
            retry = seen == self._seen and not force  # the same index, read again for keys not opened
            reasons = {t: _reason(exc) for t, exc in unopened.items()}
            if retry and reasons.keys() == self._unopened.keys():
                self._unopened = reasons  # the reason may have changed (a PIN file now there, too open)
                return False  # none opened since: the state served stays, its (token) key objects too
            before = self._state
            state, lost = state.keeping_revocations(before)
            state, kept = state.with_keys_of(before, unopened)
            self._install(state)
            self._seen, self._unopened = seen, reasons
            fresh = not retry or not unopened
            report = bool(lost or unopened) and seen != self._reported
            if report:
                self._reported = seen
        if report:
            self._report(state, lost, unopened, kept)
        if fresh:
            changed = before.records != state.records or before.revocations != state.revocations
            counts = f"{len(state.records)} keys, {len(state.revocations.revoked)} revoked" if changed else ""
            log.info("reloaded key store %s (agent %s): %s", state.path, state.agent, counts or "unchanged")
        return not unopened

    def load_afresh(self, floor: RevocationList, *, lock_wait_s: float = START_LOCK_WAIT_S) -> None:
        """Serve the store as it is on disk now, nothing taken from the state before (a worker's: its
        parent's copy, with keys revoked since). KeyStoreError, the state unchanged, when the index
        cannot be read, the lock stays taken past ``lock_wait_s``, or the index went back below
        ``floor``, the revocations the parent read (an older ``keys.json`` put back): it would bring a
        revoked key back. A key that cannot be opened does not sign, as after a reload (logged)."""
        with self._reload_lock:
            seen = self.store.fingerprint()
            unopened: dict[str, Exception] = {}
            state = self.store.load(private=self._private, unopened=unopened, lock_wait_s=lock_wait_s)
            _check_floor(state, floor)
            self._install(state)
            self._seen, self._unopened = seen, {t: _reason(exc) for t, exc in unopened.items()}
            self._reported = seen if unopened else _NOTHING_REPORTED
            self._force_pending = self._busy_reported = False
        if unopened:
            self._report(state, frozenset(), unopened, frozenset())

    def forget_private_keys(self) -> None:
        """Hold no private key from now on (``run --workers``' parent, which signs nothing: each worker
        loads the store itself, ``load_afresh``). The public state stays: windows, revocations."""
        with self._reload_lock:
            self._install(replace(self._state, private=MappingProxyType({})))

    def _wait_for_the_lock(self, force: bool) -> None:
        self._force_pending = force  # a SIGHUP that found the store locked is not lost
        if not self._busy_reported:  # once until a reload gets through
            self._busy_reported = True
            log.warning(
                "key store %s is locked by another process: not re-read yet, trying again at the next check",
                self.store.path,
            )

    @staticmethod
    def _report(
        state: StoreState, lost: frozenset[str], unopened: dict[str, Exception], kept: frozenset[str]
    ) -> None:
        for thumbprint in sorted(lost):
            log.error(
                "key store %s: the index no longer lists %s as revoked; it stays revoked in this process",
                state.path,
                thumbprint,
            )
        for thumbprint, exc in sorted(unopened.items()):
            how = "signs with the copy loaded before" if thumbprint in kept else "cannot sign until it opens"
            log.error("key store %s: key %s not opened, it %s: %s", state.path, thumbprint, how, exc)

    def _install(self, state: StoreState) -> None:
        """Serve ``state`` from now on (under the reload lock; a subclass prepares for it first)."""
        self._state = state


class RevocationFloor:
    """The revocations read in a store so far, never fewer, ``as_of`` never earlier: what ``run
    --workers``' parent holds for each worker it starts (``StoreWatcher.load_afresh``), refreshed by
    ``check`` (one ``stat``; the public half read when the index changed). An index that cannot be
    read leaves it as it was (the workers say why); a writer's lock is waited for at most
    ``RELOAD_LOCK_WAIT_S``, then the next check tries again."""

    def __init__(self, store: WatchedStore, floor: RevocationList) -> None:
        self.store = store
        self.floor = floor
        self._seen: object = _NOTHING_REPORTED  # the index's fingerprint read last: none yet

    def check(self) -> RevocationList:
        seen = self.store.fingerprint()
        if seen == self._seen:
            return self.floor
        try:
            read = self.store.load(private=False, lock_wait_s=RELOAD_LOCK_WAIT_S).revocations
        except (KeyStoreError, TokenError, ConfigError) as exc:
            if not (isinstance(exc, KeyStoreError) and exc.reason == STORE_BUSY):
                self._seen = seen  # read again once it changes
            return self.floor
        self._seen = seen
        self.floor = merge_revocation_lists(self.floor, read)
        return self.floor


def _check_floor(state: StoreState, floor: RevocationList) -> None:
    """Refuse ``state`` when it revokes less than ``floor``, or as of an earlier time."""
    revocations = state.revocations
    lost = sorted(floor.revoked - revocations.revoked)
    if lost:
        more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        raise KeyStoreError(
            STORE_ROLLED_BACK,
            state.path,
            f"the index no longer lists key {lost[0]}{more} as revoked, which this proxy read revoked "
            "(an older keys.json put back?); it is not served",
        )
    if revocations.as_of < floor.as_of:
        raise KeyStoreError(
            STORE_ROLLED_BACK,
            state.path,
            f"the revocation list is as of {format_rfc3339(revocations.as_of)}, before "
            f"{format_rfc3339(floor.as_of)} as this proxy read it (an older keys.json put back?); "
            "it is not served",
        )


def _reason(exc: Exception) -> str:
    """The stable reason ``/readyz`` gives for a key not opened: a token's own (the PIN), else one."""
    return exc.reason if isinstance(exc, TokenError) else KEY_UNOPENED


class StoreKeyProvider(StoreWatcher, KeyProvider):
    """Signs with the key ``choose_signing_key`` picks at the moment of each call (activated, in its
    window, not revoked); answers from memory (see ``StoreWatcher``)."""

    def __init__(self, store: WatchedStore) -> None:
        super().__init__(store, private=True)

    def current(self, now: float) -> SigningKey | None:
        return self.state().signing_key(now)

    def unavailable(self) -> str | None:
        """``next-key-<reason>`` when a key published to sign later could not be opened by the last
        reload (nor kept from the load before): requests would get 503 from its activation."""
        unopened = self._unopened
        if not unopened:
            return None
        now = time.time()
        state = self.state()
        signing = state.signing_record(now)
        for record in state.waiting_records(now):  # in index order; one signing now signs anyway
            reason = unopened.get(record.thumbprint) if record != signing else None
            if reason is not None and record.thumbprint not in state.private:
                return NEXT_KEY_PREFIX + reason
        return None

    def not_after(self, now: float) -> float | None:
        chosen = self.state().signing_record(now)
        return None if chosen is None else float(chosen.not_after)

    def key_for(self, thumbprint: str, now: float) -> SigningKey | None:
        state = self.state()  # one state: record and private key from the same load
        record = state.record(thumbprint)
        if record is None or not record.usable_at(now):
            return None
        # published but not yet activated: caching verifiers may lack it (unless it signs anyway)
        waiting = record.activation > now and state.signing_record(now) != record
        return None if waiting else state.private.get(thumbprint)

    def not_after_of(self, thumbprint: str) -> float | None:
        record = self.state().record(thumbprint)
        return None if record is None else float(record.not_after)
