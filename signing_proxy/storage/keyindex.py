"""The key store's index file, ``keys.json``: its format, strict parsing and rendering (no file I/O),
and ``StoreState``, the view of a store loaded from it.

The index lists each key's thumbprint, public ``x`` and window, and the revocation list::

    {"format": "signing-proxy-keystore/1", "agent": "default",
     "keys": [{"thumbprint", "x", "not_before", "not_after", "created_at"[, "activates_at"]}, ...],
     "revocations": {"as_of": RFC 3339, "revoked": [thumbprint, ...]}}

``activates_at`` is written only for a key that signs later than its window opens (``keys rotate``
publishes first, signs later), so an index without a pending rotation reads as before. ``pkcs11``
(an RFC 7512 URI, never with a PIN) marks a key whose private half lives on a PKCS#11 token rather
than in ``<thumbprint>.pem``; the rest of the entry, and rotation, are the same for both kinds. Parsing
refuses duplicate members, unknown or missing members, a thumbprint that ``x`` does not hash to,
an empty window and an activation outside the window, with a ValueError (or KeyFormatError)
naming the member.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from ..core.b64 import b64url_decode
from ..core.errors import KeyFormatError
from ..core.json_bounds import loads_strict
from ..core.jwk import PublicKey, SigningKey
from ..core.keys import (
    Directory,
    DirectoryKey,
    KeyRecord,
    RevocationList,
    format_rfc3339,
    is_thumbprint,
    parse_rfc3339,
)
from ..core.pkcs11_uri import parse_pkcs11_uri
from ..core.rotation import KeyState, choose_signing_key, key_state, next_change, publishable
from .pkcs11 import TokenKey

__all__ = [
    "INDEX_FORMAT",
    "MAX_INDEX_BYTES",
    "MAX_STORE_KEYS",
    "IndexEntry",
    "StoreState",
    "parse_index",
    "render_index",
]

INDEX_FORMAT: Final = "signing-proxy-keystore/1"
MAX_INDEX_BYTES: Final = 4 * 1024 * 1024  # our choice: 10 000 revoked thumbprints fit easily
MAX_STORE_KEYS: Final = 1024  # our choice: keys the index may hold (expired ones included)

_ENTRY_MEMBERS = frozenset({"thumbprint", "x", "not_before", "not_after", "created_at"})
_OPTIONAL_ENTRY_MEMBERS = frozenset({"activates_at", "pkcs11"})
_INDEX_MEMBERS = frozenset({"format", "agent", "keys", "revocations"})


@dataclass(frozen=True)
class IndexEntry:
    """One key of the index: thumbprint, public ``x`` (base64url) and times in unix seconds
    (``activates_at``: when it may start signing; None: when its window opens)."""

    thumbprint: str
    x: str
    not_before: int
    not_after: int
    created_at: int
    activates_at: int | None = None
    pkcs11: str | None = None  # the token key's RFC 7512 URI; None: a key file beside the index

    @classmethod
    def of(
        cls,
        key: SigningKey,
        not_before: int,
        not_after: int,
        created_at: int,
        activates_at: int | None = None,
    ) -> IndexEntry:
        """The entry of ``key``: a token key (``TokenKey``) is named by its URI, a file key by nothing."""
        token = str(key.uri) if isinstance(key, TokenKey) else None
        x = key.public.jwk()["x"]
        return cls(key.thumbprint, x, not_before, not_after, created_at, activates_at, token)

    def record(self, *, revoked: bool = False) -> KeyRecord:
        return KeyRecord(
            self.thumbprint, self.not_before, self.not_after, self.created_at, revoked, self.activates_at
        )


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
    tokens: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # thumbprint -> URI

    def record(self, thumbprint: str) -> KeyRecord | None:
        return next((r for r in self.records if r.thumbprint == thumbprint), None)

    def signing_record(self, now: float) -> KeyRecord | None:
        """The key that signs at ``now`` (``rotation.choose_signing_key``), or None."""
        return choose_signing_key(self.records, now)

    def waiting_records(self, now: float) -> list[KeyRecord]:
        """The keys published to sign later, in index order: not revoked, not yet activated, still in
        their window (one may sign now all the same: revoking the signing key lets it sign at once)."""
        return [r for r in self.records if not r.revoked and now < r.activation and now < r.not_after]

    def signing_key(self, now: float) -> SigningKey | None:
        chosen = self.signing_record(now)
        return None if chosen is None else self.private.get(chosen.thumbprint)

    def state_of(self, record: KeyRecord, now: float) -> KeyState:
        """``published``, ``signing``, ``retiring``, ``expired`` or ``revoked``."""
        return key_state(record, self.records, now)

    def next_change(self, record: KeyRecord, now: float) -> tuple[int, KeyState] | None:
        """When ``record``'s state next changes, and to what (None: it never does by itself)."""
        return next_change(record, self.records, now)

    def keeping_revocations(self, before: StoreState) -> tuple[StoreState, frozenset[str]]:
        """This state with every key ``before`` revoked still revoked (its record, the list, no private
        key) and ``as_of`` never earlier than ``before``'s: an index put back from an older copy must not
        bring a revoked key back. Also returns the thumbprints this index no longer listed."""
        lost = before.revocations.revoked - self.revocations.revoked
        as_of = max(before.revocations.as_of, self.revocations.as_of)
        if not lost and as_of == self.revocations.as_of:
            return self, lost
        revoked = self.revocations.revoked | lost
        records = tuple(replace(r, revoked=True) if r.thumbprint in lost else r for r in self.records)
        private = MappingProxyType({t: k for t, k in self.private.items() if t not in revoked})
        kept = replace(self, records=records, revocations=RevocationList(as_of, revoked), private=private)
        return kept, lost

    def with_keys_of(
        self, before: StoreState, unopened: Collection[str]
    ) -> tuple[StoreState, frozenset[str]]:
        """This state with the private keys of ``unopened`` (keys this load could not open) taken from
        ``before`` where it held them: the same thumbprint is the same key, and this state's record
        (its window, its revocation) decides when it signs. Also returns the thumbprints taken."""
        taken = {
            t: before.private[t]
            for t in unopened
            if t in before.private and (record := self.record(t)) is not None and not record.revoked
        }
        if not taken:
            return self, frozenset()
        return replace(self, private=MappingProxyType({**self.private, **taken})), frozenset(taken)

    def directory(self, now: float, revocation_url: str | None) -> Directory:
        """The keys to publish at ``now``: unrevoked, unexpired (current and next ones)."""
        keys = tuple(
            DirectoryKey(self.publics[r.thumbprint], r.not_before, r.not_after)
            for r in publishable(self.records, now)
        )
        return Directory(keys, revocation_url)


