"""The publication listener: exactly the spec's documents and headers, never a private member, 503
without a valid key, per-agent base paths for a registry host, and `publish --out` byte-identical
to what is served."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.jwk import PRIVATE_JWK_MEMBERS
from signing_proxy.core.keys import parse_directory, parse_revocation_list
from signing_proxy.core.manifest import parse_manifest
from signing_proxy.core.rotation import CLOCK_MARGIN_S
from signing_proxy.service.publish import PublishServer
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider, StoreWatcher

DIRECTORY = "/.well-known/http-message-signatures-directory"
MANIFEST = "/.well-known/svc.json"
REVOCATIONS = "/.well-known/http-message-signatures-revocations.json"
JWK_MEMBERS = ["kty", "crv", "use", "alg", "x", "not_before", "not_after"]  # spec order

Client = Callable[..., Awaitable[TestClient[Any, Any]]]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def publish_config(data: Path, **publish: Any) -> dict[str, Any]:
    return {
        "data_dir": str(data),
        "publish": {"listen": "127.0.0.1:0", "domain": "agent.example", **publish},
    }


def server_for(raw: dict[str, Any], clock: Clock) -> PublishServer:
    config = parse_config(raw)
    watchers: dict[str, StoreWatcher] = {
        config.signing.agent: StoreKeyProvider(KeyStore(config.data_path, config.signing.agent))
    }
    for agent in config.publish.agents:
        watchers[agent] = StoreWatcher(KeyStore(config.data_path, agent), private=False)
    return PublishServer(config, watchers, clock=clock)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    store = KeyStore(tmp_path / "data")
    store.create(1_800_000_000, lifetime_s=10_000)
    store.rotate(1_800_000_100, grace_s=3600, lifetime_s=10_000)
    return tmp_path / "data"


async def test_directory_is_a_pure_jwk_set_with_the_spec_members(data: Path, aiohttp_client: Client) -> None:
    client = await aiohttp_client(server_for(publish_config(data), Clock(1_800_000_200)).build_app())
    resp = await client.get(DIRECTORY)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/jwk-set+json"
    assert resp.headers["Cache-Control"] == "max-age=3600"
    body = await resp.read()
    doc = json.loads(body)
    assert list(doc) == ["keys", "revocation_url"]
    assert doc["revocation_url"] == "https://agent.example" + REVOCATIONS
    assert len(doc["keys"]) == 2
    for entry in doc["keys"]:
        assert list(entry) == JWK_MEMBERS  # exactly these, no kid
        assert (entry["kty"], entry["crv"], entry["use"], entry["alg"]) == ("OKP", "Ed25519", "sig", "EdDSA")
        assert not PRIVATE_JWK_MEMBERS & set(entry)
    private = [key.to_jwk()["d"] for key in StoreKeyProvider(KeyStore(data)).state().private.values()]
    assert private
    assert not any(d.encode() in body for d in private)
    directory = parse_directory(body)
    assert {k.thumbprint for k in directory.keys} == {
        r.thumbprint for r in KeyStore(data).load(private=False).records
    }


async def test_manifest_is_exactly_ver_role_domain(data: Path, aiohttp_client: Client) -> None:
    client = await aiohttp_client(server_for(publish_config(data), Clock(1_800_000_200)).build_app())
    resp = await client.get(MANIFEST)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Cache-Control"] == "max-age=3600"
    body = await resp.read()
    assert body == b'{"ver":"1.0","role":"ROLE_AGENT","domain":"agent.example"}'
    parse_manifest(body, served_host="agent.example", strict_agent=True)


async def test_revocation_list_is_served_with_a_short_lifetime(data: Path, aiohttp_client: Client) -> None:
    clock = Clock(1_800_000_200)
    server = server_for(publish_config(data), clock)
    client = await aiohttp_client(server.build_app())
    resp = await client.get(REVOCATIONS)
    assert resp.status == 200
    assert resp.headers["Cache-Control"] == "max-age=60"
    assert parse_revocation_list(await resp.read()).revoked == frozenset()
    newest = KeyStore(data).load().signing_record(clock.t)
    assert newest is not None
    KeyStore(data).revoke(newest.thumbprint, clock.t)
    for watcher in server._routes.values():
        watcher[2].reload()
    revoked = parse_revocation_list(await (await client.get(REVOCATIONS)).read())
    assert revoked.revoked == {newest.thumbprint}
    assert revoked.as_of == 1_800_000_200
    directory = parse_directory(await (await client.get(DIRECTORY)).read())
    assert newest.thumbprint not in {k.thumbprint for k in directory.keys}


async def test_after_the_grace_period_only_the_new_key_is_published(
    data: Path, aiohttp_client: Client
) -> None:
    clock = Clock(1_800_000_200)
    client = await aiohttp_client(server_for(publish_config(data), clock).build_app())
    assert len(parse_directory(await (await client.get(DIRECTORY)).read()).keys) == 2
    clock.t = 1_800_000_100 + 3600 + 1  # the old key's not_after is rotation + grace (+ <1 s)
    keys = parse_directory(await (await client.get(DIRECTORY)).read()).keys
    assert [k.not_before for k in keys] == [1_800_000_100 - CLOCK_MARGIN_S]


async def test_no_valid_key_means_503_not_an_empty_directory(data: Path, aiohttp_client: Client) -> None:
    client = await aiohttp_client(server_for(publish_config(data), Clock(1_900_000_000)).build_app())
    resp = await client.get(DIRECTORY)
    assert resp.status == 503
    assert resp.headers["Content-Type"] == "application/problem+json"
    assert resp.headers["Cache-Control"] == "no-store"
    assert (await resp.json())["reason"] == "no-valid-key"
    assert (await client.get(MANIFEST)).status == 200
    assert (await client.get(REVOCATIONS)).status == 200


async def test_head_other_methods_and_unknown_paths(data: Path, aiohttp_client: Client) -> None:
    client = await aiohttp_client(server_for(publish_config(data), Clock(1_800_000_200)).build_app())
    head = await client.head(DIRECTORY)
    assert head.status == 200
    assert head.headers["Content-Type"] == "application/jwk-set+json"
    assert await head.read() == b""
    assert head.headers["Server"] == "signing-proxy"  # no library versions on a public listener
    post = await client.post(DIRECTORY, data=b"x")
    assert post.status == 405
    assert post.headers["Allow"] == "GET, HEAD"
    assert (await post.json())["reason"] == "method-not-allowed"
    missing = await client.get("/.well-known/other")
    assert missing.status == 404
    assert (await missing.json())["reason"] == "not-found"
    assert (await client.get(DIRECTORY + "/")).status == 404


async def test_max_age_and_revocation_url_are_configurable(data: Path, aiohttp_client: Client) -> None:
    raw = publish_config(
        data,
        directory_max_age_s=600,
        revocation_path="/keys/revoked.json",
        revocation_url="https://cdn.example/revoked.json",
    )
    client = await aiohttp_client(server_for(raw, Clock(1_800_000_200)).build_app())
    resp = await client.get(DIRECTORY)
    assert resp.headers["Cache-Control"] == "max-age=600"
    assert (await resp.json())["revocation_url"] == "https://cdn.example/revoked.json"
    assert (await client.get("/keys/revoked.json")).status == 200


async def test_a_registry_host_serves_each_agent_under_its_base_path(
    data: Path, aiohttp_client: Client
) -> None:
    alice, bob = KeyStore(data, "alice"), KeyStore(data, "bob")
    a, b = alice.create(1_800_000_000, lifetime_s=1000), bob.create(1_800_000_000, lifetime_s=1000)
    raw = publish_config(data, domain="registry.example", agents=["alice", "bob"])
    client = await aiohttp_client(server_for(raw, Clock(1_800_000_200)).build_app())
    for name, record in (("alice", a), ("bob", b)):
        base = f"/agents/{name}"
        resp = await client.get(base + DIRECTORY)
        assert resp.status == 200
        doc = await resp.json(content_type=None)
        assert doc["revocation_url"] == f"https://registry.example{base}{REVOCATIONS}"
        assert [k.thumbprint for k in parse_directory(json.dumps(doc).encode()).keys] == [record.thumbprint]
        manifest = await (await client.get(base + MANIFEST)).read()
        assert manifest == b'{"ver":"1.0","role":"ROLE_AGENT","domain":"registry.example"}'
        assert (await client.get(base + REVOCATIONS)).status == 200
    assert (await client.get("/agents/carol" + DIRECTORY)).status == 404


async def test_static_export_is_byte_identical_to_the_listener(
    tmp_path: Path, aiohttp_client: Client
) -> None:
    now = time.time()
    data = tmp_path / "data"
    store = KeyStore(data)
    first = store.create(now - 1000, lifetime_s=10**6)
    store.rotate(now - 500, grace_s=3600, lifetime_s=10**6)
    store.revoke(first.thumbprint, now - 100)
    KeyStore(data, "alice").create(now - 1000, lifetime_s=10**6)
    raw = publish_config(data, agents=["alice"], public_url="https://keys.agent.example/")
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "public"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "signing_proxy", "publish", "--config", str(config_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(
        [
            ".well-known/http-message-signatures-directory",
            ".well-known/http-message-signatures-revocations.json",
            ".well-known/svc.json",
            "agents/alice/.well-known/http-message-signatures-directory",
            "agents/alice/.well-known/http-message-signatures-revocations.json",
            "agents/alice/.well-known/svc.json",
        ]
    )
    client = await aiohttp_client(server_for(raw, Clock(time.time())).build_app())
    for rel in written:
        served = await (await client.get("/" + rel)).read()
        assert served == (out / rel).read_bytes(), rel
    assert json.loads((out / written[0]).read_text())["revocation_url"] == (
        "https://keys.agent.example" + REVOCATIONS
    )
    assert oct(os.stat(out / written[0]).st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    ("publish", "message"),
    [
        ({"listen": "127.0.0.1:0"}, "publish.domain: required"),
        ({"listen": "8443", "domain": "a.example"}, "publish.listen: must be HOST:PORT"),
        ({"domain": "not a domain"}, "publish.domain: must be a domain name"),
        ({"directory_max_age_s": 59}, "publish.directory_max_age_s: must be at least 60"),
        ({"directory_max_age_s": 86_401}, "publish.directory_max_age_s: must be at most 86400"),
        ({"revocation_path": "revoked.json"}, "publish.revocation_path"),
        ({"revocation_path": DIRECTORY}, "publish.revocation_path"),
        ({"revocation_path": "/agents/x.json"}, "publish.revocation_path"),
        ({"revocation_url": "/relative"}, "publish.revocation_url: must be an absolute"),
        ({"public_url": "https://a.example/?q"}, "publish.public_url"),
        ({"agents": ["Alice"]}, "publish.agents[0]: agent names"),
        ({"agents": ["a", "a"]}, "publish.agents: an agent is listed twice"),
        ({"mystery": 1}, "publish.mystery: unknown key"),
    ],
)
def test_publish_config_mistakes_name_their_key(publish: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"publish": publish})
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("name", ["public_url", "revocation_url"])
@pytest.mark.parametrize(
    "url",
    [
        "https://alice:s3cret@registry.example",
        "https://alice:s3cret@registry.example/rl.json",
        "https://registry.example@127.0.0.1/rl.json",  # looks like one host, is another
        "https://alice:s3cret@registry.example/rl json",  # refused anyway: it was shown
        "https://registry.example/rl.json?u=alice:s3cret@x",  # a query, with an '@': not shown
    ],
)
def test_publish_urls_with_userinfo_are_refused_without_showing_it(name: str, url: str) -> None:
    """``user:password@`` was accepted and published: the directory's revocation_url carried the
    password, and every verifier's egress (ours too) refuses userinfo, so the list was never
    fetched and every request signed with these keys failed closed (401 revocation-unavailable)."""
    with pytest.raises(ConfigError) as err:
        parse_config({"publish": {"listen": "127.0.0.1:0", "domain": "registry.example", name: url}})
    message = str(err.value)
    assert message.startswith(f"publish.{name}: "), message
    assert "user:password@" in message or "not shown" in message, message
    assert not any(part in message for part in ("s3cret", "alice", "127.0.0.1")), message


def test_publishing_a_static_signing_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"publish\.listen: publishing needs the key store"):
        parse_config(
            {"signing": {"key": "/k.pem"}, "publish": {"listen": "127.0.0.1:0", "domain": "a.example"}}
        )
    with pytest.raises(ConfigError, match=r"signing\.agent"):
        parse_config({"signing": {"agent": "../x"}})
    with pytest.raises(ConfigError, match=r"signing\.key_lifetime_s"):
        parse_config({"signing": {"key_lifetime_s": 60}})


async def test_a_registry_agent_gets_the_spec_directory_whatever_it_accepts(
    data: Path, aiohttp_client: Client
) -> None:
    """An agent of ``publish.agents`` asked for the drafts' media type was answered with it, and with
    no proof (we hold none of its private keys): a draft client ignores every such key, and
    protocol-02 has a directory's Signature-Agent be an origin, so ``/agents/<name>`` is no
    web-bot-auth directory. It now gets the spec's form (``application/jwk-set+json``) only; the
    root agent still gets the drafts' signed directory when it asks for it."""
    alice = KeyStore(data, "alice")
    record = alice.create(1_800_000_000, lifetime_s=1000)
    raw = publish_config(data, domain="registry.example", agents=["alice"])
    client = await aiohttp_client(server_for(raw, Clock(1_800_000_200)).build_app())
    web = "application/http-message-signatures-directory+json"
    for accept in (web, f"application/jwk-set+json;q=0.5, {web}"):
        resp = await client.get("/agents/alice" + DIRECTORY, headers={"Accept": accept})
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/jwk-set+json"
        assert "Signature" not in resp.headers
        assert "Signature-Input" not in resp.headers
        body = await resp.read()
        assert [k.thumbprint for k in parse_directory(body).keys] == [record.thumbprint]
        assert [key["alg"] for key in json.loads(body)["keys"]] == ["EdDSA"]  # the spec's form
    root = await client.get(DIRECTORY, headers={"Accept": web})
    assert root.headers["Content-Type"] == web
    assert "Signature" in root.headers
