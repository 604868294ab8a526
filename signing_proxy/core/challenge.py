"""Accept-Signature (RFC 9421 section 5.1): what an origin's challenge asks for, bounded to what we sign.

An origin that refuses with 401, 403 or 429 may say which signature it wants in ``Accept-Signature``:
a Dictionary whose members are Inner Lists of component identifiers, with the parameters it asks
for (``tag="web-bot-auth"``, a ``nonce`` value, or a bare ``nonce``/``created`` meaning "include
one"). ``plan_retry`` turns it into a ``RetryPlan`` — the web-bot-auth profile with the narrowing
components asked for and the origin's nonce — or None when the challenge asks for nothing we would
sign differently (no loop: a challenge we already met, or one we cannot meet, is passed back).
A retry sends our Signature-Agent as a Dictionary member, which protocol-02 requires to be an https
origin (a verifier ignores any other member): ``retry_refusal`` says when the configured URL is not
one (a registry's ``https://registry.example/agents/alice``), and the retry is then declined, never
sent with a member no verifier would use. Sans-IO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import FieldError
from .profiles import WEB_BOT_AUTH, WEB_BOT_AUTH_TAG, WEB_COVERABLE, SigningProfile, member_refusal
from .sfv import is_string
from .signature_components import ALG_ED25519, Component, parse_field_dictionary

__all__ = ["CHALLENGE_STATUSES", "RetryPlan", "plan_retry", "retry_refusal"]

CHALLENGE_STATUSES = frozenset({401, 403, 429})
_CONTENT_DIGEST = Component("content-digest")
_MAX_NONCE_CHARS = 256  # our choice: far above a 64-byte base64 nonce


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """The signature a challenge asks for: a profile value (components included) and its nonce."""

    profile: SigningProfile
    nonce: str | None  # the origin's nonce, sent back verbatim; None: a fresh random one
    digest: bool  # the challenge asked for content-digest (set and covered)


def plan_retry(accept_signature: str, sent: SigningProfile | None) -> RetryPlan | None:
    """The retry a challenge asks for, or None (malformed, not web-bot-auth, nothing to change).

    ``sent`` is the profile the refused request was signed under (None: unsigned).
    """
    try:
        members = parse_field_dictionary(accept_signature, "Accept-Signature")
    except FieldError:
        return None
    for member in members.values():
        plan = _plan(member, sent)
        if plan is not None:
            return plan
    return None


def retry_refusal(plan: RetryPlan, agent: str) -> str | None:
    """Why ``plan`` cannot be signed with the Signature-Agent URL ``agent`` (None: it can; "" sends
    none): its Dictionary member must be an https origin (``profiles.member_refusal``)."""
    if plan.profile.signature_agent != "dictionary":
        return None
    return member_refusal(agent)


def _plan(member: Any, sent: SigningProfile | None) -> RetryPlan | None:
    if not (isinstance(member, tuple) and isinstance(member[0], list)):
        return None
    items, params = member
    if not is_string(params.get("tag"), WEB_BOT_AUTH_TAG):
        return None  # the spec's profile signs exactly its five components: nothing to change
    alg = params.get("alg")
    if alg is not None and not is_string(alg, ALG_ED25519):
        return None
    wanted = _components(items)
    if wanted is None:
        return None
    nonce = params.get("nonce")
    if nonce is not None and not isinstance(nonce, str | bool):
        return None
    if isinstance(nonce, str) and (
        len(nonce) > _MAX_NONCE_CHARS or not nonce.isascii() or not nonce.isprintable()
    ):
        return None
    given = nonce if isinstance(nonce, str) else None
    extra = tuple(c for c in wanted if c not in WEB_BOT_AUTH.components and c != _CONTENT_DIGEST)
    digest = _CONTENT_DIGEST in wanted
    profile = WEB_BOT_AUTH
    if extra:
        profile = dataclasses.replace(WEB_BOT_AUTH, components=(*WEB_BOT_AUTH.components, *extra))
    if sent is not None and sent.name == profile.name and not extra and not digest and given is None:
        return None  # what we sent already meets it
    return RetryPlan(profile, given, digest)


def _components(items: Sequence[tuple[Any, Any]]) -> tuple[Component, ...] | None:
    """The asked components we can produce (``signature-agent`` is ours to add); None if any is not."""
    out: list[Component] = []
    for value, item_params in items:
        if not isinstance(value, str):
            return None
        if value == "signature-agent":
            continue  # covered by its member whenever we send one
        if item_params:
            return None
        component = Component(value)
        if component not in WEB_COVERABLE:  # what a web-bot-auth signature of ours can cover
            return None
        if component not in out:
            out.append(component)
    return tuple(out)