def render_index(agent: str, entries: Sequence[IndexEntry], revocations: RevocationList) -> bytes:
    """The index document (keys ordered by window start), as ASCII JSON with a final newline."""
    ordered = sorted(entries, key=lambda e: (e.not_before, e.created_at, e.thumbprint))
    doc = {
        "format": INDEX_FORMAT,
        "agent": agent,
        "keys": [_render_entry(e) for e in ordered],
        "revocations": {
            "as_of": format_rfc3339(revocations.as_of),
            "revoked": sorted(revocations.revoked),
        },
    }
    return (json.dumps(doc, indent=2) + "\n").encode("ascii")


def _render_entry(entry: IndexEntry) -> dict[str, str]:
    doc = {
        "thumbprint": entry.thumbprint,
        "x": entry.x,
        "not_before": format_rfc3339(entry.not_before),
        "not_after": format_rfc3339(entry.not_after),
        "created_at": format_rfc3339(entry.created_at),
    }
    if entry.activates_at is not None and entry.activates_at > entry.not_before:
        doc["activates_at"] = format_rfc3339(entry.activates_at)
    if entry.pkcs11 is not None:
        doc["pkcs11"] = entry.pkcs11
    return doc


def _members(
    obj: object, required: frozenset[str], where: str, optional: frozenset[str] = frozenset()
) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object")
    missing, unknown = sorted(required - obj.keys()), sorted(obj.keys() - required - optional)
    if missing:
        raise ValueError(f"{where} lacks member {missing[0]!r}")
    if unknown:
        raise ValueError(f"{where} has unknown member {unknown[0]!r}")
    return obj


def _token_uri(value: object, i: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"keys[{i}].pkcs11 must be a PKCS#11 URI string")
    uri = parse_pkcs11_uri(value)  # KeyFormatError names what is wrong
    if uri.pin_value is not None:
        raise ValueError(f"keys[{i}].pkcs11 must not carry a pin-value (the index is no place for a PIN)")
    return value


def parse_index(data: bytes, agent: str) -> tuple[list[IndexEntry], RevocationList]:
    """``agent``'s index entries and revocation list; ValueError or KeyFormatError says what is wrong."""
    doc = _members(loads_strict(data), _INDEX_MEMBERS, "the index")
    if doc["format"] != INDEX_FORMAT:
        raise ValueError(f"format {doc['format']!r}; expected {INDEX_FORMAT!r}")
    if doc["agent"] != agent:
        raise ValueError(f"it belongs to agent {doc['agent']!r}, not {agent!r} (its directory)")
    raw_keys = doc["keys"]
    if not isinstance(raw_keys, list) or len(raw_keys) > MAX_STORE_KEYS:
        raise ValueError(f"'keys' must be an array of at most {MAX_STORE_KEYS} entries")
    entries: list[IndexEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_keys):
        item = _members(raw, _ENTRY_MEMBERS, f"keys[{i}]", _OPTIONAL_ENTRY_MEMBERS)
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
        activates_at = parse_rfc3339(item["activates_at"]) if "activates_at" in item else None
        if activates_at is not None and not not_before <= activates_at < not_after:
            raise ValueError(f"keys[{i}]: activates_at must lie in [not_before, not_after)")
        token = _token_uri(item["pkcs11"], i) if "pkcs11" in item else None
        entries.append(IndexEntry(thumbprint, x, not_before, not_after, created_at, activates_at, token))
    rev = _members(doc["revocations"], frozenset({"as_of", "revoked"}), "revocations")
    revoked = rev["revoked"]
    if not isinstance(revoked, list) or not all(isinstance(t, str) for t in revoked):
        raise ValueError("revocations.revoked must be an array of thumbprints")
    return entries, RevocationList(parse_rfc3339(rev["as_of"]), frozenset(revoked))
