"""The key store: our Ed25519 signing keys, their windows and our revocation list, on disk.

One store per agent lives in ``<data_dir>/keys/<agent>/`` (``default`` when unnamed): a private
key per file named by its RFC 7638 thumbprint (``<thumbprint>.pem``, PKCS#8, mode 0600) and an
index ``keys.json`` (mode 0600) holding each key's public ``x`` and window ``[not_before,
not_after)`` and the revocation list (spec "Key directory", "Key publication, rotation and
revocation"). Both directories are 0700. Every write is atomic (temporary file, fsync, rename) and
every change holds an exclusive lock, so a reader sees either the old store or the new one. Loading
refuses a malformed index, a key file whose key does not match its name, and anything that group
or others can access, with a message naming the path.

A change (rotate, revoke, prune) first deletes what one cut short left: ``write_atomic``'s
temporaries and key files the index no longer names for an unrevoked key. Revoking and pruning read
no private key, so a broken key file never blocks them. ``StoreKeyProvider`` and ``StoreWatcher``
(``storewatch.py``, re-exported here) serve a store from memory to a running process and re-read it
off the loop every ``RELOAD_CHECK_INTERVAL_S`` and on SIGHUP. The index format is ``keyindex.py``'s,
the owner-only file handling ``files.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Final

from ..config import AGENT_NAME_RE
from ..core.b64 import b64url_decode
from ..core.errors import KeyFormatError
from ..core.jwk import PublicKey, SigningKey
from ..core.keys import (
    MAX_DIRECTORY_KEYS,
    MAX_REVOKED_THUMBPRINTS,
    KeyRecord,
    RevocationList,
    choose_signing_key,
    format_rfc3339,
    is_thumbprint,
)
from ..core.rotation import CLOCK_MARGIN_S
from ..errors import ConfigError, KeyStoreError, TokenError
from .files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    PrivateFileError,
    check_private_dir,
    file_lock,
    make_private_dir,
    read_private,
    sweep,
    temporary_target,
)
from .keyfile import KeyFileError, load_key_file, write_private_file
from .keyindex import MAX_INDEX_BYTES, MAX_STORE_KEYS, IndexEntry, StoreState, parse_index, render_index
from .pkcs11 import TokenKey
from .storewatch import STORE_BUSY, StoreKeyProvider, StoreWatcher

__all__ = [
    "DEFAULT_AGENT",
    "DEFAULT_GRACE_S",
    "DEFAULT_KEY_LIFETIME_S",
    "INDEX_NAME",
    "LEGACY_KEY_NAME",
    "RELOAD_CHECK_INTERVAL_S",
    "STORE_DIR_NAME",
    "KeyStore",
    "KeyStoreError",
    "StoreKeyProvider",
    "StoreState",
    "StoreWatcher",
    "check_agent_name",
    "open_or_create",
]

log = logging.getLogger("signing_proxy.keys")

STORE_DIR_NAME: Final = "keys"  # <data_dir>/keys/<agent>/
INDEX_NAME: Final = "keys.json"
LOCK_NAME: Final = ".lock"
LEGACY_KEY_NAME: Final = "agent-key.pem"  # the single key of earlier versions, imported once
DEFAULT_AGENT: Final = "default"
DEFAULT_KEY_LIFETIME_S: Final = 90 * 86_400  # our choice: a key's window when none is given
DEFAULT_GRACE_S: Final = 48 * 3600  # spec: Limits ("typically 24 to 48 hours")
RELOAD_CHECK_INTERVAL_S: Final = 1.0  # our choice: how often a running proxy looks at the index

TokenKeys = Callable[[str, PublicKey], SigningKey]  # (pkcs11 URI, public key) -> the token key


def check_agent_name(agent: str) -> str:
    """Return ``agent`` when it is a valid agent name (lower-case, a safe path and URL segment)."""
    if not isinstance(agent, str) or not AGENT_NAME_RE.fullmatch(agent):
        raise ValueError(f"agent name {agent!r}: use 1-63 of a-z 0-9 . _ - starting with a letter or digit")
    return agent


class KeyStore:
    """The files of one agent's store; ``load`` reads them, the other methods change them atomically.

    Every method that changes the store takes ``now`` (unix seconds) and refuses, unless ``force``,
    to leave the store with no key valid at ``now``.
    """

    def __init__(
        self, data_dir: Path, agent: str = DEFAULT_AGENT, *, tokens: TokenKeys | None = None
    ) -> None:
        self.tokens = tokens  # opens the keys an entry's ``pkcs11`` names; None: they load as public only
        self.data_dir = Path(data_dir)
        self.agent = check_agent_name(agent)
        self.root = self.data_dir / STORE_DIR_NAME
        self.path = self.root / agent
        self.index_path = self.path / INDEX_NAME

    def __repr__(self) -> str:
        return f"KeyStore({str(self.path)!r})"

    def key_path(self, thumbprint: str) -> Path:
        return self.path / f"{thumbprint}.pem"

    def exists(self) -> bool:
        return self.index_path.exists()

    def fingerprint(self) -> tuple[int, ...] | None:
        """Changes whenever the index is rewritten (inode, size, times); None when it is missing."""
        try:
            st = os.stat(self.index_path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    # --- reading ---

    def load(
        self,
        *,
        private: bool = True,
        unopened: dict[str, Exception] | None = None,
        lock_wait_s: float | None = None,
    ) -> StoreState:
        """Read and check the whole store (private keys of unrevoked keys too, with ``private``).

        ``unopened``: a key that cannot be opened is entered there (thumbprint -> the refusal) and has
        no private key, instead of refusing the whole store. ``lock_wait_s``: wait at most that long
        for a writer's lock (``store-busy`` after it), not for as long as the writer holds it."""
        with self._lock(exclusive=False, wait_s=lock_wait_s):
            return self._load(private=private, unopened=unopened)[0]

    def _load(
        self, *, private: bool, unopened: dict[str, Exception] | None = None
    ) -> tuple[StoreState, list[IndexEntry]]:
        entries, revocations = self._read_index()
        revoked = revocations.revoked
        records = tuple(e.record(revoked=e.thumbprint in revoked) for e in entries)
        publics = {e.thumbprint: PublicKey.from_raw(b64url_decode(e.x)) for e in entries}
        keys: dict[str, SigningKey] = {}
        for entry, record in zip(entries, records, strict=True):
            if not private or record.revoked:  # a revoked key's file is deleted; it never signs again
                continue
            try:
                if entry.pkcs11 is None:
                    keys[record.thumbprint] = self._read_private(record.thumbprint)
                elif self.tokens is not None:  # on a token: opened when it first signs
                    keys[record.thumbprint] = self.tokens(entry.pkcs11, publics[record.thumbprint])
            except (KeyStoreError, TokenError, ConfigError) as exc:  # the last two: a token entry this
                if unopened is None:  # process cannot open (no signing.pkcs11.module, no PIN)
                    raise
                unopened[record.thumbprint] = exc
        tokens = MappingProxyType({e.thumbprint: e.pkcs11 for e in entries if e.pkcs11 is not None})
        publics_view, keys_view = MappingProxyType(publics), MappingProxyType(keys)
        state = StoreState(self.agent, self.path, records, publics_view, revocations, keys_view, tokens)
        return state, entries

    def _refusal(self, exc: PrivateFileError, *, directory: bool) -> KeyStoreError:
        """The key store's words for a private file or folder that cannot be used."""
        path = exc.path
        if exc.reason == "missing":
            return KeyStoreError(
                "store-missing",
                path,
                f"no key store for agent {self.agent!r} (`signing-proxy run` creates one on first start; "
                f"`signing-proxy keys rotate --agent {self.agent}` adds a first key)",
            )
        if exc.reason == "wrong-kind":
            return KeyStoreError(
                "store-malformed", path, "is not a " + ("directory" if directory else "file")
            )
        if exc.reason == "too-open":
            want = PRIVATE_DIR_MODE if directory else PRIVATE_FILE_MODE
            return KeyStoreError(
                "store-permissions",
                path,
                f"mode is {exc.mode:04o}; the key store must be accessible by its owner "
                f"only (run: chmod {want:o} {path})",
            )
        operation = "read" if exc.reason == "denied" else exc.operation
        return KeyStoreError("store-unreadable", path, f"cannot {operation}: {exc.detail}")

    def _check_dir(self, path: Path) -> None:
        try:
            check_private_dir(path)
        except PrivateFileError as exc:
            raise self._refusal(exc, directory=True) from None

    def _read_index(self) -> tuple[list[IndexEntry], RevocationList]:
        if not self.path.exists() and not self.path.is_symlink():
            self._check_dir(self.path)  # names the store, not its parent
        self._check_dir(self.root)
        self._check_dir(self.path)
        try:
            data = read_private(self.index_path, max_bytes=MAX_INDEX_BYTES)
        except PrivateFileError as exc:
            raise self._refusal(exc, directory=False) from None
        if len(data) > MAX_INDEX_BYTES:
            raise KeyStoreError("store-malformed", self.index_path, f"larger than {MAX_INDEX_BYTES} bytes")
        try:
            return parse_index(data, self.agent)
        except (KeyFormatError, ValueError) as exc:
            detail = exc.detail if isinstance(exc, KeyFormatError) else str(exc)
            raise KeyStoreError("store-malformed", self.index_path, f"malformed index: {detail}") from None

    def _read_private(self, thumbprint: str) -> SigningKey:
        path = self.key_path(thumbprint)
        try:
            key = load_key_file(path)
        except KeyFileError as exc:
            raise KeyStoreError(exc.reason, path, str(exc).removeprefix(f"{path}: ")) from None
        if key.thumbprint != thumbprint:
            raise KeyStoreError(
                "key-file-mismatch",
                path,
                f"holds the key {key.thumbprint}, not the key {thumbprint} its name and the index say",
            )
        return key

    # --- changing ---

    def create(
        self,
        now: float,
        *,
        lifetime_s: int = DEFAULT_KEY_LIFETIME_S,
        key: SigningKey | None = None,
        created_at: int | None = None,
    ) -> KeyRecord:
        """Create the store with one key that signs from ``now`` for ``lifetime_s`` (a new key unless
        given); its window opens ``CLOCK_MARGIN_S`` earlier, for verifiers whose clock is behind."""
        _check_positive(lifetime_s, "lifetime")
        self._make_dirs()
        with self._lock(exclusive=True):
            if self.index_path.exists():
                raise KeyStoreError("store-exists", self.index_path, "the key store already exists")
            key = key or SigningKey.generate()
            start = math.floor(now)
            first = start if created_at is None else min(created_at, start)
            entry = IndexEntry.of(key, start - CLOCK_MARGIN_S, start + lifetime_s, first, start)
            self._write_key(key, overwrite=True)  # no index refers to a file a create cut short left
            self._write_index([entry], RevocationList(start))
            return entry.record()

    def rotate(
        self,
        now: float,
        *,
        grace_s: int = DEFAULT_GRACE_S,
        lifetime_s: int = DEFAULT_KEY_LIFETIME_S,
        activate_in_s: int = 0,
        force: bool = False,
        key: SigningKey | None = None,
    ) -> tuple[KeyRecord, tuple[KeyRecord, ...]]:
        """Publish a new key at once (its window opens ``CLOCK_MARGIN_S`` before ``now``) that signs
        from ``activate_in_s`` later for ``lifetime_s``; every key usable now ends at that activation
        + ``grace_s`` (never later than it was), so it signs until then and stays published for the grace.

        Refused (``rotation-pending``) while an earlier new key waits for its activation, and unless
        ``force`` when no key signing now stays valid until the activation. ``key``: that key (one
        on a token) instead of a new file key. Returns the new record and the moved records.
        """
        _check_positive(grace_s, "grace")
        _check_positive(lifetime_s, "lifetime")
        if isinstance(activate_in_s, bool) or not isinstance(activate_in_s, int) or activate_in_s < 0:
            raise ValueError("activate-in must be zero or a positive number of seconds")
        with self._lock(exclusive=True):
            state, entries = self._load(private=False)  # no key but the one signing until then is needed
            self._sweep(entries, state.revocations)
            pending = state.waiting_records(now)
            if pending:
                raise KeyStoreError(
                    "rotation-pending",
                    self.path,
                    f"key {pending[0].thumbprint} is already waiting to sign from "
                    f"{format_rfc3339(pending[0].activation)}; revoke it first or wait",
                )
            live = [r for r in state.records if not r.revoked and now < r.not_after]
            if len(live) >= MAX_DIRECTORY_KEYS or len(entries) >= MAX_STORE_KEYS:  # the index's bound too
                detail = f"{len(live)} keys are published, {len(entries)} kept; run `keys prune` first"
                raise KeyStoreError("too-many-keys", self.path, detail)
            start = math.floor(now)
            activation = start if activate_in_s == 0 else math.ceil(now) + activate_in_s
            cutoff = math.ceil(now) + activate_in_s + grace_s  # the activation's second + grace
            if not force and activation > start:
                signing = [r for r in state.records if r.usable_at(now) and r.activation <= now]
                if not any(r.not_after >= activation for r in signing):
                    raise KeyStoreError(
                        "no-valid-key",
                        self.path,
                        f"no key signing now stays valid until the new key activates at "
                        f"{format_rfc3339(activation)} (use a shorter --activate-in, or --force)",
                    )
                self._check_signing_file(state, entries, now)
            created = max([start, *(e.created_at + 1 for e in entries)])  # strictly newest
            key = key or SigningKey.generate()
            if state.record(key.thumbprint) is not None:
                raise KeyStoreError("key-exists", self.path, f"key {key.thumbprint} is already in the store")
            if key.thumbprint in state.revocations.revoked:  # pruned, still revoked: it would never sign
                raise KeyStoreError("key-revoked", self.path, f"key {key.thumbprint} was revoked")
            new = IndexEntry.of(key, start - CLOCK_MARGIN_S, activation + lifetime_s, created, activation)
            moved: list[KeyRecord] = []
            out: list[IndexEntry] = []
            for entry, record in zip(entries, state.records, strict=True):
                if record.usable_at(now) and entry.not_after > cutoff:
                    out.append(replace(entry, not_after=cutoff))
                    moved.append(replace(record, not_after=cutoff))
                else:
                    out.append(entry)
            out.append(new)
            self._write_key(key)
            self._write_index(out, state.revocations)
            return new.record(), tuple(moved)

    def revoke(self, thumbprint: str, now: float, *, force: bool = False) -> bool:
        """Add ``thumbprint`` to the revocation list (new ``as_of``) and delete its private key.

        Returns False when it was already revoked (nothing changes).
        """
        with self._lock(exclusive=True):
            state, entries = self._load(private=False)  # a broken key file never blocks a revocation
            self._sweep(entries, state.revocations)
            record = state.record(thumbprint)
            if record is None:
                raise KeyStoreError("unknown-key", self.path, f"agent {self.agent!r} has no key {thumbprint}")
            if record.revoked:  # a revoke cut short before its unlink: the private key goes now
                self.key_path(thumbprint).unlink(missing_ok=True)
                return False
            if len(state.revocations.revoked) >= MAX_REVOKED_THUMBPRINTS:
                raise KeyStoreError("too-many-revoked", self.path, "the revocation list is full")
            after = [replace(r, revoked=True) if r is record else r for r in state.records]
            self._refuse_no_valid_key(after, now, force, f"revoking {thumbprint}")
            revocations = RevocationList(
                max(math.floor(now), state.revocations.as_of), state.revocations.revoked | {thumbprint}
            )
            self._write_index(entries, revocations)
            self.key_path(thumbprint).unlink(missing_ok=True)
            return True

    def prune(self, now: float, *, force: bool = False) -> tuple[KeyRecord, ...]:
        """Drop keys past ``not_after`` and revoked keys (their thumbprints stay in the revocation list)."""
        with self._lock(exclusive=True):
            state, entries = self._load(private=False)  # dropping a key reads none
            self._sweep(entries, state.revocations)
            dropped = tuple(r for r in state.records if r.revoked or now >= r.not_after)
            if not dropped:
                return ()
            kept_records = [r for r in state.records if r not in dropped]
            self._refuse_no_valid_key(kept_records, now, force, "pruning")
            gone = {r.thumbprint for r in dropped}
            self._write_index([e for e in entries if e.thumbprint not in gone], state.revocations)
            for thumbprint in sorted(gone):
                self.key_path(thumbprint).unlink(missing_ok=True)
            return dropped

    def _check_signing_file(self, state: StoreState, entries: Sequence[IndexEntry], now: float) -> None:
        """Refuse a rotation that leaves signing until its activation to a key whose file is unusable."""
        chosen = state.signing_record(now)
        on_file = {e.thumbprint for e in entries if e.pkcs11 is None}
        if chosen is not None and chosen.thumbprint in on_file:
            try:
                self._read_private(chosen.thumbprint)
            except KeyStoreError as exc:
                hint = "it signs until the new key activates (rotate with --now, or --force)"
                raise KeyStoreError(exc.reason, exc.path, f"{exc.detail}; {hint}") from None

    def _refuse_no_valid_key(self, records: Sequence[KeyRecord], now: float, force: bool, what: str) -> None:
        if not force and choose_signing_key(records, now) is None:
            raise KeyStoreError(
                "no-valid-key",
                self.path,
                f"{what} would leave agent {self.agent!r} with no valid signing key "
                "(run `signing-proxy keys rotate` first, or pass --force)",
            )

    # --- files ---

    def _make_dirs(self) -> None:
        for directory in (self.data_dir, self.root, self.path):
            make_private_dir(directory)

    def _sweep(self, entries: Sequence[IndexEntry], revocations: RevocationList) -> None:
        """Delete what a writer cut short (killed, power lost) left in the store's folder: temporaries
        of the index and of key files, and key files of keys the index lists as revoked or not at all.
        Only under the exclusive lock (no writer is half-way), only regular files named as the store
        names its own (a symbolic link is left alone), only in this folder."""
        keep = {f"{e.thumbprint}.pem" for e in entries if e.thumbprint not in revocations.revoked}

        def doomed(name: str) -> bool:
            target = temporary_target(name)
            if target is not None:
                return target == INDEX_NAME or _is_key_file_name(target)
            return _is_key_file_name(name) and name not in keep

        for name in sweep(self.path, doomed):
            log.info("key store %s: deleted %s, left by a change cut short", self.path, name)

    @contextlib.contextmanager
    def _lock(self, *, exclusive: bool, wait_s: float | None = None) -> Iterator[None]:
        """An advisory lock on ``<store>/.lock``: exclusive to change, shared to read (when it exists)."""
        lock_path = self.path / LOCK_NAME
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(file_lock(lock_path, shared=not exclusive, wait_s=wait_s))
            except BlockingIOError:
                raise KeyStoreError(STORE_BUSY, self.path, "another process holds the store's lock") from None
            except FileNotFoundError:
                if exclusive:
                    raise KeyStoreError("store-missing", self.path, "the key store is missing") from None
                # a store written by hand, or on a read-only volume: read without the lock
            except OSError as exc:
                raise KeyStoreError("store-unreadable", lock_path, f"cannot open: {exc.strerror}") from None
            yield

    def _write_key(self, key: SigningKey, *, overwrite: bool = False) -> None:
        if not isinstance(key, TokenKey):  # a token key stays on its token: the index names it
            write_private_file(self.key_path(key.thumbprint), key.to_pem(), overwrite=overwrite)

    def _write_index(self, entries: Sequence[IndexEntry], revocations: RevocationList) -> None:
        data = render_index(self.agent, entries, revocations)
        write_private_file(self.index_path, data, overwrite=True)


