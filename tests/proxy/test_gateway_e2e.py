"""End to end with real processes: agent proxy -> relay -> gateway -> backend, every refusal with its
exact status and reason, and the X-Verified-* fields the backend receives.

The agent proxy and the relay sign from their key stores and publish their directories on
loopback; the gateway resolves the agent's key from Signature-Agent and the relay's from
``gateway.broker_directories``, and a delegation's authority JWT against the issuer's directory
(``gateway.trusted_issuers``: current key, one rotated out within ``issuer_key_grace_s`` and one
after it). The client writes the requester itself (the agent proxy inserts none), so chains the
agent proxy would refuse to inject can be sent.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.core.delegation import extend_chain, issue_authority
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.jws import sign_jwt
from signing_proxy.core.signatures import Component, Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_received_uri
from signing_proxy.storage.keystore import KeyStore
from tests.harness import WAIT_S, ProxyProcess, free_port
from tests.proxy.gateway_backend import DISCOVER, OWNER_ISS, Backend, exchange_body, issuer_key

pytestmark = pytest.mark.integration

GRACE_S = 3600
CHALLENGE = 'Signature realm="signing-proxy"'  # WWW-Authenticate of every 401


def hop(tmp: Path, *, mode: str, label: str, next_hop: int | None = None, **extra: Any) -> dict[str, Any]:
    """A signing hop with a key store and a publish listener (its directory) on loopback."""
    tmp.mkdir()
    publish = free_port()
    base = f"http://127.0.0.1:{publish}"
    config: dict[str, Any] = {
        "mode": mode,
        "log": {"format": "json"},
        "signing": {"key": None, "label": label, **({"signature_agent": base} if mode == "agent" else {})},
        "publish": {"listen": f"127.0.0.1:{publish}", "domain": "127.0.0.1", "public_url": base},
        "egress": {"allow_private": ["127.0.0.1/32"]},
        **extra,
    }
    if next_hop is not None:
        config["upstream"] = {"next_hop": f"http://127.0.0.1:{next_hop}"}
    return config


def gateway_config(backend: Backend, relay_publish: str, **gateway: Any) -> dict[str, Any]:
    return {
        "mode": "gateway",
        "log": {"format": "json"},
        "egress": {"allow_private": ["127.0.0.1/32"]},
        "gateway": {
            "upstream": backend.url,
            "broker_directories": [relay_publish],
            "trusted_issuers": {OWNER_ISS: {"directory": backend.issuer_directory}},
            "issuer_key_grace_s": GRACE_S,
            "understood_extensions": ["acme:billing"],
            **gateway,
        },
    }


def web_too(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` accepting web-bot-auth labels too (a gateway's default is the spec's profile only)."""
    return {**config, "verify": {"web_bot_auth": True}}


def signing_key(data_dir: Path) -> SigningKey:
    key = KeyStore(data_dir).load(private=True).signing_key(time.time())
    assert key is not None
    return key


