"""Signing profiles as values: the spec's ``svc`` profile and the IETF ``web-bot-auth`` profile.

A ``SigningProfile`` says what one signature covers and carries: the covered components of a first
signer, the extra parameters (``tag``, a random ``nonce``), the ``Signature-Agent`` form, whether
``Content-Digest`` is set and covered, and the longest validity. ``SVC`` is the spec's profile
("Request signature"), byte-identical to what ``signatures`` always produced; ``WEB_BOT_AUTH``
follows ``draft-ietf-webbotauth-httpsig-protocol`` (notes: spec-notes section 6): ``@authority``,
``"signature-agent";key=<label>`` when a Signature-Agent is sent, ``tag="web-bot-auth"``, a 64-byte
nonce, and an outer hop that also covers ``"signature-input";key=<previous>`` and the inner
signature's components.

The verifier side is here too (``entry_profile``, ``check_web_components``,
``web_signature_agent``): a label's profile is named by its ``tag`` (none: ``svc``), each profile
has its own rules, and a stack mixing profiles is refused. Sans-IO: the nonce bytes come from the
caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal

from .b64 import b64_encode
from .errors import FieldError, VerificationError
from .fields import Fields
from .sfv import is_string, is_token, parse_item, serialize_member
from .signature_components import (
    SPEC_COMPONENTS,
    Component,
    hop_components,
    parse_field_dictionary,
    serialize_sf_string,
)
from .uri import directory_base

__all__ = [
    "MAX_AGENT_MEMBERS",
    "MAX_WEB_COMPONENTS",
    "PROFILES",
    "SVC",
    "WEB_BOT_AUTH",
    "WEB_BOT_AUTH_TAG",
    "WEB_COVERABLE",
    "SignatureAgentForm",
    "SigningProfile",
    "agent_members",
    "check_web_components",
    "entry_profile",
    "member_refusal",
    "profile_components",
    "profile_params",
    "signature_agent_field",
    "web_signature_agent",
]

WEB_BOT_AUTH_TAG = "web-bot-auth"  # draft-ietf-webbotauth-httpsig-protocol: MUST
WEB_MAX_VALIDITY_S = 86_400  # the drafts: "RECOMMENDED that expiry be no more than 24 hours"
WEB_NONCE_BYTES = 64  # draft-meunier-web-bot-auth-architecture-05: RECOMMENDED 64 bytes

SignatureAgentForm = Literal["spec", "dictionary", "string"]
"""``spec``: bare URL or sf-String, possibly empty, covered plain; ``dictionary``: ``label="https://…"``
covered as ``"signature-agent";key=<label>`` (absent when there is no URL); ``string``: the drafts'
legacy sf-String form covered plain (absent when there is no URL)."""

_AUTHORITY = Component("@authority")
_TARGET_URI = Component("@target-uri")
# Narrowing components a web-bot-auth signer may add (protocol-02), and the body's digest.
_WEB_OPTIONAL = frozenset(
    Component(name)
    for name in ("@method", "@path", "@query", "@scheme", "@request-target", "@target-uri", "content-digest")
)
WEB_COVERABLE = _WEB_OPTIONAL | {_AUTHORITY}  # all a web-bot-auth label may cover (and Signature-Agent)
# our choice: components a web-bot-auth label may cover beyond those of the label before it (each
# later label covers them all again, and its predecessor's two members): signers cover a handful,
# and each costs a value read before any key is known
MAX_WEB_COMPONENTS = 64
# our choice: members of a Signature-Agent Dictionary. Each signer of a stack provides one for its
# label (protocol-02), and a stack has at most MAX_HOPS (16) signers; an agent may add a few of other
# types. A stranger's thousands cost a parse per reader and, at a relay, a label search over them all
MAX_AGENT_MEMBERS = 64


@dataclass(frozen=True, slots=True)
class SigningProfile:
    """What a signature under this profile covers and carries."""

    name: str
    components: tuple[Component, ...]  # a first signer's, Signature-Agent member excluded
    tag: str | None  # the ``tag`` parameter; None: none (the spec's profile)
    nonce_bytes: int  # random bytes in ``nonce`` (base64); 0: no nonce
    signature_agent: SignatureAgentForm
    content_digest: bool  # set Content-Digest on every request and cover it
    covers_authorization: bool  # send Authorization (empty when none) and cover it
    max_validity_s: int | None  # expires - created at most this (None: the signer's setting)
    outer_covers_input: bool  # a later hop also covers ``"signature-input";key=<previous>``


SVC = SigningProfile(
    name="svc",
    components=SPEC_COMPONENTS,
    tag=None,
    nonce_bytes=0,
    signature_agent="spec",
    content_digest=True,
    covers_authorization=True,
    max_validity_s=None,
    outer_covers_input=False,
)

WEB_BOT_AUTH = SigningProfile(
    name=WEB_BOT_AUTH_TAG,
    components=(_AUTHORITY,),
    tag=WEB_BOT_AUTH_TAG,
    nonce_bytes=WEB_NONCE_BYTES,
    signature_agent="dictionary",
    content_digest=False,
    covers_authorization=False,
    max_validity_s=WEB_MAX_VALIDITY_S,
    outer_covers_input=True,
)

PROFILES = {SVC.name: SVC, WEB_BOT_AUTH.name: WEB_BOT_AUTH}


def member_refusal(url: str) -> str | None:
    """Why ``url`` cannot be sent as a Signature-Agent Dictionary member, or None (it can; "" sends none).

    protocol-02 5.5: a directory member "MUST be the ASCII serialization of an origin" and a verifier
    "MUST ignore a member carrying anything else"; its values are https URIs. So an https origin
    (``https://agent.example``, a trailing ``/`` allowed): no path (a registry's ``/agents/alice``
    names no directory here, nor does ``//``, which ``directory_base`` would strip: the member is sent
    as configured), userinfo, query or fragment.
    """
    if not url:
        return None
    try:
        base = directory_base(url)
    except FieldError:
        base = ""
    if base.startswith("https://") and "/" not in base.removeprefix("https://") and _origin_path(url):
        return None
    return (
        f"{url!r} is no https origin (https://agent.example): a protocol-02 verifier ignores a "
        "web-bot-auth Signature-Agent member that is not one, and finds no key directory"
    )


# The signer asks per web-bot-auth request about its one configured URL (a few across reloads); the
# verifier asks ``member_refusal`` itself about strangers' members, which must not evict it.
_configured_refusal = lru_cache(maxsize=8)(member_refusal)


def signature_agent_field(
    profile: SigningProfile, label: str, url: str
) -> tuple[str | None, Component | None]:
    """The Signature-Agent field value to send (None: send none) and the component covering it.
    FieldError ``signature-agent-not-origin`` for a Dictionary member that is no https origin
    (``member_refusal``): never sent, a verifier would ignore it."""
    if profile.signature_agent == "spec":
        return (serialize_sf_string(url) if url else ""), Component("signature-agent")
    if not url:
        return None, None
    if profile.signature_agent == "dictionary":
        refusal = _configured_refusal(url)
        if refusal is not None:
            raise FieldError("signature-agent-not-origin", refusal)
        return f"{label}={serialize_sf_string(url)}", Component("signature-agent", key=label)
    return serialize_sf_string(url), Component("signature-agent")


def profile_components(
    profile: SigningProfile,
    *,
    previous: str | None,
    agent: Component | None,
    inner: Sequence[Component] = (),
) -> tuple[Component, ...]:
    """The covered set of a label under ``profile``: ``previous`` is the label before ours (None for
    the first signer), ``agent`` the component covering our Signature-Agent, ``inner`` what the
    previous label covered (an outer web-bot-auth hop covers it too)."""
    if profile is SVC:
        return hop_components(previous)  # the hot path: the spec's tuple itself for a first signer
    own = list(profile.components)
    if agent is not None:
        own.append(agent)
    if previous is None:
        return tuple(own)
    mine = set(own)
    own.extend(dict.fromkeys(c for c in inner if c not in mine))  # in order, each once (by hash)
    own.append(Component("signature", key=previous))
    if profile.outer_covers_input:
        own.append(Component("signature-input", key=previous))
    return tuple(own)


def profile_params(profile: SigningProfile, nonce: bytes | None) -> tuple[tuple[str, str | int], ...]:
    """Parameters after ``keyid``, ``alg``, ``created``, ``expires``: ``nonce`` then ``tag``."""
    params: list[tuple[str, str | int]] = []
    if profile.nonce_bytes:
        if nonce is None or len(nonce) != profile.nonce_bytes:
            raise ValueError(f"profile {profile.name} needs a {profile.nonce_bytes}-byte nonce")
        params.append(("nonce", b64_encode(nonce)))
    if profile.tag is not None:
        params.append(("tag", profile.tag))
    return tuple(params)


# --- verifying ---


def entry_profile(tag: object, label: str) -> SigningProfile:
    """The profile a label claims by its ``tag`` (none: the spec's); an unknown tag is refused, and so
    is one that is not a String (the Token ``web-bot-auth`` too: ``unsupported-tag``)."""
    if tag is None:
        return SVC
    # RFC 9421 2.3: a String; the Token web-bot-auth (http-sf's Token equals its text) names nothing
    if is_string(tag, WEB_BOT_AUTH_TAG):
        return WEB_BOT_AUTH
    detail = "tag names no profile this verifier accepts"
    if tag.__class__ is not str:
        detail += ' (it must be a String, as tag="web-bot-auth")'
    raise VerificationError("unsupported-tag", detail, label)


def check_web_components(
    label: str, components: Sequence[Component], previous: tuple[str, Sequence[Component]] | None
) -> None:
    """The web-bot-auth rules on one label's covered set: ``@authority`` or ``@target-uri``, only the
    optional narrowing components and Signature-Agent beyond them; a later hop covers the previous
    label's ``signature`` and ``signature-input`` members and everything the previous label covered."""
    inherited = frozenset(previous[1]) if previous is not None else frozenset()
    if sum(c not in inherited for c in components) > MAX_WEB_COMPONENTS:  # before any value is read
        raise VerificationError(
            "too-many-components",
            f"label {label!r} covers more than {MAX_WEB_COMPONENTS} components of its own",
            label,
        )
    present = set(components)  # membership by hash: a stack's last label may cover a thousand
    if len(present) != len(components):
        raise VerificationError("duplicate-component", "a component is covered twice", label)
    if _AUTHORITY not in present and _TARGET_URI not in present:
        raise VerificationError(
            "missing-covered-component",
            f'label {label!r} covers neither "@authority" nor "@target-uri"',
            label,
        )
    allowed = set(WEB_COVERABLE)
    if previous is not None:
        prev_label, prev_components = previous
        chained = (Component("signature", key=prev_label), Component("signature-input", key=prev_label))
        for needed in (*chained, *prev_components):
            if needed not in present:
                raise VerificationError(
                    "predecessor-not-covered",
                    f"label {label!r} must cover {needed.serialized} of label {prev_label!r}",
                    label,
                )
        allowed.update(chained)
        allowed.update(prev_components)
    agents = [c for c in components if c.name == "signature-agent"]
    if len(agents) > 1 and previous is None:
        raise VerificationError("duplicate-component", "Signature-Agent is covered twice", label)
    extra = [c for c in components if c not in allowed and c.name != "signature-agent" and not _web_extra(c)]
    if extra:
        raise VerificationError(
            "unexpected-covered-component",
            f"label {label!r} covers {', '.join(c.serialized for c in extra)} beyond the web profile",
            label,
        )


def _web_extra(component: Component) -> bool:
    """A component a web-bot-auth signer may cover beyond the profile's (protocol-02 names
    ``@query-param``; Cloudflare's signers take any list): one named query parameter, or a whole
    HTTP field by its lower-case name. Not Signature or Signature-Input (a later hop covers the
    previous label's members), nor any other field's member."""
    if component.query_name is not None:
        return True
    name = component.name
    return component.key is None and _FIELD_NAME.fullmatch(name) is not None and name not in _SIGNATURE_FIELDS


_FIELD_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110 token, lower case (RFC 9421 2.1)
_SIGNATURE_FIELDS = frozenset({"signature", "signature-input"})


def web_signature_agent(
    fields: Fields, labels: Sequence[tuple[str, Sequence[Component]]]
) -> tuple[str, str | None]:
    """What the first web-bot-auth label of ``labels`` (each label with its covered components, in
    stack order) covers of Signature-Agent, as a verdict shows it, and the directory origin that
    names. The first: the legacy sf-String covered plain, as sent, or the one Dictionary member
    covered (``"signature-agent";key=<m>``) alone, as ``m=<value>`` with the value serialized as in
    the signature base, never the whole field (anyone on the path can add a member: "A verifier MUST
    NOT attribute a signature to a member that signature does not cover"); "" when it covers none.
    The directory: None when it covers none, or the member is one the drafts have a verifier ignore
    (a ``type`` other than ``directory``; an http URL, or one with a path, which is no https origin;
    the legacy String, from drafts that took any URI, may have one): its keys are then only pinned ones.
    A Dictionary of more than ``MAX_AGENT_MEMBERS`` members is refused before it is parsed.
    One sent that the first label does not cover is refused (anyone on the path could add it) unless
    it is a Dictionary each of whose members a later label covers: a relay's own (each signer
    provides one for its label), stacked on an agent that sent none (``_later_members_only``).
    """
    label, components = labels[0]
    covered = [c for c in components if c.name == "signature-agent"]
    raw = fields.combined("signature-agent")
    if raw is None:
        if covered:
            raise VerificationError(
                "missing-covered-header", "covered field 'signature-agent' is absent", label
            )
        return "", None
    if not covered:
        _later_members_only(raw, label, labels[1:])
        return "", None  # attributed to no member: the agent's key is a pinned one
    component = covered[0]
    if component.key is None:  # the drafts' legacy form: one sf-String
        try:
            value, params = parse_item(raw)
        except (ValueError, UnicodeEncodeError):
            raise VerificationError(
                "malformed-signature-agent", "Signature-Agent is neither a Dictionary nor a String", label
            ) from None
        if not isinstance(value, str) or params:
            raise VerificationError("malformed-signature-agent", "Signature-Agent must be a String", label)
        return raw, _web_directory(value, label)  # the drafts of that form took any URI (a path too)
    try:
        members = agent_members(raw)
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail, label) from None
    member = members.get(component.key)
    if member is None:
        raise VerificationError(
            "missing-dictionary-member", f"Signature-Agent has no member {component.key!r}", label
        )
    value, params = member
    if not isinstance(value, str):
        raise VerificationError(
            "malformed-signature-agent", "a Signature-Agent member must be a String", label
        )
    shown = f"{component.key}={serialize_member(member)}"  # the member alone, as its base line has it
    kind = params.get("type")
    if kind is not None and not is_token(kind, "directory"):
        # protocol-02 5.2.1: "A verifier that does not support a type value MUST ignore that member,
        # and MUST NOT infer the mechanism from the URI path" (jwks_uri, cimd: not ours)
        return shown, None
    # 5.5: a directory member "MUST be the ASCII serialization of an origin" (values "MUST be https
    # URIs"), and a verifier "MUST ignore a member carrying anything else": an http URL or a path
    # names no directory here (never one fetched over plain http, whatever egress allows)
    if value.startswith("http://"):
        return shown, None
    base = _web_directory(value, label)  # what is no http(s) URL at all is refused, malformed
    return shown, (base if member_refusal(value) is None else None)  # the signer's rule, one copy


