"""Issue 15 attack 1, "revoke anyone's key": a stranger's directory whose revocation list names a
victim's thumbprint must change nothing for the victim (DESIGN section 7: a revocation list applies
only to its own directory's keys); the victim's own list still revokes the victim."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerificationError,
    directory_url,
)
from tests.verify.strangers import BODY, TARGET, CountingFetch, directory_doc, forged, revocation_doc, signed

VICTIM = SigningKey.from_seed(bytes(range(32)))
ATTACKER = SigningKey.from_seed(bytes(range(7, 39)))
VICTIM_DIR = "https://victim.example"
ATTACKER_DIR = "https://attacker.example"
VICTIM_LIST = "https://victim.example/revoked.json"
ATTACKER_LIST = "https://attacker.example/revoked.json"


def world(now: int) -> CountingFetch:
    fetch = CountingFetch()
    fetch.answers[directory_url(VICTIM_DIR)] = FetchResult(
        200, directory_doc(VICTIM, now=now, revocation_url=VICTIM_LIST), None
    )
    fetch.answers[VICTIM_LIST] = FetchResult(200, revocation_doc(as_of=now), None)
    fetch.answers[directory_url(ATTACKER_DIR)] = FetchResult(
        200, directory_doc(ATTACKER, now=now, revocation_url=ATTACKER_LIST), None
    )
    fetch.answers[ATTACKER_LIST] = FetchResult(200, revocation_doc(VICTIM.thumbprint, as_of=now), None)
    return fetch


async def test_poisoning_an_attackers_list_naming_the_victim_leaves_the_victim_accepted() -> None:
    now = int(time.time())
    fetch = world(now)
    verifier = RequestVerifier(DirectoryResolver(fetch), revocations=RevocationPoller(fetch))
    # the attacker's own, valid request makes the verifier fetch the attacker's list
    attack = await verifier.verify("POST", TARGET, signed(f'"{ATTACKER_DIR}"', ATTACKER, now=now), BODY)
    assert attack.agent.keyid == ATTACKER.thumbprint
    assert ATTACKER_LIST in fetch.calls
    victim = await verifier.verify("POST", TARGET, signed(f'"{VICTIM_DIR}"', VICTIM, now=now), BODY)
    assert victim.agent.keyid == VICTIM.thumbprint  # not key-revoked: the list was not the victim's
    await verifier.close()


async def test_poisoning_with_an_expired_garbage_signature_fetches_nothing() -> None:
    now = int(time.time())
    fetch = world(now)
    verifier = RequestVerifier(DirectoryResolver(fetch), revocations=RevocationPoller(fetch))
    garbage = forged(f'"{ATTACKER_DIR}"', ATTACKER.thumbprint, now=now, created=now - 120, expires=now - 60)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, garbage, BODY)
    assert err.value.reason == "signature-expired"
    assert fetch.calls == []  # refused before any I/O
    await verifier.close()


async def test_the_victims_own_list_still_revokes_the_victim() -> None:
    now = int(time.time())
    fetch = world(now)
    fetch.answers[VICTIM_LIST] = FetchResult(200, revocation_doc(VICTIM.thumbprint, as_of=now), None)
    verifier = RequestVerifier(DirectoryResolver(fetch), revocations=RevocationPoller(fetch))
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, signed(f'"{VICTIM_DIR}"', VICTIM, now=now), BODY)
    assert err.value.reason == "key-revoked"
    await verifier.close()


@pytest.mark.parametrize("entries", [1024, 1], ids=["victim-cached", "victim-kept-aside"])
async def test_poisoning_one_strangers_long_list_leaves_others_directories_and_kept_revocations(
    entries: int,
) -> None:
    """The victim's list revoked VICTIM, then stopped naming it (it stays revoked). The attacker's
    list of 60,000 thumbprints (2.8 MB) was charged 9.6 MB to the attacker's directory entry: past the
    cache's 8 MiB, which pushed every other directory out, then past the 4 MiB of kept-aside sets,
    which dropped the victim's. VICTIM was accepted again. A list that long is now refused. (With one
    cache entry, the attacker's directory pushes the victim's out: its set is kept aside.)"""
    now = int(time.time())
    fetch = world(now)
    fetch.answers[VICTIM_LIST] = FetchResult(200, revocation_doc(VICTIM.thumbprint, as_of=now), None)
    resolver, poller = DirectoryResolver(fetch, max_entries=entries), RevocationPoller(fetch)
    verifier = RequestVerifier(resolver, revocations=poller)
    victim = signed(f'"{VICTIM_DIR}"', VICTIM, now=now)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, victim, BODY)
    assert err.value.reason == "key-revoked"
    fetch.answers[VICTIM_LIST] = FetchResult(200, revocation_doc(as_of=now + 1), None)
    assert await poller.poll_once(directory_url(VICTIM_DIR), VICTIM_LIST)  # omits VICTIM: still revoked
    many = (hashlib.sha256(b"%d" % i).digest() for i in range(60_000))
    long_list = revocation_doc(*(base64.urlsafe_b64encode(d).rstrip(b"=").decode() for d in many), as_of=now)
    fetch.answers[ATTACKER_LIST] = FetchResult(200, long_list, None)
    attack = forged(f'"{ATTACKER_DIR}"', ATTACKER.thumbprint, now=now)
    with pytest.raises(VerificationError) as refused:
        await verifier.verify("POST", TARGET, attack, BODY)
    assert resolver.holds(directory_url(VICTIM_DIR)) == (entries > 1)  # else kept aside, out of it
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, victim, BODY)
    assert err.value.reason == "key-revoked"
    assert refused.value.reason == "revocation-unavailable"  # the attacker's own keys fail closed
    await verifier.close()
