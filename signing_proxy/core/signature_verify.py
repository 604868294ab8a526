"""RFC 9421 verification under the spec's profile: parse a signature stack, then verify it purely.

Verification follows "resolve, then verify" (DESIGN, STYLE 2): ``parse_signature_stack``
(``signature_stack``) turns Signature-Input and Signature into ``SignatureEntry`` values in stack
order, bounded before any label is read, the caller resolves each
keyid (a directory fetch is I/O, so it happens outside) and hands ``verify_stack`` a ``KeyLookup``.
``check_stack`` applies every rule that needs no key — exactly the covered set of
``hop_components`` for its position, ``alg="ed25519"``, a thumbprint ``keyid``, ``created`` no more
than ``skew_s`` ahead of ``now`` (a parameter, never a clock), ``now`` before ``expires``, a lifetime
of at most ``max_validity_s``, Content-Digest over the received body, at most ``MAX_HOPS`` labels,
every covered component present (the first label's base is built here, the others' components
looked up) — so a caller can refuse before any I/O; ``verify_checked`` then checks each key's window
and revocation and each signature over its base, a later label's built only once its key is in hand
(a stranger's stack costs one base until a label verifies), and returns a frozen ``VerifiedStack``,
the only thing a caller should trust. ``verify_stack`` is both. Refusals are VerificationError with
the spec's reason codes. Import the public names from ``signatures`` (``check_stack``/
``verify_checked`` from here).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .digest import verify_content_digest
from .errors import FieldError, SigningError, VerificationError
from .gateway_ingest import IngestError, exchange_method
from .jwk import PublicKey
from .keys import is_thumbprint
from .profiles import SVC, WEB_MAX_VALIDITY_S, check_web_components, entry_profile, web_signature_agent
from .sfv import is_string, parse_item
from .signature_components import (
    ALG_ED25519,
    SPEC_COMPONENTS,
    Component,
    Dictionaries,
    Message,
    check_components,
    signature_base,
)
from .signature_stack import MAX_HOPS, MAX_STACK_COMPONENTS, SignatureEntry, parse_signature_stack
from .uri import directory_base

__all__ = [
    "DEFAULT_MAX_VALIDITY_S",
    "DEFAULT_SKEW_S",
    "MAX_HOPS",
    "MAX_SKEW_S",
    "MAX_STACK_COMPONENTS",
    "CheckedStack",
    "KeyLookup",
    "SignatureEntry",
    "VerificationKey",
    "VerifiedSignature",
    "VerifiedStack",
    "check_not_expired",
    "check_stack",
    "parse_signature_agent",
    "parse_signature_stack",
    "verify_checked",
    "verify_stack",
]

_CONTENT_DIGEST = Component("content-digest")  # built once: checked on every web-bot-auth stack
DEFAULT_SKEW_S = 5  # our choice: the spec gives no clock-skew tolerance (README, "Where the spec is silent")
MAX_SKEW_S = 300  # our choice: the most a configuration may forgive (a signature's whole default life)
# our choice (spec silent, config verify.max_validity_s): a leaked request is replayable for at most an hour
DEFAULT_MAX_VALIDITY_S = 3600
# RFC 9421 signature parameters registry; the spec's template uses the first four.
_KNOWN_PARAMS = frozenset({"keyid", "alg", "created", "expires", "nonce", "tag"})


# An sf-string without escapes or parameters, which is what a Signature-Agent URL is: read in C
_PLAIN_SF_STRING = re.compile(r'"[ !#-\[\]-~]*"')


def parse_signature_agent(value: str | None) -> str | None:
    """The directory base named by Signature-Agent (a bare URL or an RFC 8941 String) in its one
    spelling (``directory_base``); empty -> None."""
    if value is None:
        raise FieldError("missing-covered-header", "Signature-Agent header is absent")
    value = value.strip()
    if not value:
        return None
    if _PLAIN_SF_STRING.fullmatch(value):
        url = value[1:-1]
    elif value.startswith('"'):
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
    return directory_base(url)  # one spelling per directory: its cache, revocation state and identity


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
    signature_agent: str  # what the agent's label covers: the field, or (web) its member alone: key=value
    directory: str | None  # the directory base it names (None when empty)
    profile: str = SVC.name  # the profile every label was signed under ("svc" or "web-bot-auth")

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


def _check_params(
    entry: SignatureEntry, now: float, skew_s: int, max_validity_s: int | None, *, web: bool = False
) -> tuple[str, int, int]:
    label = entry.label
    unknown = {name for name, _ in entry.params} - _KNOWN_PARAMS
    if unknown:
        raise VerificationError("unknown-signature-parameter", f"parameters {sorted(unknown)}", label)
    nonce = entry.param("nonce")  # RFC 9421 section 2.3: a String, like alg (a Token is not one)
    if nonce is not None and nonce.__class__ is not str:
        raise VerificationError("malformed-signature-input", "nonce must be a String", label)
    if web and max_validity_s is not None:  # the drafts: alg optional, expiry within 24 hours
        max_validity_s = min(max_validity_s, WEB_MAX_VALIDITY_S)
    alg = entry.param("alg")
    if alg is None and not web:
        raise VerificationError("missing-alg", 'alg="ed25519" is required', label)
    if alg is not None and not is_string(alg, ALG_ED25519):
        raise VerificationError("unsupported-algorithm", f"alg {alg!r} is not the String ed25519", label)
    keyid = entry.keyid
    if not keyid:
        raise VerificationError("missing-keyid", "keyid is required", label)
    if not is_thumbprint(keyid):  # no directory can hold it: refused as it would be after a lookup
        raise VerificationError("unknown-keyid", "keyid is not an RFC 7638 thumbprint", label)
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
    if max_validity_s is not None and expires - created > max_validity_s:
        raise VerificationError("validity-too-long", f"expires - created exceeds {max_validity_s} s", label)
    # skew forgives a signer's clock ahead of ours for created only; the window ends at expires
    # (spec: "a signature outside that window is refused"), half-open like a key's window
    if created > now + skew_s:
        raise VerificationError("signature-not-yet-valid", "created is in the future", label)
    check_not_expired(expires, now, label)
    return keyid, created, expires


def check_not_expired(expires: int, now: float, label: str | None) -> None:
    """``signature-expired`` from ``expires`` on: the window is half-open, as a key's is. Judged
    before a signature's keys are fetched and again once they are here (the fetches take time)."""
    if now >= expires:
        raise VerificationError("signature-expired", "the signature's window has ended", label)


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


