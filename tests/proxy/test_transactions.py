"""One key per transaction (``proxy/transactions.py``, spec "Bound retrieval URLs" 4): the proxy reads
the ExecuteTransaction answers it forwards, and a later fetch of a bound retrieval URL is signed with
the transaction's key and presents it, after a rotation too; when that key may no longer sign the fetch
is refused, never signed with another. Times are injected: the key store's windows are exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.retrieval import sign_retrieval_url
from signing_proxy.core.signature_key import RETRIEVAL_COMPONENTS
from signing_proxy.core.signatures import Message, VerificationKey, verify_stack
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.framing import Outgoing
from signing_proxy.net.upstream import ResponseHead
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.transactions import MAX_TTL_S, TransactionKeys
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.verify import DeliveryPolicy, DeliveryVerifier, DirectoryResolver, RequestVerifier
from tests.oracle import oracle_verify
from tests.verify.fakes import FakeFetch

T = 1_800_000_000
EXCHANGE = SigningKey.from_seed(b"\x51" * 32)
EXECUTE = "https://exchange.example/v1/svc.v1.ExchangeService/ExecuteTransaction"
OBJECT = "https://cdn.example/objects/42"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Rig:
    """A key store (first key at T), the signer and the transaction keys over it, one clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock(T + 1)
        self.store = KeyStore(tmp_path / "data")
        self.first = self.store.create(T).thumbprint
        self.keys = StoreKeyProvider(self.store)
        self.config = parse_config({"data_dir": str(tmp_path / "data")})
        self.signer = Signer(self.keys, label="agent", validity_s=300, clock=self.clock)
        self.transactions = TransactionKeys(self.keys, clock=self.clock)

    def rotate(self, *, grace_s: int) -> str:
        new, _moved = self.store.rotate(self.clock.now, grace_s=grace_s)
        assert self.keys.reload(force=True)
        return new.thumbprint

    def answer(self, body: object, *, keyid: str | None = None, status: int = 200) -> int:
        """Forward an ExecuteTransaction signed with ``keyid`` whose answer is ``body``."""
        tap = self.transactions.tap_for("POST", parse_absolute_uri(EXECUTE), keyid or self.first)
        assert tap is not None
        tap.head = ResponseHead(
            status=status,
            reason="OK",
            version="1.1",
            headers=[(b"Content-Type", b"application/json")],
            content_length=None,
            keep_alive=True,
        )
        tap.feed(json.dumps(body).encode())
        before = len(self.transactions)
        assert tap.on_complete is not None
        tap.on_complete(tap)
        return len(self.transactions) - before

    def send(self, url: str, lines: list[tuple[str, str]] | None = None) -> Outgoing:
        return SigningPipeline(
            config=self.config, signer=self.signer, bearers=BearerStore(()), transactions=self.transactions
        ).prepare("GET", parse_absolute_uri(url), lines or [], b"", framed=False)


def bound(agent: str, *, path: str = OBJECT, expires: int = T + 600) -> str:
    return sign_retrieval_url(path, EXCHANGE, agent_id=agent, expires=expires)


def sent_fields(out: Outgoing) -> Fields:
    head = out.head.decode("latin-1").split("\r\n")[1:]
    return Fields(
        (line.partition(": ")[0], line.partition(": ")[2])
        for line in head
        if ": " in line and not line.startswith("Host:")
    )


def keyid_of(out: Outgoing, target: Target, public: SigningKey, *, six: bool) -> str:
    """Verify what was sent with ``public`` (our verifier and the oracle); return its keyid."""
    fields = sent_fields(out)
    required = RETRIEVAL_COMPONENTS if six else RETRIEVAL_COMPONENTS[:5]
    stack = verify_stack(
        Message(out.method, target, fields),
        out.body,
        lambda e, _i: VerificationKey(public.public) if e.keyid == public.thumbprint else None,
        now=T + 30,
        required=required,
    )
    keys = {public.thumbprint: public.public.key}
    assert oracle_verify(out.method, target.uri, list(fields), out.body, keys, check_time=False) == ["agent"]
    return stack.agent.keyid


