"""Key directories, key windows, the revocation list and the choice of our signing key (sans-IO).

A directory (spec "Key directory") is a JWK Set of Ed25519 keys, each valid in the half-open
window ``[not_before, not_after)`` and named only by its RFC 7638 thumbprint; a revocation list is a
thumbprint-only snapshot polled every 300 s +/- 10 % (spec "Key publication, rotation and
revocation", "Limits"). Parsers are strict and refuse the whole document on any fault, with a
stable ``KeyFormatError.reason`` (one exception, RFC 7517 section 5: a key in the drafts' form of a
type we do not implement is ignored); renderers emit deterministic bytes. Nothing here reads a clock:
``now`` is always a parameter in unix seconds. Our own keys over time (activation, states, the
choice of the signing key) live in ``rotation`` and are re-exported here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from .errors import KeyFormatError
from .jwk import PRIVATE_JWK_MEMBERS, PublicKey, SigningKey, public_key_from_jwk
from .rfc3339 import format_rfc3339, parse_rfc3339
from .rotation import KeyRecord, choose_signing_key, key_state, publishable

__all__ = [
    "DIRECTORY_MEDIA_TYPE",
    "DIRECTORY_PATH",
    "MAX_DIRECTORY_BYTES",
    "MAX_DIRECTORY_KEYS",
    "MAX_REVOCATION_LIST_BYTES",
    "MAX_REVOKED_THUMBPRINTS",
    "REVOCATION_LIST_MAX_AGE_S",
    "REVOCATION_LIST_MEDIA_TYPE",
    "REVOCATION_POLL_INTERVAL_S",
    "REVOCATION_POLL_JITTER",
    "Directory",
    "DirectoryKey",
    "KeyProvider",
    "KeyRecord",
    "RevocationList",
    "StaticKeyProvider",
    "choose_signing_key",
    "format_rfc3339",
    "is_thumbprint",
    "key_state",
    "merge_revocation_lists",
    "next_poll_delay",
    "parse_directory",
    "parse_directory_key",
    "parse_revocation_list",
    "parse_rfc3339",
    "publishable",
    "render_directory",
    "render_revocation_list",
]

DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"  # spec: Key directory
DIRECTORY_MEDIA_TYPE = "application/jwk-set+json"  # spec: Key directory (drafts differ, notes 6.4)
REVOCATION_LIST_MEDIA_TYPE = "application/json"  # our choice: the spec names no media type
REVOCATION_LIST_MAX_AGE_S = 60  # spec: Limits ("short or zero", example 60 s)
REVOCATION_POLL_INTERVAL_S = 300  # spec: Limits
REVOCATION_POLL_JITTER = 0.10  # spec: Limits (+/-10 %)
MAX_DIRECTORY_KEYS = 64  # our choice: the spec gives no limit (drafts: bound the key count)
MAX_DIRECTORY_BYTES = 64 * 1024  # our choice: the spec gives no body-size limit
MAX_REVOKED_THUMBPRINTS = 10_000  # our choice
MAX_REVOCATION_LIST_BYTES = 1024 * 1024  # our choice: 10 000 entries fit with room to spare
# Our choice: what a list may make the parser build beside its entries. A list is one object and one
# array of thumbprints; its other members are not shown (spec), so they are let through, but 4 MiB of
# ``[]`` or ``{}`` in one of them took 0.4 s to parse on the verifier's event loop (once per
# directory a stranger names, and again at every poll). Counted before parsing, in C.
MAX_LIST_CONTAINERS = 64  # ``{`` and ``[`` bytes, strings included (thumbprints and as_of hold none)
MAX_LIST_OTHER_VALUES = 256  # ``,`` bytes beyond one per entry

# 32 bytes in unpadded base64url: 42 characters, then one whose two low bits are zero (canonical
# form, as b64url_decode demands). A regex, not a decode: a 4 MiB revocation list names ~90,000.
_THUMBPRINT = re.compile(r"[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]")
# Many at once (a revocation list): one match over the lines, in C, instead of one call each.
_THUMBPRINT_LINES = re.compile(f"{_THUMBPRINT.pattern}(?:\n{_THUMBPRINT.pattern})*")
# RFC 8037 `EdDSA` (the spec's value), RFC 9864 `Ed25519` (its fully-specified successor) and the
# HTTP Signature Algorithms registry's `ed25519` (web-bot-auth drafts) all name Ed25519 here.
_ACCEPTED_ALGS = frozenset({"EdDSA", "Ed25519", "ed25519"})


# --------------------------------------------------------------------------------------------
# Strict JSON


def _load_json(body: bytes, max_bytes: int, reason: str, too_large: str, what: str) -> Any:
    """UTF-8 JSON with no duplicate member names, no NaN/Infinity, bounded in size."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise KeyFormatError(reason, f"{what} body must be bytes")
    if len(body) > max_bytes:
        raise KeyFormatError(too_large, f"{what} is larger than {max_bytes} bytes")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in items:
            if name in out:
                raise KeyFormatError(reason, f"{what} repeats member {name!r}")
            out[name] = value
        return out

    def no_constant(name: str) -> Any:
        raise KeyFormatError(reason, f"{what} contains {name}, which is not JSON")

    try:
        text = bytes(body).decode("utf-8")
        return json.loads(text, object_pairs_hook=pairs, parse_constant=no_constant)
    except KeyFormatError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise KeyFormatError(reason, f"{what} is not UTF-8 JSON") from exc


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _check_http_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and url.isascii()
        ok = ok and not any(ch.isspace() for ch in url)
    except ValueError:
        ok = False
    if not ok:
        raise KeyFormatError("bad-revocation-url", f"{url!r} is not an absolute http(s) URL")


