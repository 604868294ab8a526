"""The signed directory's proofs are made once and shared: a stranger's requests never cost a
signature round each (a key on a token signs on the module's one thread, where the proxy's own
request signatures wait). Concurrent requests await one round, a key-store change or an expired entry
makes new proofs, and a token that fails is tried once per hold, logged once, not once per request."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from signing_proxy.config import parse_config
from signing_proxy.core.directory_proof import WEB_DIRECTORY_MEDIA_TYPE, proven_keys
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import parse_directory
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service import publish
from signing_proxy.service.directory_proofs import FAILURE_HOLD_S, PROOF_CACHE_S
from signing_proxy.service.keys import key_provider_for
from signing_proxy.service.publish import PublishServer
from signing_proxy.service.tokenkeys import token_slot_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider, StoreWatcher
from signing_proxy.storage.pkcs11 import TokenKey, generate_token_key
from tests.harness import WAIT_S
from tests.softhsm import SoftHsm

DIRECTORY = "/.well-known/http-message-signatures-directory"
SIGNED = {"Accept": WEB_DIRECTORY_MEDIA_TYPE}
PROOF_FIELDS = ("Content-Digest", "Signature-Input", "Signature")
T0 = 1_800_000_200

Client = Callable[..., Awaitable[TestClient[Any, Any]]]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _config(data: Path, **signing: Any) -> Any:
    return parse_config(
        {
            "data_dir": str(data),
            "intercept": {"enabled": False},
            "publish": {
                "listen": "127.0.0.1:0",
                "domain": "agent.example",
                "public_url": "https://dir.example",
            },
            **({"signing": signing} if signing else {}),
        }
    )


def _proofs(headers: Any) -> tuple[str, ...]:
    return tuple(headers[name] for name in PROOF_FIELDS)


def _count_signatures(monkeypatch: pytest.MonkeyPatch, cls: type[SigningKey]) -> list[bytes]:
    """Every signature ``cls`` makes, in order (its ``sign`` wrapped)."""
    made: list[bytes] = []
    sign = cls.sign

    def counted(self: SigningKey, data: bytes) -> bytes:
        made.append(data)
        return sign(self, data)

    monkeypatch.setattr(cls, "sign", counted)
    return made


# --- keys in files: the cache, without a token ---


@pytest.fixture
def file_store(tmp_path: Path) -> tuple[PublishServer, StoreKeyProvider, KeyStore, Clock]:
    store = KeyStore(tmp_path / "data")
    store.create(1_800_000_000, lifetime_s=10_000)
    store.rotate(1_800_000_100, grace_s=3600, lifetime_s=10_000)  # two published keys
    config = _config(tmp_path / "data")
    watcher = StoreKeyProvider(KeyStore(config.data_path))
    clock = Clock(T0)
    watchers: dict[str, StoreWatcher] = {"default": watcher}
    return PublishServer(config, watchers, clock=clock), watcher, store, clock


async def test_repeated_requests_share_the_proofs_and_a_key_store_change_makes_new_ones(
    file_store: tuple[PublishServer, StoreKeyProvider, KeyStore, Clock],
    aiohttp_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, watcher, store, clock = file_store
    made = _count_signatures(monkeypatch, SigningKey)
    client = await aiohttp_client(server.build_app())
    first = await client.get(DIRECTORY, headers=SIGNED)
    assert first.status == 200
    assert len(made) == 2  # one proof per published key
    for _ in range(5):
        again = await client.get(DIRECTORY, headers=SIGNED)
        assert again.status == 200
        assert _proofs(again.headers) == _proofs(first.headers)
        assert await again.read() == await first.read()
    assert len(made) == 2  # no signature for any of them

    clock.t += 1
    store.rotate(clock.t, grace_s=3600, lifetime_s=10_000)  # a third key published
    assert watcher.reload()
    changed = await client.get(DIRECTORY, headers=SIGNED)
    assert changed.status == 200
    assert len(made) == 2 + 3  # fresh proofs, one per key now published
    body = await changed.read()
    keys = parse_directory(body).keys
    assert len(keys) == 3
    fields = Fields(tuple((name, changed.headers[name]) for name in PROOF_FIELDS))
    assert proven_keys(body, "dir.example", fields, [k.public for k in keys], now=clock.t) == frozenset(
        k.thumbprint for k in keys
    )

    same_keys = watcher.state()
    assert watcher.reload(force=True)  # the same keys, loaded again: a new state, new proofs
    assert watcher.state() is not same_keys
    assert (await client.get(DIRECTORY, headers=SIGNED)).status == 200
    assert len(made) == 2 + 3 + 3
    await server.stop()


async def test_an_expired_cache_entry_is_signed_again(
    file_store: tuple[PublishServer, StoreKeyProvider, KeyStore, Clock],
    aiohttp_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _watcher, _store, clock = file_store
    made = _count_signatures(monkeypatch, SigningKey)
    client = await aiohttp_client(server.build_app())
    first = await client.get(DIRECTORY, headers=SIGNED)
    assert first.headers["Cache-Control"] == "max-age=3600"

    clock.t = T0 + PROOF_CACHE_S - 1  # still shared, cached no longer than its proofs hold
    shared = await client.get(DIRECTORY, headers=SIGNED)
    assert _proofs(shared.headers) == _proofs(first.headers)
    assert shared.headers["Cache-Control"] == f"max-age={3600 - PROOF_CACHE_S + 1}"
    assert len(made) == 2
    body = await shared.read()
    fields = Fields(tuple((name, shared.headers[name]) for name in PROOF_FIELDS))
    publics = [k.public for k in parse_directory(body).keys]
    assert len(proven_keys(body, "dir.example", fields, publics, now=clock.t) or ()) == 2

    clock.t = T0 + PROOF_CACHE_S  # expired: a new round, created anew
    fresh = await client.get(DIRECTORY, headers=SIGNED)
    assert fresh.status == 200
    assert len(made) == 4
    assert fresh.headers["Signature-Input"] != first.headers["Signature-Input"]
    assert f"created={T0 + PROOF_CACHE_S - 5}" in fresh.headers["Signature-Input"]  # CLOCK_MARGIN_S
    assert fresh.headers["Cache-Control"] == "max-age=3600"
    await server.stop()


# --- a key on a token ---


def _token_server(tmp_path: Path, hsm: SoftHsm, clock: Clock) -> PublishServer:
    config = _config(tmp_path / "data", pkcs11=hsm.pkcs11_config())
    uri = hsm.uri("agent")
    key = generate_token_key(token_slot_for(config, uri), parse_pkcs11_uri(uri))
    KeyStore(config.data_path).create(clock.t - 10, lifetime_s=86_400, key=key)
    keys = key_provider_for(config)
    assert isinstance(keys, StoreWatcher)
    return PublishServer(config, {"default": keys}, clock=clock)


@pytest.mark.integration
async def test_concurrent_requests_await_one_round_of_token_proofs(
    tmp_path: Path, hsm: SoftHsm, aiohttp_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(time.time())
    server = _token_server(tmp_path, hsm, clock)
    requests = 20
    arrived = asyncio.Event()
    seen = 0
    negotiate = publish.prefers_web_directory

    def counting(accept: str | None) -> bool:  # each directory request, before it signs or waits
        nonlocal seen
        seen += 1
        if seen == requests:
            arrived.set()
        return negotiate(accept)

    monkeypatch.setattr(publish, "prefers_web_directory", counting)
    release = threading.Event()
    signed: list[bytes] = []
    sign = TokenKey.sign

    def held(self: TokenKey, data: bytes) -> bytes:  # the token is slow: held until all have asked
        signed.append(data)
        release.wait(WAIT_S)
        return sign(self, data)

    monkeypatch.setattr(TokenKey, "sign", held)
    client = await aiohttp_client(server.build_app())
    try:
        asked = [asyncio.ensure_future(client.get(DIRECTORY, headers=SIGNED)) for _ in range(requests)]
        await asyncio.wait_for(arrived.wait(), WAIT_S)
    finally:
        release.set()
    answers = await asyncio.wait_for(asyncio.gather(*asked), WAIT_S)
    assert [a.status for a in answers] == [200] * requests
    assert len(signed) == 1  # one key, one proof: one round for all of them
    assert len({_proofs(a.headers) for a in answers}) == 1
    await server.stop()


@pytest.mark.integration
async def test_a_failing_token_is_tried_once_per_hold_and_logged_once(
    tmp_path: Path,
    hsm: SoftHsm,
    aiohttp_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(time.time())
    server = _token_server(tmp_path, hsm, clock)
    signed = _count_signatures(monkeypatch, TokenKey)
    client = await aiohttp_client(server.build_app())
    caplog.set_level(logging.WARNING, logger="signing_proxy.publish")
    with hsm.removed():
        for _ in range(10):
            answer = await client.get(DIRECTORY, headers=SIGNED)
            assert answer.status == 503
            assert answer.headers["Content-Type"] == "application/problem+json"
            assert (await answer.json())["reason"] == "token-unavailable"
            assert answer.headers["Retry-After"] == str(FAILURE_HOLD_S)
        assert len(signed) == 1  # held: one try, not one per request
        clock.t += FAILURE_HOLD_S
        assert (await client.get(DIRECTORY, headers=SIGNED)).status == 503
        assert len(signed) == 2  # tried again once the hold is over
    warnings = [r for r in caplog.records if r.name == "signing_proxy.publish"]
    assert len(warnings) == 1  # not one line per refused request, nor per round within a minute
    assert "a token did not sign (token-missing; 1 round(s) failed)" in warnings[0].getMessage()

    clock.t += FAILURE_HOLD_S  # the token is back
    recovered = await client.get(DIRECTORY, headers=SIGNED)
    assert recovered.status == 200
    assert "binding0=" in recovered.headers["Signature"]
    await server.stop()