@dataclass
class World:
    backend: Backend
    agent: ProxyProcess
    gateway: ProxyProcess
    capped: ProxyProcess  # gateway.max_hops: 1
    agent_key: SigningKey
    relay_jkt: str
    owner: SigningKey
    rotated_within: SigningKey
    rotated_after: SigningKey
    principal: SigningKey
    agent_directory: str  # the agent's publish listener
    web_key: SigningKey  # pinned at the gateway: a web-bot-auth member over http names no directory

    def post(self, body: bytes, gateway: ProxyProcess | None = None, **headers: str) -> requests.Response:
        url = f"{(gateway or self.gateway).url}{DISCOVER}"
        headers = {"Content-Type": "application/json", **headers}
        return requests.post(
            url, data=body, headers=headers, proxies={"http": self.agent.url}, timeout=WAIT_S
        )

    def authority(self, owner: SigningKey | None = None) -> str:
        now = int(time.time())
        return issue_authority(
            owner or self.owner, iss=OWNER_ISS, holder_jkt=self.principal.thumbprint,
            now=now, scope=["dist:US:*", "subscription:news"], exp=now + 3600,
        )  # fmt: skip

    def chain(self, holder: str | None = None, owner: SigningKey | None = None) -> str:
        return extend_chain(
            self.authority(owner),
            self.principal,
            holder_jkt=holder or self.agent_key.thumbprint,
            now=time.time(),
            scope=["dist:US:CA"],
            exp=int(time.time()) + 1800,
        )

    def child(self, **claims: Any) -> str:
        """A hand-made principal link (what extend_chain would refuse to write)."""
        claims = {"iss": "urn:principal", "cnf": {"jkt": self.agent_key.thumbprint}, **claims}
        return self.authority() + "~" + sign_jwt(claims, self.principal, {"jwk": self.principal.public.jwk()})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gateway")
    owner, within, after = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    with Backend() as backend:
        backend.directories["issuer"] = [
            issuer_key(within, ended_ago_s=60),
            issuer_key(after, ended_ago_s=2 * GRACE_S),
            issuer_key(owner),
        ]
        relay_port = free_port()
        relay_config = hop(tmp / "relay", mode="relay", label="broker", listen=f"127.0.0.1:{relay_port}")
        relay_publish = relay_config["publish"]["public_url"]
        agent_config = hop(tmp / "agent", mode="agent", label="agent", next_hop=relay_port)
        (tmp / "gw").mkdir()
        (tmp / "capped").mkdir()
        web_key, web_pem = SigningKey.generate(), tmp / "gw" / "web-agent.pem"
        web_pem.write_bytes(web_key.to_pem())
        web_pem.chmod(0o600)
        pinned = {"pinned_agent_keys": [str(web_pem)]}
        # web-bot-auth labels: accepted by "gw" (told so), refused by "capped" (the default)
        gw = web_too(gateway_config(backend, relay_publish, max_hops=2, **pinned))
        capped_config = gateway_config(backend, relay_publish, max_hops=1, **pinned)
        with (
            ProxyProcess(tmp / "gw", gw) as gateway,
            ProxyProcess(tmp / "capped", capped_config) as capped,
            ProxyProcess(tmp / "relay", relay_config),
            ProxyProcess(tmp / "agent", agent_config) as agent,
        ):  # fmt: skip
            relay_key = signing_key(tmp / "relay" / "data")
            yield World(
                backend, agent, gateway, capped, signing_key(tmp / "agent" / "data"), relay_key.thumbprint,
                owner, within, after, SigningKey.generate(), agent_config["publish"]["public_url"], web_key,
            )  # fmt: skip


