"""A reload (on a worker thread) swapped the loaded chain and the rendered member in two stores; a
request on the loop between them checked the new chain and inserted the old one, bound to a key
that no longer signs. A request now reads both in one reference: it inserts the chain it checked."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from signing_proxy.errors import ProxyError
from signing_proxy.proxy.requester import RequesterInjector
from tests.proxy.test_requester import (
    NOW,
    PROXY,
    ROTATED,
    Clock,
    Keys,
    apply,
    injector,
    make_chain,
    write_chain,
)


class Racing(RequesterInjector):
    """Runs a request after each store the reload makes (wherever it is split in two, a request
    in between is run)."""

    reloading = False
    seen: list[bytes | ProxyError]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if type(self).reloading and name != "seen":
            type(self).reloading = False  # not again from within the request
            try:
                self.seen.append(apply(self))
            except ProxyError as refused:
                self.seen.append(refused)
            type(self).reloading = True


def test_a_request_during_a_reload_inserts_the_chain_it_checked(tmp_path: Path) -> None:
    keys, clock = Keys(PROXY), Clock()
    inj = injector(tmp_path, keys=keys, clock=clock)
    inj.__class__ = Racing
    assert isinstance(inj, Racing)
    inj.seen = []
    keys.key = ROTATED  # the old chain's holder no longer signs; the new chain is bound to ROTATED
    write_chain(tmp_path / "delegation.jwt", make_chain(holder=ROTATED, exp=int(NOW) + 1800))
    os.utime(tmp_path / "delegation.jwt", ns=(1, 1))
    clock.now += 1.5
    Racing.reloading = True
    assert inj.reload()
    Racing.reloading = False
    assert inj.seen  # a request ran after each store
    for during in inj.seen:
        if isinstance(during, bytes):  # inserted: then the chain of the key that signs, never the old one
            token = base64.b64decode(json.loads(during)["requester"]["delegation"]["token"]).decode()
            assert ROTATED.thumbprint in json.dumps(_claims(token)), "the old chain, checked as the new one"
        else:
            assert during.status == 503  # refused, as a request before the reload is (fail closed)
    after = json.loads(apply(inj))["requester"]["delegation"]
    assert ROTATED.thumbprint in json.dumps(_claims(base64.b64decode(after["token"]).decode()))


def _claims(chain: str) -> list[dict[str, Any]]:
    """Every link's claims (no check: what was inserted is what is asked)."""
    links = []
    for jwt in chain.split("~"):
        payload = jwt.split(".")[1]
        links.append(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
    return links