def _is_key_file_name(name: str) -> bool:
    return name.endswith(".pem") and is_thumbprint(name.removesuffix(".pem"))


def _check_positive(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds")


def open_or_create(
    data_dir: Path,
    agent: str,
    now: float,
    *,
    lifetime_s: int = DEFAULT_KEY_LIFETIME_S,
) -> tuple[KeyStore, KeyRecord | None, Path | None]:
    """The agent's store, created on first use: with the legacy ``<data_dir>/agent-key.pem`` imported
    as its first key (agent ``default`` only; the file is left in place and no longer read), or with a
    new key. Returns the store, the record created (None if it existed) and the imported file."""
    store = KeyStore(data_dir, agent)
    if store.exists():
        return store, None, None
    legacy = Path(data_dir) / LEGACY_KEY_NAME
    key: SigningKey | None = None
    created_at: int | None = None
    if agent == DEFAULT_AGENT and legacy.exists():
        try:
            key = load_key_file(legacy)
        except KeyFileError as exc:
            raise KeyStoreError(exc.reason, legacy, str(exc).removeprefix(f"{legacy}: ")) from None
        created_at = math.floor(min(legacy.stat().st_mtime, now))
    try:
        record = store.create(now, lifetime_s=lifetime_s, key=key, created_at=created_at)
    except KeyStoreError as exc:
        if exc.reason == "store-exists":  # another process created it a moment ago: use theirs
            return store, None, None
        raise
    return store, record, legacy if key is not None else None