def is_thumbprint(value: object) -> bool:
    """True for a canonical RFC 7638 SHA-256 thumbprint: 43 base64url characters naming 32 bytes."""
    return isinstance(value, str) and _THUMBPRINT.fullmatch(value) is not None


def all_thumbprints(values: Collection[object]) -> bool:
    """``all(is_thumbprint(v) for v in values)``, for thousands of values in one regex pass.

    The lines match only if each is a thumbprint; with exactly ``len(values)`` lines (the length
    says so: 43 characters and a separator each) no value hid a line break, so each line is a value.
    """
    if not values:
        return True
    try:
        text = "\n".join(cast("Collection[str]", values))  # TypeError: a value is not a string
    except TypeError:
        return False
    return len(text) == 44 * len(values) - 1 and _THUMBPRINT_LINES.fullmatch(text) is not None


# --------------------------------------------------------------------------------------------
# Directory


@dataclass(frozen=True)
class DirectoryKey:
    """One published key and its validity window ``[not_before, not_after)`` in unix seconds.

    ``drafts``: published in the web-bot-auth drafts' form, without the spec's ``not_before`` and
    ``not_after`` (the window is its ``nbf``/``exp`` NumericDates, else unbounded while listed): such
    a key verifies web-bot-auth labels only (``Directory.lookup(..., web=True)``)."""

    public: PublicKey
    not_before: int
    not_after: int
    drafts: bool = False

    def __post_init__(self) -> None:
        if not self.not_before < self.not_after:
            raise KeyFormatError("bad-key-window", "not_before must be earlier than not_after")

    @property
    def thumbprint(self) -> str:
        """The RFC 7638 thumbprint: the RFC 9421 ``keyid`` of this key."""
        return self.public.thumbprint

    def valid_at(self, now: float) -> bool:
        """Half-open window: valid from ``not_before`` inclusive, refused at and after ``not_after``."""
        return self.not_before <= now < self.not_after

    def jwk(self) -> dict[str, str]:
        """The spec's JsonWebKey, members in spec order; never a ``kid``, never a private member."""
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "use": "sig",
            "alg": "EdDSA",
            "x": self.public.jwk()["x"],
            "not_before": format_rfc3339(self.not_before),
            "not_after": format_rfc3339(self.not_after),
        }


