"""The key-store half of the ``signing-proxy`` command: ``keys list|rotate|revoke|prune``, ``publish``,
and what ``run`` needs to sign from the store and serve the publication listener.

Every ``keys`` command takes ``--config``/``--data-dir`` and ``--agent NAME`` (default
``signing.agent``), and refuses to leave the agent with no valid key unless ``--force``. Times are
printed as RFC 3339 UTC; durations are read as ``30m``, ``48h``, ``90d`` or ``3600s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .. import __version__
from ..config.schema import Config, ConfigError
from ..core.errors import KeyFormatError
from ..core.keys import format_rfc3339
from ..errors import CliError
from .main import _add_config_flag, _load, load_signing_key

if TYPE_CHECKING:
    from ..core.keys import KeyProvider
    from ..service.publish import PublishServer
    from ..storage.keystore import KeyStore, StoreState, StoreWatcher

__all__ = [
    "KeyServices",
    "add_parsers",
    "key_provider_for",
    "parse_duration",
    "start_key_services",
]

log = logging.getLogger("signing_proxy")

_DURATION = re.compile(r"([0-9]{1,9})([smhd])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
MAX_DURATION_S: Final = 100 * 365 * 86_400  # our choice: windows stay far inside RFC 3339's range
EXPIRY_WARNING_S: Final = 7 * 86_400  # our choice: warn at start-up when the signing key ends this soon
DEFAULT_GRACE: Final = "48h"  # spec: Limits (rotation grace "typically 24 to 48 hours")


def parse_duration(text: str) -> int:
    """``30m``, ``48h``, ``90d``, ``3600s`` -> seconds (``0s`` is 0); anything else raises ValueError."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30m, 48h, 90d or 3600s")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than 100 years")
    return seconds


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- run: the signing key provider and the publication listener -------------------------------------


def key_provider_for(config: Config) -> KeyProvider:
    """``signing.key`` set: that one key, always (no windows). Otherwise the agent's key store, created
    on first run (importing a legacy ``<data_dir>/agent-key.pem``), re-read when it changes."""
    from ..core.keys import StaticKeyProvider
    from ..storage.keystore import KeyStoreError, StoreKeyProvider, open_or_create

    if config.signing.key:
        return StaticKeyProvider(load_signing_key(config))
    now = time.time()
    agent = config.signing.agent
    try:
        store, created, imported = open_or_create(
            config.data_path, agent, now, lifetime_s=config.signing.key_lifetime_s
        )
        provider = StoreKeyProvider(store)
    except KeyStoreError as exc:
        raise CliError(f"key store: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot create the key store in {config.data_path}: {exc.strerror or exc}") from None
    if created is not None and imported is not None:
        log.info(
            "imported the signing key %s from %s into the key store %s, valid until %s; "
            "that file is no longer read",
            created.thumbprint,
            imported,
            store.path,
            format_rfc3339(created.not_after),
        )
    elif created is not None:
        log.info(
            "generated a new signing key %s in the key store %s, valid until %s (first run)",
            created.thumbprint,
            store.path,
            format_rfc3339(created.not_after),
        )
    state = provider.state()
    chosen = state.signing_record(now)
    if chosen is None:
        log.warning(
            "agent %s has no valid signing key: requests get 503 until `signing-proxy keys rotate`", agent
        )
    elif chosen.not_after - now < EXPIRY_WARNING_S and not any(
        r.not_after > chosen.not_after and not r.revoked
        for r in state.records  # no successor yet
    ):
        log.warning(
            "signing key %s of agent %s ends at %s; run `signing-proxy keys rotate`",
            chosen.thumbprint,
            agent,
            format_rfc3339(chosen.not_after),
        )
    return provider


@dataclass
class KeyServices:
    """What ``run`` starts beside the proxy: the publication listener and the SIGHUP reload."""

    publisher: PublishServer | None = None
    watchers: dict[str, StoreWatcher] = field(default_factory=dict)
    _signal_installed: bool = False

    def reload(self) -> None:
        log.info("SIGHUP: reloading the key store")
        for watcher in self.watchers.values():
            watcher.reload()

    async def stop(self) -> None:
        if self._signal_installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal_installed = False
        if self.publisher is not None:
            await self.publisher.stop()


