"""``signing_proxy.client.Signer`` and the adapters' edges: loading the proxy's YAML, the profile as
one parameter, refusals that keep a request from being sent (no key, a body too large, a compressed
aiohttp body), hosts left unsigned, bearer credentials, fields the agent tried to set itself, the key
source looked at off the event loop once per interval, and every hop of an aiohttp redirect signed."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests
import yaml
from aiohttp import web

from signing_proxy.client import HttpxAuth, NotSigned, RequestsAuth, Signer, SigningMiddleware, key_file
from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import KeyProvider, StaticKeyProvider
from signing_proxy.errors import ConfigError
from tests.harness import VerifyingOrigin

KEY = SigningKey.from_seed(b"\x51" * 32)


class NoKey(KeyProvider):
    def current(self, now: float) -> SigningKey | None:
        return None


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as started:
        started.trust(KEY)
        yield started


def write_key(tmp_path: Path) -> Path:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    return path


def session(signer: Signer) -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.auth = RequestsAuth(signer)
    return s


def test_from_config_reads_the_proxys_yaml_and_its_key_file(tmp_path: Path) -> None:
    config = tmp_path / "signing-proxy.yaml"
    raw = {
        "signing": {"key": str(write_key(tmp_path)), "label": "bot", "signature_agent": "https://a.example"}
    }
    config.write_text(yaml.safe_dump(raw))
    signed = Signer.from_config(config).sign("GET", "https://o.example/x", [], b"")
    assert signed is not None
    assert signed.keyid == KEY.thumbprint
    fields = dict(signed.fields)
    assert fields["Signature-Agent"] == '"https://a.example"'
    assert fields["Signature-Input"].startswith('bot=("@method" "@target-uri" "content-digest" ')


def test_a_mistake_in_the_config_is_refused_with_its_key_path() -> None:
    with pytest.raises(ConfigError, match=r"^signing\.labl"):
        Signer.from_config({"signing": {"labl": "x"}}, keys=StaticKeyProvider(KEY))


def test_the_profile_is_one_parameter_and_only_known_ones_are_taken() -> None:
    assert Signer(StaticKeyProvider(KEY)).profile is None  # per host, as config.profiles says
    with pytest.raises(
        ConfigError, match=r"^profile: 'web' is not a known signing profile \(svc, web-bot-auth\)"
    ):
        Signer(StaticKeyProvider(KEY), profile="web")


@pytest.mark.parametrize("forced", [None, "web-bot-auth"])
def test_web_bot_auth_destinations_are_signed_under_their_profile(forced: str | None) -> None:
    """Per host from ``profiles.rules`` (as the proxy does), or forced by ``profile=``."""
    config = {"profiles": {"rules": [{"hosts": ["*.web.example"], "profile": "web-bot-auth"}]}}
    signer = Signer.from_config(config, keys=StaticKeyProvider(KEY))
    if forced is not None:
        signer = Signer(StaticKeyProvider(KEY), signer.config, profile=forced)
    web = signer.sign("GET", "https://www.web.example/page", [], b"")
    assert web is not None
    web_input = dict(web.fields)["Signature-Input"]
    assert 'tag="web-bot-auth"' in web_input
    assert '"@authority"' in web_input
    spec = signer.sign("GET", "https://exchange.example/x", [], b"")
    assert spec is not None
    spec_input = dict(spec.fields)["Signature-Input"]
    assert ("tag=" in spec_input) is (forced is not None)


def test_a_forced_web_bot_auth_profile_needs_an_origin_for_its_signature_agent_member() -> None:
    """``profile="web-bot-auth"`` skipped the check ``profiles.default`` gets and signed with
    ``agent="https://registry.example/agents/alice"``, a member a protocol-02 verifier ignores."""
    registry = parse_config({"signing": {"signature_agent": "https://registry.example/agents/alice"}})
    with pytest.raises(
        ConfigError, match=r"^profile: 'web-bot-auth' sends signing\.signature_agent .* no https origin"
    ):
        Signer(StaticKeyProvider(KEY), registry, profile="web-bot-auth")
    spec = Signer(StaticKeyProvider(KEY), registry, profile="svc").sign("GET", "https://o.example/", [], b"")
    assert spec is not None  # the spec's profile takes a directory base with a path
    assert dict(spec.fields)["Signature-Agent"] == '"https://registry.example/agents/alice"'
    origin = parse_config({"signing": {"signature_agent": "https://agent.example"}})
    web = Signer(StaticKeyProvider(KEY), origin, profile="web-bot-auth").sign(
        "GET", "https://o.example/", [], b""
    )
    assert web is not None
    assert dict(web.fields)["Signature-Agent"] == 'agent="https://agent.example"'


def test_a_relay_config_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^mode:"):
        Signer(StaticKeyProvider(KEY), parse_config({"mode": "relay"}))


def test_no_valid_key_refuses_and_nothing_is_sent(origin: VerifyingOrigin) -> None:
    with session(Signer(NoKey())) as s, pytest.raises(NotSigned) as refused:
        s.get(origin.url("/x"), timeout=15)
    assert (refused.value.status, refused.value.reason) == (503, "no-valid-signing-key")
    assert origin.arrivals == []


def test_an_in_memory_body_above_the_limit_is_refused(origin: VerifyingOrigin) -> None:
    signer = Signer(StaticKeyProvider(KEY), parse_config({"limits": {"max_body_bytes": 1000}}))
    with httpx.Client(auth=HttpxAuth(signer), trust_env=False) as c, pytest.raises(NotSigned) as refused:
        c.post(origin.url("/x"), content=b"a" * 1001)
    assert refused.value.reason == "body-too-large"
    assert origin.arrivals == []


def test_a_file_body_is_refused_on_its_declared_length_or_read_and_signed(
    tmp_path: Path, origin: VerifyingOrigin
) -> None:
    signer = Signer(StaticKeyProvider(KEY), parse_config({"limits": {"max_body_bytes": 1000}}))
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(b"b" * 1001)
    small.write_bytes(b"s" * 1000)
    with session(signer) as s:
        with big.open("rb") as fh:
            with pytest.raises(NotSigned, match="body-too-large"):
                s.put(origin.url("/big"), data=fh, timeout=15)
            assert fh.tell() == 0  # refused on its declared length, before a byte was read
        with small.open("rb") as fh:
            assert s.put(origin.url("/small"), data=fh, timeout=15).status_code == 200
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.oracle, arrival.body) == (True, "ok", b"s" * 1000)


async def test_an_aiohttp_compressed_body_is_refused(origin: VerifyingOrigin) -> None:
    middleware = SigningMiddleware(Signer(StaticKeyProvider(KEY)))
    async with aiohttp.ClientSession(middlewares=(middleware,), trust_env=False) as s:
        with pytest.raises(NotSigned, match="compressed-body"):
            await s.post(origin.url("/x"), data=b"x" * 100, compress="deflate")
        async with s.post(origin.url("/file"), data=io.BytesIO(b"from a file")) as response:
            assert response.status == 200
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.oracle, arrival.body) == (True, "ok", b"from a file")


def test_an_unsigned_host_is_sent_as_it_is(origin: VerifyingOrigin) -> None:
    signer = Signer(StaticKeyProvider(KEY), parse_config({"hosts": {"unsigned": ["127.0.0.1"]}}))
    assert signer.sign("GET", origin.url("/x"), [], b"") is None
    with session(signer) as s:
        assert s.get(origin.url("/x"), timeout=15).status_code == 200
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.reason) == (False, "missing-signature")
    assert arrival.header("signature") is None


def test_a_bearer_credential_is_injected_and_covered(origin: VerifyingOrigin) -> None:
    rule = {"hosts": ["127.0.0.1"], "bearer_env": "TOKEN", "allow_plaintext": True}
    signer = Signer(
        StaticKeyProvider(KEY), parse_config({"credentials": [rule]}), environ={"TOKEN": "s3cret"}
    )
    with httpx.Client(auth=HttpxAuth(signer), trust_env=False) as c:
        assert c.get(origin.url("/x")).status_code == 200
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.oracle) == (True, "ok")
    assert arrival.header("authorization") == "Bearer s3cret"


def test_fields_the_agent_set_itself_are_replaced_not_doubled(origin: VerifyingOrigin) -> None:
    forged = {"Signature": "agent=:AAAA:", "Signature-Input": "agent=();created=1", "Content-Digest": "x"}
    with session(Signer(StaticKeyProvider(KEY))) as s:
        assert s.post(origin.url("/x"), data=b"body", headers=forged, timeout=15).status_code == 200
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.oracle) == (True, "ok")
    names = [n.lower() for n, _ in arrival.lines]
    assert names.count("signature") == names.count("signature-input") == names.count("content-digest") == 1


def test_a_malformed_url_is_refused() -> None:
    with pytest.raises(NotSigned) as refused:
        Signer(StaticKeyProvider(KEY)).sign("GET", "not a url", [], b"")
    assert refused.value.status == 400


def test_key_file_refuses_a_file_readable_by_others(tmp_path: Path) -> None:
    path = write_key(tmp_path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^signing\.key: "):
        key_file(path)


class CountingStore(StaticKeyProvider):
    """A reloadable key source that records the thread each reload ran on."""

    def __init__(self, key: SigningKey) -> None:
        super().__init__(key)
        self.threads: list[int] = []

    def reload(self, *, force: bool = False) -> bool:
        self.threads.append(threading.get_ident())
        return True


async def test_the_async_adapters_look_at_the_key_source_off_the_event_loop(origin: VerifyingOrigin) -> None:
    keys = CountingStore(KEY)
    signer = Signer(keys, refresh_every_s=0)
    loop_thread = threading.get_ident()
    async with httpx.AsyncClient(auth=HttpxAuth(signer), trust_env=False) as c:
        assert (await c.get(origin.url("/httpx"))).status_code == 200
    middlewares = (SigningMiddleware(signer),)
    async with (
        aiohttp.ClientSession(middlewares=middlewares, trust_env=False) as s,
        s.get(origin.url("/a")) as r,
    ):
        assert r.status == 200
    assert len(keys.threads) == 2
    assert loop_thread not in keys.threads
    with session(signer) as sync:  # a sync client looks on its own thread, when due
        assert sync.get(origin.url("/requests"), timeout=15).status_code == 200
    assert keys.threads[2] == loop_thread
    assert all(a.verified for a in origin.arrivals)


def test_the_key_source_is_looked_at_once_per_interval() -> None:
    now = [100.0]
    keys = CountingStore(KEY)
    signer = Signer(keys, refresh_every_s=1.0, monotonic=lambda: now[0])
    auth = RequestsAuth(signer)
    for step in (0.0, 0.5, 0.6, 0.1, 1.0):
        now[0] += step
        auth(requests.Request("GET", "https://o.example/").prepare())
    assert len(keys.threads) == 2  # at 101.1 and 102.2, not in between


async def test_aiohttp_signs_every_hop_of_a_redirect() -> None:
    async def redirect_once(request: web.Request) -> web.StreamResponse:
        if request.path == "/start":
            raise web.HTTPFound("/final?x=1")
        return web.Response(text="ok")

    with VerifyingOrigin(handler=redirect_once) as origin:
        origin.trust(KEY)
        middlewares = (SigningMiddleware(Signer(StaticKeyProvider(KEY))),)
        session = aiohttp.ClientSession(middlewares=middlewares, trust_env=False)
        async with session as s, s.get(origin.url("/start")) as response:
            assert (response.status, await response.text()) == (200, "ok")
    assert [a.target_uri.split("/", 3)[3] for a in origin.arrivals] == ["start", "final?x=1"]
    assert all(a.verified and a.oracle == "ok" for a in origin.arrivals)
