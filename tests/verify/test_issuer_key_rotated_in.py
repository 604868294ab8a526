"""A token signed by a key its issuer rotated in after the gateway cached the issuer's directory is
accepted: the directory is fetched again (at most once per ``keyid_refetch_s``, as for an agent's
unknown ``keyid``) before the token is refused, so an issuer's rotation never causes a refusal. A
token under a key nobody published is still refused, and does not make the directory be fetched at
every request."""

from __future__ import annotations

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import DirectoryKey
from signing_proxy.verify.gateway import DELEGATION_INVALID
from tests.verify.fakes import NOW
from tests.verify.test_gateway import OWNER, World, _directory, world  # noqa: F401 (the fixture)

OWNER_DIRECTORY = OWNER + "/.well-known/http-message-signatures-directory"


def fetches(world: World) -> int:  # noqa: F811 (the fixture's name)
    return world.fetch.calls.count(OWNER_DIRECTORY)


async def test_a_token_under_a_key_rotated_in_since_the_directory_was_cached_is_accepted(
    world: World,  # noqa: F811 (the fixture)
) -> None:
    assert (await world.check(world.body(world.chain()))).delegation is not None  # cached: the old key
    world.clock.now += 31  # later than keyid_refetch_s (30 s) after the fetch
    rotated = SigningKey.generate()
    world.fetch.answers[OWNER_DIRECTORY] = _directory(
        DirectoryKey(world.owner.public, NOW - 60, NOW + 3600),
        DirectoryKey(rotated.public, NOW - 1, NOW + 7200),
    )
    verdict = await world.check(world.body(world.chain(owner=rotated)))
    assert verdict.delegation is not None
    assert fetches(world) == 2  # once cached, once fetched again for the key it did not list


async def test_a_token_under_an_unpublished_key_is_refused_and_fetches_again_once(
    world: World,  # noqa: F811 (the fixture)
) -> None:
    assert (await world.check(world.body(world.chain()))).delegation is not None
    world.clock.now += 31
    for _ in range(3):
        refusal = await world.refused(world.body(world.chain(owner=SigningKey.generate())))
        assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
        assert refusal.detail.startswith("untrusted-issuer-key")
    assert fetches(world) == 2  # one fetch again, then none until keyid_refetch_s has passed
