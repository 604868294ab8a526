"""The signed directory: content negotiation on the publication listener, one possession proof per
published key (checked for every key, under the directory draft's rules), a tampered body failing,
and a verifier's resolver keeping only the keys whose proof holds."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from signing_proxy.config import VerifyConfig, parse_config
from signing_proxy.core.directory_proof import WEB_DIRECTORY_MEDIA_TYPE, proven_keys
from signing_proxy.core.fields import Fields
from signing_proxy.core.keys import parse_directory
from signing_proxy.core.rotation import CLOCK_MARGIN_S
from signing_proxy.service.publish import PublishServer, prefers_web_directory
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider, StoreWatcher
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.directory import DirectoryResolver, FetchResult
from tests.verify.fakes import FakeFetch

DIRECTORY = "/.well-known/http-message-signatures-directory"
NOW = 1_800_000_200
Client = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def server(tmp_path: Path) -> PublishServer:
    store = KeyStore(tmp_path / "data")
    store.create(1_800_000_000, lifetime_s=10_000)
    store.rotate(1_800_000_100, grace_s=3600, lifetime_s=10_000)  # two published keys
    config = parse_config(
        {
            "data_dir": str(tmp_path / "data"),
            "publish": {
                "listen": "127.0.0.1:0",
                "domain": "agent.example",
                "public_url": "https://dir.example",
            },
        }
    )
    watchers: dict[str, StoreWatcher] = {"default": StoreKeyProvider(KeyStore(config.data_path))}
    return PublishServer(config, watchers, clock=lambda: NOW)


async def _fetch(server: PublishServer, client_factory: Client, accept: str | None) -> tuple[bytes, Any]:
    client = await client_factory(server.build_app())
    resp = await client.get(DIRECTORY, headers={"Accept": accept} if accept else {})
    assert resp.status == 200
    return await resp.read(), resp.headers


async def test_the_spec_media_type_stays_the_default(server: PublishServer, aiohttp_client: Client) -> None:
    for accept in (
        None,
        "application/json",
        "application/jwk-set+json, application/http-message-signatures-directory+json;q=0.5",
    ):
        _body, headers = await _fetch(server, aiohttp_client, accept)
        assert headers["Content-Type"] == "application/jwk-set+json"
        assert "Signature" not in headers
        assert headers["Vary"] == "Accept"


async def test_every_published_key_has_a_valid_possession_proof(
    server: PublishServer, aiohttp_client: Client
) -> None:
    body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    assert headers["Content-Type"] == WEB_DIRECTORY_MEDIA_TYPE
    directory = parse_directory(body)
    assert len(directory.keys) == 2
    fields = Fields(tuple((n, headers[n]) for n in ("Content-Digest", "Signature-Input", "Signature")))
    raw = fields.combined("signature-input") or ""
    assert raw.count('tag="http-message-signatures-directory"') == 2
    assert raw.count('("@authority";req "content-digest")') == 2
    publics = [k.public for k in directory.keys]
    for key in directory.keys:  # each key's proof on its own
        assert proven_keys(body, "dir.example", fields, [key.public], now=NOW) == frozenset({key.thumbprint})
    assert proven_keys(body, "dir.example", fields, publics, now=NOW) == frozenset(
        k.thumbprint for k in directory.keys
    )
    # bound to our public authority, not to whatever Host was asked
    assert proven_keys(body, "127.0.0.1", fields, publics, now=NOW) == frozenset()


async def test_a_tampered_directory_body_fails(server: PublishServer, aiohttp_client: Client) -> None:
    body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    fields = Fields(tuple((n, headers[n]) for n in ("Content-Digest", "Signature-Input", "Signature")))
    doc = json.loads(body)
    doc["keys"] = doc["keys"][:1]  # a key withdrawn on the way
    tampered = json.dumps(doc, separators=(",", ":")).encode()
    publics = [k.public for k in parse_directory(body).keys]
    assert proven_keys(tampered, "dir.example", fields, publics, now=NOW) == frozenset()


async def test_the_resolver_ignores_keys_whose_proof_fails(
    server: PublishServer, aiohttp_client: Client
) -> None:
    body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    keys = parse_directory(body).keys
    # keep only the first proof: the second key is published without one
    first_input = headers["Signature-Input"].split(", binding1=")[0]
    first_sig = headers["Signature"].split(", binding1=")[0]
    proofs = (
        ("Content-Digest", headers["Content-Digest"]),
        ("Signature-Input", first_input),
        ("Signature", first_sig),
    )
    fetch = FakeFetch()
    url = "https://dir.example" + DIRECTORY
    fetch.answers[url] = FetchResult(200, body, "max-age=300", proofs)
    resolver = DirectoryResolver(fetch, clock=lambda: NOW)
    directory = await resolver.get("https://dir.example")
    assert [k.thumbprint for k in directory.keys] == [keys[0].thumbprint]
    # an unsigned (spec) response keeps every key
    fetch.answers["https://spec.example" + DIRECTORY] = FetchResult(200, body, "max-age=300")
    assert len((await resolver.get("https://spec.example")).keys) == 2
    await resolver.close()


async def test_a_proof_created_ahead_of_the_clock_is_judged_with_the_verifiers_own_skew(
    server: PublishServer, aiohttp_client: Client
) -> None:
    """The publisher's clock 8 s ahead of ours, past the margin its proofs leave (their created is
    CLOCK_MARGIN_S behind its clock): they hold under verify.skew_s 10, not under 5."""
    body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    proofs = tuple((name, headers[name]) for name in ("Content-Digest", "Signature-Input", "Signature"))
    fetch = FakeFetch()
    fetch.answers["https://dir.example" + DIRECTORY] = FetchResult(200, body, "max-age=300", proofs)
    kept = []
    for limits in (VerifyConfig(), VerifyConfig(skew_s=10)):
        verifier = build_verifier(limits=limits, clock=lambda: NOW - 8 - CLOCK_MARGIN_S)
        verifier.resolver.fetch = fetch
        kept.append(len((await verifier.resolver.get("https://dir.example")).keys))
        await verifier.close()
    assert kept == [0, 2]


async def test_a_verifier_a_few_seconds_behind_us_still_finds_our_proofs_current(
    server: PublishServer, aiohttp_client: Client
) -> None:
    """The drafts have a verifier refuse a proof created in the future: one whose clock was even
    0.5 s behind ours proved no key (with no skew of its own)."""
    body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    fields = Fields(tuple((n, headers[n]) for n in ("Content-Digest", "Signature-Input", "Signature")))
    publics = [k.public for k in parse_directory(body).keys]
    for behind in (0.5, 3.0, CLOCK_MARGIN_S):
        proven = proven_keys(body, "dir.example", fields, publics, now=NOW - behind, skew_s=0)
        assert proven is not None
        assert len(proven) == 2, behind


def test_accept_negotiation() -> None:
    assert prefers_web_directory(WEB_DIRECTORY_MEDIA_TYPE)
    assert prefers_web_directory(f"application/jwk-set+json;q=0.5, {WEB_DIRECTORY_MEDIA_TYPE}")
    assert not prefers_web_directory(f"{WEB_DIRECTORY_MEDIA_TYPE};q=0")
    assert not prefers_web_directory("*/*")
    assert not prefers_web_directory(None)


async def test_the_drafts_media_type_carries_no_jose_alg(
    server: PublishServer, aiohttp_client: Client
) -> None:
    """The drafts restrict a directory key's ``alg`` to the HTTP Signature Algorithms registry
    (``ed25519``), and WebCrypto refuses a JWK whose ``alg`` is ``ed25519``: under the drafts' media
    type the directory omits ``alg`` (it was the spec's JOSE ``EdDSA``); the spec's keeps ``EdDSA``.
    The proofs' Content-Digest covers the body served, and the rest is the spec's body unchanged."""
    spec_body, _ = await _fetch(server, aiohttp_client, "application/jwk-set+json")
    web_body, headers = await _fetch(server, aiohttp_client, WEB_DIRECTORY_MEDIA_TYPE)
    spec_keys, web_keys = json.loads(spec_body)["keys"], json.loads(web_body)["keys"]
    assert [key["alg"] for key in spec_keys] == ["EdDSA", "EdDSA"]
    assert all("alg" not in key for key in web_keys)
    assert web_keys == [{m: v for m, v in key.items() if m != "alg"} for key in spec_keys]
    fields = Fields(tuple((n, headers[n]) for n in ("Content-Digest", "Signature-Input", "Signature")))
    publics = [k.public for k in parse_directory(web_body).keys]
    assert proven_keys(web_body, "dir.example", fields, publics, now=NOW) == frozenset(
        k.thumbprint for k in parse_directory(spec_body).keys
    )
