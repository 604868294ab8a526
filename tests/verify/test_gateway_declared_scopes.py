"""The gateway's effective scopes with a delegation: the requester's declared scopes, each covered
by the chain's final scope (a declared scope the chain does not cover is refused like a widening),
else the chain's scope, else the exchange's default policy. Before, a delegation replaced the
declared scopes by the chain's: an exchange filtering by them served what the requester had not
asked for, and a chain without a scope claim lost the declared ones (the default policy instead)."""

from __future__ import annotations

import base64
import json

from signing_proxy.core.delegation import extend_chain, issue_authority
from signing_proxy.verify import apply_disclosure
from signing_proxy.verify.gateway import DELEGATION_INVALID, QUOTA_EXCEEDED
from tests.verify import test_gateway
from tests.verify.fakes import NOW
from tests.verify.test_gateway import OWNER, World

world = test_gateway.world  # the fixture

CATALOG = {
    "https://pub.example/ca": "dist:US:CA",
    "https://pub.example/ny": "dist:US:NY",
    "https://pub.example/news": "subscription:news",
    "https://pub.example/free": None,
}


def shown(scopes: tuple[str, ...] | None, default: tuple[str, ...] = ()) -> list[str]:
    groups = [{"uri": uri} for uri in CATALOG]
    kept = apply_disclosure(
        groups, scopes, lambda g: CATALOG[g["uri"]], policy="hide", default_scopes=default
    )
    return [group["uri"] for group in kept]


def unscoped_chain(w: World) -> str:
    """A chain none of whose links carries a scope claim (allowed: only the holder binding is not
    optional)."""
    authority = issue_authority(
        w.owner, iss=OWNER, holder_jkt=w.principal.thumbprint, now=NOW, exp=NOW + 3600
    )
    return extend_chain(authority, w.principal, holder_jkt=w.agent.thumbprint, now=NOW, exp=NOW + 1800)


async def test_declared_scopes_narrower_than_the_chain_are_the_effective_ones(world: World) -> None:
    body = world.body(world.chain(scope=["dist:US:*"]), scopes=["dist:US:CA"], delegation_scopes=())
    verdict = await world.check(body)
    assert verdict.scopes == ("dist:US:CA",)
    assert dict(verdict.headers())["X-Verified-Scopes"] == "dist:US:CA"
    assert shown(verdict.scopes) == ["https://pub.example/ca", "https://pub.example/free"]


async def test_a_declared_scope_the_chain_does_not_cover_is_refused(world: World) -> None:
    """The reviewer's case: declared dist:US:CA:SF under a chain granting dist:US:CA. Matching is
    segment-wise with no implicit prefix (spec "Scopes"), so the grant does not cover it: refused,
    as is a declared scope outside the grant altogether; neither spends an access."""
    chain = world.chain(max_accesses=1)
    for declared in (["dist:US:CA:SF"], ["dist:US:CA", "dist:US:NY"]):
        refusal = await world.refused(world.body(chain, scopes=declared))
        assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
        assert refusal.detail.startswith("scope-wider: ")
    verdict = await world.check(world.body(chain, scopes=["dist:US:CA"]))
    assert verdict.remaining_accesses == 0  # the refused requests were not counted


async def test_a_chain_without_a_scope_keeps_the_declared_scopes(world: World) -> None:
    body = world.body(unscoped_chain(world), scopes=["subscription:news"], delegation_scopes=())
    verdict = await world.check(body)
    assert verdict.scopes == ("subscription:news",)
    assert dict(verdict.headers())["X-Verified-Scopes"] == "subscription:news"
    assert shown(verdict.scopes, default=("*",)) == ["https://pub.example/news", "https://pub.example/free"]


async def test_no_declared_scopes_take_the_chains_scope(world: World) -> None:
    verdict = await world.check(world.body(world.chain()))
    assert verdict.scopes == ("dist:US:CA",)
    assert dict(verdict.headers())["X-Verified-Scopes"] == "dist:US:CA"


async def test_no_declared_scopes_and_no_chain_scope_is_the_default_policy(world: World) -> None:
    verdict = await world.check(world.body(unscoped_chain(world), delegation_scopes=()))
    assert verdict.delegation is not None
    assert verdict.scopes is None
    assert "X-Verified-Scopes" not in dict(verdict.headers())
    assert shown(verdict.scopes, default=("dist:US:NY",)) == [
        "https://pub.example/ny",
        "https://pub.example/free",
    ]


async def test_without_a_delegation_the_declared_scopes_as_before(world: World) -> None:
    verdict = await world.check(world.body(scopes=["dist:US:NY"]))
    assert verdict.scopes == ("dist:US:NY",)
    assert dict(verdict.headers())["X-Verified-Scopes"] == "dist:US:NY"
    plain = await world.check(world.body())
    assert not plain.scopes
    assert "X-Verified-Scopes" not in dict(plain.headers())


async def test_two_spellings_of_one_token_count_against_one_quota(world: World) -> None:
    """proto-JSON bytes may come URL-safe and unpadded; the quota is keyed by the decoded chain."""
    chain = world.chain(max_accesses=1)
    canonical = world.body(chain)
    doc = json.loads(canonical)
    delegation = doc["requester"]["delegation"]
    delegation["token"] = base64.urlsafe_b64encode(chain.encode()).decode().rstrip("=")
    other = json.dumps(doc).encode()
    assert other != canonical
    assert (await world.check(other)).remaining_accesses == 0
    refusal = await world.refused(canonical)
    assert (refusal.status, refusal.reason) == (429, QUOTA_EXCEEDED)
