"""What the operator hands ``signing-proxy delegate``: chains (``@FILE``, ``@-``), key files, the
holder (a key, a thumbprint, or the proxy's own key), the owner's JWK Set, times, scopes and caps.

Every refusal is a ``CliError`` naming the flag.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ..core.delegation import NUMERIC_DATE_MAX
from ..core.durations import parse_duration
from ..core.errors import KeyFormatError
from ..core.json_bounds import loads_strict
from ..core.jwk import PRIVATE_JWK_MEMBERS, PublicKey
from ..core.keys import (
    MAX_DIRECTORY_BYTES,
    MAX_DIRECTORY_KEYS,
    DirectoryKey,
    format_rfc3339,
    is_thumbprint,
    parse_directory_key,
    parse_rfc3339,
)
from ..core.pkcs11_uri import is_pkcs11_uri, mask_pin_value
from ..core.requester import parse_duration_s
from ..core.scopes import scope_segments
from ..errors import CliError, KeyFileError, KeyStoreError
from ..storage.keyfile import read_public_file
from ..storage.keystore import LEGACY_KEY_NAME, KeyStore
from .common import config_from, public_key_file, signing_key_file
from .tokenkeys import token_key_at

__all__ = [
    "MAX_CHAIN_FILE_BYTES",
    "caps_args",
    "expires_at",
    "holder_jkt",
    "now_arg",
    "print_notes",
    "proxy_holder_jkt",
    "read_chain",
    "read_owner_keys",
    "scopes_arg",
]

MAX_CHAIN_FILE_BYTES: Final = 256 * 1024


def read_chain(arg: str) -> str:
    """The chain itself, ``@FILE`` or ``@-`` (stdin), whitespace stripped."""
    if not arg.startswith("@"):
        return arg.strip()
    source = arg[1:]
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_CHAIN_FILE_BYTES + 1)
        else:
            with Path(source).expanduser().open("rb") as fh:
                data = fh.read(MAX_CHAIN_FILE_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read the chain from {source}: {exc.strerror or exc}") from None
    if len(data) > MAX_CHAIN_FILE_BYTES:
        raise CliError(f"{source}: larger than {MAX_CHAIN_FILE_BYTES} bytes; not a delegation chain")
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise CliError(f"{source}: not ASCII; a delegation chain is compact JWSs joined with ~") from None


def now_arg(args: argparse.Namespace) -> float:
    if getattr(args, "now", None) is None:
        return time.time()
    try:
        return float(parse_rfc3339(args.now, bounded=False))
    except KeyFormatError as exc:
        raise CliError(f"--now: {exc.detail}") from None


def expires_at(text: str, now: float) -> int:
    """``--expires``: a duration from now (``30d``, ``12h``; not ``0s``) or an RFC 3339 date-time,
    after ``now`` and no later than the last NumericDate once its offset is applied."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        try:
            exp = parse_rfc3339(text, bounded=False)  # its own words below
        except KeyFormatError:
            raise CliError(
                f"--expires: {text!r} is neither a duration (30m, 12h, 30d) nor RFC 3339"
            ) from None
    else:
        if seconds <= 0:  # an exp of now is already expired
            raise CliError(f"--expires: {text!r} is no time from now; a duration must be positive (12h, 30d)")
        exp = math.floor(now) + seconds
    if exp > NUMERIC_DATE_MAX:
        raise CliError(f"--expires: {text!r} is after 9999-12-31T23:59:59Z once its offset is applied")
    if exp <= now:
        raise CliError(f"--expires: {text!r} is not after now ({format_rfc3339(now)}); it would be expired")
    return exp


