"""A signature stack as received: Signature-Input and Signature parsed into ``SignatureEntry``
values in stack order (the first label is the first signer), bounded before anything is read of a
label: at most ``MAX_HOPS`` labels and ``MAX_STACK_COMPONENTS`` component identifiers in all.
Verifying them is ``signature_verify``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import FieldError, VerificationError
from .fields import Fields
from .sfv import serialize_member
from .signature_components import Component, parse_field_dictionary, received_component

__all__ = ["MAX_HOPS", "MAX_STACK_COMPONENTS", "SignatureEntry", "parse_signature_stack"]

# our choice (spec: hop caps "not shown"): the most labels any verifier takes, with or without a
# max_hops of its own; a broker chain is 2 or 3, and each label's base repeats every covered value
MAX_HOPS = 16
# our choice: component identifiers across all labels. Each later web-bot-auth label covers the one
# before it again, plus its two members and its Signature-Agent member: MAX_HOPS labels over a first
# one of b components cover 16 b + 360 (b = 40 fits); a stranger's thousands each cost parsing and a
# lookup before any key is known
MAX_STACK_COMPONENTS = 1024


@dataclass(frozen=True, slots=True)
class SignatureEntry:
    """One parsed label of a signature stack."""

    label: str
    components: tuple[Component, ...]
    params: tuple[tuple[str, object], ...]
    params_value: str  # re-serialized inner list: the @signature-params value (RFC 9421 3.2 step 7)
    signature: bytes

    def param(self, name: str) -> object:
        for key, value in self.params:
            if key == name:
                return value
        return None

    @property
    def keyid(self) -> str | None:
        value = self.param("keyid")
        return value if isinstance(value, str) else None


def parse_signature_stack(fields: Fields) -> tuple[SignatureEntry, ...]:
    """Parse Signature-Input and Signature into entries in stack order (first label = first signer)."""
    raw_input = fields.combined("Signature-Input")
    raw_sig = fields.combined("Signature")
    if raw_input is None and raw_sig is None:
        raise VerificationError("missing-signature", "no Signature-Input and Signature headers")
    if raw_input is None or raw_sig is None:
        missing = "Signature-Input" if raw_input is None else "Signature"
        raise VerificationError("missing-signature", f"{missing} header is absent")
    try:
        inputs = parse_field_dictionary(raw_input, "Signature-Input")
        signatures = parse_field_dictionary(raw_sig, "Signature")
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail) from exc
    if not inputs:
        raise VerificationError("missing-signature", "Signature-Input is empty")
    dangling = set(inputs) ^ set(signatures)
    if dangling:
        raise VerificationError("dangling-label", f"labels {sorted(dangling)} appear in only one header")
    if len(inputs) > MAX_HOPS:  # before any label is read: a stranger may send thousands
        raise VerificationError("too-many-hops", f"{len(inputs)} signatures exceed the cap of {MAX_HOPS}")
    covered = sum(len(m[0]) for m in inputs.values() if isinstance(m, tuple) and isinstance(m[0], list))
    if covered > MAX_STACK_COMPONENTS:  # before any identifier is read, nor any value
        raise VerificationError(
            "too-many-components", f"the labels cover {covered} components, more than {MAX_STACK_COMPONENTS}"
        )
    return tuple(_entry(label, member, signatures[label]) for label, member in inputs.items())


def _entry(label: str, member: Any, sig_member: Any) -> SignatureEntry:
    if not (isinstance(member, tuple) and isinstance(member[0], list)):
        raise VerificationError("malformed-signature-input", f"member {label!r} is not an Inner List", label)
    items, params = member
    components = []
    for item_value, item_params in items:
        if not isinstance(item_value, str):  # a Token is not a str (http-sf uses UserString)
            raise VerificationError("malformed-signature-input", "component identifiers are Strings", label)
        component = received_component(item_value, item_params)
        if component is None:
            raise VerificationError(
                "unsupported-component-parameter",
                f"component {item_value!r} has parameters {sorted(item_params)}",
                label,
            )
        components.append(component)
    if not (isinstance(sig_member, tuple) and isinstance(sig_member[0], bytes)):
        raise VerificationError("malformed-signature", f"member {label!r} is not a Byte Sequence", label)
    return SignatureEntry(
        label=label,
        components=tuple(components),
        params=tuple(params.items()),
        params_value=serialize_member(member),
        signature=sig_member[0],
    )
