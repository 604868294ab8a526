"""Relay mode in-process: every refusal rule of the incoming stack, and the label it stacks.

The relay (a real ``ProxyApp`` in relay mode on 127.0.0.1) resolves the agent's key through a
directory served over loopback; each test sends one raw HTTP/1.1 request signed by ``core`` and
broken in exactly one way, and asserts the refusal reason — and that nothing reached the origin.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.config import parse_config
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    StaticKeyProvider,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.signatures import (
    SPEC_COMPONENTS,
    Message,
    attach_signature,
    sign_message,
)
from signing_proxy.core.uri import parse_absolute_uri, parse_received_uri
from signing_proxy.proxy.relay import unique_label
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S, VerifyingOrigin
from tests.oracle import oracle_agent_sign

pytestmark = pytest.mark.integration

AGENT = SigningKey.from_seed(bytes(range(32)))
RELAY = SigningKey.from_seed(bytes(range(5, 37)))
STRANGER = SigningKey.from_seed(bytes(range(9, 41)))


@dataclass
class DirectoryHost:
    """Serves the agent's directory and revocation list; tests edit them."""

    keys: list[DirectoryKey] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    base: str = ""

    async def directory(self, _r: web.Request) -> web.Response:
        body = render_directory(Directory(tuple(self.keys), f"{self.base}/revoked.json"))
        return web.Response(
            body=body, content_type="application/jwk-set+json", headers={"Cache-Control": "no-store"}
        )

    async def revocations(self, _r: web.Request) -> web.Response:
        return web.Response(
            body=render_revocation_list(RevocationList(int(time.time()), frozenset(self.revoked))),
            content_type="application/json",
        )


@dataclass
class Rig:
    relay_port: int
    origin: VerifyingOrigin
    agent_dir: DirectoryHost
    app: ProxyApp


@asynccontextmanager
async def running_relay(
    tmp_path: Path, extra: Callable[[VerifyingOrigin], dict[str, Any]]
) -> AsyncIterator[Rig]:
    """A relay (a real ``ProxyApp`` on 127.0.0.1; ``extra``: more of its configuration, given the
    origin) that resolves the agent's key from a directory served on loopback, and a verifying
    origin that trusts the agent and the relay."""
    host = DirectoryHost()
    now = int(time.time())
    host.keys = [DirectoryKey(AGENT.public, now - 60, now + 3600)]
    web_app = web.Application()
    web_app.router.add_get("/.well-known/http-message-signatures-directory", host.directory)
    web_app.router.add_get("/revoked.json", host.revocations)
    async with TestServer(web_app, host="127.0.0.1") as dir_server:
        host.base = f"http://127.0.0.1:{dir_server.port}"
        with VerifyingOrigin() as origin:
            origin.trust(AGENT, RELAY)
            config = {
                "mode": "relay",
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path),
                "signing": {"label": "broker"},
                "egress": {"allow_private": ["127.0.0.1/32"]},  # the directory host is on loopback
                "log": {"access_log": False},
                **extra(origin),
            }
            app = ProxyApp(parse_config(config), StaticKeyProvider(RELAY))
            (_, port), *_ = await app.start()
            try:
                yield Rig(port, origin, host, app)
            finally:
                await app.stop(drain_s=1)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_relay(tmp_path, lambda _origin: {"relay": {"max_hops": 3}}) as running:
        yield running


def build(
    rig: Rig,
    *,
    body: bytes = b'{"ver":"1.0"}',
    sign_path: str = "/x",
    send_path: str | None = None,
    key: SigningKey = AGENT,
    created: int | None = None,
    mutate: Callable[[Fields], object] | None = None,  # what it returns is not used
) -> bytes:
    """A request signed by ``key`` as an agent for ``sign_path``, then sent for ``send_path``."""
    created = int(time.time()) if created is None else created
    sign_url = rig.origin.url(sign_path)
    fields = Fields(
        [
            ("Content-Type", "application/json"),
            ("Content-Digest", content_digest(b'{"ver":"1.0"}')),
            ("Authorization", "Bearer agent-token"),
            ("Signature-Agent", f'"{rig.agent_dir.base}"'),
        ]
    )
    message = Message("POST", parse_absolute_uri(sign_url), fields)
    attach_signature(fields, sign_message(message, key, created=created, expires=created + 60))
    if mutate is not None:
        mutate(fields)
    url = rig.origin.url(send_path or sign_path)
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    return head.encode() + body


async def send(rig: Rig, raw: bytes) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", rig.relay_port), WAIT_S)
    writer.write(raw)
    data = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