def scopes_arg(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    scopes = [s for value in values for s in value.split()]
    for scope in scopes:
        try:
            scope_segments(scope)
        except ValueError as exc:
            raise CliError(f"--scope {scope!r}: {exc}") from None
    return scopes


def proxy_holder_jkt(args: argparse.Namespace, now: float) -> tuple[str, list[str]]:
    """The thumbprint of the key the proxy signs with now, and notes for the operator (where it was
    found, a key about to take over).

    ``signing.key`` when set (a ``pkcs11:`` URI: the token's key, its public half read from the
    token with ``signing.pkcs11``'s module and PIN, as ``keys show --pkcs11`` does); otherwise the
    key store's current key (or the legacy ``<data_dir>/agent-key.pem`` a first run would import).
    Only public data is read from the store. No message shows a PIN.
    """
    config = config_from(argparse.Namespace(config=args.holder_config, data_dir=args.data_dir))
    if config.signing.key and is_pkcs11_uri(config.signing.key):
        token_key = token_key_at(config, config.signing.key, "signing.key")
        jkt = token_key.thumbprint
        return jkt, [f"holder: the proxy's signing key {jkt} (signing.key: {token_key.uri.describe()})"]
    if config.signing.key:
        shown = mask_pin_value(config.signing.key)  # a mistyped pkcs11: URI ("pkcs11;...") is a path here
        jkt = signing_key_file(config.signing.key, "signing.key").thumbprint  # its refusal masks a PIN
        return jkt, [f"holder: the proxy's signing key {jkt} (signing.key {shown})"]
    try:
        store = KeyStore(config.data_path, args.agent or config.signing.agent)
    except ValueError as exc:
        raise CliError(f"--agent: {exc}") from None
    if not store.exists():
        legacy = config.data_path / LEGACY_KEY_NAME
        if legacy.exists():
            jkt = signing_key_file(str(legacy), "legacy key").thumbprint
            return jkt, [f"holder: the proxy's signing key {jkt} ({legacy}, imported on its first run)"]
        raise CliError(
            f"the proxy has no key store at {store.path} yet: create its key first "
            "(signing-proxy keys rotate --config FILE, or run the proxy once)"
        )
    try:
        state = store.load(private=False)
    except KeyStoreError as exc:
        raise CliError(f"key store: {exc}") from None
    chosen = state.signing_record(now)
    if chosen is None:
        raise CliError(f"the key store {store.path} has no key valid now; run `signing-proxy keys rotate`")
    notes = [f"holder: the proxy's signing key {chosen.thumbprint} (key store {store.path})"]
    notes += [
        f"note: key {r.thumbprint} starts signing at {format_rfc3339(r.not_before)}; "
        "re-issue the delegation to it then"
        for r in state.records
        if r.not_before > now and not r.revoked
    ]
    return chosen.thumbprint, notes


def holder_jkt(args: argparse.Namespace, now: float, notes: list[str]) -> str:
    """``--holder-key`` / ``--holder-jkt`` / ``--holder-config`` (``--data-dir``): exactly one."""
    proxy = args.holder_config is not None or args.data_dir is not None
    given = sum((args.holder_key is not None, args.holder_jkt is not None, proxy))
    if given != 1:
        raise CliError(
            "name the holder once: --holder-key PATH, --holder-jkt THUMBPRINT, or the proxy's key with "
            "--holder-config FILE / --data-dir DIR"
        )
    if args.holder_jkt is not None:
        if not is_thumbprint(args.holder_jkt):
            raise CliError("--holder-jkt: an RFC 7638 SHA-256 thumbprint is 43 base64url characters")
        return str(args.holder_jkt)
    if args.holder_key is not None:
        return public_key_file(Path(args.holder_key).expanduser(), "--holder-key").thumbprint
    jkt, found = proxy_holder_jkt(args, now)
    notes.extend(found)
    return jkt


def print_notes(notes: list[str]) -> None:
    for note in notes:
        print(note, file=sys.stderr)


def read_owner_keys(path: Path, now: float, grace_s: int, notes: list[str]) -> list[PublicKey]:
    """The owner's JWK Set: keys whose window (plus grace after its end) covers now.

    Read as a served directory is (``core.keys.parse_directory_key``): a key's window is its
    ``not_before``/``not_after``, else the drafts' JWK ``nbf``/``exp``, else unbounded; the file is
    a regular file of at most ``MAX_DIRECTORY_BYTES`` and strict JSON (a member given twice is
    refused, never "last wins")."""
    try:
        data = read_public_file(path, max_bytes=MAX_DIRECTORY_BYTES, what="JWK Set")
    except KeyFileError as exc:  # a pkcs11: URI given for the file: its PIN is not shown
        raise CliError(f"--owner-jwks: {exc.shown()}") from None
    try:
        doc = loads_strict(data)
    except ValueError as exc:
        raise CliError(f"--owner-jwks: {path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise CliError(f'--owner-jwks: {path} must be a JWK Set, {{"keys": [...]}}')
    entries: list[object] = doc["keys"]
    if len(entries) > MAX_DIRECTORY_KEYS:
        raise CliError(
            f"--owner-jwks: {path}: {len(entries)} keys; at most {MAX_DIRECTORY_KEYS} are accepted"
        )
    for i, entry in enumerate(entries):  # a leaked private key refuses the file before any other fault
        if isinstance(entry, dict) and PRIVATE_JWK_MEMBERS.intersection(entry):
            raise CliError(f"--owner-jwks: keys[{i}] carries private key material")
    keys: list[PublicKey] = []
    seen: set[str] = set()
    outside = 0
    for i, entry in enumerate(entries):
        key = _owner_key(entry, i)
        if key.thumbprint in seen:
            raise CliError(f"--owner-jwks: keys[{i}]: key {key.thumbprint} appears twice")
        seen.add(key.thumbprint)
        if key.not_before <= now < key.not_after + grace_s:
            keys.append(key.public)
        else:
            outside += 1
    if outside:
        notes.append(f"note: {outside} owner key(s) outside their window at {format_rfc3339(now)}")
    return keys


def _owner_key(entry: object, i: int) -> DirectoryKey:
    if not isinstance(entry, dict):
        raise CliError(f"--owner-jwks: keys[{i}] is not a JSON object")
    if ("not_before" in entry) != ("not_after" in entry):
        raise CliError(f"--owner-jwks: keys[{i}]: set both not_before and not_after, or neither")
    try:
        return parse_directory_key(entry)
    except KeyFormatError as exc:
        raise CliError(f"--owner-jwks: keys[{i}]: {exc.detail or exc.reason}") from None


def caps_args(args: argparse.Namespace) -> tuple[int | None, int | None, int | None]:
    """``--max-spend-cents``, ``--max-accesses``, ``--quota-period`` (seconds); None when not given."""
    period = None
    if args.quota_period is not None:
        try:
            period = parse_duration_s(args.quota_period)
        except ValueError as exc:
            raise CliError(f"--quota-period: {exc}") from None
    for flag, value in (("--max-spend-cents", args.max_spend_cents), ("--max-accesses", args.max_accesses)):
        if value is not None and value < 0:
            raise CliError(f"{flag}: must not be negative")
    return args.max_spend_cents, args.max_accesses, period