def test_a_bound_fetch_is_signed_by_the_transactions_key_after_a_rotation_and_presents_it(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    url = bound(rig.first)
    assert rig.answer({"agent_identity_hash": rig.first, "retrieval_endpoint": url}) == 1
    rig.clock.now = T + 20
    second = rig.rotate(grace_s=100)  # the first key now retires: valid until T + 120
    rig.clock.now = T + 30
    other = rig.send("https://cdn.example/elsewhere")
    assert sent_fields(other).combined("signature-key") is None  # an ordinary request presents nothing
    assert other.keyid == second
    out = rig.send(url, [("Signature-Key", 'agent=hwk;kty="OKP";crv="Ed25519";x="forged"')])
    assert out.keyid == rig.first
    first_key = rig.keys.state().private[rig.first]
    target = parse_absolute_uri(url)
    assert keyid_of(out, target, first_key, six=True) == rig.first
    presented = sent_fields(out).get_all("signature-key")
    assert presented == [f'agent=hwk;kty="OKP";crv="Ed25519";x="{first_key.public.jwk()["x"]}";alg="Ed25519"']


async def test_the_delivery_check_accepts_what_the_proxy_sends(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    url = bound(rig.first)
    rig.answer({"retrieval_endpoint": {"url": url}})
    rig.clock.now = T + 20
    rig.rotate(grace_s=100)
    out = rig.send(url)
    resolver = DirectoryResolver(FakeFetch(), clock=lambda: T + 30)
    delivery = DeliveryVerifier(
        RequestVerifier(resolver, clock=lambda: T + 30),
        DeliveryPolicy(pinned_exchange_keys=(EXCHANGE.public,)),
    )
    verified = await delivery.verify("GET", url, sent_fields(out), out.body)
    assert verified.agent_id == verified.signature.keyid == rig.first


def test_a_fetch_whose_key_is_gone_is_refused_naming_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    url = bound(rig.first, expires=T + 3600)
    rig.answer({"retrieval_endpoint": url})
    rig.clock.now = T + 20
    rig.rotate(grace_s=100)
    rig.clock.now = T + 120  # the first key's window has ended
    with pytest.raises(ProxyError) as info:
        rig.send(url)
    assert (info.value.status, info.value.reason) == (503, "transaction-key-unavailable")
    assert rig.first in info.value.detail
    assert rig.send("https://cdn.example/elsewhere").keyid != rig.first  # others are unaffected


def test_only_urls_bound_to_the_key_that_signed_the_call_are_remembered(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    stranger = SigningKey.from_seed(b"\x52" * 32).thumbprint
    assert rig.answer({"retrieval_endpoint": bound(stranger)}) == 0
    assert rig.answer({"retrieval_endpoint": bound(rig.first)}, status=500) == 0
    assert rig.answer({"retrieval_endpoint": bound(rig.first, expires=T)}) == 0  # already expired
    assert rig.answer({"retrieval_endpoint": "https://cdn.example/bearer"}) == 0  # unbound
    assert (
        rig.answer(
            {"items": [{"retrieval_endpoint": bound(rig.first, path=OBJECT + str(i))} for i in range(3)]}
        )
        == 3
    )


def test_a_url_not_remembered_is_bound_when_its_agent_id_names_a_key_of_ours(tmp_path: Path) -> None:
    rig = Rig(tmp_path)  # e.g. another worker process forwarded the ExecuteTransaction
    rig.clock.now = T + 20
    second = rig.rotate(grace_s=100)
    rig.clock.now = T + 30
    assert rig.send(bound(rig.first)).keyid == rig.first
    stranger = SigningKey.from_seed(b"\x53" * 32).thumbprint
    assert rig.send(bound(stranger)).keyid == second  # not ours: an ordinary request


def test_memory_is_bounded_and_entries_expire(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.transactions = TransactionKeys(rig.keys, clock=rig.clock, max_entries=2)
    for i in range(3):
        rig.answer({"retrieval_endpoint": bound(rig.first, path=f"{OBJECT}/{i}", expires=T + 10**6)})
    assert len(rig.transactions) == 2
    rig.clock.now = T + 1 + MAX_TTL_S  # capped at a day whatever expires_at says
    target = parse_absolute_uri(bound(rig.first, path=f"{OBJECT}/2", expires=T + 10**6))
    rig.store.revoke(rig.first, rig.clock.now, force=True)
    rig.keys.reload(force=True)
    assert rig.transactions.bound_key(target) is None
    assert len(rig.transactions) == 1


def test_only_signed_execute_transaction_posts_are_tapped(tmp_path: Path) -> None:
    keys = TransactionKeys(Rig(tmp_path).keys)
    execute = parse_absolute_uri(EXECUTE)
    assert keys.tap_for("POST", execute, "k") is not None
    assert keys.tap_for("POST", execute, None) is None  # forwarded unsigned (hosts.unsigned)
    assert keys.tap_for("GET", execute, "k") is None
    assert keys.tap_for("POST", parse_absolute_uri(EXECUTE.replace("Execute", "Discover")), "k") is None