@dataclass(frozen=True)
class Directory:
    """A parsed or to-be-served key directory; thumbprints are unique. ``keys`` are the spec's (with
    their windows); ``web_keys`` those published in the drafts' form (``DirectoryKey.drafts``, which
    decides: ``of`` sorts a list of both)."""

    keys: tuple[DirectoryKey, ...]
    revocation_url: str | None = None
    web_keys: tuple[DirectoryKey, ...] = ()
    _index: dict[str, DirectoryKey] = field(init=False, repr=False, compare=False)

    @classmethod
    def of(cls, keys: Iterable[DirectoryKey], revocation_url: str | None = None) -> Directory:
        """A directory of ``keys`` in either form, each where its ``drafts`` flag puts it."""
        listed = tuple(keys)
        spec = tuple(key for key in listed if not key.drafts)
        return cls(spec, revocation_url, tuple(key for key in listed if key.drafts))

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        object.__setattr__(self, "keys", keys)
        if any(key.drafts for key in keys) or not all(key.drafts for key in self.web_keys):
            raise ValueError("a key in the drafts' form goes in web_keys, and only such a key (Directory.of)")
        index: dict[str, DirectoryKey] = {}
        for key in (*keys, *self.web_keys):
            if key.thumbprint in index:
                raise KeyFormatError("duplicate-key", f"key {key.thumbprint} appears twice")
            index[key.thumbprint] = key
        object.__setattr__(self, "_index", index)
        if self.revocation_url is not None:
            _check_http_url(self.revocation_url)

    def lookup(self, keyid: str, *, web: bool = False) -> DirectoryKey | None:
        """The key with this thumbprint, whatever its window; one in the drafts' form only for a
        web-bot-auth label (``web``): the spec selects a key by its ``[not_before, not_after)``."""
        key = self._index.get(keyid)
        return key if key is not None and (web or not key.drafts) else None

    def find(self, keyid: str, now: float, *, revoked: Set[str] = frozenset()) -> DirectoryKey | None:
        """The key with this thumbprint only if its window covers ``now`` and it is not in ``revoked``."""
        key = self._index.get(keyid)
        if key is None or not key.valid_at(now) or keyid in revoked:
            return None
        return key

    def keys_valid_at(self, now: float) -> tuple[DirectoryKey, ...]:
        """Every key whose window covers ``now``, in directory order (spec "Projection" 3)."""
        return tuple(key for key in self.keys if key.valid_at(now))


def render_directory(directory: Directory, *, now: float | None = None, jose_alg: bool = True) -> bytes:
    """Compact JSON ``{"keys":[...],"revocation_url":...}``; keys in the directory's order.

    With ``now``, refuse to render a directory in which no key is valid (spec "Key lookup" 2).
    ``jose_alg=False`` (the drafts' media type) leaves out the spec's JOSE ``"alg": "EdDSA"``: the
    drafts restrict a directory key's ``alg`` to the HTTP Signature Algorithms registry
    (``ed25519``), and not written at all is the one form both accept (``alg`` is optional in a JWK,
    Cloudflare's verifier imports a key from ``kty``/``crv``/``x``, and WebCrypto's ``importKey``
    refuses a JWK whose ``alg`` is ``ed25519``).
    """
    if now is not None and not directory.keys_valid_at(now):
        raise KeyFormatError("no-valid-key", "at least one served key must be valid at serve time")
    jwks = [key.jwk() for key in directory.keys]
    if not jose_alg:
        jwks = [{member: value for member, value in jwk.items() if member != "alg"} for jwk in jwks]
    doc: dict[str, object] = {"keys": jwks}
    if directory.revocation_url is not None:
        doc["revocation_url"] = directory.revocation_url
    return _compact(doc)


def parse_directory_key(entry: object) -> DirectoryKey:
    """One JsonWebKey of a directory, checked strictly (see ``parse_directory``)."""
    if not isinstance(entry, Mapping):
        raise KeyFormatError("malformed-directory", "a key entry is a JSON object")
    leaked = PRIVATE_JWK_MEMBERS.intersection(entry)
    if leaked:
        raise KeyFormatError("private-member-in-directory", f"members {sorted(leaked)} are private")
    public = public_key_from_jwk(entry)
    use, alg = entry.get("use"), entry.get("alg")
    if use is not None and use != "sig":
        raise KeyFormatError("unsupported-key-use", f"use {use!r}; directory keys are for 'sig'")
    if alg is not None and (not isinstance(alg, str) or alg not in _ACCEPTED_ALGS):  # {} is unhashable
        raise KeyFormatError("unsupported-key-alg", f"alg {alg!r}; expected 'EdDSA'")
    if "kid" in entry and entry["kid"] != public.thumbprint:
        raise KeyFormatError("kid-mismatch", "a kid, when present, must equal the RFC 7638 thumbprint")
    if "not_before" not in entry and "not_after" not in entry:  # the drafts' form: nbf/exp, or none
        return DirectoryKey(public, _numeric_date(entry, "nbf", 0), _numeric_date(entry, "exp", 2**62), True)
    for member in ("not_before", "not_after"):
        if member not in entry:
            raise KeyFormatError("missing-key-window", f"member {member!r} is required")
    not_before = parse_rfc3339(entry["not_before"], round_up=True)
    not_after = parse_rfc3339(entry["not_after"])
    return DirectoryKey(public, not_before, not_after)


