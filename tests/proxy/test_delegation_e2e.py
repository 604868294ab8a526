"""End to end: owner issues, principal extends to the proxy's key (CLI), the proxy injects the
requester into a DiscoverResources call from an unmodified client (HTTP_PROXY), and a test exchange
built on ``gateway_middleware`` checks layer 1, the requester and the delegation chain, bound to
the key that signed the request, then answers offers filtered by the delegated scopes.

The exchange is given no key: it resolves the agent's key from the directory the proxy's publish
listener serves (named by Signature-Agent), like a real exchange. Its only trust anchor for the
delegation is the owner's public key.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from aiohttp import web

from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.keys import parse_rfc3339
from signing_proxy.storage.keystore import KeyStore
from signing_proxy.verify import (
    GATEWAY,
    DirectoryResolver,
    EgressPolicy,
    GatewayVerifier,
    HttpClient,
    IssuerAnchor,
    RequestVerifier,
    RevocationPoller,
    SqliteCounterStore,
    VerifierPolicy,
    apply_disclosure,
    gateway_middleware,
    http_fetcher,
)
from signing_proxy.verify.issuers import IssuerKeys
from tests.harness import WAIT_S, OnItsOwnLoop, ProxyProcess, free_port, proxy_env

pytestmark = pytest.mark.integration

DISCOVER = "/v1/svc.v1.ExchangeService/DiscoverResources"
CATALOG = {  # resource -> the scope it requires
    "https://pub.example/us/ca/article": "dist:US:CA",
    "https://pub.example/us/ny/article": "dist:US:NY",
    "https://pub.example/eu/article": "dist:EU",
    "https://pub.example/news/daily": "subscription:news",
}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )


def ok(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Received:
    body: dict[str, Any]
    keyid: str
    directory: str | None


@dataclass
class Exchange(OnItsOwnLoop):
    """An exchange on the package's embedding API: ``gateway_middleware`` runs layer 1 (keys from the
    agent's directory), requester ingest and layer 3 (the owner key as the only anchor of the
    chain, bound to the request's signer), and ``apply_disclosure`` answers offers by scope."""

    thread_name = "exchange"

    data_dir: Path
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _gateway: GatewayVerifier | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def trust_owner(self, key: PublicKey) -> None:
        assert self._gateway is not None
        self._gateway.issuers.trusted = {"https://owner.example": IssuerAnchor(keys=(key,))}

    async def discover(self, request: web.Request) -> web.Response:
        verdict = request[GATEWAY]  # present only when every step passed
        body = json.loads(await request.read())
        self.received.append(Received(body, verdict.stack.agent.keyid, verdict.stack.directory))
        groups = [
            {"uri": uri, "offers": [{"scope": required, "pricing": pricing(required)}]}
            for uri, required in CATALOG.items()
            if uri in body.get("uris", [])
        ]
        # the chain's narrowest scopes (the token's claims), or the declared ones; none: everything public
        shown = apply_disclosure(
            groups, verdict.scopes, lambda g: CATALOG[g["uri"]], policy="reveal", default_scopes=("*",)
        )
        return web.json_response({"offer_groups": shown})

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        client: HttpClient | None = None
        runner: web.AppRunner | None = None

        async def start() -> None:
            nonlocal client, runner
            client = HttpClient.standalone()  # no upstream.next_hop: directory fetches go direct
            loopback = EgressPolicy(allow_private=("127.0.0.1/32",))  # the directory hosts of this test
            fetch = http_fetcher(client, egress=loopback)
            # Directories re-fetched every second: a rotation shows up at once (real ones cache longer).
            resolver = DirectoryResolver(fetch, floor_s=0.5, ceiling_s=1.0)
            revocations = RevocationPoller(fetch)
            verifier = RequestVerifier(resolver, VerifierPolicy(), revocations=revocations, egress=loopback)
            self._gateway = GatewayVerifier(
                verifier,
                IssuerKeys(resolver, revocations, loopback),
                SqliteCounterStore(self.data_dir / "counters.sqlite3"),  # the chain caps max_accesses
            )
            app = web.Application(middlewares=[gateway_middleware(self._gateway)])
            app.router.add_post(DISCOVER, self.discover)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.port = runner.addresses[0][1]

        async def stop() -> None:
            if runner is not None:
                await runner.cleanup()
            if self._gateway is not None:
                await self._gateway.close()
            if client is not None:
                await client.close()

        loop.run_until_complete(start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(stop())
        loop.close()


def pricing(required: str) -> str:
    return "subscription" if required.startswith("subscription:") else "per_request"


def write_key(path: Path) -> SigningKey:
    key = SigningKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.to_pem())
    return key


