"""RFC 9421 HTTP Message Signatures with the spec's profile: build bases, sign, parse, verify.

The spec ("Request signature") pins the profile: Ed25519, ``keyid`` = RFC 7638 thumbprint,
``created`` and ``expires`` required, and exactly five covered components — ``@method``,
``@target-uri``, ``content-digest``, ``authorization``, ``signature-agent``. Each broker hop adds a
label covering the same five plus ``"signature";key="<previous label>"`` ("Multi-hop forwarding").

Signing and verifying both work on a ``Message`` (method, canonical target, ordered field lines)
and never read a clock: ``now`` is a parameter. Verification follows "resolve, then verify": parse
the stack, let the caller resolve every keyid (a directory fetch is I/O, so it happens outside),
then verify purely and return a frozen ``VerifiedStack`` — the only thing a caller should trust.

This module signs (``sign_message``, ``attach_signature``) and is the one import path for the whole
piece: the signature base (components, ``Message``, ``signature_base``) lives in
``signature_components`` and parsing and verifying a stack in ``signature_verify``, both re-exported
here. Neither imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .b64 import b64_encode
from .errors import SigningError
from .fields import Fields
from .jwk import SigningKey
from .signature_components import (
    SPEC_COMPONENTS,
    Component,
    Message,
    component_value,
    hop_components,
    serialize_params_value,
    serialize_sf_string,
    signature_base,
    signing_params_value,
)
from .signature_verify import (
    DEFAULT_SKEW_S,
    MAX_HOPS,
    KeyLookup,
    SignatureEntry,
    VerificationKey,
    VerifiedSignature,
    VerifiedStack,
    parse_signature_agent,
    parse_signature_stack,
    verify_stack,
)

__all__ = [
    "DEFAULT_SKEW_S",
    "DEFAULT_VALIDITY_S",
    "MAX_HOPS",
    "SPEC_COMPONENTS",
    "Component",
    "KeyLookup",
    "Message",
    "SignatureEntry",
    "SignedMember",
    "VerificationKey",
    "VerifiedSignature",
    "VerifiedStack",
    "attach_signature",
    "component_value",
    "hop_components",
    "parse_signature_agent",
    "parse_signature_stack",
    "serialize_params_value",
    "serialize_sf_string",
    "sign_message",
    "signature_base",
    "verify_stack",
]

DEFAULT_VALIDITY_S = 300  # expires - created; the spec gives no number, the drafts say "short"


@dataclass(frozen=True, slots=True)
class SignedMember:
    """One new signature: the label, its Signature-Input member value and the signature bytes."""

    label: str
    params_value: str
    signature: bytes
    base: bytes

    @property
    def input_member(self) -> str:
        return f"{self.label}={self.params_value}"

    @property
    def signature_member(self) -> str:
        return f"{self.label}=:{b64_encode(self.signature)}:"


def sign_message(
    message: Message,
    key: SigningKey,
    *,
    created: int,
    expires: int,
    label: str = "agent",
    components: Sequence[Component] = SPEC_COMPONENTS,
    extra_params: Sequence[tuple[str, str | int]] = (),
) -> SignedMember:
    """Sign ``message`` with params in the order ``keyid``, ``alg``, ``created``, ``expires``."""
    if expires <= created:
        raise SigningError("bad-signature-window", "expires must be after created")
    params_value = signing_params_value(components, key.thumbprint, created, expires, extra_params)
    base = signature_base(message, components, params_value)
    return SignedMember(label, params_value, key.sign(base), base)


def attach_signature(fields: Fields, member: SignedMember) -> None:
    """Add the member to Signature-Input and Signature, keeping earlier members byte-for-byte."""
    for name, text in (("Signature-Input", member.input_member), ("Signature", member.signature_member)):
        existing = fields.combined(name)
        if existing is None:
            fields.add(name, text)
        else:
            fields.set(name, f"{existing}, {text}" if existing else text)