async def refused(rig: Rig, raw: bytes, reason: str, status: int = 401) -> dict[str, Any]:
    got, doc = await send(rig, raw)
    assert (got, doc.get("reason")) == (status, reason), doc
    assert rig.origin.arrivals == [], "a refused request reached the origin"
    return doc


async def test_relay_verifies_then_stacks_its_label_keeping_covered_fields(rig: Rig) -> None:
    raw = build(rig)
    status, doc = await send(rig, raw)
    assert status == 200, doc
    arrival = rig.origin.arrivals[-1]
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.labels == ["agent", "broker"]
    assert arrival.keyids == [AGENT.thumbprint, RELAY.thumbprint]
    field_lines = raw.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    sent = {name.lower(): value for name, value in (line.split(": ", 1) for line in field_lines)}
    for name in ("authorization", "signature-agent", "content-digest"):
        assert arrival.header(name) == sent[name], name  # byte-for-byte
    assert (arrival.header("signature-input") or "").startswith(sent["signature-input"] + ", broker=")
    assert '"signature";key="agent"' in (arrival.header("signature-input") or "")


async def test_unsigned_request_is_refused(rig: Rig) -> None:
    raw = f"GET {rig.origin.url('/x')} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    await refused(rig, raw, "missing-signature")


@pytest.mark.parametrize("signature_input", [None, "agent=bad input"], ids=["unsigned", "malformed"])
async def test_every_401_of_the_relay_names_the_scheme_it_wants(
    rig: Rig, signature_input: str | None
) -> None:
    """RFC 9110 section 11.6.1: a 401 carries WWW-Authenticate. Those of a stack that could not be
    read (none, or malformed) had none; only those of verification did."""
    extra = (
        ""
        if signature_input is None
        else f"Signature-Input: {signature_input}\r\nSignature: agent=:AA==:\r\n"
    )
    raw = f"GET {rig.origin.url('/x')} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", rig.relay_port), WAIT_S)
    writer.write(raw)
    head = (await asyncio.wait_for(reader.read(), WAIT_S)).partition(b"\r\n\r\n")[0].decode()
    writer.close()
    await writer.wait_closed()
    assert head.startswith("HTTP/1.1 401 ")
    assert 'WWW-Authenticate: Signature realm="signing-proxy"' in head.split("\r\n")


async def test_tampered_body_is_refused(rig: Rig) -> None:
    await refused(rig, build(rig, body=b'{"ver":"2.0"}'), "content-digest-mismatch")


async def test_tampered_target_is_refused(rig: Rig) -> None:
    await refused(rig, build(rig, sign_path="/x", send_path="/y"), "bad-signature")


async def test_missing_covered_header_is_refused(rig: Rig) -> None:
    await refused(rig, build(rig, mutate=lambda f: f.remove("authorization")), "missing-covered-header")


async def test_second_authorization_line_is_refused(rig: Rig) -> None:
    doc = await refused(
        rig, build(rig, mutate=lambda f: f.add("Authorization", "Bearer other")), "bad-signature"
    )
    assert "authorization" in doc["detail"]


async def test_expired_signature_is_refused(rig: Rig) -> None:
    await refused(rig, build(rig, created=int(time.time()) - 3600), "signature-expired")


async def test_unknown_keyid_is_refused(rig: Rig) -> None:
    await refused(rig, build(rig, key=STRANGER), "unknown-keyid")


async def test_key_outside_its_window_is_refused(rig: Rig) -> None:
    now = int(time.time())
    rig.agent_dir.keys = [DirectoryKey(AGENT.public, now - 3600, now - 10)]
    await refused(rig, build(rig), "key-outside-window")


async def test_revoked_key_is_refused(rig: Rig) -> None:
    rig.agent_dir.revoked.add(AGENT.thumbprint)
    await refused(rig, build(rig), "key-revoked")


async def test_label_that_does_not_cover_its_predecessor_is_refused(rig: Rig) -> None:
    def add_bad_hop(fields: Fields) -> None:
        url = rig.origin.url("/x")
        bad = sign_message(
            Message("POST", parse_absolute_uri(url), fields),
            STRANGER,
            created=int(time.time()),
            expires=int(time.time()) + 60,
            label="broker",
            components=SPEC_COMPONENTS,
        )
        attach_signature(fields, bad)

    await refused(rig, build(rig, mutate=add_bad_hop), "predecessor-not-covered")


async def test_hop_cap_counts_our_signature(rig: Rig) -> None:
    def two_more(fields: Fields) -> None:
        for label in ("b1", "b2"):
            fields.set(
                "Signature-Input", f'{fields.combined("Signature-Input")}, {label}=("@method");keyid="k"'
            )
            fields.set("Signature", f"{fields.combined('Signature')}, {label}=:AAAA:")

    doc = await refused(rig, build(rig, mutate=two_more), "too-many-hops", status=403)
    assert "max_hops=3" in doc["detail"]


