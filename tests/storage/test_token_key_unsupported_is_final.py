"""A key object the token holds but cannot sign with (``token-key-unsupported``: CKA_SIGN false, or
not an Ed25519 key) is a final refusal: the request is refused at once with that reason, the module
is not reset, and a fixed key is picked up by the probe or by a reload (SIGHUP, a rotation).

The fault: ``Pkcs11Module.call`` took the reason for a failure of the module or its session, so
every signature (and every probe, once a second) reset the module twice (sessions closed, the
module re-initialised, every key's handle taken and proved again) and held up the module's other
keys, for an object no reset changes. The module's ``generation`` counts its resets.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.pkcs11_uri import Pkcs11Uri, parse_pkcs11_uri
from signing_proxy.errors import TokenError
from signing_proxy.storage.keystore import KeyStore, TokenKeys
from signing_proxy.storage.pkcs11 import (
    Pkcs11KeyProvider,
    TokenKey,
    TokenSlot,
    generate_token_key,
    module_for,
)
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider
from tests.softhsm import PIN, SoftHsm
from tests.storage.test_token_key_without_sign import _pair_that_may_not_sign

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")

P256_OID = "1.2.840.10045.3.1.7"  # RFC 5480 secp256r1: an EC key, not Ed25519


def _slot(hsm: SoftHsm, obj: str) -> TokenSlot:
    return TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri(obj)), PIN, 2.0)


def _opener(slot: TokenSlot) -> TokenKeys:
    """The key store's opener, as ``service.tokenkeys`` makes it: one slot per token, a new key per load."""

    def open_key(uri: str, public: PublicKey) -> SigningKey:
        return TokenKey(slot, parse_pkcs11_uri(uri), public)

    return open_key


def _allow_signing(slot: TokenSlot, label: str) -> None:
    """The operator's fix: CKA_SIGN true on the private key object under ``label``."""
    with slot.module.lock:
        private = slot.session(rw=True).get_key(object_class=p11.ObjectClass.PRIVATE_KEY, label=label)
        private[p11.Attribute.SIGN] = True


def _refused(key: TokenKey) -> str:
    with pytest.raises(TokenError) as caught:
        key.sign_within(b"signature base")
    assert PIN not in str(caught.value)
    return caught.value.reason


def test_a_key_that_may_not_sign_is_refused_at_once_without_a_module_reset(hsm: SoftHsm) -> None:
    slot = _slot(hsm, "nosign")
    _pair_that_may_not_sign(slot, "nosign")
    key = TokenKey(slot, slot.uri, slot.public_key(slot.uri))  # as signing.key opened it, before the change
    provider = Pkcs11KeyProvider(key)
    resets = slot.module.generation

    assert _refused(key) == "token-key-unsupported"
    assert _refused(key) == "token-key-unsupported"
    assert slot.module.generation == resets  # neither attempt reset the module
    assert provider.unavailable() == "token-key-unsupported"  # /readyz, as before

    async def sign_async() -> str:
        with pytest.raises(TokenError) as caught:
            await key.sign_async(b"signature base")
        return caught.value.reason

    with slot.module.lock:  # the module busy with another call: the refusal does not wait for it
        assert _refused(key) == "token-key-unsupported"
        assert asyncio.run(sign_async()) == "token-key-unsupported"
    assert slot.module.stalled is None  # nothing was queued into the module, nothing timed out

    provider.probe()  # the refresh's probe (every second, and on SIGHUP) looks without a reset
    assert slot.module.generation == resets
    assert provider.unavailable() == "token-key-unsupported"

    _allow_signing(slot, "nosign")
    assert _refused(key) == "token-key-unsupported"  # requests do not ask the token again
    provider.probe()  # the probe finds the object fixed
    assert provider.unavailable() is None
    assert key.public.verify(key.sign_within(b"signature base"), b"signature base")
    assert slot.module.generation == resets


