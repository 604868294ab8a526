"""A covered field named by ``Connection`` is hop-by-hop: it ends at this hop, so every verifying
face treats it as absent, as the gateway mode does (it verifies after ``drop_hop_by_hop``).

Spec "Request signature" rule 4: a verifier MUST reject a request that omits a covered header. The
aiohttp ``signature_middleware``, ``verify-origin`` and the embedded ``gateway_middleware`` verified
the raw lines with the named field still in them and accepted the request; they now refuse it with
the gateway mode's reasons
(``missing-covered-header`` for ``Authorization``, ``missing-signature`` for ``Signature-Input``).
Requests go over a raw socket so the ``Connection`` line is exactly the one written here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import VerifierPolicy
from tests.verify.directory_host import served_directory
from tests.verify.strangers import raw_post, verifying_face

AGENT = SigningKey.from_seed(bytes(range(5, 37)))
BODY = b"{}"


@pytest.fixture
def directory_base() -> Iterator[str]:
    with served_directory(AGENT) as base:
        yield base


@pytest.fixture(params=["signature_middleware", "verify-origin", "gateway_middleware"])
async def face(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The port of a verifying face: 200 for a verified request, 401 problem+json otherwise."""
    async with verifying_face(request.param, VerifierPolicy()) as port:
        yield port


def signed(port: int, directory_base: str) -> list[tuple[str, str]]:
    now = int(time.time())
    fields = Fields(
        [
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", "Bearer t"),
            ("Signature-Agent", f'"{directory_base}"'),
        ]
    )
    url = f"http://127.0.0.1:{port}/x"
    message = Message("POST", parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, AGENT, created=now, expires=now + 60))
    return list(fields)


async def test_a_signed_request_is_accepted(face: int, directory_base: str) -> None:
    status, _, doc = await raw_post(face, signed(face, directory_base), BODY)
    assert (status, doc["verified"]) == (200, True), doc


@pytest.mark.parametrize(
    ("named", "reason"),
    [
        ("authorization", "missing-covered-header"),
        ("Authorization", "missing-covered-header"),
        ("signature-input", "missing-signature"),
    ],
)
async def test_a_covered_field_named_by_connection_counts_as_absent(
    face: int, directory_base: str, named: str, reason: str
) -> None:
    status, _, doc = await raw_post(face, signed(face, directory_base), BODY, f"close, {named}")
    assert (status, doc["reason"]) == (401, reason), doc
