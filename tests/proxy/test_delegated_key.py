"""The delegated key (``proxy/requester.py``): while a delegation chain is configured, exchange calls
carrying it are signed with the key the chain is bound to (``cnf.jkt``) for as long as that key's
window lasts, even after a rotation; the proxy warns ahead (log, metric, ``/readyz``) and refuses with
503 ``delegation-key-expired`` once it has ended, never signing with a key the chain does not name."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from signing_proxy.core.delegation import verify_chain
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, VerificationKey, verify_stack
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ConfigError, ProxyError
from signing_proxy.net.framing import Outgoing
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.requester import RequesterInjector, injector_for
from signing_proxy.service.app import ProxyApp
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.oracle import oracle_verify
from tests.proxy.test_requester import BODY, DISCOVER, JSON_LINES, NOW, OWNER, config, make_chain, write_chain

GRACE_S = 600


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Rig:
    """A key store whose first key the chain is bound to, and the proxy's parts over it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.clock = Clock(NOW + 1)
        self.store = KeyStore(tmp_path / "data")
        self.store.create(NOW - 60)
        self.keys = StoreKeyProvider(self.store)
        self.first = self.key(self.keys.current(NOW + 1))
        write_chain(tmp_path / "delegation.jwt", make_chain(self.first))
        self.config = config(tmp_path, delegation={}).with_overrides(intercept={"enabled": False})
        made = injector_for(self.config, self.keys, clock=self.clock)
        assert made is not None
        self.injector: RequesterInjector = made
        self.signer = Signer(self.keys, label="agent", validity_s=300, clock=self.clock)

    @staticmethod
    def key(key: SigningKey | None) -> SigningKey:
        assert key is not None
        return key

    def rotate(self) -> SigningKey:
        new, _moved = self.store.rotate(self.clock.now, grace_s=GRACE_S)
        assert self.keys.reload(force=True)
        return self.keys.state().private[new.thumbprint]

    def send(self, url: str = DISCOVER, body: bytes = BODY) -> Outgoing:
        return SigningPipeline(
            config=self.config, signer=self.signer, bearers=BearerStore(()), requester=self.injector
        ).prepare("POST", parse_absolute_uri(url), JSON_LINES, body, framed=True)


def verified_keyid(out: Outgoing, now: float, *keys: SigningKey) -> str:
    """What the exchange sees at ``now``: layer 1 (our verifier and the oracle), then the holder binding."""
    head = out.head.decode("latin-1").split("\r\n")[1:]
    fields = Fields(
        (line.partition(": ")[0], line.partition(": ")[2])
        for line in head
        if ": " in line and not line.startswith("Host:")
    )
    trusted = {k.thumbprint: k for k in keys}
    stack = verify_stack(
        Message("POST", out.target, fields),
        out.body,
        lambda e, _i: VerificationKey(trusted[e.keyid].public) if e.keyid in trusted else None,
        now=now,
    )
    public = {t: k.public.key for t, k in trusted.items()}
    assert oracle_verify("POST", out.target.uri, list(fields), out.body, public, check_time=False) == [
        "agent"
    ]
    keyid = stack.agent.keyid
    requester = json.loads(out.body).get("requester")
    if requester is not None and "delegation" in requester:
        token = base64.b64decode(requester["delegation"]["token"]).decode()
        verify_chain(token, owner_keys=[OWNER.public], holder_jkt=keyid, now=now)  # the holder binding
    return keyid