async def start_key_services(config: Config, keys: KeyProvider, *, reuse_port: bool = False) -> KeyServices:
    """Start the publication listener when ``publish.listen`` is set (printing its address) and reload
    the key stores on SIGHUP."""
    from ..service.publish import PublishServer
    from ..storage.keystore import KeyStore, KeyStoreError, StoreWatcher

    services = KeyServices()
    if isinstance(keys, StoreWatcher):
        services.watchers[config.signing.agent] = keys
    if config.publish.listen is not None:
        if not isinstance(keys, StoreWatcher):  # config validation refuses signing.key with publish.listen
            raise CliError("publish.listen: publishing needs the key store; unset signing.key")
        for i, agent in enumerate(config.publish.agents):
            if agent not in services.watchers:
                try:
                    services.watchers[agent] = StoreWatcher(KeyStore(config.data_path, agent), private=False)
                except KeyStoreError as exc:
                    raise CliError(f"publish.agents[{i}]: {exc}") from None
        services.publisher = PublishServer(config, services.watchers)
        try:
            addresses = await services.publisher.start(reuse_port=reuse_port)
        except OSError as exc:
            reason = exc.strerror or exc
            raise CliError(f"publish.listen: cannot bind {config.publish.listen}: {reason}") from None
        for host, port in addresses:
            shown = f"[{host}]" if ":" in host else host
            line = f"signing-proxy {__version__} publishing on http://{shown}:{port}"
            print(line, file=sys.stderr, flush=True)
    if services.watchers and sys.platform != "win32":
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, services.reload)
        services._signal_installed = True
    return services


# --- keys list | rotate | revoke | prune ------------------------------------------------------------


def _store(args: argparse.Namespace) -> tuple[Config, KeyStore]:
    from ..storage.keystore import KeyStore

    config = _load(args)
    agent = args.agent or config.signing.agent
    try:
        store = KeyStore(config.data_path, agent)
    except ValueError as exc:
        raise CliError(f"--agent: {exc}") from None
    if config.signing.key and agent == config.signing.agent:
        print(
            f"note: signing.key is set ({config.signing.key}); `signing-proxy run` signs with that file, "
            "not with this store",
            file=sys.stderr,
        )
    return config, store


def _fail(exc: Exception) -> CliError:
    return CliError(str(exc))


def _print_state(state: StoreState, now: float) -> None:
    print(f"agent {state.agent}: {state.path}")
    rows = [(r.thumbprint, state.state_of(r, now), r.not_before, r.not_after) for r in state.records]
    listed = {r.thumbprint for r in state.records}
    print(f"{'THUMBPRINT':<44} {'STATE':<9} {'NOT_BEFORE':<21} NOT_AFTER")
    for thumbprint, key_state, not_before, not_after in rows:
        print(f"{thumbprint:<44} {key_state:<9} {format_rfc3339(not_before):<21} {format_rfc3339(not_after)}")
    for thumbprint in sorted(state.revocations.revoked - listed):
        print(f"{thumbprint:<44} {'revoked':<9} {'-':<21} - (pruned)")
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
            }
            for r in state.records
        ],
        "signing": getattr(state.signing_record(now), "thumbprint", None),
        "revocations": {
            "as_of": format_rfc3339(state.revocations.as_of),
            "revoked": sorted(state.revocations.revoked),
        },
    }


def cmd_keys_list(args: argparse.Namespace) -> int:
    from ..storage.keystore import KeyStoreError

    _config, store = _store(args)
    now = time.time()
    try:
        state = store.load(private=False)
    except KeyStoreError as exc:
        raise _fail(exc) from None
    if args.json:
        print(json.dumps(_state_json(state, now), indent=2))
    else:
        _print_state(state, now)
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from ..storage.keystore import KeyStoreError, open_or_create

    config, store = _store(args)
    lifetime = args.lifetime if args.lifetime is not None else config.signing.key_lifetime_s
    now = time.time()
    try:
        store, created, imported = open_or_create(config.data_path, store.agent, now, lifetime_s=lifetime)
        if created is not None and imported is None:
            print(f"created the key store {store.path} with key {created.thumbprint}")
            print(f"  valid {format_rfc3339(created.not_before)} .. {format_rfc3339(created.not_after)}")
            return 0
        if imported is not None:
            print(f"imported {imported} into the key store {store.path}")
        new, moved = store.rotate(
            now, grace_s=args.grace, lifetime_s=lifetime, activate_in_s=args.activate_in, force=args.force
        )
    except (KeyStoreError, ValueError) as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise CliError(f"cannot write the key store {store.path}: {exc.strerror or exc}") from None
    when = "now" if args.activate_in == 0 else f"at {format_rfc3339(new.not_before)}"
    print(f"new key {new.thumbprint}: signs from {when}")
    print(f"  valid {format_rfc3339(new.not_before)} .. {format_rfc3339(new.not_after)}")
    for record in moved:
        print(f"key {record.thumbprint}: retiring, now ends at {format_rfc3339(record.not_after)}")
    print("a running proxy picks this up within a second (at once on SIGHUP); republish static files")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from ..storage.keystore import KeyStoreError

    _config, store = _store(args)
    try:
        changed = store.revoke(args.thumbprint, time.time(), force=args.force)
        state = store.load(private=False)
    except KeyStoreError as exc:
        raise _fail(exc) from None
    as_of = format_rfc3339(state.revocations.as_of)
    if not changed:
        print(f"{args.thumbprint} was already revoked (revocation list as_of {as_of})")
        return 0
    print(f"revoked {args.thumbprint}: it never signs again; its private key file is deleted")
    print(f"revocation list as_of {as_of}: {len(state.revocations.revoked)} revoked")
    if state.signing_record(time.time()) is None:
        print("no key is valid now: the proxy answers 503 no-valid-signing-key until `keys rotate`")
    return 0


