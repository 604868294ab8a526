"""``signing-proxy keys generate|show|list|rotate|revoke|prune`` and ``signing-proxy publish``.

``generate`` and ``show`` work on a single key file. The store commands take ``--config``/``--data-dir``
and ``--agent NAME`` (default ``signing.agent``), and refuse to leave the agent with no valid key
unless ``--force``. ``rotate`` publishes first and signs later: the new key signs once every cached
copy of the directory holds it (``publish.directory_max_age_s`` + ``ROTATION_MARGIN_S``, or longer
while a copy the publication listener served, with its own max-age, may be cached: the store's
``served.json``), unless ``--activate-in`` or ``--now`` says otherwise; ``--grace`` is at least
``signing.validity_s`` + the running proxy's reload interval, so no signature the old key makes
outlives its window. Times are printed as RFC 3339 UTC; durations are read as ``30m``, ``48h``,
``90d`` or ``3600s``. ``publish --out`` is ``publish.py``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Final

from ..config import Config
from ..core.durations import parse_duration
from ..core.jwk import SigningKey
from ..core.keys import format_rfc3339
from ..core.pkcs11_uri import mask_pin_value
from ..core.rotation import ROTATION_MARGIN_S, KeyRecord, activation_delay, cache_wait, choose_signing_key
from ..errors import CliError, KeyFileError, KeyStoreError, StorageError
from ..storage.keyfile import load_key_file, write_private_file
from ..storage.keystore import RELOAD_CHECK_INTERVAL_S, KeyStore, StoreState, open_or_create
from ..storage.served import SERVED_NAME, read_served
from .common import add_config_flag, add_data_dir_flag, config_from, duration, store_refused
from .publish import add_publish_parser
from .tokenkeys import cmd_token_generate, cmd_token_show, token_key_for_store

__all__ = ["add_parsers"]

DEFAULT_GRACE: Final = "48h"  # spec: Limits (rotation grace "typically 24 to 48 hours")


# --- keys generate | show ---------------------------------------------------------------------------


def cmd_keys_generate(args: argparse.Namespace) -> int:
    if args.pkcs11 is not None:  # on a token: nothing is written here
        if args.out is not None:
            raise CliError("give either --out or --pkcs11")
        return cmd_token_generate(args)
    if args.out is None:
        raise CliError("--out PATH (a key file) or --pkcs11 URI (a key on a token) is required")
    path = Path(args.out).expanduser()
    if path.name in ("", "..") or path.is_dir():  # --force must not try to replace a folder
        raise CliError(f"--out {args.out!r} is a directory; name the key file, e.g. {path / 'key.pem'}")
    key = SigningKey.generate()
    data = json.dumps(key.to_jwk()).encode() + b"\n" if args.format == "jwk" else key.to_pem()
    try:
        write_private_file(path, data, overwrite=args.force)
    except FileExistsError:
        raise CliError(f"{path} exists; use --force to replace it") from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    _print_key(key, path)
    return 0


def cmd_keys_show(args: argparse.Namespace) -> int:
    if (args.pkcs11 is None) == (args.path is None):
        raise CliError("give a key file PATH or --pkcs11 URI")
    if args.pkcs11 is not None:
        return cmd_token_show(args)
    path = Path(args.path).expanduser()
    try:
        key = load_key_file(path)
    except KeyFileError as exc:  # a pkcs11: URI without --pkcs11 is taken for a path: its PIN not shown
        raise CliError(exc.shown()) from None
    _print_key(key, path)
    return 0


def _print_key(key: SigningKey, path: Path) -> None:
    print(f"thumbprint: {key.thumbprint}")
    print(f"file:       {path}")
    print(f"public jwk: {json.dumps(key.public.jwk())}")


# --- keys list | rotate | revoke | prune ------------------------------------------------------------


def _store(args: argparse.Namespace) -> tuple[Config, KeyStore]:
    config = config_from(args)
    agent = args.agent or config.signing.agent
    try:
        store = KeyStore(config.data_path, agent)
    except ValueError as exc:
        raise CliError(f"--agent: {exc}") from None
    if config.signing.key and agent == config.signing.agent:
        print(
            f"note: signing.key is set ({mask_pin_value(config.signing.key)}); `signing-proxy run` signs "
            "with that key, not with this store",
            file=sys.stderr,
        )
    return config, store


def _next(state: StoreState, record: KeyRecord, now: float) -> str:
    change = state.next_change(record, now)
    return "-" if change is None else f"{change[1]} at {format_rfc3339(change[0])}"


def _print_state(state: StoreState, now: float) -> None:
    print(f"agent {state.agent}: {state.path}")
    listed = {r.thumbprint for r in state.records}
    print(f"{'THUMBPRINT':<44} {'STATE':<9} {'NOT_BEFORE':<21} {'NOT_AFTER':<21} NEXT")
    for r in state.records:
        window = f"{format_rfc3339(r.not_before):<21} {format_rfc3339(r.not_after):<21}"
        token = state.tokens.get(r.thumbprint)
        where = "" if token is None else f" (on a token: {token})"  # the URI names no PIN
        print(f"{r.thumbprint:<44} {state.state_of(r, now):<9} {window} {_next(state, r, now)}{where}")
    for thumbprint in sorted(state.revocations.revoked - listed):
        print(f"{thumbprint:<44} {'revoked':<9} {'-':<21} {'-':<21} - (pruned)")
    revoked = len(state.revocations.revoked)
    print(f"revocation list as_of {format_rfc3339(state.revocations.as_of)}: {revoked} revoked")
    if state.signing_record(now) is None:
        print("no key is valid now: the proxy answers 503 no-valid-signing-key")


def _state_json(state: StoreState, now: float) -> dict[str, Any]:
    return {
        "agent": state.agent,
        "path": str(state.path),
        "keys": [
            {
                "thumbprint": r.thumbprint,
                "state": state.state_of(r, now),
                "not_before": format_rfc3339(r.not_before),
                "not_after": format_rfc3339(r.not_after),
                "created_at": format_rfc3339(r.created_at),
                "activates_at": format_rfc3339(r.activation),
                "next_change": _change_json(state, r, now),
                "pkcs11": state.tokens.get(r.thumbprint),  # None: a key file in the store
            }
            for r in state.records
        ],
        "signing": getattr(state.signing_record(now), "thumbprint", None),
        "revocations": {
            "as_of": format_rfc3339(state.revocations.as_of),
            "revoked": sorted(state.revocations.revoked),
        },
    }


def _change_json(state: StoreState, record: KeyRecord, now: float) -> dict[str, str] | None:
    change = state.next_change(record, now)
    return None if change is None else {"state": change[1], "at": format_rfc3339(change[0])}


def cmd_keys_list(args: argparse.Namespace) -> int:
    _config, store = _store(args)
    now = time.time()
    try:
        state = store.load(private=False)
    except KeyStoreError as exc:
        raise store_refused(exc) from None
    if args.json:
        print(json.dumps(_state_json(state, now), indent=2))
    else:
        _print_state(state, now)
    return 0


def _check_grace(grace_s: int, validity_s: int) -> None:
    """Refuse a grace shorter than ``signing.validity_s`` + the running proxy's reload interval.

    A rotation cuts the old key's window to the new key's activation + the grace, but a signature the
    old key made before the rotation, or before a running proxy reloaded the store (up to
    ``RELOAD_CHECK_INTERVAL_S`` later), says ``expires`` ``validity_s`` after it was made: a verifier
    holding the new directory refuses it once the window has closed (spec: "Verifiers MUST reject
    signatures whose key is outside its window"). With this floor the window outlasts every such
    signature, and each one the old key makes up to the activation keeps its full validity. Checked
    before anything is written (a store, a key on a token), ``--now`` included.
    """
    reload_s = math.ceil(RELOAD_CHECK_INTERVAL_S)
    least = validity_s + reload_s
    if grace_s < least:
        raise CliError(
            f"--grace {grace_s}s is shorter than signing.validity_s ({validity_s} seconds) plus the "
            f"{reload_s} s a running proxy takes to reload the key store: signatures the old key has made "
            f"would outlive its window and be refused; use --grace {least}s or longer (a compromised key: "
            "`keys revoke`)"
        )


def _served_until(store: KeyStore, max_age: int, now: float) -> tuple[int, int] | None:
    """Until when a copy of the directory the publication listener served may be cached, and its
    max-age (``served.json``). None when there is no record: a note says the configuration's max-age
    is waited for; an unusable record is ignored with a warning (it never blocks a rotation)."""
    try:
        record = read_served(store.path)
    except StorageError as exc:
        print(
            f"warning: ignoring {exc} ({exc.reason}): waiting for publish.directory_max_age_s",
            file=sys.stderr,
        )
        return None
    if record is None:
        print(
            f"note: no publication listener has recorded its max-age in {store.path / SERVED_NAME}: "
            f"waiting for publish.directory_max_age_s ({max_age} s) of this configuration",
            file=sys.stderr,
        )
        return None
    return record.latest(now)


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    config, store = _store(args)
    _check_grace(args.grace, config.signing.validity_s)
    lifetime = args.lifetime if args.lifetime is not None else config.signing.key_lifetime_s
    max_age = config.publish.directory_max_age_s
    token_key = token_key_for_store(config, args.pkcs11) if args.pkcs11 else None  # on a token
    now = time.time()  # after the token's key is made: the old key's window is cut from here
    try:
        if token_key is not None and not store.exists():
            first = store.create(now, lifetime_s=lifetime, key=token_key)
            print(
                f"created the key store {store.path} with key {first.thumbprint} (on the token): it signs now"
            )
            return 0
        store, created, imported = open_or_create(config.data_path, store.agent, now, lifetime_s=lifetime)
        if created is not None and imported is None:
            print(f"created the key store {store.path} with key {created.thumbprint}: it signs now")
            print(f"  valid {format_rfc3339(created.not_before)} .. {format_rfc3339(created.not_after)}")
            return 0
        if imported is not None:
            print(f"imported {imported} into the key store {store.path}")
        records = store.load(private=False).records
        signer = choose_signing_key(records, now)
        served = None if signer is None or args.now else _served_until(store, max_age, now)
        cached_until = None if served is None else served[0]
        delay = 0 if args.now else args.activate_in
        if delay is None:
            delay = activation_delay(records, now, max_age, cached_until=cached_until)
        new, moved = store.rotate(
            now, grace_s=args.grace, lifetime_s=lifetime, activate_in_s=delay, force=args.force, key=token_key
        )
    except (KeyStoreError, ValueError) as exc:
        raise store_refused(exc) from None
    except OSError as exc:
        raise CliError(f"cannot write the key store {store.path}: {exc.strerror or exc}") from None
    signs = "now" if new.activation <= now else f"from {format_rfc3339(new.activation)}"
    print(f"new key {new.thumbprint}: published now, signs {signs}")
    print(f"  valid {format_rfc3339(new.not_before)} .. {format_rfc3339(new.not_after)}")
    wait = cache_wait(max_age, now, cached_until)
    longer = ""  # the listener served a higher max-age than this configuration's: its copies count
    if served is not None and wait > max_age:
        longer = f"a copy served with max-age {served[1]} may be cached until {format_rfc3339(served[0])}"
        if args.activate_in is None:
            print(f"  {longer}, longer than publish.directory_max_age_s ({max_age} s): waiting for it")
    cut = {r.thumbprint: r for r in moved}
    if signer is not None:
        old = cut.get(signer.thumbprint, signer)
        until = format_rfc3339(min(new.activation, old.not_after))
        ends = f"{'now ends' if old.thumbprint in cut else 'ends'} at {format_rfc3339(old.not_after)}"
        print(f"key {old.thumbprint}: signs until {until}, then retiring; {ends}")
    for record in moved:
        if signer is None or record.thumbprint != signer.thumbprint:
            print(f"key {record.thumbprint}: retiring, now ends at {format_rfc3339(record.not_after)}")
    if signer is not None and delay < wait + ROTATION_MARGIN_S:
        print(
            f"warning: the new key signs before every cached copy of the directory can hold it "
            f"(publish.directory_max_age_s is {max_age} s{'; ' + longer if longer else ''}): verifiers "
            "that cached it refuse our requests until they re-fetch it",
            file=sys.stderr,
        )
    print("a running proxy picks this up within a second (at once on SIGHUP); republish static files")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    _config, store = _store(args)
    try:
        changed = store.revoke(args.thumbprint, time.time(), force=args.force)
        state = store.load(private=False)
    except KeyStoreError as exc:
        raise store_refused(exc) from None
    as_of = format_rfc3339(state.revocations.as_of)
    if not changed:
        print(f"{args.thumbprint} was already revoked (revocation list as_of {as_of})")
        return 0
    print(f"revoked {args.thumbprint}: it never signs again; its private key file is deleted")
    print(f"revocation list as_of {as_of}: {len(state.revocations.revoked)} revoked")
    now = time.time()
    signing = state.signing_record(now)
    if signing is None:
        print("no key is valid now: the proxy answers 503 no-valid-signing-key until `keys rotate`")
    elif signing.activation > now:
        print(
            f"key {signing.thumbprint} signs now, before its activation at "
            f"{format_rfc3339(signing.activation)}: verifiers holding an older copy of the directory "
            "refuse our requests until they re-fetch it"
        )
    return 0


def cmd_keys_prune(args: argparse.Namespace) -> int:
    _config, store = _store(args)
    now = time.time()
    try:
        dropped = store.prune(now, force=args.force)
    except KeyStoreError as exc:
        raise store_refused(exc) from None
    if not dropped:
        print("nothing to prune")
    for record in dropped:
        why = "revoked, stays in the revocation list" if record.revoked else "expired"
        print(f"pruned {record.thumbprint} ({why}, ended {format_rfc3339(record.not_after)})")
    return 0


# --- parser ----------------------------------------------------------------------------------------


def _store_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flag(parser)
    add_data_dir_flag(parser)
    parser.add_argument("--agent", metavar="NAME", help="whose key store (default: signing.agent, 'default')")


def add_parsers(sub: Any) -> None:
    """Add ``keys generate|show|list|rotate|revoke|prune`` and ``publish`` to the top-level subcommands."""
    keys = sub.add_parser("keys", help="signing keys").add_subparsers(dest="keys_command", metavar="ACTION")
    gen = keys.add_parser(
        "generate",
        help="generate an Ed25519 signing key",
        description="Generate an Ed25519 key, written owner-only (0600).",
    )
    gen.add_argument("--out", metavar="PATH", help="file to write")
    gen.add_argument(
        "--pkcs11",
        metavar="URI",
        help="create a non-extractable key pair on a PKCS#11 token instead (pkcs11:token=...;object=...)",
    )
    add_config_flag(gen)
    gen.add_argument(
        "--format", choices=("pem", "jwk"), default="pem", help="PKCS#8 PEM (default) or private JWK"
    )
    gen.add_argument("--force", action="store_true", help="replace an existing file")
    gen.set_defaults(func=cmd_keys_generate)
    show = keys.add_parser(
        "show",
        help="print a key's thumbprint and public JWK",
        description="Print the RFC 7638 thumbprint (the keyid) and the public JWK of a key file.",
    )
    show.add_argument("path", metavar="PATH", nargs="?", help="a key file: PKCS#8 PEM or private JWK (0600)")
    show.add_argument("--pkcs11", metavar="URI", help="a key pair on a PKCS#11 token instead of a file")
    add_config_flag(show)
    show.set_defaults(func=cmd_keys_show)

    listing = keys.add_parser(
        "list",
        help="list the key store: thumbprint, state, window, next change",
        description="List the agent's keys (state published, signing, retiring, expired or revoked; "
        "window [not_before, not_after) in RFC 3339 UTC; the next change of state and when) and the "
        "revocation list.",
    )
    _store_flags(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_keys_list)

    rotate = keys.add_parser(
        "rotate",
        help="add a new signing key: published now, signing once cached directories hold it",
        description="Add a new key, published at once beside the old one. It starts signing after "
        "publish.directory_max_age_s + 30 s, or longer while a copy the publication listener served "
        "with a higher max-age may be cached (so every verifier's cached directory holds it), or after "
        "--activate-in, or at once with --now; the old key signs until then and stays published for "
        "GRACE after it. On an empty store: create the first key (it signs at once).",
    )
    _store_flags(rotate)
    rotate.add_argument(
        "--grace",
        type=duration,
        default=parse_duration(DEFAULT_GRACE),
        metavar="DURATION",
        help=f"how long the old key stays published and valid after the new one activates "
        f"(default {DEFAULT_GRACE}; at least signing.validity_s + {math.ceil(RELOAD_CHECK_INTERVAL_S)}s, "
        "so that no signature it made outlives it)",
    )
    rotate.add_argument(
        "--lifetime",
        type=duration,
        default=None,
        metavar="DURATION",
        help="how long the new key signs from its activation (default signing.key_lifetime_s, 90d)",
    )
    rotate.add_argument(
        "--pkcs11",
        metavar="URI",
        help="the new key is on a PKCS#11 token (pkcs11:token=...;object=...): made there unless it "
        "exists; module and PIN from signing.pkcs11",
    )
    when = rotate.add_mutually_exclusive_group()
    when.add_argument(
        "--activate-in",
        type=duration,
        default=None,
        metavar="DURATION",
        help="start signing with the new key this much later (default publish.directory_max_age_s "
        "+ 30s, or the max-age the publication listener served if higher, capped at the end of the "
        "current key's window)",
    )
    when.add_argument(
        "--now",
        action="store_true",
        help="emergency: sign with the new key at once (verifiers that cached the directory refuse "
        "our requests until they re-fetch it)",
    )
    rotate.add_argument(
        "--force",
        action="store_true",
        help="allow --activate-in beyond the end of the current key (the new key then signs from that end)",
    )
    rotate.set_defaults(func=cmd_keys_rotate)

    revoke = keys.add_parser(
        "revoke",
        help="revoke a key: it never signs again and is listed in the revocation list",
        description="Add THUMBPRINT to the revocation list (with a new as_of) and delete its private key. "
        "A thumbprint may start with '-': write `keys revoke [options] -- THUMBPRINT`.",
    )
    _store_flags(revoke)
    revoke.add_argument(
        "thumbprint", metavar="THUMBPRINT", help="the key's thumbprint (one starting with '-' goes after --)"
    )
    revoke.add_argument("--force", action="store_true", help="allow revoking the last valid key")
    revoke.set_defaults(func=cmd_keys_revoke)

    prune = keys.add_parser(
        "prune",
        help="drop expired and revoked keys (revoked thumbprints stay in the revocation list)",
        description="Drop keys past not_after and revoked keys, with their private key files.",
    )
    _store_flags(prune)
    prune.add_argument("--force", action="store_true", help="prune even when no key is valid")
    prune.set_defaults(func=cmd_keys_prune)

    add_publish_parser(sub)
