"""A private key object the token does not let sign (CKA_SIGN false) is refused as
``token-key-unsupported``, naming the key and never the PIN.

The fault: python-pkcs11 builds such an object without a ``sign`` method, so the challenge at open
raised AttributeError, which is no TokenError: it escaped ``Pkcs11Module.call`` and ``tracked``, the
probe raised it and a request's signature got a traceback (a 500) instead of a 503 with a reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.errors import TokenError
from signing_proxy.storage.pkcs11 import (
    ED25519_CURVE_OID,
    Pkcs11KeyProvider,
    TokenKey,
    TokenSlot,
    module_for,
    open_token_key,
)
from tests.softhsm import PIN, SoftHsm

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")


def _pair_that_may_not_sign(slot: TokenSlot, label: str) -> Any:
    """An Ed25519 key pair under ``label`` whose private key has CKA_SIGN false; its public key."""
    from pkcs11.util.ec import encode_named_curve_parameters

    with slot.module.lock:
        public, _private = slot.session(rw=True).generate_keypair(
            p11.KeyType.EC_EDWARDS,
            mechanism=p11.Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
            store=True,
            public_template={
                p11.Attribute.TOKEN: True,
                p11.Attribute.LABEL: label,
                p11.Attribute.EC_PARAMS: encode_named_curve_parameters(ED25519_CURVE_OID),
                p11.Attribute.VERIFY: True,
            },
            private_template={
                p11.Attribute.TOKEN: True,
                p11.Attribute.LABEL: label,
                p11.Attribute.PRIVATE: True,
                p11.Attribute.SENSITIVE: True,
                p11.Attribute.SIGN: False,
            },
        )
    return public


def test_a_private_key_that_may_not_sign_is_token_key_unsupported(hsm: SoftHsm) -> None:
    uri = parse_pkcs11_uri(hsm.uri("nosign"))
    slot = TokenSlot(module_for(hsm.module), uri, PIN, 2.0)
    _pair_that_may_not_sign(slot, "nosign")

    with pytest.raises(TokenError) as opened:  # at start-up (signing.key) or keys add
        open_token_key(slot, uri)
    assert opened.value.reason == "token-key-unsupported"
    assert "object 'nosign'" in opened.value.detail
    assert "CKA_SIGN" in opened.value.detail
    assert PIN not in str(opened.value)
    assert slot.failure == "token-key-unsupported"

    key = TokenKey(slot, uri, slot.public_key(uri))  # as a key store entry opens it (public key only)
    provider = Pkcs11KeyProvider(key)
    provider.probe()  # no exception: the probe thread carries on
    assert key.probe() is False
    assert provider.unavailable() == "token-key-unsupported"  # /readyz says why
    with pytest.raises(TokenError) as signed:
        key.sign_within(b"base")
    assert signed.value.reason == "token-key-unsupported"

    async def sign_async() -> TokenError:
        with pytest.raises(TokenError) as caught:
            await key.sign_async(b"base")
        return caught.value

    assert asyncio.run(sign_async()).reason == "token-key-unsupported"  # a 503 with a reason, not a 500
    assert slot.module.stalled is None
