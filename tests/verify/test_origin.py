"""``build_verify_origin``: the verdict of each request as JSON (200) or problem+json (401), with
directories fetched through the package's HTTP client from a loopback directory host."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import EgressPolicy, HttpClient, VerifierPolicy, build_verify_origin
from tests.verify.directory_host import served_directory

AGENT = SigningKey.from_seed(bytes(range(3, 35)))
LOOPBACK = EgressPolicy(allow_private=("127.0.0.1/32",))  # the directory host: allow-listed


@pytest.fixture
def directory_base() -> Iterator[str]:
    with served_directory(AGENT) as base:
        yield base


@pytest.fixture(params=["own client", "given client"])
async def origin(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async with HttpClient.standalone() as client:
        given = client if request.param == "given client" else None
        async with TestServer(
            build_verify_origin(VerifierPolicy(), client=given, egress=LOOPBACK), host="127.0.0.1"
        ) as server:
            yield f"http://127.0.0.1:{server.port}"


def signed(url: str, agent: str, authorization: str = "") -> list[tuple[str, str]]:
    now = int(time.time())
    fields = Fields(
        [
            ("Content-Digest", content_digest(b"{}")),
            ("Authorization", authorization),
            ("Signature-Agent", agent),
        ]
    )
    attach_signature(
        fields,
        sign_message(Message("POST", parse_absolute_uri(url), fields), AGENT, created=now, expires=now + 60),
    )
    return list(fields)


async def test_verified_and_refused_requests_get_their_verdicts(origin: str, directory_base: str) -> None:
    url = f"{origin}/x?y=1"
    async with aiohttp.ClientSession() as session:
        headers = signed(url, f'"{directory_base}"')
        async with session.post(URL(url, encoded=True), data=b"{}", headers=headers) as resp:
            doc = await resp.json()
            assert resp.status == 200, doc
        assert (doc["verified"], doc["directory"], doc["path"]) == (True, directory_base, "/x?y=1")
        assert doc["labels"][0]["keyid"] == AGENT.thumbprint
        async with session.post(URL(url, encoded=True), data=b"{}") as resp:
            doc = await resp.json(content_type=None)
            assert resp.status == 401
        assert (doc["verified"], doc["reason"]) == (False, "missing-signature")


async def test_the_verdict_never_shows_a_bearer_credential(origin: str, directory_base: str) -> None:
    """The signature base in a 200 verdict showed the covered ``Authorization`` line whole."""
    url = f"{origin}/x"
    async with aiohttp.ClientSession() as session:
        headers = signed(url, f'"{directory_base}"', authorization="Bearer s3cr3t-token")
        async with session.post(URL(url, encoded=True), data=b"{}", headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, text
    assert "s3cr3t-token" not in text
    base = json.loads(text)["labels"][0]["signature_base"]
    assert '\n"authorization": (not shown)\n' in base
    assert base.startswith('"@method": POST\n')  # the rest of the base is shown


async def test_any_host_gets_its_verdict(origin: str, directory_base: str) -> None:
    """``verify-origin`` gates nothing: it answers the verdict for whatever name it was sent, where
    the middlewares answer only for their ``hosts`` (421 ``misdirected-request`` otherwise)."""
    url = "http://publisher-a.example/article"
    async with aiohttp.ClientSession() as session:
        headers = [("Host", "publisher-a.example"), *signed(url, f'"{directory_base}"')]
        async with session.post(f"{origin}/article", data=b"{}", headers=headers) as resp:
            doc = await resp.json()
            assert resp.status == 200, doc
    assert (doc["verified"], doc["path"]) == (True, "/article")


async def test_an_empty_signature_agent_without_a_pinned_key_says_so(origin: str) -> None:
    """The quick-start proxy sends an empty Signature-Agent: the verdict said only "no key for keyid",
    not that the request names no directory and a pinned key (``--pinned-key``) is what finds it."""
    url = f"{origin}/x"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=b"{}", headers=signed(url, "")) as resp,
    ):
        doc = await resp.json(content_type=None)
        assert resp.status == 401
    assert doc["reason"] == "unknown-keyid"
    assert "names no key directory" in doc["detail"]
    assert "pinned" in doc["detail"]
