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
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
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
    config = parse_config({"signing": {"signature_agent": "https://agent.example"}})
    pipeline = SigningPipeline(
        config=config,
        signer=signer,
        bearers=BearerStore(config.credentials, {}),
        profiles=ProfileSelector(config.profiles),
    )
    target = parse_absolute_uri("http://api.example/feed")
    out = pipeline.prepare("POST", target, [("Host", "api.example")], b"{}", framed=False)  # one pass
    head = out.head.decode("latin-1")
    fast = re.search(r"\r\nSignature-Input: ([^\r]*)", head)
    assert fast is not None
    assert window(fast[1]) == expected
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
