"""core.ed25519: libsodium signs the same bytes as OpenSSL and the verifier keeps OpenSSL's verdicts.

Issue 21 allows libsodium only "with proof of identical accept/refuse behaviour": RFC 8032 vectors,
random keys and messages, and the edges where the two libraries differ (small-order and
non-canonical keys and ``R``, ``S`` not reduced) are each checked against OpenSSL's own verdict.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from signing_proxy.core import ed25519
from signing_proxy.core.jwk import PublicKey, SigningKey

# RFC 8032 section 7.1: TEST 1, TEST 2, TEST 3 (secret key, public key, message, signature)
RFC8032_VECTORS = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
]

# Points of small order (orders 1, 2, 4 and 8) in canonical form, and non-canonical encodings
# (y >= p, or x = 0 with the sign bit set): what libsodium refuses as a key or as R.
SMALL_ORDER = [
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity, order 1
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = -1, order 2
    "0000000000000000000000000000000000000000000000000000000000000000",  # y = 0, order 4
    "0000000000000000000000000000000000000000000000000000000000000080",  # y = 0, x negative
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
]
NON_CANONICAL = [
    "0100000000000000000000000000000000000000000000000000000000000080",  # identity, x = 0 negative
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p + 1 (identity)
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",  # y = -1, x = 0 negative
]
L = 2**252 + 27742317777372353535851937790883648493  # the group order (RFC 8032 section 5.1)


def openssl_verdict(raw_public: bytes, signature: bytes, data: bytes) -> bool:
    """OpenSSL's verdict (it loads any 32 bytes as a key and decides when verifying)."""
    key = Ed25519PublicKey.from_public_bytes(raw_public)
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def sodium_verdict(raw_public: bytes, signature: bytes, data: bytes) -> bool:
    try:
        crypto_sign_open(signature + data, raw_public)
    except BadSignatureError:
        return False
    return True


def assert_same_verdict(raw_public: bytes, signature: bytes, data: bytes) -> bool:
    """Ours equals OpenSSL's, and libsodium never accepts what OpenSSL refuses; returns the verdict."""
    expected = openssl_verdict(raw_public, signature, data)
    assert PublicKey.from_raw(raw_public).verify(signature, data) is expected
    if sodium_verdict(raw_public, signature, data):
        assert expected, "libsodium accepted what OpenSSL refuses"
    return expected


@pytest.mark.parametrize(("secret", "public", "message", "signature"), RFC8032_VECTORS)
def test_rfc8032_7_1_vectors_sign_and_verify(secret: str, public: str, message: str, signature: str) -> None:
    key = SigningKey.from_seed(bytes.fromhex(secret))
    assert key.public.raw.hex() == public
    assert key.sign(bytes.fromhex(message)).hex() == signature
    assert key.public.verify(bytes.fromhex(signature), bytes.fromhex(message))
    assert_same_verdict(bytes.fromhex(public), bytes.fromhex(signature), bytes.fromhex(message))


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), data=st.binary(max_size=2048))
def test_signatures_are_byte_identical_to_openssl(seed: bytes, data: bytes) -> None:
    openssl = Ed25519PrivateKey.from_private_bytes(seed)
    ours = SigningKey.from_seed(seed)
    assert ours.sign(data) == openssl.sign(data)
    raw = openssl.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert ours.public.raw == raw


@settings(max_examples=300, deadline=None)
@given(
    seed=st.binary(min_size=32, max_size=32),
    data=st.binary(max_size=256),
    flip=st.integers(min_value=-1, max_value=64 * 8 - 1),
)
def test_valid_and_bit_flipped_signatures_get_openssls_verdict(seed: bytes, data: bytes, flip: int) -> None:
    key = SigningKey.from_seed(seed)
    signature = bytearray(key.sign(data))
    if flip >= 0:
        signature[flip // 8] ^= 1 << (flip % 8)
    verdict = assert_same_verdict(key.public.raw, bytes(signature), data)
    assert verdict is (flip < 0)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.binary(min_size=32, max_size=32),
    signature=st.binary(min_size=0, max_size=80),
    data=st.binary(max_size=64),
)
def test_arbitrary_keys_and_signatures_get_openssls_verdict(
    raw: bytes, signature: bytes, data: bytes
) -> None:
    assert_same_verdict(raw, signature, data)


