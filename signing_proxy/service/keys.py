"""The running proxy's keys: the signing key provider, the publication listener, and the refresh
that re-reads the key stores off the event loop.

Requests read keys from memory only. While the services run, every ``RELOAD_CHECK_INTERVAL_S``
(and at once on ``reload()``, which ``run`` calls on SIGHUP) each store is re-read through
``asyncio.to_thread``, so no file is opened, locked or stat'ed on the loop. A re-read waits for a
`keys` command's lock at most ``storewatch.RELOAD_LOCK_WAIT_S`` and tries again at the next check:
``asyncio.run`` waits for that thread at exit, and one parked in ``flock`` held SIGTERM up for as
long as the other process kept the lock.

Refusals are package errors for the caller to print: ``ConfigError`` (the message starts with the
key path), ``KeyStoreError`` (names the store), ``OSError`` from binding ``publish.listen``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..config import Config
from ..core.keys import KeyProvider, StaticKeyProvider, format_rfc3339
from ..core.pkcs11_uri import is_pkcs11_uri
from ..errors import ConfigError, KeyFileError, KeyStoreError
from ..storage.keyfile import load_key_file
from ..storage.keystore import (
    RELOAD_CHECK_INTERVAL_S,
    KeyStore,
    StoreKeyProvider,
    StoreWatcher,
    open_or_create,
)
from ..storage.pkcs11 import Pkcs11KeyProvider
from ..storage.tokenstore import TokenStoreKeyProvider
from ..storage.worker import DaemonWorker
from .tokenkeys import token_keys_for, token_provider_for

if TYPE_CHECKING:
    from .publish import PublishServer

__all__ = ["EXPIRY_WARNING_S", "KeyServices", "file_key_provider", "key_provider_for", "start_key_services"]

log = logging.getLogger("signing_proxy")

EXPIRY_WARNING_S: Final = 7 * 86_400  # our choice: warn at start-up when the signing key ends this soon


class _NoKeys(KeyProvider):
    """The key provider of a process that never signs (mode gateway)."""

    def current(self, now: float) -> None:
        return None


def file_key_provider(path: str | Path) -> KeyProvider:
    """One key from a PEM or private JWK file (owner-only), always valid: ``signing.key``."""
    try:
        return StaticKeyProvider(load_key_file(Path(path).expanduser()))
    except KeyFileError as exc:
        # a mistyped pkcs11: URI ("pkcs11;...", "pkcs:...") is taken for a path: its PIN is not shown
        raise ConfigError(f"signing.key: {exc.shown()}") from None


def key_provider_for(config: Config) -> KeyProvider:
    """``signing.key`` set: that one key, always (no windows). Otherwise the agent's key store, created
    on first run (importing a legacy ``<data_dir>/agent-key.pem``), refreshed by ``KeyServices``.
    A gateway signs nothing: no key, no key store."""
    if config.mode == "gateway":
        return _NoKeys()
    if config.signing.key and is_pkcs11_uri(config.signing.key):
        return token_provider_for(config)
    if config.signing.key:
        return file_key_provider(config.signing.key)
    now = time.time()
    agent = config.signing.agent
    try:
        store, created, imported = open_or_create(
            config.data_path, agent, now, lifetime_s=config.signing.key_lifetime_s
        )
    except OSError as exc:
        reason = f"cannot create the key store: {exc.strerror or exc}"
        raise KeyStoreError("store-unwritable", config.data_path, reason) from None
    store.tokens = token_keys_for(config)  # entries naming a key on a PKCS#11 token
    provider = TokenStoreKeyProvider(store)
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
    _warn_about_expiry(provider, agent, now)
    return provider


def _warn_about_expiry(provider: StoreKeyProvider, agent: str, now: float) -> None:
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


@dataclass
class KeyServices:
    """What runs beside the proxy: the publication listener and the key stores' refresh."""

    publisher: PublishServer | None = None
    watchers: dict[str, StoreWatcher] = field(default_factory=dict)
    publish_addresses: list[tuple[str, int]] = field(default_factory=list)
    token_providers: list[Pkcs11KeyProvider | TokenStoreKeyProvider] = field(default_factory=list)
    # a daemon thread: a probe stuck in a hung token does not keep the process from exiting
    _prober: DaemonWorker = field(default_factory=lambda: DaemonWorker("token-probe"), init=False, repr=False)
    _probing: asyncio.Future[None] | None = field(default=None, init=False, repr=False)

    def _probe_tokens(self) -> None:
        for provider in self.token_providers:
            try:
                provider.probe()
            except Exception:  # keep probing: the next tick tries again
                log.exception("PKCS#11 token: probe failed")

    _refresh: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _forced: bool = field(default=False, init=False, repr=False)

    def reload(self) -> None:
        """Re-read every key store now, changed or not (off the loop); ``run`` calls this on SIGHUP."""
        log.info("SIGHUP: reloading the key store")
        self._forced = True
        self._wake.set()

    def start_refresh(self, interval_s: float = RELOAD_CHECK_INTERVAL_S) -> None:
        """Look at the stores every ``interval_s`` (re-reading a changed one) and on ``reload()``,
        until ``stop()``."""
        if (self.watchers or self.token_providers) and self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_loop(interval_s))

    async def _refresh_loop(self, interval_s: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)
            self._wake.clear()
            force, self._forced = self._forced, False
            if self.token_providers and (self._probing is None or self._probing.done()):
                # a failed token, tried again on a thread of its own: a hung token holds up no
                # reload, and a probe still running is not queued again
                self._probing = asyncio.get_running_loop().run_in_executor(self._prober, self._probe_tokens)
            for watcher in tuple(self.watchers.values()):
                try:
                    await asyncio.to_thread(watcher.reload, force=force)
                except Exception:  # keep refreshing: the keys loaded before keep serving
                    log.exception("key store %s: refresh failed", watcher.store.path)

    async def stop(self) -> None:
        """Stop the refresh, then the publication listener."""
        if self._refresh is not None:
            task, self._refresh = self._refresh, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._prober.shutdown(wait=False, cancel_futures=True)
        if self.publisher is not None:
            await self.publisher.stop()


async def start_key_services(config: Config, keys: KeyProvider, *, reuse_port: bool = False) -> KeyServices:
    """Start the publication listener when ``publish.listen`` is set (its addresses in
    ``publish_addresses``) and the refresh of every key store in use."""
    services = KeyServices()
    if isinstance(keys, StoreWatcher):
        services.watchers[config.signing.agent] = keys
    if isinstance(keys, Pkcs11KeyProvider | TokenStoreKeyProvider):
        services.token_providers.append(keys)
    if config.publish.listen is not None:
        if not isinstance(keys, StoreWatcher):  # config validation refuses signing.key with publish.listen
            raise ConfigError("publish.listen: publishing needs the key store; unset signing.key")
        for i, agent in enumerate(config.publish.agents):
            if agent not in services.watchers:
                try:
                    services.watchers[agent] = StoreWatcher(KeyStore(config.data_path, agent), private=False)
                except KeyStoreError as exc:
                    raise ConfigError(f"publish.agents[{i}]: {exc}") from None
        # aiohttp only in a process that publishes (service/admin_app.py says why)
        from .publish import PublishServer  # noqa: PLC0415

        services.publisher = PublishServer(config, services.watchers)
        services.publish_addresses = await services.publisher.start(reuse_port=reuse_port)
    services.start_refresh()
    return services
