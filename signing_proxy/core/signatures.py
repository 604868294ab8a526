"""RFC 9421 HTTP Message Signatures with the spec's profile: build bases, sign, parse, verify.

The spec ("Request signature") pins the profile: Ed25519, ``keyid`` = RFC 7638 thumbprint,
``created`` and ``expires`` required, and exactly five covered components — ``@method``,
``@target-uri``, ``content-digest``, ``authorization``, ``signature-agent``. Each broker hop adds a
label covering the same five plus ``"signature";key="<previous label>"`` ("Multi-hop forwarding").

Signing and verifying both work on a ``Message`` (method, canonical target, ordered field lines)
and never read a clock: ``now`` is a parameter. Verification follows "resolve, then verify": parse
the stack, let the caller resolve every keyid (a directory fetch is I/O, so it happens outside),
then verify purely and return a frozen ``VerifiedStack`` — the only thing a caller should trust.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .b64 import b64_encode
from .digest import verify_content_digest
from .errors import FieldError, SigningError, VerificationError
from .fields import Fields
from .jwk import PublicKey, SigningKey
from .sfv import parse_dictionary, parse_item, serialize_member
from .uri import Target

__all__ = [
    "DEFAULT_SKEW_S",
    "DEFAULT_VALIDITY_S",
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
    "hop_components",
    "parse_signature_agent",
    "parse_signature_stack",
    "serialize_sf_string",
    "sign_message",
    "signature_base",
    "verify_stack",
]

ALG_ED25519 = "ed25519"  # RFC 9421 section 3.3.6; the spec's only algorithm
DEFAULT_SKEW_S = 5  # our choice: the spec gives no clock-skew tolerance (README, "Where the spec is silent")
DEFAULT_VALIDITY_S = 300  # expires - created; the spec gives no number, the drafts say "short"
# RFC 9421 signature parameters registry; the spec's template uses the first four.
_KNOWN_PARAMS = frozenset({"keyid", "alg", "created", "expires", "nonce", "tag"})
_SF_INT_MAX = 999_999_999_999_999  # RFC 8941 section 3.3.1: at most 15 digits


def serialize_sf_string(value: str) -> str:
    """RFC 8941 section 4.1.6 String: printable ASCII in double quotes, ``\\`` and ``"`` escaped."""
    if not (value.isascii() and value.isprintable()):  # exactly %x20-7E
        raise SigningError("non-ascii-component", "structured-field strings are printable ASCII only")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Component:
    """A component identifier: a lower-case name, with a ``key`` parameter for dictionary members."""

    name: str
    key: str | None = None
    serialized: str = field(init=False, repr=False, compare=False)  # computed once: the hot path reuses it
    is_derived: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base = serialize_sf_string(self.name)
        value = base if self.key is None else f"{base};key={serialize_sf_string(self.key)}"
        object.__setattr__(self, "serialized", value)
        object.__setattr__(self, "is_derived", self.name.startswith("@"))


SPEC_COMPONENTS: tuple[Component, ...] = (
    Component("@method"),
    Component("@target-uri"),
    Component("content-digest"),
    Component("authorization"),
    Component("signature-agent"),
)


_SPEC_INNER = "(" + " ".join(c.serialized for c in SPEC_COMPONENTS) + ")"


def hop_components(previous_label: str | None) -> tuple[Component, ...]:
    """The spec's covered set for a label: the five, plus the predecessor's signature for a later hop."""
    if previous_label is None:
        return SPEC_COMPONENTS
    return (*SPEC_COMPONENTS, Component("signature", key=previous_label))


def _sf_int(value: int) -> str:
    if not -_SF_INT_MAX <= value <= _SF_INT_MAX:
        raise SigningError("bad-signature-parameter", "integer out of structured-field range")
    return str(value)


def _serialize_param(value: str | int) -> str:
    if isinstance(value, bool):
        raise SigningError("bad-signature-parameter", "boolean signature parameters are not used")
    if isinstance(value, int):
        if not -_SF_INT_MAX <= value <= _SF_INT_MAX:
            raise SigningError("bad-signature-parameter", "integer out of structured-field range")
        return str(value)
    return serialize_sf_string(value)


def serialize_params_value(components: Sequence[Component], params: Sequence[tuple[str, str | int]]) -> str:
    """The Inner List that is both the ``@signature-params`` value and the Signature-Input member."""
    return _inner_list(tuple(components)) + "".join(
        f";{name}={_serialize_param(value)}" for name, value in params
    )


