"""A stranger's stack of many well-formed labels, end to end (DESIGN section 7: every per-client
structure has a bound).

No signature needs to be valid: each later label need only cover the five components and
``"signature";key="<previous>"`` with a thumbprint-shaped keyid and a fresh window, and every base
repeats the covered ``Authorization``. With no hop cap configured, a verifier built the base of every
label, then fetched the directory the first label names, before refusing the request at that label.
Every verifying face (the aiohttp ``signature_middleware``, ``verify-origin``, the embedded
``gateway_middleware``; the relay and the gateway mode share their verifier) now refuses a stack of
more than ``MAX_HOPS`` labels ``401 too-many-hops`` with no fetch. Requests go over a raw socket, as a
stranger sends them, to a face on 127.0.0.1 port 0.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signature_verify import MAX_HOPS
from signing_proxy.verify import VerifierPolicy
from tests.verify.strangers import Host, directory_doc, host, raw_post, verifying_face

AGENT = SigningKey.from_seed(bytes(range(7, 39)))
BODY = b"{}"
FIVE = '"@method" "@target-uri" "content-digest" "authorization" "signature-agent"'


@pytest.fixture
async def directory() -> AsyncIterator[Host]:
    """The directory the first label names: a fetch of it would be recorded."""
    async with host() as found:
        found.directory(directory_doc(AGENT, now=int(time.time())))
        yield found


@pytest.fixture(params=["signature_middleware", "verify-origin", "gateway_middleware"])
async def face(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The port of a verifying face with no hop cap of its own: 401 problem+json for a refusal."""
    policy = VerifierPolicy()
    assert policy.max_hops is None
    async with verifying_face(request.param, policy) as port:
        yield port


def many_labels(labels: int, agent: str) -> list[tuple[str, str]]:
    """Field lines of a stack of ``labels`` well-formed labels, none validly signed, and four long
    ``Authorization`` lines that every label's base would repeat."""
    now = int(time.time())
    params = f';keyid="{AGENT.thumbprint}";alg="ed25519";created={now};expires={now + 60}'
    inputs = [f"a0=({FIVE}){params}"]
    inputs += [f'a{i}=({FIVE} "signature";key="a{i - 1}"){params}' for i in range(1, labels)]
    forged = base64.b64encode(bytes(64)).decode()
    return [
        ("Content-Digest", content_digest(BODY)),
        ("Signature-Agent", f'"{agent}"'),
        *[("Authorization", "x" * 8000) for _ in range(4)],
        *lines("Signature-Input", inputs),
        *lines("Signature", [f"a{i}=:{forged}:" for i in range(labels)]),
    ]


def lines(name: str, members: list[str]) -> list[tuple[str, str]]:
    """The members as lines of ``name`` of at most 8,000 bytes: aiohttp takes lines of 8,190."""
    found: list[tuple[str, str]] = []
    line = ""
    for member in members:
        if line and len(line) + len(member) + 2 > 8000:
            found.append((name, line))
            line = ""
        line = f"{line}, {member}" if line else member
    return [*found, (name, line)]


async def test_a_stack_past_the_bound_is_refused_too_many_hops_with_no_fetch(
    face: int, directory: Host
) -> None:
    status, head, doc = await raw_post(face, many_labels(4 * MAX_HOPS, directory.base), BODY)
    assert (status, doc["reason"]) == (401, "too-many-hops"), doc
    assert b'WWW-Authenticate: Signature realm="signing-proxy"' in head
    assert directory.seen == []


async def test_a_forged_stack_within_the_bound_is_refused_at_its_first_label(
    face: int, directory: Host
) -> None:
    status, _, doc = await raw_post(face, many_labels(MAX_HOPS, directory.base), BODY)
    assert (status, doc["reason"]) == (401, "bad-signature"), doc
