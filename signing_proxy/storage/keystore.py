"""The key store: our Ed25519 signing keys, their windows and our revocation list, on disk.

One store per agent lives in ``<data_dir>/keys/<agent>/`` (``default`` when unnamed): a private
key per file named by its RFC 7638 thumbprint (``<thumbprint>.pem``, PKCS#8, mode 0600) and an
index ``keys.json`` (mode 0600) holding each key's public ``x`` and window ``[not_before,
not_after)`` and the revocation list (spec "Key directory", "Key publication, rotation and
revocation"). Both directories are 0700. Every write is atomic (temporary file, fsync, rename) and
every change holds an exclusive lock, so a reader sees either the old store or the new one. Loading
refuses a malformed index, a key file whose key does not match its name, and anything that group
or others can access, with a message naming the path.

``StoreKeyProvider`` signs with ``choose_signing_key`` evaluated at each call, so a key stops
signing the moment its window closes, and re-reads the store when its index changes (checked at
most once a second) or when ``reload()`` is called (the CLI calls it on SIGHUP).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from ..config.schema import AGENT_NAME_RE
from ..core.b64 import b64url_decode
from ..core.errors import KeyFormatError
from ..core.jwk import PublicKey, SigningKey
from ..core.keys import (
    MAX_DIRECTORY_KEYS,
    MAX_REVOKED_THUMBPRINTS,
    Directory,
    DirectoryKey,
    KeyProvider,
    KeyRecord,
    RevocationList,
    choose_signing_key,
    format_rfc3339,
    is_thumbprint,
    key_state,
    parse_rfc3339,
    publishable,
)
from ..errors import KeyStoreError
from .keyfile import KeyFileError, load_key_file, write_private_file

if sys.platform != "win32":
    import fcntl

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
INDEX_FORMAT: Final = "signing-proxy-keystore/1"
DEFAULT_AGENT: Final = "default"
DEFAULT_KEY_LIFETIME_S: Final = 90 * 86_400  # our choice: a key's window when none is given
DEFAULT_GRACE_S: Final = 48 * 3600  # spec: Limits ("typically 24 to 48 hours")
RELOAD_CHECK_INTERVAL_S: Final = 1.0  # our choice: how often a running proxy looks at the index
MAX_INDEX_BYTES: Final = 4 * 1024 * 1024  # our choice: 10 000 revoked thumbprints fit easily
MAX_STORE_KEYS: Final = 1024  # our choice: keys the index may hold (expired ones included)
DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
GROUP_OTHER_BITS: Final = 0o077

_ENTRY_MEMBERS = frozenset({"thumbprint", "x", "not_before", "not_after", "created_at"})
_INDEX_MEMBERS = frozenset({"format", "agent", "keys", "revocations"})


def check_agent_name(agent: str) -> str:
    """Return ``agent`` when it is a valid agent name (lower-case, a safe path and URL segment)."""
    if not isinstance(agent, str) or not AGENT_NAME_RE.fullmatch(agent):
        raise ValueError(f"agent name {agent!r}: use 1-63 of a-z 0-9 . _ - starting with a letter or digit")
    return agent


@dataclass(frozen=True)
class StoreState:
    """One consistent view of a store: records (``revoked`` from the revocation list), public keys,
    the revocation list, and the private keys of unrevoked keys when loaded with ``private``."""

    agent: str
    path: Path
    records: tuple[KeyRecord, ...]
    publics: Mapping[str, PublicKey]
    revocations: RevocationList
    private: Mapping[str, SigningKey] = field(default_factory=lambda: MappingProxyType({}))

    def record(self, thumbprint: str) -> KeyRecord | None:
        return next((r for r in self.records if r.thumbprint == thumbprint), None)

    def signing_record(self, now: float) -> KeyRecord | None:
        """The newest key valid at ``now`` and not revoked (DESIGN 4), or None."""
        return choose_signing_key(self.records, now)

    def signing_key(self, now: float) -> SigningKey | None:
        chosen = self.signing_record(now)
        return None if chosen is None else self.private.get(chosen.thumbprint)

    def state_of(self, record: KeyRecord, now: float) -> str:
        """``active``, ``next``, ``retiring``, ``revoked`` or ``expired``."""
        return key_state(record, self.records, now)

    def directory(self, now: float, revocation_url: str | None) -> Directory:
        """The keys to publish at ``now``: unrevoked, unexpired (current and next ones)."""
        keys = tuple(
            DirectoryKey(self.publics[r.thumbprint], r.not_before, r.not_after)
            for r in publishable(self.records, now)
        )
        return Directory(keys, revocation_url)


@dataclass(frozen=True)
class _Entry:
    thumbprint: str
    x: str
    not_before: int
    not_after: int
    created_at: int


class KeyStore:
    """The files of one agent's store; ``load`` reads them, the other methods change them atomically.

    Every method that changes the store takes ``now`` (unix seconds) and refuses, unless ``force``,
    to leave the store with no key valid at ``now``.
    """

    def __init__(self, data_dir: Path, agent: str = DEFAULT_AGENT) -> None:
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

    def load(self, *, private: bool = True) -> StoreState:
        """Read and check the whole store (private keys of unrevoked keys too, with ``private``)."""
        with self._lock(exclusive=False):
            return self._load(private=private)[0]

    def _load(self, *, private: bool) -> tuple[StoreState, list[_Entry]]:
        entries, revocations = self._read_index()
        revoked = revocations.revoked
        records = tuple(
            KeyRecord(e.thumbprint, e.not_before, e.not_after, e.created_at, e.thumbprint in revoked)
            for e in entries
        )
        publics = {e.thumbprint: PublicKey.from_raw(b64url_decode(e.x)) for e in entries}
        keys: dict[str, SigningKey] = {}
        if private:
            for record in records:
                if not record.revoked:  # a revoked key's file is deleted; it never signs again
                    keys[record.thumbprint] = self._read_private(record.thumbprint)
        state = StoreState(
            self.agent, self.path, records, MappingProxyType(publics), revocations, MappingProxyType(keys)
        )
        return state, entries

    def _check_owner_only(self, path: Path, *, directory: bool) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise KeyStoreError(
                "store-missing",
                path,
                f"no key store for agent {self.agent!r} (`signing-proxy run` creates one on first start; "
                f"`signing-proxy keys rotate --agent {self.agent}` adds a first key)",
            ) from None
        except OSError as exc:
            raise KeyStoreError("store-unreadable", path, f"cannot stat: {exc.strerror}") from None
        kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
        if not kind_ok:
            raise KeyStoreError("store-malformed", path, "is not a " + ("directory" if directory else "file"))
        if st.st_mode & GROUP_OTHER_BITS:
            want = DIR_MODE if directory else FILE_MODE
            raise KeyStoreError(
                "store-permissions",
                path,
                f"mode is {stat.S_IMODE(st.st_mode):04o}; the key store must be accessible by its owner "
                f"only (run: chmod {want:o} {path})",
            )

    def _read_index(self) -> tuple[list[_Entry], RevocationList]:
        if not self.path.exists() and not self.path.is_symlink():
            self._check_owner_only(self.path, directory=True)  # names the store, not its parent
        self._check_owner_only(self.root, directory=True)
        self._check_owner_only(self.path, directory=True)
        self._check_owner_only(self.index_path, directory=False)
        try:
            with open(self.index_path, "rb") as fh:
                data = fh.read(MAX_INDEX_BYTES + 1)
        except OSError as exc:
            raise KeyStoreError("store-unreadable", self.index_path, f"cannot read: {exc.strerror}") from None
        if len(data) > MAX_INDEX_BYTES:
            raise KeyStoreError("store-malformed", self.index_path, f"larger than {MAX_INDEX_BYTES} bytes")
        try:
            return _parse_index(data, self.agent)
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
        """Create the store with one key valid from ``now`` for ``lifetime_s`` (a new key unless given)."""
        _check_positive(lifetime_s, "lifetime")
        self._make_dirs()
        with self._lock(exclusive=True):
            if self.index_path.exists():
                raise KeyStoreError("store-exists", self.index_path, "the key store already exists")
            key = key or SigningKey.generate()
            start = math.floor(now)
            entry = _Entry(
                key.thumbprint,
                key.public.jwk()["x"],
                start,
                start + lifetime_s,
                start if created_at is None else min(created_at, start),
            )
            self._write_key(key)
            self._write_index([entry], RevocationList(start))
            return KeyRecord(entry.thumbprint, entry.not_before, entry.not_after, entry.created_at)

    def rotate(
        self,
        now: float,
        *,
        grace_s: int = DEFAULT_GRACE_S,
        lifetime_s: int = DEFAULT_KEY_LIFETIME_S,
        activate_in_s: int = 0,
        force: bool = False,
    ) -> tuple[KeyRecord, tuple[KeyRecord, ...]]:
        """Add a new key valid from now (or ``activate_in_s`` later) for ``lifetime_s``; every key valid
        now ends at the new key's start + ``grace_s`` (never later than it already did).

        Returns the new record and the records whose ``not_after`` moved.
        """
        _check_positive(grace_s, "grace")
        _check_positive(lifetime_s, "lifetime")
        if isinstance(activate_in_s, bool) or not isinstance(activate_in_s, int) or activate_in_s < 0:
            raise ValueError("activate-in must be zero or a positive number of seconds")
        with self._lock(exclusive=True):
            state, entries = self._load(private=True)
            pending = [r for r in state.records if not r.revoked and r.not_before > now]
            if pending:
                raise KeyStoreError(
                    "rotation-pending",
                    self.path,
                    f"key {pending[0].thumbprint} is already waiting to become active at "
                    f"{format_rfc3339(pending[0].not_before)}; revoke it first or wait",
                )
            live = [r for r in state.records if not r.revoked and now < r.not_after]
            if len(live) >= MAX_DIRECTORY_KEYS:
                raise KeyStoreError(
                    "too-many-keys", self.path, f"{len(live)} keys are published; run `keys prune` first"
                )
            start = math.floor(now) if activate_in_s == 0 else math.ceil(now) + activate_in_s
            cutoff = math.ceil(now) + activate_in_s + grace_s
            created = max([math.floor(now), *(e.created_at + 1 for e in entries)])  # strictly newest
            key = SigningKey.generate()
            new = _Entry(key.thumbprint, key.public.jwk()["x"], start, start + lifetime_s, created)
            moved: list[KeyRecord] = []
            out: list[_Entry] = []
            for entry, record in zip(entries, state.records, strict=True):
                if record.valid_at(now) and not record.revoked and entry.not_after > cutoff:
                    out.append(replace(entry, not_after=cutoff))
                    moved.append(replace(record, not_after=cutoff))
                else:
                    out.append(entry)
            out.append(new)
            if not force and activate_in_s:
                bridging = [r for r in state.records if r.valid_at(now) and not r.revoked]
                if not any(r.not_after >= start for r in bridging):
                    raise KeyStoreError(
                        "no-valid-key",
                        self.path,
                        f"no key stays valid until the new key starts at {format_rfc3339(start)} "
                        "(use a shorter --activate-in, or --force)",
                    )
            self._write_key(key)
            self._write_index(out, state.revocations)
            return KeyRecord(new.thumbprint, new.not_before, new.not_after, new.created_at), tuple(moved)

    def revoke(self, thumbprint: str, now: float, *, force: bool = False) -> bool:
        """Add ``thumbprint`` to the revocation list (new ``as_of``) and delete its private key.

        Returns False when it was already revoked (nothing changes).
        """
        with self._lock(exclusive=True):
            state, entries = self._load(private=True)
            record = state.record(thumbprint)
            if record is None:
                raise KeyStoreError("unknown-key", self.path, f"agent {self.agent!r} has no key {thumbprint}")
            if record.revoked:
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
            state, entries = self._load(private=True)
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
        self.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        for directory in (self.root, self.path):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, DIR_MODE)

    @contextlib.contextmanager
    def _lock(self, *, exclusive: bool) -> Iterator[None]:
        """An advisory lock on ``<store>/.lock``: exclusive to change, shared to read (when it exists)."""
        if sys.platform == "win32":
            yield
            return
        lock_path = self.path / LOCK_NAME
        try:
            if exclusive:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            else:
                fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if exclusive:
                raise KeyStoreError("store-missing", self.path, "the key store is missing") from None
            yield  # a store written by hand, or on a read-only volume: read without the lock
            return
        except OSError as exc:
            raise KeyStoreError("store-unreadable", lock_path, f"cannot open: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write_key(self, key: SigningKey) -> None:
        write_private_file(self.key_path(key.thumbprint), key.to_pem())

    def _write_index(self, entries: Sequence[_Entry], revocations: RevocationList) -> None:
        ordered = sorted(entries, key=lambda e: (e.not_before, e.created_at, e.thumbprint))
        doc = {
            "format": INDEX_FORMAT,
            "agent": self.agent,
            "keys": [
                {
                    "thumbprint": e.thumbprint,
                    "x": e.x,
                    "not_before": format_rfc3339(e.not_before),
                    "not_after": format_rfc3339(e.not_after),
                    "created_at": format_rfc3339(e.created_at),
                }
                for e in ordered
            ],
            "revocations": {
                "as_of": format_rfc3339(revocations.as_of),
                "revoked": sorted(revocations.revoked),
            },
        }
        data = (json.dumps(doc, indent=2) + "\n").encode("ascii")
        write_private_file(self.index_path, data, overwrite=True)


def _check_positive(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds")


def _strict_json(data: bytes) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in items:
            if name in out:
                raise ValueError(f"member {name!r} appears twice")
            out[name] = value
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_constant=no_constant)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno})") from None


def _members(obj: object, required: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object")
    missing, unknown = sorted(required - obj.keys()), sorted(obj.keys() - required)
    if missing:
        raise ValueError(f"{where} lacks member {missing[0]!r}")
    if unknown:
        raise ValueError(f"{where} has unknown member {unknown[0]!r}")
    return obj


def _parse_index(data: bytes, agent: str) -> tuple[list[_Entry], RevocationList]:
    doc = _members(_strict_json(data), _INDEX_MEMBERS, "the index")
    if doc["format"] != INDEX_FORMAT:
        raise ValueError(f"format {doc['format']!r}; expected {INDEX_FORMAT!r}")
    if doc["agent"] != agent:
        raise ValueError(f"it belongs to agent {doc['agent']!r}, not {agent!r} (its directory)")
    raw_keys = doc["keys"]
    if not isinstance(raw_keys, list) or len(raw_keys) > MAX_STORE_KEYS:
        raise ValueError(f"'keys' must be an array of at most {MAX_STORE_KEYS} entries")
    entries: list[_Entry] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_keys):
        item = _members(raw, _ENTRY_MEMBERS, f"keys[{i}]")
        thumbprint, x = item["thumbprint"], item["x"]
        if not is_thumbprint(thumbprint):
            raise ValueError(f"keys[{i}].thumbprint is not an RFC 7638 thumbprint")
        if thumbprint in seen:
            raise ValueError(f"keys[{i}]: key {thumbprint} is listed twice")
        seen.add(thumbprint)
        try:
            public = PublicKey.from_raw(b64url_decode(x)) if isinstance(x, str) else None
        except (ValueError, KeyFormatError):
            public = None
        if public is None:
            raise ValueError(f"keys[{i}].x is not a base64url Ed25519 public key")
        if public.thumbprint != thumbprint:
            raise ValueError(f"keys[{i}]: x does not hash to the thumbprint {thumbprint}")
        not_before = parse_rfc3339(item["not_before"])
        not_after = parse_rfc3339(item["not_after"])
        created_at = parse_rfc3339(item["created_at"])
        if not not_before < not_after:
            raise ValueError(f"keys[{i}]: not_before must be earlier than not_after")
        entries.append(_Entry(thumbprint, x, not_before, not_after, created_at))
    rev = _members(doc["revocations"], frozenset({"as_of", "revoked"}), "revocations")
    revoked = rev["revoked"]
    if not isinstance(revoked, list) or not all(isinstance(t, str) for t in revoked):
        raise ValueError("revocations.revoked must be an array of thumbprints")
    return entries, RevocationList(parse_rfc3339(rev["as_of"]), frozenset(revoked))


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


class StoreWatcher:
    """A store loaded once and re-read when its index changes (looked at no more than once per
    ``check_interval_s``) or on ``reload()``. A store that turns bad is reported and the last good
    state is kept."""

    def __init__(
        self,
        store: KeyStore,
        *,
        private: bool,
        check_interval_s: float = RELOAD_CHECK_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._private = private
        self._interval = check_interval_s
        self._monotonic = monotonic
        self._seen = store.fingerprint()
        self._state = store.load(private=private)  # a bad store at start-up is refused
        self._next_check = monotonic() + check_interval_s
        self._reported: tuple[int, ...] | None = None

    def state(self) -> StoreState:
        """The current state, re-read first when the index changed since the last look."""
        now = self._monotonic()
        if now >= self._next_check:
            self._next_check = now + self._interval
            if self.store.fingerprint() != self._seen:
                self.reload()
        return self._state

    def reload(self) -> bool:
        """Re-read the store now; False (and the previous state kept) when it cannot be loaded."""
        seen = self.store.fingerprint()
        try:
            state = self.store.load(private=self._private)
        except KeyStoreError as exc:
            if seen != self._reported:  # once per version of the index, not once per second
                self._reported = seen
                log.error("key store not reloaded, keeping the keys loaded before: %s", exc)
            return False
        before = self._state
        self._state, self._seen = state, seen
        if before.records != state.records or before.revocations != state.revocations:
            log.info(
                "reloaded key store %s (agent %s): %d keys, %d revoked",
                state.path,
                state.agent,
                len(state.records),
                len(state.revocations.revoked),
            )
        else:
            log.info("reloaded key store %s (agent %s): unchanged", state.path, state.agent)
        return True


class StoreKeyProvider(StoreWatcher, KeyProvider):
    """Signs with the store's newest key valid at the moment of each call, never outside its window."""

    def __init__(
        self,
        store: KeyStore,
        *,
        check_interval_s: float = RELOAD_CHECK_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, private=True, check_interval_s=check_interval_s, monotonic=monotonic)

    def current(self, now: float) -> SigningKey | None:
        return self.state().signing_key(now)

    def not_after(self, now: float) -> float | None:
        chosen = self.state().signing_record(now)
        return None if chosen is None else float(chosen.not_after)
