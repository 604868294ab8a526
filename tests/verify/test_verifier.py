"""The reusable verifier: an aiohttp app with ``signature_middleware``, keys found only through
directories (fake fetcher) or pinned, requests signed by core and sent over loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    SIGNATURE,
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
    directory_url,
    signature_middleware,
)
from signing_proxy.verify.cache import TokenBucket

AGENT = SigningKey.from_seed(bytes(range(32)))
BROKER = SigningKey.from_seed(bytes(range(1, 33)))
AGENT_DIR = "https://agent.example"
BROKER_DIR = "https://broker.example"
REVOCATIONS = "https://agent.example/revoked.json"


class Fetch:
    def __init__(self) -> None:
        now = int(time.time())
        self.answers = {
            directory_url(AGENT_DIR): render_directory(
                Directory((DirectoryKey(AGENT.public, now - 60, now + 3600),), REVOCATIONS)
            ),
            directory_url(BROKER_DIR): render_directory(
                Directory((DirectoryKey(BROKER.public, now - 60, now + 3600),))
            ),
            REVOCATIONS: render_revocation_list(RevocationList(now, frozenset())),
        }

    async def __call__(self, url: str) -> FetchResult:
        body = self.answers.get(url)
        return FetchResult(200, body, "max-age=60") if body is not None else FetchResult(404, b"", None)


@dataclass
class Exchange:
    url: str
    fetch: Fetch
    verifier: RequestVerifier


@pytest.fixture
async def exchange() -> AsyncIterator[Exchange]:
    fetch = Fetch()
    verifier = RequestVerifier(
        DirectoryResolver(fetch),
        VerifierPolicy(broker_directories=(BROKER_DIR,), max_hops=3),
        revocations=RevocationPoller(fetch),
    )

    async def handler(request: web.Request) -> web.Response:
        stack = request[SIGNATURE]
        return web.json_response(
            {
                "labels": [s.label for s in stack.signatures],
                "directory": stack.directory,
                "sources": [s.key_source for s in stack.signatures],
            }
        )

    async def health(_r: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[signature_middleware(verifier, exempt_paths=("/healthz",))])
    app.router.add_get("/healthz", health)
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        yield Exchange(f"http://127.0.0.1:{server.port}", fetch, verifier)


def signed_headers(
    url: str,
    body: bytes,
    *,
    agent: str = f'"{AGENT_DIR}"',
    key: SigningKey = AGENT,
    broker: SigningKey | None = None,
) -> list[tuple[str, str]]:
    now = int(time.time())
    fields = Fields(
        [("Content-Digest", content_digest(body)), ("Authorization", ""), ("Signature-Agent", agent)]
    )
    message = Message("POST", parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, key, created=now, expires=now + 60))
    if broker is not None:
        attach_signature(
            fields,
            sign_message(
                message,
                broker,
                created=now,
                expires=now + 60,
                label="broker",
                components=hop_components("agent"),
            ),
        )
    return list(fields)


async def post(
    url: str, headers: list[tuple[str, str]], body: bytes = b"{}"
) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            URL(url, encoded=True), data=body, headers=headers, skip_auto_headers=("Content-Type",)
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def test_accepts_an_agent_signature_resolved_through_its_directory(exchange: Exchange) -> None:
    url = f"{exchange.url}/svc.v1.ExchangeService/DiscoverResources"
    status, doc = await post(url, signed_headers(url, b"{}"))
    assert status == 200, doc
    assert doc == {"labels": ["agent"], "directory": AGENT_DIR, "sources": [AGENT_DIR]}


async def test_accepts_a_broker_label_resolved_in_the_broker_directory(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert status == 200, doc
    assert doc["sources"] == [AGENT_DIR, BROKER_DIR]


async def test_refusal_is_401_problem_with_reason(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    status, doc = await post(
        url, signed_headers(url, b"{}", key=BROKER)
    )  # BROKER is not in the agent directory
    assert status == 401
    assert doc["reason"] == "unknown-keyid"
    assert doc["label"] == "agent"


async def test_tampered_body_is_refused(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}"), body=b'{"x":1}')
    assert (status, doc["reason"]) == (401, "content-digest-mismatch")


async def test_revoked_key_is_refused_once_the_list_says_so(exchange: Exchange) -> None:
    exchange.fetch.answers[REVOCATIONS] = render_revocation_list(
        RevocationList(int(time.time()), frozenset({AGENT.thumbprint}))
    )
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}"))
    assert (status, doc["reason"]) == (401, "key-revoked")


async def test_key_outside_its_window_is_refused(exchange: Exchange) -> None:
    now = int(time.time())
    exchange.fetch.answers[directory_url(AGENT_DIR)] = render_directory(
        Directory((DirectoryKey(AGENT.public, now - 3600, now - 1),))
    )
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}"))
    assert (status, doc["reason"]) == (401, "key-outside-window")


async def test_unreachable_directory_is_refused(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}", agent='"https://nowhere.example"'))
    assert (status, doc["reason"]) == (401, "directory-unavailable")


async def test_empty_signature_agent_needs_pinned_keys(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}", agent=""))
    assert (status, doc["reason"]) == (401, "unknown-keyid")
    exchange.verifier.policy = VerifierPolicy(pinned_agent_keys=(AGENT.public,))
    status, doc = await post(url, signed_headers(url, b"{}", agent=""))
    assert status == 200
    assert doc["sources"] == ["pinned"]


async def test_hop_cap_is_enforced(exchange: Exchange) -> None:
    exchange.verifier.policy = VerifierPolicy(broker_directories=(BROKER_DIR,), max_hops=1)
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert (status, doc["reason"]) == (401, "too-many-hops")


async def test_unsigned_request_is_refused_and_exempt_paths_pass(exchange: Exchange) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{exchange.url}/x") as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == 'Signature realm="signing-proxy"'
            assert (await resp.json(content_type=None))["reason"] == "missing-signature"
        async with session.get(f"{exchange.url}/healthz") as resp:
            assert resp.status == 200


async def test_a_broker_known_by_a_pinned_key_needs_no_directory(exchange: Exchange) -> None:
    url = f"{exchange.url}/x"
    exchange.verifier.policy = VerifierPolicy()  # no broker directories: the broker label is unknown
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert (status, doc["reason"], doc["label"]) == (401, "unknown-keyid", "broker")
    exchange.verifier.policy = VerifierPolicy(pinned_broker_keys=(BROKER.public,))
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert status == 200, doc
    assert doc["sources"] == [AGENT_DIR, "pinned"]


async def test_a_busy_verifier_answers_503_and_a_configured_broker_spends_no_budget(
    exchange: Exchange,
) -> None:
    resolver = exchange.verifier.resolver
    resolver.fetch_budget = TokenBucket(0.001, 1, time.time)  # one new directory, then none for ages
    url = f"{exchange.url}/x"
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert status == 200, doc  # the agent's directory took the token; the broker's (configured) none
    exchange.fetch.answers[directory_url("https://other.example")] = exchange.fetch.answers[
        directory_url(AGENT_DIR)
    ]
    headers = signed_headers(url, b"{}", agent='"https://other.example"')
    async with aiohttp.ClientSession() as session, session.post(url, data=b"{}", headers=headers) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json(content_type=None))["reason"] == "verifier-busy"
    status, doc = await post(url, signed_headers(url, b"{}", broker=BROKER))
    assert status == 200, doc  # agents already known are served as before