@pytest.mark.parametrize(("key", "r"), list(itertools.product(SMALL_ORDER + NON_CANONICAL, repeat=2)))
def test_small_order_and_non_canonical_points_get_openssls_verdict(key: str, r: str) -> None:
    """With S = 0 the cofactorless equation holds for some of these: OpenSSL accepts, libsodium not."""
    for data in (b"", b"signing-proxy"):
        assert_same_verdict(bytes.fromhex(key), bytes.fromhex(r) + bytes(32), data)


def test_a_small_order_key_that_openssl_accepts_is_still_accepted() -> None:
    """The identity as key and as R with S = 0 verifies any message under OpenSSL: kept as it was."""
    identity = bytes.fromhex(SMALL_ORDER[0])
    signature = identity + bytes(32)
    assert openssl_verdict(identity, signature, b"anything") is True
    assert not sodium_verdict(identity, signature, b"anything")
    assert PublicKey.from_raw(identity).verify(signature, b"anything")


def test_s_not_reduced_modulo_l_is_refused_by_both() -> None:
    key = SigningKey.from_seed(bytes(range(32)))
    signature = key.sign(b"m")
    s = int.from_bytes(signature[32:], "little") + L
    unreduced = signature[:32] + s.to_bytes(32, "little")
    assert assert_same_verdict(key.public.raw, unreduced, b"m") is False


def test_wrong_lengths_are_refused() -> None:
    key = SigningKey.from_seed(bytes(32))
    signature = key.sign(b"m")
    for bad in (b"", signature[:63], signature + b"\x00"):
        assert not key.public.verify(bad, b"m")
    assert len(signature) == ed25519.SIGNATURE_BYTES


def test_a_secret_of_another_length_is_refused_before_libsodium_reads_it() -> None:
    """libsodium reads 64 bytes from the secret's address whatever was passed: a shorter one would be
    read past its end, a longer one cut silently."""
    secret = ed25519.secret_from_seed(bytes(32))
    assert len(secret) == ed25519.SECRET_BYTES
    for bad in (secret[:32], secret[:63], secret + b"\x00"):
        with pytest.raises(ValueError, match="64 bytes"):
            ed25519.sign(bad, b"m")


def test_threads_signing_at_once_each_get_their_own_signature() -> None:
    """The in-process client signs from several threads: each call writes into its own buffer."""
    keys = [SigningKey.from_seed(bytes([i]) * 32) for i in range(8)]
    messages = [bytes([i]) * (100 + i) for i in range(8)]
    expected = [Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32).sign(messages[i]) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(50):
            got = list(pool.map(lambda i: keys[i].sign(messages[i]), range(8)))
            assert got == expected


class _OpenSSLNotAsked:
    """Stands in for OpenSSL's key: a valid signature must be settled before it is asked."""

    asked = 0

    def verify(self, _signature: bytes, _data: bytes) -> None:
        self.asked += 1
        raise InvalidSignature


def test_a_valid_signature_is_accepted_by_libsodium_alone() -> None:
    """The fast path is taken (a broken one would fall back to OpenSSL silently, slowly)."""
    key = SigningKey.from_seed(bytes(range(32)))
    openssl = _OpenSSLNotAsked()
    signature = key.sign(b"m")
    assert ed25519.verify(openssl, key.public.raw, signature, b"m")  # type: ignore[arg-type]
    assert openssl.asked == 0
    assert not ed25519.verify(openssl, key.public.raw, signature, b"other")  # type: ignore[arg-type]
    assert openssl.asked == 1  # what libsodium refuses, OpenSSL decides