@dataclass(frozen=True, slots=True)
class CheckedStack:
    """A stack that passed every rule needing no key; each label with its keyid, created, expires."""

    message: Message  # its fields unchanged until ``verify_checked``
    entries: tuple[tuple[SignatureEntry, str, int, int], ...]  # keyid, created, expires
    base: bytes  # the first label's signature base; a later label's is built when it is verified
    dictionaries: Dictionaries  # the message's Dictionary fields, each parsed once for every label
    signature_agent: str  # what the first label covers (``VerifiedStack.signature_agent``)
    directory: str | None  # the directory base it names (None when empty)
    profile: str = SVC.name


def check_stack(
    message: Message,
    body: bytes | None,
    *,
    now: float,
    skew_s: int = DEFAULT_SKEW_S,
    max_validity_s: int | None = DEFAULT_MAX_VALIDITY_S,
    max_hops: int | None = None,
    required: Sequence[Component] = SPEC_COMPONENTS,
    allow_web: bool = True,
    entries: tuple[SignatureEntry, ...] | None = None,
) -> CheckedStack:
    """Every rule that needs no key (parse, hop cap, components, parameters, window, lifetime,
    Signature-Agent syntax, Content-Digest, covered values); raise VerificationError with the first
    refusal. The hop cap is ``max_hops`` (``parse_signature_stack`` holds every stack to ``MAX_HOPS``).

    ``body`` is the received content; pass None only when the caller checks Content-Digest itself.
    ``allow_web``: accept web-bot-auth stacks (their own rules). ``required`` is what the spec's
    profile must cover; a caller that requires anything else (a bound retrieval fetch) accepts the
    spec's profile only, since a web-bot-auth label is judged by its own rules, not by ``required``.
    ``entries``: ``parse_signature_stack(message.fields)``, when the caller holds it already.
    """
    if entries is None:
        entries = parse_signature_stack(message.fields)
    if max_hops is not None and len(entries) > max_hops:  # parse_signature_stack holds to MAX_HOPS
        raise VerificationError("too-many-hops", f"{len(entries)} signatures exceed the cap of {max_hops}")
    profile = entry_profile(entries[0].param("tag"), entries[0].label)
    if profile is not SVC and not (allow_web and tuple(required) == SPEC_COMPONENTS):
        raise VerificationError(
            "unsupported-tag", "only the spec's profile is accepted here", entries[0].label
        )
    if profile is not SVC and _names_exchange_call(message):
        # spec "Request signature": an exchange call covers exactly the five components; a
        # web-bot-auth label binds the authority only, so method, target and body would go unsigned
        raise VerificationError(
            "exchange-call-profile",
            "an exchange call must be signed under the spec's profile, not web-bot-auth",
            entries[0].label,
        )
    for entry in entries[1:]:
        if entry_profile(entry.param("tag"), entry.label) is not profile:
            raise VerificationError(
                "profile-mix",
                f"label {entry.label!r} is not signed under the first label's profile",
                entry.label,
            )
    web = profile is not SVC
    checked = []
    previous: SignatureEntry | None = None
    for entry in entries:
        if web:
            before = None if previous is None else (previous.label, previous.components)
            check_web_components(entry.label, entry.components, before)
        else:
            _check_components(entry, None if previous is None else previous.label, required)
        checked.append((entry, *_check_params(entry, now, skew_s, max_validity_s, web=web)))
        previous = entry
    if web:
        labels = [(entry.label, entry.components) for entry in entries]
        raw_agent, directory = web_signature_agent(message.fields, labels)
        digest_covered = any(_CONTENT_DIGEST in e.components for e in entries)
    else:
        raw_agent_field = message.fields.combined("signature-agent")
        if raw_agent_field is None:
            raise VerificationError("missing-covered-header", "covered field 'signature-agent' is absent")
        raw_agent = raw_agent_field
        try:
            directory = parse_signature_agent(raw_agent)
        except FieldError as exc:
            raise VerificationError(exc.reason, exc.detail) from exc
        digest_covered = True
    if body is not None and digest_covered:
        verify_content_digest(message.fields.combined("content-digest"), body)
    # a covered field that is absent or ambiguous needs no key to be refused: the first label's base
    # is built (it is verified first), a later label's components beyond those are looked up
    dictionaries: Dictionaries = {}
    entry = entries[0]
    try:
        base = signature_base(message, entry.components, entry.params_value, dictionaries)
        if len(entries) > 1:
            seen = set(entry.components)
            for entry in entries[1:]:
                beyond = [c for c in entry.components if c not in seen]
                check_components(message, beyond, dictionaries)
                seen.update(beyond)
    except SigningError as exc:
        raise VerificationError(exc.reason, exc.detail, entry.label) from exc
    return CheckedStack(message, tuple(checked), base, dictionaries, raw_agent, directory, profile.name)