def _foreign_drafts_key(entry: object) -> bool:
    """A key in the drafts' form (no spec window) whose ``kty``/``crv`` we do not implement: ignored
    (RFC 7517 section 5; protocol-02 names RSA and EC keyids). The spec's form is Ed25519 only."""
    if not isinstance(entry, Mapping) or "not_before" in entry or "not_after" in entry:
        return False
    kty, crv = entry.get("kty"), entry.get("crv")
    return isinstance(kty, str) and (kty != "OKP" or (isinstance(crv, str) and crv != "Ed25519"))


def _numeric_date(entry: Mapping[str, object], member: str, absent: int) -> int:
    """A JWK's ``nbf``/``exp`` (RFC 7519 NumericDate: seconds; a fraction rounded inward)."""
    value = entry.get(member)
    if value is None:
        return absent
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**62:
        raise KeyFormatError("bad-key-window", f"{member} must be a NumericDate (seconds since 1970)")
    return math.ceil(value) if member == "nbf" else math.floor(value)


def parse_directory(
    body: bytes, *, max_keys: int = MAX_DIRECTORY_KEYS, max_bytes: int = MAX_DIRECTORY_BYTES
) -> Directory:
    """Parse a served directory strictly; any faulty entry refuses the whole document.

    Unknown members are tolerated; an empty ``keys`` array is accepted (it means "no key"). A key
    with neither ``not_before`` nor ``not_after`` is the web-bot-auth drafts' (``web_keys``: its
    window from ``nbf``/``exp`` when given); one with only one of them is refused. A drafts' key of
    another type (RSA, EC, OKP X25519...) is skipped, but counts against ``max_keys``.
    """
    doc = _load_json(body, max_bytes, "malformed-directory", "directory-too-large", "directory")
    if not isinstance(doc, dict):
        raise KeyFormatError("malformed-directory", "a directory is a JSON object")
    entries = doc.get("keys")
    if not isinstance(entries, list):
        raise KeyFormatError("malformed-directory", "member 'keys' (array) is required")
    if len(entries) > max_keys:
        raise KeyFormatError("too-many-keys", f"{len(entries)} keys; at most {max_keys} are accepted")
    # A leaked private key anywhere refuses the document before any other check can stop earlier.
    for i, entry in enumerate(entries):
        if isinstance(entry, Mapping) and PRIVATE_JWK_MEMBERS.intersection(entry):
            raise KeyFormatError("private-member-in-directory", f"keys[{i}] carries private key material")
    keys: list[DirectoryKey] = []
    for i, entry in enumerate(entries):
        if _foreign_drafts_key(entry):
            continue
        try:
            keys.append(parse_directory_key(entry))
        except KeyFormatError as exc:
            raise KeyFormatError(exc.reason, f"keys[{i}]: {exc.detail}") from exc
    url = doc.get("revocation_url")
    if url is not None and not isinstance(url, str):
        raise KeyFormatError("bad-revocation-url", "revocation_url must be a string")
    return Directory.of(keys, url or None)


# --------------------------------------------------------------------------------------------
# Revocation list


@dataclass(frozen=True)
class RevocationList:
    """A KeyRevocationList snapshot: the thumbprints revoked as of ``as_of`` (unix seconds)."""

    as_of: int
    revoked: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        revoked = frozenset(self.revoked)
        if not all_thumbprints(revoked):
            bad = min(t for t in revoked if not is_thumbprint(t))  # the first, sorted
            raise KeyFormatError("malformed-thumbprint", f"{bad!r} is not an RFC 7638 thumbprint")
        object.__setattr__(self, "revoked", revoked)

    def is_revoked(self, thumbprint: str) -> bool:
        return thumbprint in self.revoked


def render_revocation_list(rl: RevocationList) -> bytes:
    """Compact JSON ``{"as_of":RFC3339,"revoked":[sorted thumbprints]}``."""
    return _compact({"as_of": format_rfc3339(rl.as_of), "revoked": sorted(rl.revoked)})


