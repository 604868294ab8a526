"""The gateway judges a delegation at the time its issuer's keys are used: the issuer's directory
may take seconds to arrive (fetched, or fetched again for a key rotated in), and a chain whose
``exp`` passed meanwhile, or whose mirrored ``expires_at`` did, is refused ``expired``.

The issuer's directory fetch advances the injected clock while it is in flight."""

from __future__ import annotations

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import DirectoryKey
from signing_proxy.verify import FetchResult
from signing_proxy.verify.gateway import DELEGATION_INVALID
from tests.verify.fakes import NOW, FakeFetch
from tests.verify.test_gateway import OWNER, World, _directory, world  # noqa: F401 (the fixture)

OWNER_DIRECTORY = OWNER + "/.well-known/http-message-signatures-directory"


def slow_issuer(world: World, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:  # noqa: F811
    """Each fetch of the issuer's directory takes ``seconds`` on the world's clock (undone after
    the test by ``monkeypatch``)."""
    plain = FakeFetch.__call__

    async def call(self: FakeFetch, url: str) -> FetchResult:
        if url == OWNER_DIRECTORY:
            world.clock.now += seconds
        return await plain(self, url)

    monkeypatch.setattr(FakeFetch, "__call__", call)


async def test_a_chain_valid_after_a_slow_issuer_fetch_is_accepted(
    world: World,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_issuer(world, monkeypatch, 4.0)
    verdict = await world.check(world.body(world.chain(exp=NOW + 5), expires_at=NOW + 5))
    assert verdict.delegation is not None
    assert world.clock.now == NOW + 4


async def test_a_chain_whose_exp_passed_while_its_issuer_was_fetched_is_refused(
    world: World,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_issuer(world, monkeypatch, 4.0)
    refusal = await world.refused(world.body(world.chain(exp=NOW + 2), expires_at=NOW + 2))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("expired: link 1:")  # the chain's exp, not only its mirror
    assert world.fetch.calls.count(OWNER_DIRECTORY) == 1


async def test_a_mirror_whose_expires_at_passed_while_the_issuer_was_fetched_is_refused(
    world: World,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_issuer(world, monkeypatch, 4.0)
    refusal = await world.refused(world.body(world.chain(), expires_at=NOW + 2))  # the chain: 30 min
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail == "expired: delegation.expires_at has passed"


async def test_a_chain_whose_exp_passed_while_its_issuer_was_fetched_again_is_refused(
    world: World,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (await world.check(world.body(world.chain()))).delegation is not None  # directory cached
    world.clock.now += 31  # past keyid_refetch_s: a token under an unlisted key fetches it again
    rotated = SigningKey.generate()
    world.fetch.answers[OWNER_DIRECTORY] = _directory(
        DirectoryKey(world.owner.public, NOW - 60, NOW + 3600),
        DirectoryKey(rotated.public, NOW - 1, NOW + 7200),
    )
    slow_issuer(world, monkeypatch, 4.0)
    at = int(world.clock.now)
    refusal = await world.refused(world.body(world.chain(owner=rotated, exp=at + 2), expires_at=at + 2))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("expired: link 1:")
    assert world.fetch.calls.count(OWNER_DIRECTORY) == 2  # cached, then fetched again (slowly)


async def test_an_issuer_key_whose_grace_ended_while_its_directory_was_fetched_anchors_nothing(
    world: World,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issuer's keys were filtered by their window (and grace) with the time read before the
    directory was fetched: a key whose grace ended during the fetch still anchored the chain."""
    grace = 3600  # the fixture's IssuerKeys(grace_s=3600)
    world.fetch.answers[OWNER_DIRECTORY] = _directory(
        DirectoryKey(world.owner.public, NOW - 7200, NOW - grace + 2)
    )
    slow_issuer(world, monkeypatch, 4.0)
    refusal = await world.refused(world.body(world.chain()))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("untrusted-issuer-key")
