"""The drafts' signed directory is made key by key: a published key whose token does not sign is
left without its proof (still listed: the drafts' clients ignore a key without one) and the others
are served. After rotating from a token key to a file key, taking the old token offline answered
503 to every drafts' directory request for the whole grace although the signing key could prove
itself. Without the proof of the key signing now, or of every key, the answer stays 503."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from signing_proxy.config import parse_config
from signing_proxy.core.directory_proof import WEB_DIRECTORY_MEDIA_TYPE, proven_keys
from signing_proxy.core.fields import Fields
from signing_proxy.core.keys import parse_directory
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service.directory_proofs import FAILURE_HOLD_S, PROOF_CACHE_S
from signing_proxy.service.keys import key_provider_for
from signing_proxy.service.publish import PublishServer
from signing_proxy.service.tokenkeys import token_slot_for
from signing_proxy.storage.keystore import KeyStore, StoreWatcher
from signing_proxy.storage.pkcs11 import generate_token_key
from tests.softhsm import SoftHsm

pytestmark = pytest.mark.integration

DIRECTORY = "/.well-known/http-message-signatures-directory"
SIGNED = {"Accept": WEB_DIRECTORY_MEDIA_TYPE}
PROOF_FIELDS = ("Content-Digest", "Signature-Input", "Signature")

Client = Callable[..., Awaitable[TestClient[Any, Any]]]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _server(
    tmp_path: Path, hsm: SoftHsm, clock: Clock, *, token_signs: bool
) -> tuple[PublishServer, StoreWatcher, str, str]:
    """A store of a token key and a file key, one of them signing now (the token key when
    ``token_signs``, else the file key that replaced it); returns the server and both keyids."""
    config = parse_config(
        {
            "data_dir": str(tmp_path / "data"),
            "intercept": {"enabled": False},
            "publish": {
                "listen": "127.0.0.1:0",
                "domain": "agent.example",
                "public_url": "https://dir.example",
            },
            "signing": {"pkcs11": hsm.pkcs11_config()},
        }
    )
    uri = hsm.uri("agent")
    token_key = generate_token_key(token_slot_for(config, uri), parse_pkcs11_uri(uri))
    store = KeyStore(config.data_path)
    if token_signs:
        store.create(clock.t - 100, lifetime_s=86_400)
        new, _ = store.rotate(clock.t - 50, grace_s=3600, lifetime_s=86_400, key=token_key)
        file_thumbprint = next(r.thumbprint for r in store.load(private=False).records if r != new)
    else:
        store.create(clock.t - 100, lifetime_s=86_400, key=token_key)
        new, _ = store.rotate(clock.t - 50, grace_s=3600, lifetime_s=86_400)  # to a file key, at once
        file_thumbprint = new.thumbprint
    keys = key_provider_for(config)
    assert isinstance(keys, StoreWatcher)
    server = PublishServer(config, {"default": keys}, clock=clock)
    return server, keys, token_key.thumbprint, file_thumbprint


def _proven(body: bytes, headers: Any, now: float) -> frozenset[str]:
    fields = Fields(tuple((name, headers[name]) for name in PROOF_FIELDS if name in headers))
    publics = [k.public for k in parse_directory(body).keys]
    return proven_keys(body, "dir.example", fields, publics, now=now) or frozenset()


async def test_a_retiring_keys_token_offline_leaves_the_signing_keys_proof_served(
    tmp_path: Path, hsm: SoftHsm, aiohttp_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(time.time())
    server, keys, token_thumbprint, file_thumbprint = _server(tmp_path, hsm, clock, token_signs=False)
    client = await aiohttp_client(server.build_app())
    caplog.set_level(logging.WARNING, logger="signing_proxy.publish")
    first = await client.get(DIRECTORY, headers=SIGNED)
    assert first.status == 200
    assert _proven(await first.read(), first.headers, clock.t) == {token_thumbprint, file_thumbprint}
    clock.t += PROOF_CACHE_S  # the proofs made before have aged out
    with hsm.removed():
        for _ in range(3):  # each a new round: the store loaded again
            assert keys.reload(force=True)
            answer = await client.get(DIRECTORY, headers=SIGNED)
            assert answer.status == 200
            body = await answer.read()
            assert {k.thumbprint for k in parse_directory(body).keys} == {token_thumbprint, file_thumbprint}
            assert _proven(body, answer.headers, clock.t) == {file_thumbprint}  # the retiring key: none
            assert answer.headers["Signature-Input"].startswith("binding0=")
            assert "binding1=" not in answer.headers["Signature-Input"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "signing_proxy.publish"]
    assert len(warnings) == 1  # once a minute at most, not once per round
    assert "(token-missing; 1 round(s) since the last warning)" in warnings[0]
    assert f"without the proof of key {token_thumbprint}" in warnings[0]

    clock.t += PROOF_CACHE_S  # the token is back: both proofs again
    back = await client.get(DIRECTORY, headers=SIGNED)
    assert _proven(await back.read(), back.headers, clock.t) == {token_thumbprint, file_thumbprint}
    await server.stop()


async def test_without_the_signing_keys_proof_the_signed_directory_is_a_503(
    tmp_path: Path, hsm: SoftHsm, aiohttp_client: Client
) -> None:
    clock = Clock(time.time())
    server, _keys, _token_thumbprint, _file_thumbprint = _server(tmp_path, hsm, clock, token_signs=True)
    client = await aiohttp_client(server.build_app())
    assert (await client.get(DIRECTORY, headers=SIGNED)).status == 200
    clock.t += PROOF_CACHE_S
    with hsm.removed():  # the retiring file key could still prove itself: not enough
        answer = await client.get(DIRECTORY, headers=SIGNED)
        assert answer.status == 503
        assert (await answer.json())["reason"] == "token-unavailable"
        assert answer.headers["Retry-After"] == str(FAILURE_HOLD_S)
    await server.stop()