@functools.lru_cache(maxsize=64)
def _inner_list(components: tuple[Component, ...]) -> str:
    return "(" + " ".join(c.serialized for c in components) + ")"


@dataclass(slots=True)
class Message:
    """What a signature base is built from: the method as sent, the canonical target, the field lines."""

    method: str
    target: Target
    fields: Fields
    _dict_cache: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, repr=False)

    def dictionary(self, name: str) -> dict[str, Any]:
        """The combined field parsed as an RFC 8941 Dictionary (cached while the field is unchanged)."""
        value = self.fields.combined(name)
        if value is None:
            raise SigningError("missing-covered-header", f"covered field {name!r} is absent")
        cached = self._dict_cache.get(name)
        if cached is None or cached[0] != value:
            cached = (value, _parse_dictionary(value, name))
            self._dict_cache[name] = cached
        return cached[1]


def _parse_dictionary(value: str, name: str) -> dict[str, Any]:
    def refuse_duplicate(key: str, _where: str) -> None:
        raise FieldError("duplicate-label", f"{name} has member {key!r} more than once")

    try:
        return parse_dictionary(value, refuse_duplicate)
    except FieldError:
        raise
    except (ValueError, UnicodeEncodeError) as exc:
        raise FieldError(f"malformed-{name.lower()}", f"{name} is not a structured Dictionary") from exc


def component_value(message: Message, component: Component) -> str:
    """The value of one covered component (RFC 9421 sections 2.1, 2.1.2 and 2.2)."""
    name = component.name
    if component.is_derived:
        if component.key is not None:
            raise SigningError("bad-component", f"{name} takes no key parameter")
        target = message.target
        if name == "@method":
            return message.method  # as sent, case-sensitive (RFC 9421 section 2.2.1)
        if name == "@target-uri":
            return target.uri
        if name == "@authority":
            return target.authority
        if name == "@scheme":
            return target.scheme
        if name == "@path":
            return target.path
        if name == "@query":
            return target.query
        if name == "@request-target":
            return target.path_query
        raise SigningError("unsupported-component", f"derived component {name} is not supported")
    if component.key is None:
        value = message.fields.combined(name)
        if value is None:  # absent is never empty (spec, "Request signature" rule 4)
            raise SigningError("missing-covered-header", f"covered field {name!r} is absent")
        return value
    members = message.dictionary(name)
    if component.key not in members:
        raise SigningError("missing-dictionary-member", f"{name} has no member {component.key!r}")
    member = members[component.key]
    return serialize_member(member)  # strict re-serialization (RFC 9421 section 2.1.2)


def signature_base(message: Message, components: Sequence[Component], params_value: str) -> bytes:
    """RFC 9421 section 2.5: one line per component, then ``@signature-params``; LF, no trailing LF."""
    lines = [f"{c.serialized}: {component_value(message, c)}" for c in components]
    lines.append(f'"@signature-params": {params_value}')
    base = "\n".join(lines)
    if not base.isascii() or base.count("\n") != len(components):
        raise SigningError("non-ascii-component", "a covered value is not ASCII or spans lines")
    return base.encode("ascii")


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
    if extra_params:
        params: list[tuple[str, str | int]] = [
            ("keyid", key.thumbprint),
            ("alg", ALG_ED25519),
            ("created", created),
            ("expires", expires),
            *extra_params,
        ]
        params_value = serialize_params_value(components, params)
    else:  # the spec's shape, on the hot path: a thumbprint is base64url, so it needs no escaping
        inner = _SPEC_INNER if components is SPEC_COMPONENTS else _inner_list(tuple(components))
        params_value = (
            f'{inner};keyid="{key.thumbprint}";alg="{ALG_ED25519}"'
            f";created={_sf_int(created)};expires={_sf_int(expires)}"
        )
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
        inputs = _parse_dictionary(raw_input, "Signature-Input")
        signatures = _parse_dictionary(raw_sig, "Signature")
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail) from exc
    if not inputs:
        raise VerificationError("missing-signature", "Signature-Input is empty")
    dangling = set(inputs) ^ set(signatures)
    if dangling:
        raise VerificationError("dangling-label", f"labels {sorted(dangling)} appear in only one header")
    entries = []
    for label, member in inputs.items():
        entries.append(_entry(label, member, signatures[label]))
    return tuple(entries)


