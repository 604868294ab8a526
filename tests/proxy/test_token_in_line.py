"""A token key that signs in-line (``SigningPipeline.prepare``: the one-pass path and ``Signer.sign``)
answers a failing token as the off-loop path does: 503 ``signing-token-unavailable``, never a 500.

The proxy signs with a token key off the event loop (``keys.blocking``), but a reload may bring one
in as a request began (the request then signs in-line): its ``TokenError`` escaped as an internal
error. All three paths now give the same answer, and the request is never forwarded unsigned.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.metrics import Metrics
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.storage.pkcs11 import Pkcs11KeyProvider, TokenSlot, generate_token_key, module_for
from tests.softhsm import PIN, SoftHsm, use_in_this_process

pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")


def test_a_failing_token_is_503_on_every_signing_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hsm = SoftHsm(tmp_path)
    use_in_this_process(hsm, monkeypatch)
    slot = TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri("agent")), PIN)
    key = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent")))
    config = parse_config({"signing": {"signature_agent": "https://agent.example"}})
    metrics = Metrics()
    signer = Signer(Pkcs11KeyProvider(key), label="agent", validity_s=300, metrics=metrics)
    pipeline = SigningPipeline(
        config=config,
        signer=signer,
        bearers=BearerStore(config.credentials, {}),
        profiles=ProfileSelector(config.profiles),
    )
    target = parse_absolute_uri("http://api.example/feed")
    lines = [("Host", "api.example")]
    assert pipeline.prepare("GET", target, lines, b"", framed=False).keyid == key.thumbprint  # it signs

    answers: list[tuple[int, str, str]] = []
    with hsm.removed():
        for sign in (
            lambda: pipeline.prepare("GET", target, lines, b"", framed=False),  # the one-pass path
            lambda: pipeline.sign_fields("GET", target, lines, b""),  # Signer.sign
            lambda: asyncio.run(pipeline.prepare_off_loop("GET", target, lines, b"", framed=False)),
        ):
            with pytest.raises(ProxyError) as refused:
                sign()
            answers.append((refused.value.status, refused.value.reason, refused.value.detail))
    assert answers[0][:2] == (503, "signing-token-unavailable")
    assert answers[0] == answers[1] == answers[2]  # the same answer whichever path signed
    failures = metrics.signing_failures.labels(reason="signing-token-unavailable")._value.get()
    assert failures == 3