def cmd_keys_prune(args: argparse.Namespace) -> int:
    from ..storage.keystore import KeyStoreError

    _config, store = _store(args)
    now = time.time()
    try:
        dropped = store.prune(now, force=args.force)
    except KeyStoreError as exc:
        raise _fail(exc) from None
    if not dropped:
        print("nothing to prune")
    for record in dropped:
        why = "revoked, stays in the revocation list" if record.revoked else "expired"
        print(f"pruned {record.thumbprint} ({why}, ended {format_rfc3339(record.not_after)})")
    return 0


# --- publish --out ---------------------------------------------------------------------------------


def _write_public_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cmd_publish(args: argparse.Namespace) -> int:
    from ..service.publish import publications, render_publication
    from ..storage.keystore import KeyStore, KeyStoreError

    config = _load(args)
    overrides = {}
    if args.domain:
        overrides["publish.domain"] = args.domain
    if args.public_url:
        overrides["publish.public_url"] = args.public_url
    try:
        config = config.with_overrides(**overrides) if overrides else config
        targets = publications(config)
    except (ConfigError, ValueError) as exc:
        raise CliError(f"configuration error: {exc}") from None
    now = time.time()
    files: dict[str, bytes] = {}
    valid_until: list[int] = []
    for publication in targets:
        try:
            state = KeyStore(config.data_path, publication.agent).load(private=False)
            files.update(render_publication(publication, state, now))
        except KeyStoreError as exc:
            raise _fail(exc) from None
        except KeyFormatError as exc:
            hint = "run `signing-proxy keys rotate`"
            raise CliError(f"agent {publication.agent}: {exc.detail}; {hint}") from None
        valid_until.append(max(r.not_after for r in state.records if r.valid_at(now) and not r.revoked))
    out = Path(args.out).expanduser()
    try:
        for path, body in files.items():
            _write_public_file(out / path.lstrip("/"), body)
            print(out / path.lstrip("/"))
    except OSError as exc:
        raise CliError(f"cannot write to {out}: {exc.strerror or exc}") from None
    print(
        f"serve the directory as application/jwk-set+json; valid until {format_rfc3339(min(valid_until))} "
        "at the latest: re-run after every `keys rotate`, `revoke` or `prune`",
        file=sys.stderr,
    )
    return 0


# --- parser ----------------------------------------------------------------------------------------


def _store_flags(parser: argparse.ArgumentParser) -> None:
    _add_config_flag(parser)
    parser.add_argument("--data-dir", metavar="DIR", help="data directory (default: from the config)")
    parser.add_argument("--agent", metavar="NAME", help="whose key store (default: signing.agent, 'default')")


def add_parsers(sub: Any, keys: Any) -> None:
    """Add ``keys list|rotate|revoke|prune`` to ``keys`` and ``publish`` to ``sub``."""
    listing = keys.add_parser(
        "list",
        help="list the key store: thumbprint, state, window",
        description="List the agent's keys (state active, next, retiring, revoked or expired; window "
        "[not_before, not_after) in RFC 3339 UTC) and the revocation list.",
    )
    _store_flags(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_keys_list)

    rotate = keys.add_parser(
        "rotate",
        help="add a new signing key; the old one retires after a grace period",
        description="Add a new key valid now (published beside the old one; signing moves to it). Every "
        "key valid now then ends at now + GRACE. On an empty store: create the first key.",
    )
    _store_flags(rotate)
    rotate.add_argument(
        "--grace",
        type=_duration,
        default=parse_duration(DEFAULT_GRACE),
        metavar="DURATION",
        help=f"how long the old key stays published and valid (default {DEFAULT_GRACE})",
    )
    rotate.add_argument(
        "--lifetime",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="the new key's window (default signing.key_lifetime_s, 90d)",
    )
    rotate.add_argument(
        "--activate-in",
        type=_duration,
        default=0,
        metavar="DURATION",
        help="publish the new key now but start signing with it this much later (e.g. the directory's "
        "max-age, so cached directories already hold it); default 0s",
    )
    rotate.add_argument("--force", action="store_true", help="allow leaving no valid key in between")
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

    publish = sub.add_parser(
        "publish",
        help="write the key directory, svc.json and revocation list as static files",
        description="Write .well-known/http-message-signatures-directory, .well-known/svc.json and the "
        "revocation list (and /agents/<name>/... for publish.agents) under DIR, byte-identical to what "
        "publish.listen serves, for any web server or CDN.",
    )
    _add_config_flag(publish)
    publish.add_argument("--data-dir", metavar="DIR", help="data directory (default: from the config)")
    publish.add_argument("--out", required=True, metavar="DIR", help="document root to write into")
    publish.add_argument("--domain", metavar="DOMAIN", help="the manifest's domain (default publish.domain)")
    publish.add_argument(
        "--public-url", metavar="URL", help="where the files will be served (default https://<domain>)"
    )
    publish.set_defaults(func=cmd_publish)
