"""The ``Signature-Key`` header: the fetcher of a bound retrieval URL presents its public key (sans-IO).

The spec asks the fetcher to "present its public key and an RFC 9421 signature over the retrieval
request" and leaves the wire format open ("Retrieval of content from a signed URL"). We use the
``hwk`` (header web key) scheme of draft-hardt-httpbis-signature-key-08: a Structured Field
Dictionary keyed by the signature's label whose member is the Token ``hwk`` with the public JWK's
members as String parameters::

    Signature-Key: agent=hwk;kty="OKP";crv="Ed25519";x="<base64url>";alg="Ed25519"

The key must be covered by the signature it introduces (the draft's "Signature-Key integrity": an
uncovered key could be swapped with the signature), so a retrieval request covers six components:
the spec's five and ``signature-key``. Exchange calls keep exactly the spec's five.
"""

from __future__ import annotations

from typing import Any, Final

from .errors import FieldError, KeyFormatError, VerificationError
from .jwk import PublicKey, public_key_from_jwk
from .sfv import is_token
from .signature_components import SPEC_COMPONENTS, Component, parse_field_dictionary

__all__ = [
    "HWK",
    "HWK_ALG",
    "MAX_SIGNATURE_KEY_CHARS",
    "RETRIEVAL_COMPONENTS",
    "SIGNATURE_KEY",
    "SIGNATURE_KEY_COMPONENT",
    "parse_presented_key",
    "signature_key_member",
]

SIGNATURE_KEY: Final = "Signature-Key"  # draft-hardt-httpbis-signature-key section 2
HWK: Final = (
    "hwk"  # the draft's inline-key scheme: no discovery, matching "no fetch of the fetcher's directory"
)
# Draft -08 requires a fully-specified ``alg`` (RFC 9864 ``Ed25519``; the polymorphic ``EdDSA`` is
# refused); drafts -06/-07 forbade it. We send it, and accept a key without it (its kty and crv
# already name one algorithm).
HWK_ALG: Final = "Ed25519"
MAX_SIGNATURE_KEY_CHARS: Final = 4096  # our choice: one inline Ed25519 key is ~110 characters
SIGNATURE_KEY_COMPONENT: Final = Component("signature-key")
RETRIEVAL_COMPONENTS: Final[tuple[Component, ...]] = (*SPEC_COMPONENTS, SIGNATURE_KEY_COMPONENT)


def signature_key_member(label: str, public: PublicKey) -> str:
    """One ``Signature-Key`` member presenting ``public`` for the signature labelled ``label``."""
    x = public.jwk()["x"]  # base64url: no quoting needed inside an sf-string
    return f'{label}={HWK};kty="OKP";crv="Ed25519";x="{x}";alg="{HWK_ALG}"'


def _refuse(reason: str, detail: str, label: str) -> VerificationError:
    return VerificationError(reason, detail, label)


def parse_presented_key(value: str | None, label: str) -> PublicKey:
    """The public key presented for ``label`` in a combined ``Signature-Key`` value.

    Refusals (``VerificationError``): ``signature-key-missing`` (no header, or no member for the
    label), ``malformed-signature-key``, ``unsupported-signature-key-scheme`` (not ``hwk``),
    ``unsupported-signature-key`` (not an OKP/Ed25519 key, another ``alg``, or a ``kid``).
    """
    if value is None:
        raise _refuse("signature-key-missing", "the request presents no Signature-Key", label)
    if len(value) > MAX_SIGNATURE_KEY_CHARS:
        raise _refuse("malformed-signature-key", f"Signature-Key exceeds {MAX_SIGNATURE_KEY_CHARS}", label)
    try:
        members = parse_field_dictionary(value, SIGNATURE_KEY)
    except FieldError as exc:
        raise _refuse("malformed-signature-key", exc.detail, label) from None
    member = members.get(label)
    if member is None:
        raise _refuse("signature-key-missing", f"Signature-Key has no member for label {label!r}", label)
    item, params = member
    if isinstance(item, list):
        raise _refuse("malformed-signature-key", f"member {label!r} is an Inner List", label)
    if not is_token(item, HWK):
        raise _refuse("unsupported-signature-key-scheme", f"member {label!r} is not the {HWK} scheme", label)
    return _hwk_key(params, label)


def _hwk_key(params: dict[str, Any], label: str) -> PublicKey:
    strings = {name: v for name, v in params.items() if isinstance(v, str)}
    if "kid" in params:  # draft: "The kid parameter MUST NOT be used"
        raise _refuse("unsupported-signature-key", "an inline key carries no kid", label)
    alg = params.get("alg")
    if alg is not None and alg != HWK_ALG:
        raise _refuse("unsupported-signature-key", f"alg must be {HWK_ALG!r}", label)
    if strings.get("kty") != "OKP" or strings.get("crv") != "Ed25519":
        raise _refuse("unsupported-signature-key", "only OKP/Ed25519 keys are accepted", label)
    try:
        return public_key_from_jwk({"kty": "OKP", "crv": "Ed25519", "x": strings.get("x")})
    except KeyFormatError as exc:
        raise _refuse("malformed-signature-key", exc.detail, label) from None
