"""``service.keys``: the signing key provider ``run`` builds, and the key stores' refresh off the
event loop (periodic for a changed store, forced on SIGHUP, stopped with the services)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.errors import ConfigError, KeyStoreError
from signing_proxy.service.keys import KeyServices, key_provider_for, start_key_services
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider, StoreWatcher
from tests.harness import until


def config(tmp_path: Path, **raw: object) -> Config:
    return parse_config({"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), **raw})


def test_signing_key_set_gives_that_key(tmp_path: Path) -> None:
    key = SigningKey.generate()
    path = tmp_path / "key.pem"
    path.write_bytes(key.to_pem())
    path.chmod(0o600)
    provider = key_provider_for(config(tmp_path, signing={"key": str(path)}))
    assert isinstance(provider, StaticKeyProvider)
    current = provider.current(time.time())
    assert current is not None
    assert current.thumbprint == key.thumbprint


def test_an_unusable_signing_key_is_refused_with_its_key_path(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    path.write_bytes(SigningKey.generate().to_pem())
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^signing\.key: .*key\.pem: .*owner only"):
        key_provider_for(config(tmp_path, signing={"key": str(path)}))


@pytest.mark.parametrize("scheme", ["pkcs11;", "pkcs:", "pkcs11//"])
def test_a_mistyped_pkcs11_uri_is_refused_as_a_key_path_without_its_pin(tmp_path: Path, scheme: str) -> None:
    """Not ``pkcs11:``, the value is a key file's path, and the refusal named the path: with the PIN."""
    key = f"{scheme}token=t;object=k?module-path=/m.so&pin-value=s3cr3t-4711"
    with pytest.raises(ConfigError) as caught:
        key_provider_for(config(tmp_path, signing={"key": key}))
    assert str(caught.value).startswith("signing.key: ")
    assert "does not exist" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)
    assert "pin-value=(not shown)" in str(caught.value)


def test_the_first_run_creates_the_store(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        provider = key_provider_for(config(tmp_path))
    assert isinstance(provider, StoreKeyProvider)
    key = provider.current(time.time())
    assert key is not None
    assert (tmp_path / "data" / "keys" / "default" / f"{key.thumbprint}.pem").exists()
    assert "generated a new signing key" in caplog.text


def test_a_store_that_cannot_be_created_names_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file, not a directory")
    with pytest.raises(KeyStoreError, match="cannot create the key store") as refused:
        key_provider_for(config(tmp_path))
    assert refused.value.path == tmp_path / "data"


async def test_a_changed_store_is_picked_up_off_the_loop(tmp_path: Path) -> None:
    provider = key_provider_for(config(tmp_path))
    assert isinstance(provider, StoreKeyProvider)
    first = provider.current(time.time())
    services = KeyServices(watchers={"default": provider})
    services.start_refresh(interval_s=0.01)
    try:
        new, _ = KeyStore(tmp_path / "data").rotate(time.time(), grace_s=60)
        await until(lambda: provider.current(time.time()) != first, "the rotated key to sign")
        current = provider.current(time.time())
        assert current is not None
        assert current.thumbprint == new.thumbprint
    finally:
        await services.stop()


async def test_reload_rereads_an_unchanged_store_and_stop_ends_the_refresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tmp_path)
    keys = key_provider_for(cfg)
    assert isinstance(keys, StoreKeyProvider)
    services = await start_key_services(cfg, keys)
    assert services.watchers == {"default": keys}
    assert services.publisher is None
    refresh = services._refresh
    assert refresh is not None
    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        services.reload()  # SIGHUP: forced, so it is logged even though nothing changed
        await until(lambda: "unchanged" in caplog.text, "the forced reload")
    await services.stop()
    assert refresh.done()
    assert services._refresh is None


async def test_publishing_needs_the_key_store(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    static = StaticKeyProvider(SigningKey.generate())
    published = cfg.with_overrides(**{"publish.listen": "127.0.0.1:0", "publish.domain": "agent.example"})
    with pytest.raises(ConfigError, match=r"^publish\.listen: publishing needs the key store"):
        await start_key_services(published, static)


async def test_the_publication_listener_reports_its_address(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    keys = key_provider_for(cfg)
    published = cfg.with_overrides(**{"publish.listen": "127.0.0.1:0", "publish.domain": "agent.example"})
    services = await start_key_services(published, keys)
    try:
        assert services.publisher is not None
        [(host, port)] = services.publish_addresses
        assert host == "127.0.0.1"
        assert port > 0
        assert all(isinstance(w, StoreWatcher) for w in services.watchers.values())
    finally:
        await services.stop()