@pytest.mark.parametrize("incoming", [16, 17])
async def test_without_a_cap_a_relay_leaves_room_for_its_own_label(tmp_path: Path, incoming: int) -> None:
    """Every verifier takes at most MAX_HOPS (16) labels. A relay with no relay.max_hops took 16 and
    forwarded 17, which the next verifier refused; 17 was a 401 where a cap's refusal is a 403."""

    def more(fields: Fields) -> None:
        for index in range(incoming - 1):
            label = f"b{index}"
            fields.set(
                "Signature-Input", f'{fields.combined("Signature-Input")}, {label}=("@method");keyid="k"'
            )
            fields.set("Signature", f"{fields.combined('Signature')}, {label}=:AAAA:")

    async with running_relay(tmp_path, lambda _origin: {}) as uncapped:
        doc = await refused(uncapped, build(uncapped, mutate=more), "too-many-hops", status=403)
    assert "16" in doc["detail"]


def test_relay_label_is_unique_in_the_dictionary() -> None:
    assert unique_label("broker", ["agent"]) == "broker"
    assert unique_label("broker", ["agent", "broker"]) == "broker2"
    assert unique_label("broker", ["agent", "broker", "broker2"]) == "broker3"


def signed_post(url: str, base: str, body: bytes = b'{"ver":"1.0"}') -> list[tuple[str, str]]:
    """An agent's POST of ``body`` to ``url`` exactly as written (its ``@target-uri``, no normal
    form), signed by pyauth (http-message-signatures); the agent's key is in the directory at
    ``base``."""
    return oracle_agent_sign(
        "POST",
        url,
        body,
        AGENT,
        signature_agent=f'"{base}"',
        authorization="Bearer agent-token",
        head=[("Content-Type", "application/json")],
    )


def third_party(rig: Rig, url: str, body: bytes = b'{"ver":"1.0"}') -> bytes:
    """An absolute-form request for ``url`` as written, which pyauth signed as an agent."""
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    signed = signed_post(url, rig.agent_dir.base, body)
    return (head + "".join(f"{n}: {v}\r\n" for n, v in signed) + "\r\n").encode() + body


@pytest.mark.parametrize(
    "spelling",
    ["http://127.0.0.1:{port}/x?", "http://127.0.0.1:0{port}/x", "http://127.0.0.1:0{port}/x?"],
    ids=["empty-query", "leading-zero-port", "both"],
)
async def test_a_spelling_the_agent_signed_is_verified_and_sent_on_as_received(
    rig: Rig, spelling: str
) -> None:
    """RFC 9421 section 2.2.2: ``@target-uri`` is the URI as received. The relay verified, signed and
    sent on its normal form (``/x``, the port without its zero), so it refused ``bad-signature`` what
    the agent signed and the origin would have verified. It now keeps the spelling: both labels
    verify at the origin, under our verifier and under pyauth."""
    url = spelling.format(port=rig.origin.port)
    status, doc = await send(rig, third_party(rig, url))
    assert status == 200, doc
    arrival = rig.origin.arrivals[-1]
    assert arrival.target_uri == url  # Host and request target as the agent wrote them
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


@pytest.mark.parametrize(
    "spelling",
    ["HTTP://127.0.0.1:{port}/x", "http://127.0.0.1:{port}?q"],
    ids=["upper-case-scheme", "no-path"],
)
async def test_a_spelling_that_cannot_travel_on_unchanged_is_refused(rig: Rig, spelling: str) -> None:
    """What the next hop would rebuild differently (its scheme in lower case, the path an origin-form
    target must have; userinfo, never sent, in tests/core/test_fields_jwk_uri.py) is checked in its
    normal form: a signature over the spelling itself is refused at the relay, as it would be
    downstream. (Signed by ``core`` over the spelling as given: pyauth writes a path itself.)"""
    url = spelling.format(port=rig.origin.port)
    body = b'{"ver":"1.0"}'
    fields = Fields(
        [
            ("Content-Digest", content_digest(body)),
            ("Authorization", "Bearer agent-token"),
            ("Signature-Agent", f'"{rig.agent_dir.base}"'),
        ]
    )
    now = int(time.time())
    message = Message("POST", parse_received_uri(url), fields)  # @target-uri: ``url`` exactly
    attach_signature(fields, sign_message(message, AGENT, created=now, expires=now + 60))
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    raw = (head + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n").encode() + body
    await refused(rig, raw, "bad-signature")
