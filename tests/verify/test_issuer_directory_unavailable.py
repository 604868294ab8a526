"""An issuer's key directory that cannot be fetched now is not an issuer without keys: the token is
not judged, and the answer is 503 ``issuer-directory-unavailable`` with ``Retry-After`` (the failed
fetch is remembered that long), never 403 ``DENIAL_REASON_DELEGATION_INVALID``, whose spec meaning
is a token "missing, unverifiable, expired, or widening scope". A directory that was read but holds
no usable key (expired past the grace, malformed) still refuses the token: 403."""

from __future__ import annotations

import pytest

from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.errors import DirectoryError
from signing_proxy.verify import FetchResult
from signing_proxy.verify.gateway import DELEGATION_INVALID
from signing_proxy.verify.issuers import IssuerAnchor
from tests.verify.fakes import NOW
from tests.verify.test_gateway import OWNER, World, world  # noqa: F401 (the fixture)

UNAVAILABLE = "issuer-directory-unavailable"  # a stable reason: pinned here as on the wire
OWNER_DIRECTORY = OWNER + "/.well-known/http-message-signatures-directory"
REVOCATIONS = OWNER + "/revoked.json"


def served(*keys: DirectoryKey, revocation_url: str | None = None) -> FetchResult:
    return FetchResult(200, render_directory(Directory(keys, revocation_url)), "max-age=300")


@pytest.mark.parametrize(
    "failure",
    [
        DirectoryError("directory-fetch-timeout", "the fake did not answer"),
        DirectoryError("directory-fetch-failed", "connection refused by the fake"),
        FetchResult(503, b"", None),  # a 5xx: directory-fetch-failed
    ],
    ids=["timeout", "connection", "status-503"],
)
@pytest.mark.parametrize("trusted", [True, False], ids=["trusted-issuer", "named-by-the-token"])
async def test_an_unreachable_issuer_directory_is_503_retry_not_a_refused_token(
    world: World,  # noqa: F811 (the fixture)
    failure: DirectoryError | FetchResult,
    trusted: bool,
) -> None:
    if trusted:
        world.gateway.issuers.trusted = {OWNER: IssuerAnchor(directory=OWNER)}
    healthy = world.fetch.answers[OWNER_DIRECTORY]
    world.fetch.answers[OWNER_DIRECTORY] = failure
    for _ in range(2):  # the fetch, then the failure remembered: the same answer
        refusal = await world.refused(world.body(world.chain()))
        assert (refusal.status, refusal.reason) == (503, UNAVAILABLE)
        assert refusal.headers == (("Retry-After", "30"),)  # the negative cache's time
        assert "retry" in refusal.detail
        world.clock.now += 1
    world.fetch.answers[OWNER_DIRECTORY] = healthy
    world.clock.now += 30  # the failure is forgotten: fetched again, and the token judged
    assert (await world.check(world.body(world.chain()))).delegation is not None


async def test_an_unavailable_revocation_list_of_the_issuer_is_503_retry(world: World) -> None:  # noqa: F811
    key = DirectoryKey(world.owner.public, NOW - 60, NOW + 3600)
    world.fetch.answers[OWNER_DIRECTORY] = served(key, revocation_url=REVOCATIONS)
    world.fetch.answers[REVOCATIONS] = DirectoryError("revocation-fetch-timeout", "the fake did not answer")
    refusal = await world.refused(world.body(world.chain()))
    assert (refusal.status, refusal.reason) == (503, UNAVAILABLE)
    assert dict(refusal.headers)["Retry-After"] == "30"
    world.fetch.answers[REVOCATIONS] = FetchResult(
        200, render_revocation_list(RevocationList(NOW, frozenset())), None
    )
    world.clock.now += 30
    assert (await world.check(world.body(world.chain()))).delegation is not None


@pytest.mark.parametrize(
    "document",
    [
        FetchResult(200, b"{not json", "max-age=300"),  # read: malformed
        FetchResult(200, b"{}", "max-age=300"),  # read: no keys member
    ],
    ids=["malformed", "no-keys"],
)
async def test_a_directory_read_without_a_usable_key_still_refuses_the_token_403(
    world: World,  # noqa: F811 (the fixture)
    document: FetchResult,
) -> None:
    world.fetch.answers[OWNER_DIRECTORY] = document
    refusal = await world.refused(world.body(world.chain()))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("untrusted-issuer-key")


async def test_an_issuer_key_expired_past_the_grace_still_refuses_the_token_403(world: World) -> None:  # noqa: F811
    # the key's window ended more than the grace (3600 s) ago: the directory was read, its key unusable
    world.fetch.answers[OWNER_DIRECTORY] = served(
        DirectoryKey(world.owner.public, NOW - 10_000, NOW - 3601),
        DirectoryKey(world.principal.public, NOW - 60, NOW + 3600),  # a served directory holds a valid key
    )
    refusal = await world.refused(world.body(world.chain()))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("untrusted-issuer-key")