def _entry(label: str, member: Any, sig_member: Any) -> SignatureEntry:
    if not (isinstance(member, tuple) and isinstance(member[0], list)):
        raise VerificationError("malformed-signature-input", f"member {label!r} is not an Inner List", label)
    items, params = member
    components = []
    for item_value, item_params in items:
        if not isinstance(item_value, str):  # a Token is not a str (http-sf uses UserString)
            raise VerificationError("malformed-signature-input", "component identifiers are Strings", label)
        unknown = set(item_params) - {"key"}
        key = item_params.get("key")
        if unknown or (key is not None and not isinstance(key, str)):
            raise VerificationError(
                "unsupported-component-parameter", f"component {item_value!r} has parameters {unknown}", label
            )
        components.append(Component(item_value, key))
    if not (isinstance(sig_member, tuple) and isinstance(sig_member[0], bytes)):
        raise VerificationError("malformed-signature", f"member {label!r} is not a Byte Sequence", label)
    return SignatureEntry(
        label=label,
        components=tuple(components),
        params=tuple(params.items()),
        params_value=serialize_member(member),
        signature=sig_member[0],
    )


def parse_signature_agent(value: str | None) -> str | None:
    """The directory base named by Signature-Agent: a bare URL or an RFC 8941 String; empty -> None."""
    if value is None:
        raise FieldError("missing-covered-header", "Signature-Agent header is absent")
    value = value.strip()
    if not value:
        return None
    if value.startswith('"'):
        try:
            url, params = parse_item(value)
        except (ValueError, UnicodeEncodeError) as exc:
            raise FieldError(
                "malformed-signature-agent", "quoted Signature-Agent is not an sf-string"
            ) from exc
        if not isinstance(url, str) or params:
            raise FieldError("malformed-signature-agent", "Signature-Agent must be a plain String")
    else:
        url = value
    if not url.startswith(("https://", "http://")) or any(c in url for c in ' "<>\\'):
        raise FieldError("malformed-signature-agent", "Signature-Agent must be an http(s) URL")
    return url


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """A key the caller resolved for a keyid, with its published window and revocation state."""

    public: PublicKey
    not_before: int | None = None
    not_after: int | None = None
    revoked: bool = False
    source: str | None = None  # the directory URL that published it, or "pinned"


KeyLookup = Callable[[SignatureEntry, int], "VerificationKey | None"]
"""Called with an entry and its position in the stack; returns the key for its keyid, or None."""


@dataclass(frozen=True, slots=True)
class VerifiedSignature:
    """What one verified label proves: who (keyid, key source) signed which base, and when."""

    label: str
    keyid: str
    created: int
    expires: int
    components: tuple[str, ...]
    signature_base: str
    key_source: str | None


@dataclass(frozen=True, slots=True)
class VerifiedStack:
    """The verified result; trust only this, never the raw request."""

    signatures: tuple[VerifiedSignature, ...]
    signature_agent: str  # the raw covered value, byte-for-byte
    directory: str | None  # the directory base it names (None when empty)

    @property
    def hops(self) -> int:
        return len(self.signatures)

    @property
    def agent(self) -> VerifiedSignature:
        return self.signatures[0]


def _check_components(entry: SignatureEntry, previous: str | None, required: Sequence[Component]) -> None:
    expected = list(required)
    if previous is not None:
        expected.append(Component("signature", key=previous))
    got = entry.components
    if len(set(got)) != len(got):
        raise VerificationError("duplicate-component", "a component is covered twice", entry.label)
    missing = [c for c in expected if c not in got]
    extra = [c for c in got if c not in expected]
    if previous is not None and Component("signature", key=previous) in missing:
        wrong = [c.serialized for c in extra if c.name == "signature"]
        raise VerificationError(
            "predecessor-not-covered",
            f'label {entry.label!r} must cover "signature";key={previous!r}, covers {wrong or "none"}',
            entry.label,
        )
    if missing:
        raise VerificationError(
            "missing-covered-component",
            f"label {entry.label!r} does not cover {', '.join(c.serialized for c in missing)}",
            entry.label,
        )
    if extra:
        raise VerificationError(
            "unexpected-covered-component",
            f"label {entry.label!r} covers {', '.join(c.serialized for c in extra)} beyond the profile",
            entry.label,
        )