def test_a_store_key_that_may_not_sign_signs_after_the_fix_and_a_reload(tmp_path: Path, hsm: SoftHsm) -> None:
    slot = _slot(hsm, "nosign")
    _pair_that_may_not_sign(slot, "nosign")
    store = KeyStore(tmp_path / "data", tokens=_opener(slot))
    store.create(time.time(), lifetime_s=86_400, key=TokenKey(slot, slot.uri, slot.public_key(slot.uri)))
    provider = TokenStoreKeyProvider(store)
    key = provider.current(time.time())
    assert isinstance(key, TokenKey)
    resets = slot.module.generation

    assert _refused(key) == "token-key-unsupported"
    assert _refused(key) == "token-key-unsupported"
    provider.probe()
    assert slot.module.generation == resets
    assert provider.unavailable() == "token-key-unsupported"

    _allow_signing(slot, "nosign")
    assert provider.reload(force=True)  # what SIGHUP does: the store read again, its keys made anew
    fresh = provider.current(time.time())
    assert isinstance(fresh, TokenKey)
    assert fresh is not key
    assert fresh.public.verify(fresh.sign_within(b"signature base"), b"signature base")
    provider.probe()
    assert provider.unavailable() is None
    assert slot.module.generation == resets


def _replace_with_p256(slot: TokenSlot, uri: Pkcs11Uri) -> None:
    """The operator's mistake: the Ed25519 pair ``uri`` names replaced by a P-256 pair (same label, id)."""
    from pkcs11.util.ec import encode_named_curve_parameters

    assert uri.object is not None
    assert uri.id is not None
    common = {p11.Attribute.TOKEN: True, p11.Attribute.LABEL: uri.object, p11.Attribute.ID: uri.id}
    with slot.module.lock:
        session: Any = slot.session(rw=True)
        for found in list(session.get_objects({p11.Attribute.LABEL: uri.object})):
            found.destroy()
        session.generate_keypair(
            p11.KeyType.EC,
            mechanism=p11.Mechanism.EC_KEY_PAIR_GEN,
            store=True,
            public_template={
                **common,
                p11.Attribute.EC_PARAMS: encode_named_curve_parameters(P256_OID),
                p11.Attribute.VERIFY: True,
            },
            private_template={
                **common,
                p11.Attribute.PRIVATE: True,
                p11.Attribute.SENSITIVE: True,
                p11.Attribute.SIGN: True,
            },
        )


def test_a_store_key_that_is_not_ed25519_is_final_until_a_rotation(tmp_path: Path, hsm: SoftHsm) -> None:
    slot = _slot(hsm, "agent")
    store = KeyStore(tmp_path / "data", tokens=_opener(slot))
    made = generate_token_key(slot, slot.uri)
    store.create(time.time(), lifetime_s=86_400, key=made)
    _replace_with_p256(slot, made.uri)
    provider = TokenStoreKeyProvider(store)
    key = provider.current(time.time())
    assert isinstance(key, TokenKey)
    resets = slot.module.generation

    assert _refused(key) == "token-key-unsupported"
    assert _refused(key) == "token-key-unsupported"
    provider.probe()
    assert slot.module.generation == resets
    assert provider.unavailable() == "token-key-unsupported"

    # `keys rotate --now --pkcs11 URI` onto a new Ed25519 key: the periodic check sees the index change
    new = generate_token_key(slot, Pkcs11Uri(token=hsm.label, object="agent-2"))
    store.rotate(time.time(), activate_in_s=0, grace_s=3600, lifetime_s=86_400, key=new)
    assert provider.reload()
    fresh = provider.current(time.time())
    assert isinstance(fresh, TokenKey)
    assert fresh.thumbprint == new.thumbprint
    assert fresh.public.verify(fresh.sign_within(b"signature base"), b"signature base")
    provider.probe()
    assert provider.unavailable() is None
    assert slot.module.generation == resets