def refused(resp: requests.Response, status: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"] == "application/problem+json"
    # a 401 names the scheme it wants (RFC 9110 section 11.6.1); no other refusal does
    assert resp.headers.get("WWW-Authenticate") == (CHALLENGE if status == 401 else None)
    doc: dict[str, Any] = resp.json()
    assert doc["reason"] == reason, doc
    return doc


def test_plain_request_reaches_the_backend_with_verified_headers_only(world: World) -> None:
    resp = requests.get(
        f"{world.gateway.url}/feed?page=2",
        headers={
            "X-Verified-Requester-Id": "forged",
            "X-Verified-Hops": "9",
            # look-alikes a CGI or WSGI backend reads as the gateway's own (they were forwarded)
            "X_Verified_Requester_Id": "admin",
            "x-verified_hops": "0",
            "X_VERIFIED_KEYID": "forged",
        },
        proxies={"http": world.agent.url},
        timeout=WAIT_S,
    )
    assert resp.status_code == 200, resp.text
    verified = resp.json()["verified"]
    assert all("_" not in name for name in verified), verified
    assert verified["x-verified-hops"] == "2"  # agent + relay, not the client's 9
    assert verified["x-verified-keyid"] == f"{world.agent_key.thumbprint}, {world.relay_jkt}"
    assert "x-verified-requester-id" not in verified  # the client's copy was dropped
    assert len(verified["x-verified-directory"].split(", ")) == 2


def test_delegated_request_good_chain(world: World) -> None:
    resp = world.post(exchange_body(world.chain()))
    assert resp.status_code == 200, resp.text
    verified = resp.json()["verified"]
    assert verified["x-verified-requester-id"] == "agent-7"
    assert verified["x-verified-requester-domain"] == "agent.example"
    assert verified["x-verified-delegation-issuer"] == OWNER_ISS
    assert verified["x-verified-principal-key"] == world.principal.thumbprint
    assert verified["x-verified-scopes"] == "dist:US:CA"  # the narrowest in the chain
    assert verified["x-verified-holder"] == "agent"


@pytest.mark.parametrize("case", ["wrong-holder", "widened-scope", "expired-link", "rotated-after-grace"])
def test_delegation_refused_403(world: World, case: str) -> None:
    now = int(time.time())
    if case == "wrong-holder":
        chain = world.chain(holder=SigningKey.generate().thumbprint)
    elif case == "widened-scope":
        chain = world.child(scope="dist:EU", exp=now + 600)
    elif case == "expired-link":
        chain = world.child(scope="dist:US:CA", exp=now - 10)
    else:
        chain = world.chain(owner=world.rotated_after)
    before = len(world.backend.arrivals)
    doc = refused(world.post(exchange_body(chain)), 403, "DENIAL_REASON_DELEGATION_INVALID")
    assert len(world.backend.arrivals) == before  # nothing refused reaches the backend
    cause = {
        "wrong-holder": "holder-mismatch",
        "widened-scope": "scope-widened",
        "expired-link": "expired",
        "rotated-after-grace": "untrusted-issuer-key",
    }[case]
    assert doc["detail"].startswith(cause), doc


def test_issuer_key_rotated_within_grace_is_accepted(world: World) -> None:
    resp = world.post(exchange_body(world.chain(owner=world.rotated_within)))
    assert resp.status_code == 200, resp.text


def test_broker_terminal_delegation(world: World) -> None:
    """The agent delegates to the relay's key by a child JWT: the relay's label is the terminal holder."""
    chain = extend_chain(
        world.chain(),
        world.agent_key,
        holder_jkt=world.relay_jkt,
        now=time.time(),
        scope=["dist:US:CA"],
        exp=int(time.time()) + 900,
    )
    resp = world.post(exchange_body(chain))
    assert resp.status_code == 200, resp.text
    assert resp.json()["verified"]["x-verified-holder"] == "broker"


def test_over_the_hop_cap_is_401(world: World) -> None:
    refused(world.post(exchange_body(world.chain()), world.capped), 401, "too-many-hops")


def test_unspecified_requester_is_400(world: World) -> None:
    body = exchange_body(type="REQUESTER_TYPE_UNSPECIFIED")
    refused(world.post(body), 400, "requester-type-unspecified")


def test_unknown_critical_extension_is_400(world: World) -> None:
    body = exchange_body(ext={"acme:billing": 1, "other:rule": 2}, ext_critical=["other:rule"])
    refused(world.post(body), 400, "unknown-critical-extension")
    understood = exchange_body(ext={"acme:billing": 1}, ext_critical=["acme:billing"])
    assert world.post(understood).status_code == 200


def test_nothing_refused_reached_the_backend(world: World) -> None:
    """A refused request never reaches the backend; what does carries the verified hop count (the
    test sends both itself: it holds whichever tests ran before it)."""
    before = len(world.backend.arrivals)
    refused(world.post(exchange_body(type="REQUESTER_TYPE_UNSPECIFIED")), 400, "requester-type-unspecified")
    assert len(world.backend.arrivals) == before
    assert world.post(exchange_body()).status_code == 200
    assert len(world.backend.arrivals) == before + 1
    assert all(a.get("x-verified-hops") == "2" for a in world.backend.arrivals)


@pytest.mark.parametrize(
    ("method", "covered"),
    [("POST", "content-length"), ("GET", "host"), ("POST", "content-type")],
)
def test_a_web_label_covering_host_or_content_length_verifies(
    world: World, method: str, covered: str
) -> None:
    """The gateway verified over the fields it forwards, without Host and Content-Length (it writes
    its own): a label covering them was refused missing-covered-header, though the client sent them."""
    answer = send_web_signed(world, method, covered)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:400]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_gateway_refuses_web_bot_auth_labels_unless_told(world: World, method: str) -> None:
    """A web-bot-auth label binds the authority only: accepted by default, any method, target and
    body the gateway's backend received passed on one captured signature. ``verify.web_bot_auth``
    defaults to ``auto``: the spec's five components only at a gateway, both profiles elsewhere."""
    before = len(world.backend.arrivals)
    answer = send_web_signed(world, method, "host", gateway=world.capped)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:400]
    assert b'"reason":"unsupported-tag"' in answer.replace(b" ", b""), answer
    assert len(world.backend.arrivals) == before
    told = send_web_signed(world, method, "host")  # the same request to the gateway told to accept it
    assert told.startswith(b"HTTP/1.1 200 "), told[:400]