def _check_params(entry: SignatureEntry, now: float, skew_s: int) -> tuple[str, int, int]:
    label = entry.label
    unknown = {name for name, _ in entry.params} - _KNOWN_PARAMS
    if unknown:
        raise VerificationError("unknown-signature-parameter", f"parameters {sorted(unknown)}", label)
    alg = entry.param("alg")
    if alg is None:
        raise VerificationError("missing-alg", 'alg="ed25519" is required', label)
    if alg != ALG_ED25519:
        raise VerificationError("unsupported-algorithm", f"alg {alg!r} is not ed25519", label)
    keyid = entry.keyid
    if not keyid:
        raise VerificationError("missing-keyid", "keyid is required", label)
    created, expires = entry.param("created"), entry.param("expires")
    for name, value in (("created", created), ("expires", expires)):
        if value is None:
            raise VerificationError(f"missing-{name}", f"{name} is required", label)
        if not isinstance(value, int) or isinstance(value, bool):
            raise VerificationError("malformed-signature-input", f"{name} must be an Integer", label)
    assert isinstance(created, int)
    assert isinstance(expires, int)
    if expires <= created:
        raise VerificationError("bad-signature-window", "expires is not after created", label)
    if created > now + skew_s:
        raise VerificationError("signature-not-yet-valid", "created is in the future", label)
    if now >= expires + skew_s:
        raise VerificationError("signature-expired", "the signature's window has ended", label)
    return keyid, created, expires


def _check_key(entry: SignatureEntry, key: VerificationKey | None, now: float) -> VerificationKey:
    label = entry.label
    if key is None:
        raise VerificationError("unknown-keyid", f"no key for keyid {entry.keyid!r}", label)
    if key.public.thumbprint != entry.keyid:
        raise VerificationError("unknown-keyid", "resolved key does not match the keyid", label)
    if key.revoked:
        raise VerificationError("key-revoked", f"key {entry.keyid} is revoked", label)
    if (key.not_before is not None and now < key.not_before) or (
        key.not_after is not None and now >= key.not_after
    ):
        raise VerificationError("key-outside-window", f"key {entry.keyid} is outside its window", label)
    return key


def verify_stack(
    message: Message,
    body: bytes | None,
    lookup: KeyLookup,
    *,
    now: float,
    skew_s: int = DEFAULT_SKEW_S,
    max_hops: int | None = None,
    required: Sequence[Component] = SPEC_COMPONENTS,
) -> VerifiedStack:
    """Verify every label of the stack per the spec; raise VerificationError with the first refusal.

    ``body`` is the received content; pass None only when the caller checks Content-Digest itself.
    """
    entries = parse_signature_stack(message.fields)
    if max_hops is not None and len(entries) > max_hops:
        raise VerificationError("too-many-hops", f"{len(entries)} signatures exceed the cap of {max_hops}")
    checked = []
    previous: str | None = None
    for entry in entries:
        _check_components(entry, previous, required)
        checked.append((entry, *_check_params(entry, now, skew_s)))
        previous = entry.label
    raw_agent = message.fields.combined("signature-agent")
    if raw_agent is None:
        raise VerificationError("missing-covered-header", "covered field 'signature-agent' is absent")
    try:
        directory = parse_signature_agent(raw_agent)
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail) from exc
    if body is not None:
        verify_content_digest(message.fields.combined("content-digest"), body)
    verified = []
    for index, (entry, keyid, created, expires) in enumerate(checked):
        key = _check_key(entry, lookup(entry, index), now)
        try:
            base = signature_base(message, entry.components, entry.params_value)
        except SigningError as exc:
            raise VerificationError(exc.reason, exc.detail, entry.label) from exc
        if not key.public.verify(entry.signature, base):
            raise VerificationError("bad-signature", _bad_signature_hint(message, entry), entry.label)
        verified.append(
            VerifiedSignature(
                label=entry.label,
                keyid=keyid,
                created=created,
                expires=expires,
                components=tuple(c.serialized for c in entry.components),
                signature_base=base.decode("ascii"),
                key_source=key.source,
            )
        )
    return VerifiedStack(tuple(verified), raw_agent, directory)


def _bad_signature_hint(message: Message, entry: SignatureEntry) -> str:
    repeated = [
        c.name
        for c in entry.components
        if not c.is_derived and c.key is None and message.fields.count(c.name) > 1
    ]
    hint = f"label {entry.label!r} does not verify over the rebuilt signature base"
    if repeated:
        hint += f"; covered fields with repeated lines (joined with ', '): {', '.join(repeated)}"
    return hint