def agent_members(raw: str) -> Mapping[str, Any]:
    """A Signature-Agent field value as a Dictionary (read-only: parsed once per value for every
    reader of a request). FieldError ``too-many-agent-members`` before any parse when it may hold
    more than ``MAX_AGENT_MEMBERS`` (members are separated by commas; one inside a String counts too:
    no origin has one), ``malformed-signature-agent`` or ``duplicate-label`` when it is none."""
    if raw.count(",") >= MAX_AGENT_MEMBERS:
        raise FieldError(
            "too-many-agent-members", f"Signature-Agent holds more than {MAX_AGENT_MEMBERS} members"
        )
    return _parsed_agent(raw)


@lru_cache(maxsize=4)  # the verifier's check, a relay's label choice: the same value, one parse
def _parsed_agent(raw: str) -> Mapping[str, Any]:
    return MappingProxyType(parse_field_dictionary(raw, "Signature-Agent"))


def _origin_path(url: str) -> bool:
    """Whether ``url`` as written has no path but an optional ``/`` (spec-notes 6.2: "empty path or
    ``/`` only"), whatever spelling ``directory_base`` would reduce it to."""
    rest = url.partition("://")[2]
    slash = rest.find("/")
    return slash < 0 or rest[slash:] == "/"


def _later_members_only(raw: str, label: str, later: Sequence[tuple[str, Sequence[Component]]]) -> None:
    """Refuse a Signature-Agent the first label ``label`` does not cover, unless it is a Dictionary
    whose every member a later label covers by its key (``signature-agent-not-covered``)."""
    keys = {c.key for _label, components in later for c in components if c.name == "signature-agent"}
    members: Mapping[str, object] = {}
    if keys - {None}:
        try:
            members = agent_members(raw)
        except FieldError as exc:  # a String or malformed: no member a later label covers
            if exc.reason == "too-many-agent-members":  # refused as for the first label's member
                raise VerificationError(exc.reason, exc.detail, label) from None
    stray = [key for key in members if key not in keys]
    if not members or stray:
        named = f" (nor does a later label cover member {stray[0]!r})" if stray else ""
        raise VerificationError(
            "signature-agent-not-covered",
            f"label {label!r} does not cover the Signature-Agent sent{named}",
            label,
        )


def _web_directory(url: str, label: str) -> str:
    if not url.startswith(("https://", "http://")) or any(c in url for c in ' "<>\\?#'):
        raise VerificationError("malformed-signature-agent", "Signature-Agent must be an http(s) URL", label)
    try:
        return directory_base(url)  # one spelling per directory: its cache, revocation state and identity
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail, label) from None
