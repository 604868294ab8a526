"""A signature never outlives the key that made it (spec "Key publication, rotation and revocation":
"Signatures by the key are rejected at and after not_after").

``expires`` was ``created + signing.validity_s`` whatever the key's window: a signature made in the
last ``validity_s`` seconds of a key's window (a key at the end of its life with no successor, the
old key a delegation binds after a rotation) claimed a validity every verifier refuses from the
key's ``not_after`` on. Both signing paths (the one-pass path and ``Signer.sign``) now cut it there,
and a real key store gives the window.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.rotation import CLOCK_MARGIN_S
from signing_proxy.core.signature_components import Message
from signing_proxy.core.signature_verify import VerificationKey, verify_stack
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.proxy.signer import Repeats
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.oracle import oracle_verify

T = 1_900_000_000
LIFETIME_S = 1000  # the store's key: [T, T + 1000)
VALIDITY_S = 300


def signer_at(tmp_path: Path, now: float) -> tuple[Signer, StoreKeyProvider]:
    store = KeyStore(tmp_path / "data")
    store.create(T, lifetime_s=LIFETIME_S)
    keys = StoreKeyProvider(store)
    return Signer(keys, label="agent", validity_s=VALIDITY_S, clock=lambda: now), keys


def pipeline_of(signer: Signer) -> SigningPipeline:
    config = parse_config({"signing": {"signature_agent": "https://agent.example"}})
    return SigningPipeline(
        config=config,
        signer=signer,
        bearers=BearerStore(config.credentials, {}),
        profiles=ProfileSelector(config.profiles),
    )


def window(signature_input: str) -> tuple[int, int]:
    created = re.search(r";created=(\d+)", signature_input)
    expires = re.search(r";expires=(\d+)", signature_input)
    assert created is not None
    assert expires is not None
    return int(created[1]), int(expires[1])


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0, (T, T + VALIDITY_S)),  # far from the end: the configured validity
        (LIFETIME_S - VALIDITY_S, (T + 700, T + 1000)),  # ends exactly at not_after
        (LIFETIME_S - 100, (T + 900, T + 1000)),  # cut at not_after
        (LIFETIME_S - 0.5, (T + 999, T + 1000)),  # the last second of the window
    ],
)
def test_both_signing_paths_end_a_signature_with_its_key(
    tmp_path: Path, offset: float, expected: tuple[int, int]
) -> None:
    signer, keys = signer_at(tmp_path, T + offset)
    pipeline = pipeline_of(signer)
    target = parse_absolute_uri("http://api.example/feed")
    out = pipeline.prepare("POST", target, [("Host", "api.example")], b"{}", framed=False)  # one pass
    head = out.head.decode("latin-1")
    fast = re.search(r"\r\nSignature-Input: ([^\r]*)", head)
    assert fast is not None
    assert window(fast[1]) == expected
    signer.repeats = Repeats()  # a first signature of the request this second, as the one above
    general = pipeline.sign_fields("POST", target, [("Host", "api.example")], b"{}")
    assert window(general.fields.combined("signature-input") or "") == expected  # the general path
    key = keys.current(T + offset)
    assert key is not None
    fields = [(n, v) for n, _, v in (line.partition(": ") for line in head.split("\r\n")[1:] if line)]
    verified = oracle_verify(
        "POST", target.uri, fields, out.body, {key.thumbprint: key.public.key}, check_time=False
    )
    assert verified == ["agent"]


def test_signer_expires_never_passes_not_after(tmp_path: Path) -> None:
    signer, keys = signer_at(tmp_path, T)
    key = keys.current(T)
    assert key is not None
    assert signer.expires(key, T, VALIDITY_S) == T + VALIDITY_S
    assert signer.expires(key, T + 990, VALIDITY_S) == T + LIFETIME_S
    assert signer.expires(key, T + 999, 3600) == T + LIFETIME_S


@pytest.mark.parametrize("rotated", [False, True], ids=["first-key", "rotate-now"])
@pytest.mark.parametrize("behind_s", [1, 3, CLOCK_MARGIN_S])
def test_a_new_keys_first_signature_holds_for_a_verifier_whose_clock_is_behind(
    tmp_path: Path, rotated: bool, behind_s: int
) -> None:
    """ "Verifiers MUST reject signatures whose key is outside its window": a key that signs the
    moment it is made (the first key; ``keys rotate`` with no delay) had its window open that second,
    so a verifier a second behind refused its first signatures as ``key-outside-window``. The window
    now opens ``CLOCK_MARGIN_S`` before the key is made; ``created`` is forgiven by the verifier's skew."""
    store = KeyStore(tmp_path / "data")
    made = T + 0.4
    store.create(made - (1000 if rotated else 0), lifetime_s=5000)
    if rotated:
        store.rotate(made, grace_s=50, lifetime_s=1000)
    keys = StoreKeyProvider(store)
    key = keys.current(made)
    assert key is not None
    state = store.load()
    record = state.record(key.thumbprint)
    assert record is not None
    assert record.activation == T  # the new key signs from the second it was made
    (published,) = [k for k in state.directory(made, None).keys if k.thumbprint == key.thumbprint]
    signer = Signer(keys, label="agent", validity_s=VALIDITY_S, clock=lambda: made)
    pipeline = pipeline_of(signer)
    target = parse_absolute_uri("http://api.example/feed")
    out = pipeline.sign_fields("POST", target, [("Host", "api.example")], b"{}")
    window_key = VerificationKey(key.public, published.not_before, published.not_after)
    stack = verify_stack(
        Message("POST", target, out.fields),
        b"{}",
        lambda e, _i: window_key if e.keyid == key.thumbprint else None,
        now=made - behind_s,
    )
    assert stack.agent.keyid == key.thumbprint
    with pytest.raises(VerificationError, match="outside its window"):  # the margin is the bound
        verify_stack(
            Message("POST", target, out.fields),
            b"{}",
            lambda e, _i: window_key if e.keyid == key.thumbprint else None,
            now=made - CLOCK_MARGIN_S - 1,
            skew_s=CLOCK_MARGIN_S + 5,  # created forgiven: the key's window alone refuses
        )
