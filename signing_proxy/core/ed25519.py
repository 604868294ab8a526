"""Ed25519 signing and verification on libsodium, accepting and refusing exactly what OpenSSL does.

libsodium (PyNaCl) signs in about 60 % and verifies in about half the time of OpenSSL
(``cryptography``) on this project's machines; both are on the hot path (every request signs, every
relay hop and gateway verifies). Ed25519 signing is deterministic (RFC 8032 section 5.1.6), so the
two produce the same bytes. Verification differs only at the edges: libsodium also refuses
small-order and non-canonical public keys and small-order ``R`` (its accept set is a subset of
OpenSSL's: for a canonical key both hash the same bytes and compare the same re-encoded ``R``). So a
signature libsodium accepts is accepted, and one it refuses is asked of OpenSSL as before: the
verifier accepts and refuses exactly what it did with OpenSSL alone (tests/core/test_ed25519.py
holds the edge cases). ``cryptography`` keeps key files, X.509 and everything else.

Signing calls libsodium through PyNaCl's own cffi binding (``nacl._sodium``, what
``nacl.bindings.crypto_sign`` calls) instead of that wrapper: the wrapper returns the signed message
(signature and a copy of the data) as a new bytes object, sliced again to the signature, and checks
its return code through a Python helper; the agent hop spent 1.4 us per request more that way
(issue 21: two proxies under the same load, 16 paired rounds). The bytes are the same
(tests/core/test_ed25519.py compares ours with OpenSSL's).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl._sodium import ffi, lib  # type: ignore[import-not-found]  # PyNaCl's cffi module: no stub
from nacl.bindings import crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError

__all__ = ["SECRET_BYTES", "SIGNATURE_BYTES", "secret_from_seed", "sign", "verify"]

SIGNATURE_BYTES = 64  # RFC 8032 section 5.1.6
SECRET_BYTES = 64  # libsodium's secret key: the RFC 8032 seed, then the public key


def secret_from_seed(seed: bytes) -> bytes:
    """libsodium's 64-byte secret key (seed || public key) for a 32-byte RFC 8032 private seed."""
    return crypto_sign_seed_keypair(seed)[1]


def sign(secret: bytes, data: bytes) -> bytes:
    """The RFC 8032 signature of ``data``: byte-identical to OpenSSL's for the same seed.
    ``secret`` is ``secret_from_seed``'s 64 bytes (libsodium reads that many, whatever is passed)."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"an Ed25519 secret key is {SECRET_BYTES} bytes")
    signed = ffi.new("unsigned char[]", len(data) + SIGNATURE_BYTES)  # per call: threads sign too
    if lib.crypto_sign(signed, ffi.NULL, data, len(data), secret) != 0:
        raise RuntimeError("libsodium's crypto_sign failed")
    return bytes(ffi.buffer(signed, SIGNATURE_BYTES))  # crypto_sign writes signature || data


def verify(public: Ed25519PublicKey, raw_public: bytes, signature: bytes, data: bytes) -> bool:
    """True when OpenSSL would accept ``signature``: libsodium first, OpenSSL for what it refuses."""
    if len(signature) == SIGNATURE_BYTES:
        try:
            crypto_sign_open(signature + data, raw_public)
        except BadSignatureError:
            pass  # refused here; OpenSSL decides (it accepts some keys libsodium refuses)
        else:
            return True
    try:
        public.verify(signature, data)
    except InvalidSignature:
        return False
    return True
