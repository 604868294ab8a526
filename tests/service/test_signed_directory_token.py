"""The signed key directory (web-bot-auth) of a key held on a token: its proofs are made on the
token's thread, never on the event loop a stranger's request would otherwise stall, and a token that
cannot sign is answered 503 with a reason (it was an unhandled 500 in plain text)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import aiohttp
import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service.directory_proofs import PROOF_CACHE_S
from signing_proxy.service.keys import key_provider_for, start_key_services
from signing_proxy.service.tokenkeys import token_slot_for
from signing_proxy.storage.keystore import KeyStore
from signing_proxy.storage.pkcs11 import TokenKey, generate_token_key
from tests.harness import WAIT_S
from tests.softhsm import SoftHsm

pytestmark = pytest.mark.integration

SIGNED = {"Accept": "application/http-message-signatures-directory+json"}


async def test_proofs_are_made_on_the_tokens_thread_and_a_token_gone_is_a_503(
    tmp_path: Path, hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config(
        {
            "data_dir": str(tmp_path / "data"),
            "intercept": {"enabled": False},
            "publish": {"listen": "127.0.0.1:0", "domain": "agent.example"},
            "signing": {"pkcs11": hsm.pkcs11_config()},
        }
    )
    uri = hsm.uri("agent")
    key = generate_token_key(token_slot_for(config, uri), parse_pkcs11_uri(uri))
    KeyStore(config.data_path).create(time.time(), lifetime_s=86_400, key=key)
    threads: list[str] = []
    sign = TokenKey.sign

    def spied(self: TokenKey, data: bytes) -> bytes:
        threads.append(threading.current_thread().name)
        return sign(self, data)

    monkeypatch.setattr(TokenKey, "sign", spied)
    services = await start_key_services(config, key_provider_for(config))
    host, port = services.publish_addresses[0]
    url = f"http://{host}:{port}/.well-known/http-message-signatures-directory"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
            async with session.get(url, headers=SIGNED) as answer:
                assert answer.status == 200
                assert "binding0=" in answer.headers["Signature"]
            assert threads
            assert threading.main_thread().name not in threads  # never the event loop's thread
            assert services.publisher is not None  # the proofs made above are shared until they age out
            services.publisher.clock = lambda: time.time() + PROOF_CACHE_S
            with hsm.removed():
                async with session.get(url, headers=SIGNED) as answer:
                    assert answer.status == 503
                    assert answer.headers["Content-Type"] == "application/problem+json"
                    assert (await answer.json())["reason"] == "token-unavailable"
                    assert answer.headers["Retry-After"] == "5"
    finally:
        await services.stop()
