"""Each in-process adapter (httpx sync and async, requests, aiohttp) sends to a verifying origin
that checks every request with our verifier and with ``http-message-signatures``: a GET without body,
a POST of JSON, a streamed upload within ``limits.max_body_bytes`` and one above it (refused, never
sent), an exchange call that gets the Requester injected, and a key-store rotation while the client
session stays open. And what arrives carries the very bytes the proxy's pipeline would have added."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.client import NotSigned, Signer, key_file
from signing_proxy.config import parse_config
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.pipeline import BearerStore, SigningPipeline
from signing_proxy.proxy.pipeline import Signer as PipelineSigner
from signing_proxy.proxy.requester import injector_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.client.drivers import DRIVERS, Driver
from tests.harness import VerifyingOrigin

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024
AGENT = "https://agent.example"


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as started:
        yield started


def write_key(tmp_path: Path, key: SigningKey) -> Path:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(key.to_pem())
    path.chmod(0o600)
    return path


def settings(**extra: Any) -> dict[str, Any]:
    return {"signing": {"signature_agent": AGENT}, "limits": {"max_body_bytes": LIMIT}, **extra}


@pytest.fixture(params=DRIVERS, ids=[d.name for d in DRIVERS])
def driver_class(request: pytest.FixtureRequest) -> type[Driver]:
    cls: type[Driver] = request.param
    return cls


@pytest.fixture
async def driver(
    driver_class: type[Driver], tmp_path: Path, origin: VerifyingOrigin
) -> AsyncIterator[Driver]:
    key = SigningKey.from_seed(b"\x31" * 32)
    origin.trust(key)
    signer = Signer(key_file(write_key(tmp_path, key)), parse_config(settings()))
    started = driver_class(signer)
    await started.open()
    yield started
    await started.close()


def assert_verified(origin: VerifyingOrigin, body: bytes) -> None:
    assert len(origin.arrivals) == 1
    arrival = origin.arrivals[0]
    assert (arrival.verified, arrival.reason, arrival.oracle) == (True, None, "ok")
    assert arrival.body == body
    assert arrival.header("signature-agent") == f'"{AGENT}"'
    assert arrival.header("authorization") == ""  # present, empty: the spec covers it either way


async def test_get_without_body(driver: Driver, origin: VerifyingOrigin) -> None:
    assert await driver.send("GET", origin.url("/items?q=1&b=%2F")) == 200
    assert_verified(origin, b"")


@pytest.mark.parametrize("path", ["/p?", "/p??", "/p?a=1?", "/p?x=1#frag"])
async def test_what_is_signed_is_the_target_sent(driver: Driver, origin: VerifyingOrigin, path: str) -> None:
    """Libraries send these as they are, or cut them; the signature must cover what arrives."""
    assert await driver.send("GET", origin.url(path)) == 200
    assert_verified(origin, b"")


async def test_a_host_set_by_the_caller_is_the_authority_signed(
    driver: Driver, origin: VerifyingOrigin
) -> None:
    """Connecting to an address with ``Host: api.example``: the library sends that Host, so the
    target URI a verifier rebuilds names it (it was signed with the URL's authority, and refused)."""
    assert await driver.send("GET", origin.url("/p"), headers={"Host": "api.example"}) == 200
    assert_verified(origin, b"")
    assert origin.arrivals[0].header("host") == "api.example"


async def test_post_json(driver: Driver, origin: VerifyingOrigin) -> None:
    assert await driver.send("POST", origin.url("/items"), json={"name": "x", "n": [1, 2]}) == 200
    arrival = origin.arrivals[0]
    assert json.loads(arrival.body) == {"name": "x", "n": [1, 2]}
    assert_verified(origin, arrival.body)


async def test_a_streamed_upload_within_the_limit_is_read_digested_and_signed(
    driver: Driver, origin: VerifyingOrigin
) -> None:
    chunks = [bytes([i]) * 8192 for i in range(7)]  # 56 KiB, in 7 chunks, no length declared
    assert await driver.send("PUT", origin.url("/upload"), stream=chunks) == 200
    assert_verified(origin, b"".join(chunks))


async def test_a_streamed_upload_above_the_limit_is_refused_and_never_sent(
    driver: Driver, origin: VerifyingOrigin
) -> None:
    chunks = [b"z" * 8192] * 9  # 72 KiB: above the 64 KiB limit
    with pytest.raises(NotSigned) as refused:
        await driver.send("PUT", origin.url("/upload"), stream=chunks)
    assert (refused.value.status, refused.value.reason) == (413, "body-too-large")
    assert "limits.max_body_bytes (65536 bytes)" in refused.value.detail
    # the session still signs what fits, and the refused request never reached the origin
    assert await driver.send("GET", origin.url("/after")) == 200
    assert [a.target_uri.rsplit("/", 1)[1] for a in origin.arrivals] == ["after"]


async def test_an_exchange_call_gets_the_requester_injected_and_signed(
    driver_class: type[Driver], tmp_path: Path, origin: VerifyingOrigin
) -> None:
    key = SigningKey.from_seed(b"\x32" * 32)
    origin.trust(key)
    requester = {
        "id": "agent-7",
        "domain": "agent.example",
        "type": "REQUESTER_TYPE_AGENT",
        "exchanges": [origin.url("/v1")],
    }
    signer = Signer(key_file(write_key(tmp_path, key)), parse_config(settings(requester=requester)))
    driver = driver_class(signer)
    await driver.open()
    try:
        call = origin.url("/v1/svc.v1.ExchangeService/DiscoverResources")
        assert await driver.send("POST", call, json={"ver": "1.0", "uris": ["https://pub.example/a"]}) == 200
    finally:
        await driver.close()
    arrival = origin.arrivals[0]
    sent = json.loads(arrival.body)
    assert sent["requester"] == {"id": "agent-7", "domain": "agent.example", "type": "REQUESTER_TYPE_AGENT"}
    assert sent["uris"] == ["https://pub.example/a"]
    assert arrival.header("content-length") == str(len(arrival.body))
    assert_verified(origin, arrival.body)


async def test_a_key_store_rotation_is_picked_up_while_the_session_stays_open(
    driver_class: type[Driver], tmp_path: Path, origin: VerifyingOrigin
) -> None:
    data = tmp_path / "data"
    signer = Signer.from_config({"data_dir": str(data), **settings()}, refresh_every_s=0)
    assert isinstance(signer.keys, StoreKeyProvider)
    first = signer.keys.state().signing_key(time.time())
    assert first is not None
    origin.trust(first)
    driver = driver_class(signer)
    await driver.open()
    try:
        assert await driver.send("GET", origin.url("/before")) == 200
        new, _moved = KeyStore(data, "default").rotate(time.time(), activate_in_s=0)  # `keys rotate --now`
        origin.trust(KeyStore(data, "default").load().private[new.thumbprint])
        assert await driver.send("GET", origin.url("/after")) == 200
    finally:
        await driver.close()
    assert [a.keyids for a in origin.arrivals] == [[first.thumbprint], [new.thumbprint]]
    assert all(a.verified and a.oracle == "ok" for a in origin.arrivals)


async def test_the_adapters_add_the_bytes_the_proxy_would_add(
    driver_class: type[Driver], tmp_path: Path, origin: VerifyingOrigin
) -> None:
    """What arrived, run again through the proxy's own ``SigningPipeline.prepare`` at the same second with
    the same key: the same Content-Digest, Authorization, Signature-Agent, Signature-Input, Signature."""
    key = SigningKey.from_seed(b"\x33" * 32)
    origin.trust(key)
    rule = {"hosts": ["127.0.0.1"], "bearer_env": "ORIGIN_TOKEN", "allow_plaintext": True}
    config = parse_config(settings(credentials=[rule]))
    environ = {"ORIGIN_TOKEN": "t0ken"}  # a bearer credential: Authorization is compared, not empty
    driver = driver_class(Signer(StaticKeyProvider(key), config, environ=environ))
    await driver.open()
    try:
        body = {"query": "a b", "n": 1}
        assert await driver.send("POST", origin.url("/p?x=1"), json=body, headers={"X-Trace": "7"}) == 200
    finally:
        await driver.close()
    arrival = origin.arrivals[0]
    created = int(arrival.header("signature-input").split(";created=")[1].split(";")[0])  # type: ignore[union-attr]
    proxy_signer = PipelineSigner(
        StaticKeyProvider(key), label="agent", validity_s=300, clock=lambda: created
    )
    out = SigningPipeline(
        config=config,
        signer=proxy_signer,
        bearers=BearerStore(config.credentials, environ),
        requester=injector_for(config, StaticKeyProvider(key)),
    ).prepare(
        "POST",
        parse_absolute_uri(arrival.target_uri),
        [(n, v) for n, v in arrival.lines if n.lower() not in ("signature", "signature-input")],
        arrival.body,
        framed=True,
    )
    head = out.head.decode("latin-1").split("\r\n")
    proxied = Fields(tuple(line.split(": ", 1)) for line in head[1:] if ": " in line)  # type: ignore[misc]
    assert arrival.header("authorization") == "Bearer t0ken"
    for name in ("content-digest", "authorization", "signature-agent", "signature-input", "signature"):
        assert arrival.header(name) == proxied.combined(name), name
    assert out.body == arrival.body