@dataclass
class Setup:
    tmp: Path
    config: dict[str, Any]
    config_path: Path
    token_file: Path
    owner: SigningKey
    authority: str

    def store_key(self) -> str:
        chosen = KeyStore(self.tmp / "data").load(private=False).signing_record(time.time())
        assert chosen is not None
        return chosen.thumbprint

    def extend(self, *holder: str) -> str:
        """The principal extends the authority JWT (CLI) to ``holder``, narrowing; into the token file."""
        chain = ok(
            "delegate",
            "extend",
            self.authority,
            "--principal-key",
            str(self.tmp / "principal.pem"),
            *holder,
            "--scope",
            "dist:US:CA",
            "--scope",
            "subscription:news",
            "--expires",
            "1h",
        )
        self.token_file.write_text(chain + "\n")
        return chain


@contextmanager
def delegated_setup(tmp: Path, exchange_base: str, *, max_accesses: int = 100) -> Iterator[Setup]:
    """Keys, a proxy config with the requester, the proxy's key store, and the owner's authority JWT
    (capped at ``max_accesses`` a day: every chain re-issued from it shares that count)."""
    owner = write_key(tmp / "owner.pem")
    write_key(tmp / "principal.pem")
    port = free_port()
    publish = f"http://127.0.0.1:{port}"
    token_file = tmp / "delegation.jwt"
    config: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp / "data"),
        "log": {"format": "json"},
        "signing": {"key": None, "signature_agent": publish},  # the key store signs
        "publish": {"listen": f"127.0.0.1:{port}", "domain": "agent.example", "public_url": publish},
        "requester": {
            "id": "agent-7",
            "domain": "agent.example",
            "type": "REQUESTER_TYPE_DELEGATED",
            "name": "Research assistant",
            "scopes": ["dist:US:CA", "subscription:news"],
            "exchanges": [exchange_base],
            "delegation": {
                "token_file": str(token_file),
                "principal_domain": "corp.example",
                "principal_id": "alice@corp.example",
            },
        },
    }
    config_path = tmp / "config.yaml"  # the file ProxyProcess runs with (it rewrites the same content)
    config_path.write_text(yaml.safe_dump(config))
    ok("keys", "rotate", "--config", str(config_path))  # the proxy's first key, before it ever ran
    authority = ok(
        "delegate",
        "issue",
        "--owner-key",
        str(tmp / "owner.pem"),
        "--iss",
        "https://owner.example",
        "--holder-key",
        str(tmp / "principal.pem"),
        "--scope",
        "dist:US:*",
        "--scope",
        "subscription:news",
        "--expires",
        "2h",
        "--max-spend-cents",
        "10000",
        "--max-accesses",
        str(max_accesses),
        "--quota-period",
        "1d",
    )
    yield Setup(tmp, config, config_path, token_file, owner, authority)


def discover_body(*uris: str, requester: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ver": "1.0",
        "exchange": "127.0.0.1",
        "uris": list(uris),
        "acceptable_restrictions": [
            {"axis": "RESTRICTION_KIND_FUNCTION", "values": ["SUMMARIZE", "RETRIEVE"]}
        ],
    }
    if requester is not None:
        body["requester"] = requester
    return body


