"""The drafts' signed directory never asks a key that does not sign now for its proof where the call
could hold up the key that signs: a module takes one call at a time and a call cannot be cut short.

The fault: each round signed a possession proof with every published key, a key waiting for its
activation on another token of the signing key's module too. With that token out of reach (a network
HSM whose calls hang), the proof's call timed out, the module stalled on it and every request
signature of the key signing now was refused (token-unavailable) until the hung call returned.
"""

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
from signing_proxy.core.keys import parse_directory
from signing_proxy.core.pkcs11_uri import Pkcs11Uri, parse_pkcs11_uri
from signing_proxy.service.keys import key_provider_for
from signing_proxy.service.publish import PublishServer
from signing_proxy.service.tokenkeys import token_slot_for
from signing_proxy.storage.keystore import KeyStore, StoreWatcher
from signing_proxy.storage.pkcs11 import Pkcs11Module, generate_token_key, module_for
from tests.softhsm import PIN, signing_outcomes, two_tokens

pytestmark = pytest.mark.integration

DIRECTORY = "/.well-known/http-message-signatures-directory"
SIGNED = {"Accept": WEB_DIRECTORY_MEDIA_TYPE}
PROOF_FIELDS = ("Content-Digest", "Signature-Input", "Signature")
WAIT_S = 10.0  # bound on every wait here: nothing takes a second when it works

Client = Callable[..., Awaitable[TestClient[Any, Any]]]


def _proven(body: bytes, headers: Any, now: float) -> frozenset[str]:
    fields = Fields(tuple((name, headers[name]) for name in PROOF_FIELDS if name in headers))
    publics = [k.public for k in parse_directory(body).keys]
    return proven_keys(body, "dir.example", fields, publics, now=now) or frozenset()


async def test_a_waiting_key_on_an_unreachable_token_of_the_module_is_served_without_its_proof(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    aiohttp_client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hsm = two_tokens(tmp_path, monkeypatch)
    config = parse_config(
        {
            "data_dir": str(tmp_path / "data"),
            "intercept": {"enabled": False},
            "publish": {
                "listen": "127.0.0.1:0",
                "domain": "agent.example",
                "public_url": "https://dir.example",
            },
            "signing": {"pkcs11": {**hsm.pkcs11_config(), "timeout_s": 1}},
        }
    )
    now_uri, next_uri = "pkcs11:token=tok-a;object=now", "pkcs11:token=tok-b;object=next"
    signing = generate_token_key(token_slot_for(config, now_uri), parse_pkcs11_uri(now_uri))
    waiting = generate_token_key(token_slot_for(config, next_uri), parse_pkcs11_uri(next_uri))
    now = time.time()
    store = KeyStore(config.data_path)
    store.create(now - 60, lifetime_s=86_400, key=signing)
    store.rotate(now - 30, activate_in_s=3600, grace_s=3600, lifetime_s=86_400, key=waiting)
    keys = key_provider_for(config)
    assert isinstance(keys, StoreWatcher)
    server = PublishServer(config, {"default": keys})
    client = await aiohttp_client(server.build_app())

    # tok-b is now out of reach: a session on it hangs (until the test lets it go)
    contacted, release = threading.Event(), threading.Event()
    real_session = Pkcs11Module.session

    def session(mod: Pkcs11Module, uri: Pkcs11Uri, pin: str | None, *, rw: bool = False) -> Any:
        if uri.token == "tok-b":
            contacted.set()
            release.wait(WAIT_S)
        return real_session(mod, uri, pin, rw=rw)

    monkeypatch.setattr(Pkcs11Module, "session", session)
    module = module_for(hsm.module)
    with module.lock:
        module.reset()  # no pooled session left: the next call on tok-b opens one

    caplog.set_level(logging.INFO, logger="signing_proxy.publish")
    try:
        # request signatures while the signed directory is asked for, then after its round
        answer, during = await asyncio.wait_for(
            asyncio.gather(client.get(DIRECTORY, headers=SIGNED), signing_outcomes(keys, signing.thumbprint)),
            WAIT_S,
        )
        after = await asyncio.wait_for(signing_outcomes(keys, signing.thumbprint), WAIT_S)
        assert (during, after) == (["signed"] * 3, ["signed"] * 3)
        assert module.stalled is None
        assert not contacted.is_set()  # the waiting key's token was not called
        assert answer.status == 200
        body = await answer.read()
        listed = {k.thumbprint for k in parse_directory(body).keys}
        assert listed == {signing.thumbprint, waiting.thumbprint}  # listed, without its proof
        assert _proven(body, answer.headers, time.time()) == {signing.thumbprint}
        assert keys.unavailable() is None
    finally:
        release.set()
        await server.stop()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "signing_proxy.publish"]
    assert f"served without the proof of key {waiting.thumbprint}" in line
    assert "not asked" in line
    assert signing.thumbprint not in line
    assert PIN not in line