def _names_exchange_call(message: Message) -> bool:
    """An exchange call, or a path a backend may route as one (``exchange_method`` refuses it)."""
    try:
        return exchange_method(message.method, message.target.path) is not None
    except IngestError:
        return True


def verify_checked(checked: CheckedStack, lookup: KeyLookup, *, now: float) -> VerifiedStack:
    """Resolve each label's key with ``lookup``, check its window and revocation and the signature.

    ``now`` is the time the keys are used: after any fetch of them, so the signature's window is
    checked again here (``check_stack`` checked it before the fetches, which may take seconds).
    A later label's base is built here, once its key is found, and kept only if it verifies."""
    message = checked.message
    verified = []
    for index, (entry, keyid, created, expires) in enumerate(checked.entries):
        check_not_expired(expires, now, entry.label)
        key = _check_key(entry, lookup(entry, index), now)
        if index == 0:
            base = checked.base
        else:
            try:  # check_stack found every component: only a change to the fields since refuses here
                base = signature_base(message, entry.components, entry.params_value, checked.dictionaries)
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
    return VerifiedStack(tuple(verified), checked.signature_agent, checked.directory, checked.profile)


def verify_stack(
    message: Message,
    body: bytes | None,
    lookup: KeyLookup,
    *,
    now: float,
    skew_s: int = DEFAULT_SKEW_S,
    max_validity_s: int | None = DEFAULT_MAX_VALIDITY_S,
    max_hops: int | None = None,
    required: Sequence[Component] = SPEC_COMPONENTS,
    allow_web: bool = True,
) -> VerifiedStack:
    """Verify every label of the stack per the spec (``check_stack`` then ``verify_checked``)."""
    checked = check_stack(
        message,
        body,
        now=now,
        skew_s=skew_s,
        max_validity_s=max_validity_s,
        max_hops=max_hops,
        required=required,
        allow_web=allow_web,
    )
    return verify_checked(checked, lookup, now=now)


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
