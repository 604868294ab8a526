"""No revocation poller starts once the verifier is closed: a verification whose directory arrived
while ``RequestVerifier.close`` ran started one, a task asleep for 300 s that then polled through a
closed client."""

from __future__ import annotations

import asyncio

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
    directory_url,
)
from tests.verify.fakes import NOW, Clock
from tests.verify.strangers import BODY, TARGET, directory_doc, revocation_doc, signed

KEY = SigningKey.from_seed(bytes(range(32)))
WAIT_S = 10.0


class GatedFetch:
    """Answers from ``answers``; a URL in ``gates`` waits for its event first."""

    def __init__(self) -> None:
        self.answers: dict[str, FetchResult] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.asked: dict[str, asyncio.Event] = {}

    async def __call__(self, url: str) -> FetchResult:
        self.asked.setdefault(url, asyncio.Event()).set()
        gate = self.gates.get(url)
        if gate is not None:
            await gate.wait()
        return self.answers[url]


async def test_a_verification_finishing_as_the_verifier_closes_starts_no_poller() -> None:
    clock, fetch = Clock(), GatedFetch()
    first, second = "https://a.example", "https://b.example"
    for base in (first, second):
        listed = base + "/revoked.json"
        doc = directory_doc(KEY, now=int(NOW), revocation_url=listed)
        fetch.answers[directory_url(base)] = FetchResult(200, doc, "max-age=300")
        fetch.answers[listed] = FetchResult(200, revocation_doc(as_of=int(NOW)), None)
    fetch.gates[directory_url(second)] = gate = asyncio.Event()
    asked = fetch.asked.setdefault(directory_url(second), asyncio.Event())
    poller = RevocationPoller(fetch, clock=clock)
    verifier = RequestVerifier(
        DirectoryResolver(fetch, clock=clock), VerifierPolicy(), revocations=poller, clock=clock
    )
    await verifier.verify("POST", TARGET, signed(first, KEY, now=int(NOW)), BODY)
    assert poller.pollers() == 1
    late = asyncio.create_task(verifier.verify("POST", TARGET, signed(second, KEY, now=int(NOW)), BODY))
    await asyncio.wait_for(asked.wait(), WAIT_S)  # its directory's fetch is in flight
    gate.set()  # and completes as close() begins
    await verifier.close()
    await asyncio.gather(late, return_exceptions=True)
    assert poller.pollers() == 0
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not left, [t.get_coro() for t in left]