def parse_revocation_list(
    body: bytes, *, max_entries: int = MAX_REVOKED_THUMBPRINTS, max_bytes: int = MAX_REVOCATION_LIST_BYTES
) -> RevocationList:
    """Parse a KeyRevocationList strictly: ``as_of`` required; every entry a canonical thumbprint."""
    reason = "malformed-revocation-list"
    if isinstance(body, bytes | bytearray) and len(body) <= max_bytes:
        _refuse_heavy_list(body, max_entries)
    doc = _load_json(body, max_bytes, reason, "revocation-list-too-large", "revocation list")
    if not isinstance(doc, dict):
        raise KeyFormatError(reason, "a revocation list is a JSON object")
    if "as_of" not in doc:
        raise KeyFormatError(reason, "member 'as_of' is required")
    as_of = parse_rfc3339(doc["as_of"])
    entries = doc.get("revoked", [])  # proto-JSON omits an empty repeated field
    if not isinstance(entries, list):
        raise KeyFormatError(reason, "member 'revoked' must be an array")
    if len(entries) > max_entries:
        raise KeyFormatError("revocation-list-too-large", f"more than {max_entries} revoked thumbprints")
    if not all_thumbprints(entries):
        i = next(i for i, entry in enumerate(entries) if not is_thumbprint(entry))
        raise KeyFormatError("malformed-thumbprint", f"revoked[{i}] is not an RFC 7638 thumbprint")
    return RevocationList(as_of, frozenset(entries))


def _refuse_heavy_list(body: bytes | bytearray, max_entries: int) -> None:
    """KeyFormatError ``revocation-list-too-large`` for a list whose parse would build far more than
    its entries need: more than ``MAX_LIST_CONTAINERS`` arrays and objects, or more commas than
    ``max_entries`` entries and ``MAX_LIST_OTHER_VALUES`` other values take."""
    if body.count(b"{") + body.count(b"[") > MAX_LIST_CONTAINERS:
        raise KeyFormatError(
            "revocation-list-too-large", f"more than {MAX_LIST_CONTAINERS} arrays and objects"
        )
    if body.count(b",") > max_entries + MAX_LIST_OTHER_VALUES:
        raise KeyFormatError(
            "revocation-list-too-large",
            f"more than {max_entries} revoked thumbprints and {MAX_LIST_OTHER_VALUES} other values",
        )


def merge_revocation_lists(current: RevocationList | None, fresh: RevocationList) -> RevocationList:
    """The set to hold after a poll: ``fresh`` replaces ``current`` but a revoked thumbprint stays
    revoked (spec "States and transitions"). A snapshot dated before ``current`` still revokes what it
    names (a list server whose clock or replica lags once must not void every later revocation);
    ``as_of`` is the later of the two."""
    if current is None:
        return fresh
    return RevocationList(max(fresh.as_of, current.as_of), fresh.revoked | current.revoked)


def next_poll_delay(rand: float) -> float:
    """Seconds until the next revocation poll: 300 s +/- 10 %, from a uniform ``rand`` in [0, 1)."""
    if not 0.0 <= rand < 1.0:
        raise ValueError("rand must be in [0, 1)")
    return REVOCATION_POLL_INTERVAL_S * (1.0 + REVOCATION_POLL_JITTER * (2.0 * rand - 1.0))


# --------------------------------------------------------------------------------------------
# Our own keys: where the signing key comes from (windows, activation, states: ``rotation``)


class KeyProvider:
    """Where the signing key comes from; ``current`` returns None when no key may sign now.

    ``blocking``: some key may wait on a device to sign (a PKCS#11 token): the proxy then signs off
    the event loop; False keeps signing in-line (file keys: the hot path).
    """

    blocking: bool = False

    def unavailable(self) -> str | None:
        """Why the keys cannot sign now although one is chosen (a failed token), or None."""
        return None

    def current(self, now: float) -> SigningKey | None:
        raise NotImplementedError

    def not_after(self, now: float) -> float | None:
        """When the key that signs now stops being valid (None: no window, or no key)."""
        return None

    def key_for(self, thumbprint: str, now: float) -> SigningKey | None:
        """Our key ``thumbprint`` if it may still sign at ``now``: published, in its window, not
        revoked (a delegation's holder, a transaction's key). By default only the current key."""
        key = self.current(now)
        return key if key is not None and key.thumbprint == thumbprint else None

    def not_after_of(self, thumbprint: str) -> float | None:
        """When our key ``thumbprint`` stops being valid (None: unknown, or no window)."""
        return None


class StaticKeyProvider(KeyProvider):
    """One key, always valid (the key store with windows and rotation replaces it when configured)."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key

    def current(self, now: float) -> SigningKey | None:
        return self.key

    def key_for(self, thumbprint: str, now: float) -> SigningKey | None:
        return self.key if thumbprint == self.key.thumbprint else None