def test_owner_principal_proxy_exchange_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Exchange(tmp_path) as exchange, delegated_setup(tmp_path, exchange.base) as setup:
        exchange.trust_owner(setup.owner.public)
        chain = setup.extend("--holder-config", str(setup.config_path))  # bound to the proxy's own key
        proxy_jkt = setup.store_key()
        assert chain.split("~")[0] == setup.authority
        with ProxyProcess(tmp_path, setup.config) as proxy, proxy_env(monkeypatch, proxy.url):
            sent = discover_body(*CATALOG)
            resp = requests.post(
                exchange.base + "/svc.v1.ExchangeService/DiscoverResources", json=sent, timeout=WAIT_S
            )
            assert resp.status_code == 200, resp.text
            groups = {g["uri"]: g for g in resp.json()["offer_groups"]}
            # Filtered by the declared scopes (each covered by the delegation), not the owner's wider grant.
            assert groups["https://pub.example/us/ca/article"]["offers"] == [
                {"scope": "dist:US:CA", "pricing": "per_request"}
            ]
            assert groups["https://pub.example/news/daily"]["offers"][0]["pricing"] == "subscription"
            for gated in ("https://pub.example/us/ny/article", "https://pub.example/eu/article"):
                assert groups[gated] == {
                    "uri": gated,
                    "absence_reason": "OFFER_ABSENCE_REASON_SCOPE_INSUFFICIENT",
                }

            (arrived,) = exchange.received
            assert arrived.keyid == proxy_jkt  # layer 1: signed by the proxy's store key ...
            assert (
                arrived.directory == setup.config["signing"]["signature_agent"]
            )  # ... found in its directory
            received = arrived.body
            assert {k: v for k, v in received.items() if k != "requester"} == sent  # the client's body intact
            requester = received["requester"]
            assert requester["id"] == "agent-7"
            assert requester["type"] == "REQUESTER_TYPE_DELEGATED"
            assert requester["scopes"] == ["dist:US:CA", "subscription:news"]
            d = requester["delegation"]
            assert base64.b64decode(d["token"]).decode() == chain
            assert d["token_format"] == "jwt"
            assert d["principal_domain"] == "corp.example"
            assert d["scopes"] == ["dist:US:CA", "subscription:news"]
            assert d["max_spend_cents"] == "10000"
            assert d["max_accesses"] == 100
            assert d["quota_period"] == "86400s"
            assert abs(parse_rfc3339(d["expires_at"]) - (time.time() + 3600)) < 120

            # A client that sends its own requester is forwarded as it wrote it (no double injection).
            own = {
                "id": "public-bot",
                "domain": "bot.example",
                "type": "REQUESTER_TYPE_AGENT",
                "scopes": ["dist:EU"],
            }
            resp = requests.post(
                exchange.base + "/svc.v1.ExchangeService/DiscoverResources",
                json=discover_body(*CATALOG, requester=own),
                timeout=WAIT_S,
            )
            assert resp.status_code == 200, resp.text
            assert exchange.received[-1].body["requester"] == own
            offered = [g["uri"] for g in resp.json()["offer_groups"] if "offers" in g]
            assert offered == ["https://pub.example/eu/article"]

            # The operator's own check agrees with the exchange.
            jwks = tmp_path / "owner.jwks"
            jwks.write_text(json.dumps({"keys": [setup.owner.public.jwk()]}))
            verdict = ok(
                "delegate",
                "verify",
                chain,
                "--owner-jwks",
                str(jwks),
                "--holder-config",
                str(setup.config_path),
            )
            assert verdict.startswith("ok: 2 link(s)")


def test_a_chain_bound_to_another_key_refuses_to_start(tmp_path: Path) -> None:
    with delegated_setup(tmp_path, "http://127.0.0.1:9/v1") as setup:
        other = SigningKey.generate()
        chain = setup.extend(f"--holder-jkt={other.thumbprint}")
        done = subprocess.run(
            [sys.executable, "-m", "signing_proxy", "run", "--config", str(setup.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        )
        assert done.returncode == 2, done.stderr
        assert "listening on" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "signing-proxy: requester.delegation: the chain is bound to key " + other.thumbprint
        )
        assert setup.store_key() in last
        assert "signing-proxy delegate extend" in last
        assert "--holder-config" in last
        assert "key rotation" in last
        for part in chain.replace("~", ".").split("."):
            assert part not in done.stderr  # no piece of the token in the output