@pytest.mark.parametrize(
    ("covered", "extra"),
    [("content-type", [("Connection", "content-type")]), ("keep-alive", [("Keep-Alive", "timeout=5")])],
)
def test_a_label_covering_a_field_that_ends_at_the_gateway_is_refused(
    world: World, covered: str, extra: list[tuple[str, str]]
) -> None:
    """A field Connection names, or a hop-by-hop one, never reaches the backend: a label covering it
    was accepted, though what it vouched for was dropped (the middleware refuses it, as the README says)."""
    before = len(world.backend.arrivals)
    answer = send_web_signed(world, "POST", covered, extra)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:400]
    assert b'"reason":"missing-covered-header"' in answer.replace(b" ", b""), answer
    assert len(world.backend.arrivals) == before


def test_a_request_target_with_a_fragment_is_refused(world: World) -> None:
    """No request target carries a fragment (RFC 9112 section 3.2): the gateway verified ``/feed``
    and forwarded it, where the README says such a target is refused."""
    before = len(world.backend.arrivals)
    answer = send_web_signed(world, "GET", "host", target="/feed#part")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:400]
    assert b'"reason":"malformed-target"' in answer.replace(b" ", b""), answer
    assert len(world.backend.arrivals) == before


def send_web_signed(  # noqa: PLR0917
    world: World,
    method: str,
    covered: str,
    extra: Sequence[tuple[str, str]] = (),
    target: str = "/feed",
    gateway: ProxyProcess | None = None,
) -> bytes:
    """A web-bot-auth request to the gateway covering ``@authority``, ``signature-agent`` and
    ``covered`` (signed for ``/feed``), sent with ``extra`` lines and ``target``; the whole answer.
    Its member names the agent's directory over http, which protocol-02 has a verifier ignore: the
    key is the one pinned at the gateway (``gateway.pinned_agent_keys``)."""
    port = (gateway or world.gateway).port
    url = f"http://127.0.0.1:{port}/feed"
    body = b"hi" if method == "POST" else b""
    lines = [("Host", f"127.0.0.1:{port}"), ("Signature-Agent", f'agent="{world.agent_directory}"')]
    if body:
        lines += [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
    fields, now = Fields([*lines, *extra]), int(time.time())
    components = [Component("@authority"), Component("signature-agent", key="agent"), Component(covered)]
    attach_signature(
        fields,
        sign_message(
            Message(method, parse_received_uri(url), fields),
            world.web_key,
            created=now,
            expires=now + 60,
            label="agent",
            components=components,
            extra_params=[("tag", "web-bot-auth")],
        ),
    )
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields)
    connection = b"" if any(n.lower() == "connection" for n, _ in extra) else b"Connection: close\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head.encode() + connection + b"\r\n" + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer
