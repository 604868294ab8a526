"""Cloudflare's verifiers (npm, run under node) accept what the proxy emits for web-bot-auth destinations.

A real ``signing-proxy run`` process with a ``profiles`` rule naming 127.0.0.1 as a web-bot-auth
destination; a node origin (``tests/node/wba_origin.mjs``) checks every request it receives with
the ``web-bot-auth`` package's ``verify`` and with Cloudflare's ``http-message-sig`` 0.3
``verifySignature`` under the web-bot-auth policy, and answers its verdicts. Requests go through
``HTTP_PROXY`` to a plain origin and through ``HTTPS_PROXY`` (TLS interception with our CA) to an
HTTPS origin, with the Signature-Agent in the drafts' Dictionary form, in their legacy String form,
and without one. ``web-bot-auth`` 0.1.3 (the current release) builds the signature base of a
``"signature-agent";key=…`` component from the whole field, not the member (RFC 9421 2.1.2): the
Dictionary form is checked with the 0.3 library, which does it right, the other two with both.
The publication listener's signed directory is checked by the 0.3 library too
(``tests/node/wba_directory.mjs``): every key's proof holds, a changed body or another authority fails.
Requests built here are checked by both (``tests/node/wba_verify.mjs``) next to our verifier.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.config import parse_config
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Component, Message, VerificationKey, signature_base, verify_stack
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.storage.ca import CertificateAuthority
from signing_proxy.storage.keystore import KeyStore
from tests.harness import WAIT_S, ProxyProcess, proxy_env, stop_process, wait_for
from tests.proxy import test_profiles as chain  # its agent -> relay helpers (no test collected)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("node") is None
        or not (Path(__file__).parents[1] / "node/node_modules/web-bot-auth").is_dir(),
        reason="node and tests/node/node_modules (npm ci in tests/node) are needed",
    ),
]

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
KEY = SigningKey.generate()
AGENT = "https://agent.example"


class NodeOrigin:
    """``node wba_origin.mjs`` on 127.0.0.1 port 0 (read back from its first line); stopped by PID."""

    def __init__(self, cert: Path | None = None, key: Path | None = None) -> None:
        self.args = [str(cert), str(key)] if cert is not None and key is not None else []
        self.scheme = "https" if self.args else "http"
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> NodeOrigin:
        jwk = json.dumps(KEY.public.jwk())
        self.proc = subprocess.Popen(
            ["node", "wba_origin.mjs", jwk, *self.args],
            cwd=NODE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(WAIT_S)
        if not first or not first[0].startswith("listening "):
            self.__exit__()
            raise RuntimeError(f"node origin did not start: {first}")
        self.port = int(first[0].split()[1])
        return self

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        if self.proc is not None:
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wba-pki")
    ca = CertificateAuthority.generate()
    (tmp / "ca.pem").write_bytes(ca.cert_pem())
    (tmp / "leaf.pem").write_bytes(ca.mint_leaf("127.0.0.1"))
    (tmp / "leaf-key.pem").write_bytes(ca.leaf_key_pem())
    return {"ca": tmp / "ca.pem", "cert": tmp / "leaf.pem", "key": tmp / "leaf-key.pem"}


@dataclass
class Origins:
    plain: NodeOrigin
    tls: NodeOrigin
    ca: Path  # the HTTPS origin's CA (pinned for 127.0.0.1 in the proxy)


@pytest.fixture(scope="module")
def origins(pki: dict[str, Path]) -> Iterator[Origins]:
    with NodeOrigin() as plain, NodeOrigin(pki["cert"], pki["key"]) as tls:
        yield Origins(plain, tls, pki["ca"])


def _proxy(tmp: Path, origins: Origins, agent: str, form: str) -> ProxyProcess:
    rule: dict[str, Any] = {"hosts": ["127.0.0.1"], "profile": "web-bot-auth", "signature_agent": form}
    config = {
        "log": {"format": "json"},
        "signing": {"signature_agent": agent},
        "profiles": {"rules": [rule]},
        "upstream": {"pin_ca_files": {"127.0.0.1": str(origins.ca)}},
        "intercept": {"allowed_ports": [origins.tls.port]},
    }
    return ProxyProcess(tmp, config, key=KEY)


CASES = [
    pytest.param((AGENT, "dictionary", ("http_message_sig",)), id="signature-agent-dictionary"),
    pytest.param((AGENT, "string", ("web_bot_auth", "http_message_sig")), id="signature-agent-legacy-string"),
    pytest.param(("", "dictionary", ("web_bot_auth", "http_message_sig")), id="no-signature-agent"),
]


@pytest.mark.parametrize("case", CASES)
def test_cloudflare_verifiers_accept_the_proxys_web_bot_auth_requests(
    case: tuple[str, str, tuple[str, ...]], tmp_path: Path, origins: Origins, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, form, verifiers = case
    plain, tls = origins.plain, origins.tls
    with _proxy(tmp_path, origins, agent, form) as proxy, proxy_env(monkeypatch, proxy.url, https=True):
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "data" / "ca.pem"))
        with requests.Session() as session:
            verdicts = [
                session.get(plain.url("/page?q=1"), timeout=WAIT_S).json(),
                session.get(tls.url("/page?q=2"), timeout=WAIT_S).json(),
            ]

        def gets() -> list[dict[str, Any]]:
            return [d for d in proxy.access_lines() if d["method"] == "GET"]

        wait_for(lambda: len(gets()) == 2, "both requests' access-log lines")
        lines = gets()
    for verdict in verdicts:
        headers = verdict["headers"]
        assert 'tag="web-bot-auth"' in headers["signature-input"]
        if agent and form == "dictionary":
            assert headers["signature-agent"] == f'agent="{agent}"'
            assert '"signature-agent";key="agent"' in headers["signature-input"]
        elif agent:
            assert headers["signature-agent"] == f'"{agent}"'
        else:
            assert "signature-agent" not in headers
        for name in verifiers:
            assert verdict[name] == "ok", (name, verdict)
    assert verdicts[0]["url"].startswith("http://")
    assert verdicts[1]["url"].startswith("https://")
    assert [d.get("profile") for d in lines] == ["web-bot-auth", "web-bot-auth"]


def test_the_verifiers_can_refuse(tmp_path: Path, origins: Origins, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec's profile (no tag, no @authority) is refused by both: the origin's checks are real."""
    plain = origins.plain
    config = {"signing": {"signature_agent": AGENT}, "profiles": {"default": "svc"}}
    with ProxyProcess(tmp_path, config, key=KEY) as proxy, proxy_env(monkeypatch, proxy.url):
        verdict = requests.get(plain.url("/svc"), timeout=WAIT_S).json()
    assert verdict["web_bot_auth"].startswith("refused")
    assert verdict["http_message_sig"].startswith("refused")