def test_after_a_rotation_delegated_calls_keep_the_bound_key_until_its_window_ends(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert verified_keyid(rig.send(), rig.clock.now, rig.first) == rig.first.thumbprint
    rig.clock.now = NOW + 10
    second = rig.rotate()  # the first key retires: valid until NOW + 10 + GRACE_S
    rig.clock.now = NOW + 20
    plain = rig.send("https://pub.example/v1/svc.v1.ExchangeService/DiscoverResources")
    assert (
        verified_keyid(plain, rig.clock.now, second) == second.thumbprint
    )  # everything else moved to the new key
    assert (
        verified_keyid(rig.send(), rig.clock.now, rig.first) == rig.first.thumbprint
    )  # the holder, after rotation
    # a body that already carries the chain (discovery builds it from document()) is signed the same way
    built = json.dumps({"ver": "1.0", "requester": rig.injector.document()}).encode()
    assert verified_keyid(rig.send(body=built), rig.clock.now, rig.first) == rig.first.thumbprint
    rig.clock.now = NOW + 9 + GRACE_S  # the last second of the bound key's window
    assert verified_keyid(rig.send(), rig.clock.now, rig.first) == rig.first.thumbprint

    rig.clock.now = NOW + 10 + GRACE_S  # the bound key's not_after: refused, never re-keyed
    with pytest.raises(ProxyError) as info:
        rig.send()
    assert (info.value.status, info.value.reason) == (503, "delegation-key-expired")
    assert rig.first.thumbprint in info.value.detail
    assert "--holder-config" in info.value.detail
    with pytest.raises(ProxyError) as built_info:
        rig.send(body=built)  # not injected, but carrying the chain: refused too
    assert built_info.value.reason == "delegation-key-expired"
    assert rig.injector.check() == "delegation-key-expired"


def test_the_proxy_warns_ahead_of_the_bound_keys_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(tmp_path)
    app = ProxyApp(rig.config, rig.keys, clock=rig.clock)
    assert app.requester is not None
    status, doc = app.readiness()
    assert (status, doc["delegation_key"]) == (
        200,
        {
            "keyid": rig.first.thumbprint,
            "state": "ok",
            "not_after": doc["delegation_key"]["not_after"],  # type: ignore[index]
            "remaining_s": doc["delegation_key"]["remaining_s"],  # type: ignore[index]
        },
    )
    rig.clock.now = NOW + 10
    rig.rotate()
    rig.clock.now = NOW + 20
    app.requester.reload()  # the periodic check: logs the warning once
    app.requester.reload()
    assert caplog.text.count("stops signing at") == 1
    status, doc = app.readiness()
    assert status == 200  # a warning, never unready
    assert doc["delegation_key"] == {
        "keyid": rig.first.thumbprint,
        "state": "expiring",
        "not_after": "2027-01-15T08:10:10Z",
        "remaining_s": GRACE_S - 10,
    }
    assert f"signing_proxy_delegation_key_remaining_seconds {GRACE_S - 10}.0" in app.metrics.render().decode()
    rig.clock.now = NOW + 10 + GRACE_S
    status, doc = app.readiness()
    assert status == 503
    assert doc["checks"]["delegation"] == "delegation-key-expired"  # type: ignore[index]
    assert doc["delegation_key"]["state"] == "unusable"  # type: ignore[index]


def test_a_chain_bound_to_the_retiring_key_still_loads(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.clock.now = NOW + 10
    rig.rotate()
    rig.clock.now = NOW + 20  # a restart during the grace period: the old chain is still usable
    again = injector_for(rig.config, rig.keys, clock=rig.clock)
    assert again is not None
    assert again.check() == "ok"
    rig.clock.now = NOW + 10 + GRACE_S
    with pytest.raises(ConfigError) as info:  # refused at start-up once the window has ended
        injector_for(rig.config, rig.keys, clock=rig.clock)
    assert info.value.reason == "delegation-holder-mismatch"


def test_a_chain_reissued_to_a_key_not_yet_signing_waits_for_its_activation(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.clock.now = NOW + 10
    new, _moved = rig.store.rotate(rig.clock.now, grace_s=GRACE_S, activate_in_s=100)  # publish first
    assert rig.keys.reload(force=True)
    second = rig.keys.state().private[new.thumbprint]
    assert rig.keys.key_for(second.thumbprint, NOW + 20) is None  # caching verifiers may lack it yet
    write_chain(tmp_path / "delegation.jwt", make_chain(second))
    rig.clock.now = NOW + 20
    assert not rig.injector.reload()  # refused for now; the chain in force stays
    assert verified_keyid(rig.send(), rig.clock.now, rig.first) == rig.first.thumbprint
    rig.clock.now = NOW + 111  # activated: the re-issued chain is adopted on the next check
    assert rig.injector.reload()
    assert verified_keyid(rig.send(), rig.clock.now, second) == second.thumbprint