# --- the signed directory, checked by Cloudflare's http-message-sig under the directory draft's rules ---


def _directory_verdicts(url: str, authority: str, *extra: str) -> dict[str, str]:
    done = subprocess.run(
        ["node", "wba_directory.mjs", url, authority, *extra],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verdicts: dict[str, str] = json.loads(done.stdout)
    return verdicts


def test_cloudflare_accepts_every_key_proof_of_the_published_directory(tmp_path: Path) -> None:
    now = int(time.time())
    store = KeyStore(tmp_path / "data")
    store.create(now - 60, lifetime_s=86_400)
    store.rotate(now, grace_s=3600, lifetime_s=86_400)  # a current and a next key, both published
    thumbprints = {r.thumbprint for r in store.load(private=False).records}
    config = {
        "signing": {"key": None},
        "publish": {"listen": "127.0.0.1:0", "domain": "dir.example", "public_url": "https://dir.example"},
    }
    with ProxyProcess(tmp_path, config) as proxy:
        wait_for(lambda: proxy.publish_port != 0, "the publication listener")
        url = f"http://127.0.0.1:{proxy.publish_port}/.well-known/http-message-signatures-directory"
        good = _directory_verdicts(url, "dir.example")
        tampered = _directory_verdicts(url, "dir.example", "--tamper")
        foreign = _directory_verdicts(url, "127.0.0.1")
    assert good.pop("content_type") == "application/http-message-signatures-directory+json"
    assert good == dict.fromkeys(thumbprints, "ok")
    tampered.pop("content_type")
    assert set(tampered) == thumbprints
    assert all(v.startswith("refused: content-digest") for v in tampered.values())
    foreign.pop("content_type")
    assert all(v.startswith("refused") for v in foreign.values())


@pytest.mark.parametrize("written", ["0:0:0:0:0:ffff:7f00:1", "::FFFF:127.0.0.1"])
def test_cloudflare_verifiers_accept_an_ipv6_literal_as_the_proxy_spells_it(
    written: str, tmp_path: Path, origins: Origins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy signed and sent an IPv6 literal as the client wrote it; Cloudflare's verifiers
    rebuild ``@authority`` from a WHATWG URL, which compresses it, and refused the request. (An
    IPv4-mapped address reaches the loopback origin without an IPv6 listener.)"""
    config = {"signing": {"signature_agent": ""}, "profiles": {"default": "web-bot-auth"}}
    with ProxyProcess(tmp_path, config, key=KEY) as proxy, proxy_env(monkeypatch, proxy.url):
        url = f"http://[{written}]:{origins.plain.port}/v6"
        verdict = requests.get(url, timeout=WAIT_S).json()
    assert verdict["headers"]["host"] == f"[::ffff:7f00:1]:{origins.plain.port}"
    assert (verdict["web_bot_auth"], verdict["http_message_sig"]) == ("ok", "ok"), verdict


# --- requests built here, checked by Cloudflare's verifiers and ours ---------------------------------


def _node_verdicts(keys: tuple[SigningKey, ...], cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``wba_verify.mjs``'s verdicts: per case, ``web_bot_auth`` and ``http_message_sig`` per label."""
    stdin = json.dumps({"keys": {k.thumbprint: k.public.jwk() for k in keys}, "cases": cases})
    done = subprocess.run(
        ["node", "wba_verify.mjs"],
        cwd=NODE_DIR,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verdicts: dict[str, Any] = json.loads(done.stdout)
    return verdicts


def _case(url: str, fields: Fields, now: float, labels: dict[str, list[list[str | None]]]) -> dict[str, Any]:
    headers = {name.lower(): fields.combined(name) for name, _value in fields}
    return {"url": url, "method": "GET", "headers": headers, "now": int(now), "labels": labels}


def _ours(url: str, fields: Fields, now: float, *keys: SigningKey) -> str:
    by_id = {k.thumbprint: k.public for k in keys}
    try:
        verify_stack(
            Message("GET", parse_absolute_uri(url), fields),
            b"",
            lambda entry, _index: VerificationKey(by_id[entry.keyid or ""]),
            now=now,
        )
    except VerificationError as exc:
        return f"refused: {exc.reason}"
    return "ok"


def test_a_token_tag_is_refused_by_cloudflare_and_by_us() -> None:
    """RFC 9421 2.3: tag is a String. The Token ``web-bot-auth`` is "not web-bot-auth" to both
    Cloudflare verifiers; ours took it for the web profile (http-sf's Token equals its text)."""
    now = int(time.time())
    url = "https://shop.example/cart"
    cases, ours = {}, {}
    authority = (Component("@authority"),)
    for name, tag in (("string", '"web-bot-auth"'), ("token", "web-bot-auth")):
        fields = Fields(())
        params = f'("@authority");keyid="{KEY.thumbprint}";alg="ed25519";created={now};expires={now + 300}'
        params += f";tag={tag}"
        message = Message("GET", parse_absolute_uri(url), fields)
        signature = KEY.sign(signature_base(message, authority, params))
        fields.add("Signature-Input", f"agent={params}")
        fields.add("Signature", f"agent=:{base64.b64encode(signature).decode()}:")
        cases[name] = _case(url, fields, now, {"agent": [["@authority", None]]})
        ours[name] = _ours(url, fields, now + 1, KEY)
    verdicts = _node_verdicts((KEY,), cases)
    assert verdicts["string"] == {"web_bot_auth": "ok", "http_message_sig": {"agent": "ok"}}
    assert verdicts["token"]["web_bot_auth"] == "refused: tag must be 'web-bot-auth'"
    assert verdicts["token"]["http_message_sig"]["agent"] == "refused: tag must be a string"
    assert ours == {"string": "ok", "token": "refused: unsupported-tag"}


def test_a_relay_chain_on_an_agent_without_signature_agent_verifies_at_cloudflare_and_here() -> None:
    """The agent sends no Signature-Agent (arch-05; its key pinned), the relay adds and covers its
    own member: each label verifies under Cloudflare's 0.3 library with the web-bot-auth policy
    (the agent's requiring ``@authority``, the relay's also its member), and the stack at ours,
    which refused it (the agent's label "does not cover the Signature-Agent sent")."""
    url = "https://www.shop.example/cart"
    agent_config = parse_config({"signing": {"signature_agent": ""}, "profiles": chain.RULES})
    first = chain._prepare(url, ProfileSelector(agent_config.profiles), agent_config)
    relay = chain._relay(profiles=chain.RULES)
    target = parse_absolute_uri(url)
    out = asyncio.run(relay.prepare("GET", target, list(chain._fields(first)), b"", framed=False))
    fields = chain._fields(out)
    assert fields.combined("signature-agent") == 'broker="https://broker.example"'
    labels: dict[str, list[list[str | None]]] = {
        "agent": [["@authority", None]],
        "broker": [["@authority", None], ["signature-agent", "broker"]],
    }
    verdicts = _node_verdicts(
        (chain.AGENT, chain.BROKER), {"chain": _case(url, fields, chain.NOW + 1, labels)}
    )
    assert verdicts["chain"]["http_message_sig"] == {"agent": "ok", "broker": "ok"}
    assert _ours(url, fields, chain.NOW + 1, chain.AGENT, chain.BROKER) == "ok"
