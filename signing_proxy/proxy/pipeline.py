"""From the request the agent sent to the exact bytes that go upstream, signed last.

Order matters (lessons from peers: sign after every other change): drop hop-by-hop fields and
anything the agent sent that our signature would vouch for (``Signature*``, ``Signature-Agent``,
``Signature-Key``, ``Content-Digest``), settle ``Authorization``, set ``Content-Digest`` and
``Signature-Agent``, then sign ``@target-uri`` = the URI whose origin-form and ``Host`` go on the
wire, and serialize once. The key: the one the delegation chain names for an exchange call carrying
it, the transaction's for a bound retrieval URL (which also presents it, ``Signature-Key``), else the
current one. Nothing here awaits; the caller owns sockets and clocks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, NamedTuple

from ..config import Config, host_matches
from ..core.challenge import RetryPlan
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.fields import Fields
from ..core.profiles import SVC, SigningProfile, profile_components, signature_agent_field
from ..core.signature_components import base_of, signing_params_value
from ..core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    serialize_sf_string,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError
from ..net.framing import NOT_FORWARDED, Outgoing, drop_hop_by_hop, outgoing
from .credentials import BearerStore
from .profiles import ProfileSelector, fresh_params
from .signer import Signer, SignOptions
from .transactions import TransactionKeys

if TYPE_CHECKING:
    from .requester import RequesterInjector

__all__ = [
    "AGENT_STRIPPED",
    "BearerStore",
    "SignedFields",
    "Signer",
    "SigningPipeline",
    "next_hop_target",
]

log = logging.getLogger(__name__)

# What the agent may not forge: our signature and what it vouches for.
AGENT_STRIPPED = frozenset(
    {"signature", "signature-input", "signature-agent", "signature-key", "content-digest"}
)


def next_hop_target(config: Config) -> Target | None:
    """The configured next-hop relay as a connect target, or None."""
    if config.upstream.next_hop is None:
        return None
    return parse_absolute_uri(config.upstream.next_hop.rstrip("/") + "/")


class SignedFields(NamedTuple):
    """What the pipeline made of a request: the fields and body to send, the keyid that signed them
    and the profile it signed under (both None: a ``hosts.unsigned`` host, fields minus hop-by-hop)."""

    fields: Fields
    body: bytes
    keyid: str | None
    profile: str | None


@dataclass(frozen=True, slots=True)
class SigningPipeline:
    """What signs an agent request: the configuration and its live parts. ``ProxyApp`` rebuilds it
    on a reload; the in-process adapters (``signing_proxy.client``) sign through it too, so both
    produce the same bytes.

    ``profiles`` picks the destination's signing profile; without it (or for ``svc``) the spec's.
    A ``retry`` signs as an origin's Accept-Signature challenge asked (its profile, components, nonce).
    """

    config: Config
    signer: Signer
    bearers: BearerStore
    requester: RequesterInjector | None = None
    transactions: TransactionKeys | None = None
    profiles: ProfileSelector | None = None

    def sign_fields(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        retry: RetryPlan | None = None,
        sent_to: Target | None = None,
    ) -> SignedFields:
        """The pipeline without the wire. ``sent_to``: where the bytes go (an in-process caller's
        URL), when ``target`` is built from the ``Host`` it sets (what a verifier rebuilds): the
        bearer is the one configured for ``sent_to``, and when the two name other authorities no
        Requester is added (it is meant for the exchange the Host names, not for where bytes go)."""
        built = _build(self, method, target, lines, body, retry=retry, sent_to=sent_to)
        if isinstance(built, SignedFields):
            return built
        return built.signed(self.signer.sign(built.message, **built.how))

    def prepare(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        framed: bool,
        retry: RetryPlan | None = None,
    ) -> Outgoing:
        """Sign and serialize the request for ``target`` (or the next-hop relay)."""
        if retry is None:  # the common request, in one pass: the same bytes (_sign_plain)
            plain = _sign_plain(self, method, target, lines, body, framed=framed)
            if plain is not None:
                return plain
        return self._serialized(
            method, target, self.sign_fields(method, target, lines, body, retry=retry), framed
        )

    async def prepare_off_loop(
        self,
        method: str,
        target: Target,
        lines: Sequence[tuple[str, str]],
        body: bytes,
        *,
        framed: bool,
        retry: RetryPlan | None = None,
    ) -> Outgoing:
        """``prepare`` whose signature is made off the event loop (keys on a token)."""
        built = _build(self, method, target, lines, body, retry=retry)
        if not isinstance(built, SignedFields):
            built = built.signed(await self.signer.sign_off_loop(built.message, **built.how))
        return self._serialized(method, target, built, framed)

    def _serialized(self, method: str, target: Target, signed: SignedFields, framed: bool) -> Outgoing:
        return outgoing(
            method,
            target,
            signed.fields,
            signed.body,
            framed=framed,
            keyid=signed.keyid,
            via=next_hop_target(self.config),
            profile=signed.profile,
        )


_CURRENT_KEY: SignOptions = {}  # sign with the current key (shared, never changed)


class _ToSign(NamedTuple):
    message: Message
    body: bytes
    how: SignOptions  # keyid, present, missing; a profile's
    profile: str

    def signed(self, keyid: str) -> SignedFields:
        return SignedFields(self.message.fields, self.body, keyid, self.profile)


def _build(
    pipeline: SigningPipeline,
    method: str,
    target: Target,
    lines: Sequence[tuple[str, str]],
    body: bytes,
    *,
    retry: RetryPlan | None,
    sent_to: Target | None = None,
) -> _ToSign | SignedFields:
    """Everything before the signature; the fields as they go for a host sent unsigned."""
    config, bearers = pipeline.config, pipeline.bearers
    routed = sent_to is None or (sent_to.host, sent_to.port) == (target.host, target.port)
    requester = pipeline.requester if routed else None  # never to an origin it is not meant for
    transactions, profiles, label = pipeline.transactions, pipeline.profiles, pipeline.signer.label
    fields = drop_hop_by_hop(lines)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return SignedFields(fields, body, None, None)
    agent_auth = fields.get_all("authorization")
    if len(agent_auth) > 1:
        raise ProxyError(400, "duplicate-authorization", "the request has more than one Authorization line")
    fields.remove("authorization", *AGENT_STRIPPED)
    authorization = agent_auth[0].strip(" \t") if agent_auth else ""  # RFC 9110 5.5: only SP and HTAB
    credential = bearers.for_target(target if sent_to is None else sent_to)  # chosen by where it goes
    if credential is not None and (credential[0].override or not authorization):
        authorization = f"Bearer {credential[1]}"
    if profiles is not None or retry is not None:
        if retry is not None:
            profile = retry.profile
        else:
            assert profiles is not None
            profile = profiles.select(target.host, target.scheme, target.port)
        # An exchange call and a bound retrieval fetch are signed under the spec's profile with the
        # key they are bound to (the delegation's holder, the transaction's key), whatever a profile
        # rule, a learned host or a challenge asks: web-bot-auth would drop the Requester and the
        # binding. Asked only when another profile is chosen: most requests are not.
        pinned = profile is not SVC and (
            (requester is not None and requester.is_exchange_call(method, target))
            or (transactions is not None and transactions.bound_key(target) is not None)
        )
        if profile is not SVC and not pinned:
            return _build_profiled(
                Message(method, target, fields),
                body,
                authorization=authorization,
                profile=profile,
                config=config,
                label=label,
                retry=retry,
            )
    delegated: str | None = None
    if requester is not None:  # before the digest: digest and signature cover the final body
        body = requester.apply(method, target, fields, body)
        delegated = requester.holder_for(method, target, body)
    fields.add("Content-Digest", content_digest(body))
    fields.add("Authorization", authorization)
    try:
        fields.add("Signature-Agent", _signature_agent(config.signing.signature_agent))
    except (SigningError, FieldError) as exc:  # config validation makes this unreachable in practice
        raise ProxyError(500, exc.reason, "signing.signature_agent cannot be serialized") from None
    message = Message(method, target, fields)
    bound = None if delegated is not None or transactions is None else transactions.bound_key(target)
    if delegated is not None and requester is not None:  # never a key the chain does not name
        return _ToSign(message, body, {"keyid": delegated, "missing": requester.key_refusal}, SVC.name)
    if bound is not None:  # a retrieval URL: its transaction's key, presented
        how: SignOptions = {
            "keyid": bound,
            "present": True,
            "missing": partial(TransactionKeys.refusal, bound),
        }
        return _ToSign(message, body, how, SVC.name)
    return _ToSign(message, body, _CURRENT_KEY, SVC.name)


def _build_profiled(
    message: Message,
    body: bytes,
    *,
    authorization: str,
    profile: SigningProfile,
    config: Config,
    label: str,
    retry: RetryPlan | None = None,
) -> _ToSign:
    """A destination under another profile than the spec's (web-bot-auth): its components,
    parameters and Signature-Agent form. No Requester or transaction key: those are the spec's."""
    fields = message.fields
    digest = profile.content_digest or (retry is not None and retry.digest)
    if digest:
        fields.add("Content-Digest", content_digest(body))
    if profile.covers_authorization or authorization:
        fields.add("Authorization", authorization)
    try:
        value, agent = signature_agent_field(profile, label, config.signing.signature_agent)
    except (SigningError, FieldError) as exc:  # config validation makes this unreachable in practice
        raise ProxyError(500, exc.reason, "signing.signature_agent cannot be serialized") from None
    if value is not None:
        fields.add("Signature-Agent", value)
    components = profile_components(profile, previous=None, agent=agent)
    if profile.covers_authorization:
        components = (*components, Component("authorization"))
    if digest:
        components = (*components, Component("content-digest"))
    if retry is not None and retry.nonce is not None:  # the origin's nonce, sent back as given
        params: tuple[tuple[str, str | int], ...] = (("nonce", retry.nonce), ("tag", profile.tag or ""))
    else:
        params = fresh_params(profile)
    how: SignOptions = {
        "components": components,
        "extra_params": params,
        "max_validity_s": profile.max_validity_s,
    }
    return _ToSign(message, body, how, profile.name)


# dropped from the agent's lines: hop-by-hop, regenerated, and what our signature vouches for
_DROPPED = NOT_FORWARDED | AGENT_STRIPPED | {"authorization"}


@lru_cache(maxsize=8)
def _signature_agent(agent: str) -> str:
    """``Signature-Agent`` as sent: the configured URL as an sf-string, or "" (none configured)."""
    return serialize_sf_string(agent) if agent else ""


def _sign_plain(
    pipeline: SigningPipeline,
    method: str,
    target: Target,
    lines: Sequence[tuple[str, str]],
    body: bytes,
    *,
    framed: bool,
) -> Outgoing | None:
    """The common request in one pass: the spec's five components, the current key, no other rule.

    Most agent requests need no rule beyond the spec's: no challenge retry, no other profile, no
    Requester, no transaction key, no ``Connection`` naming more fields. For those this makes the
    same bytes as ``_build`` + ``Signer.sign`` + ``outgoing`` (the general path, the reference)
    without the objects in between: one pass over the lines, and the base made from the values
    just computed (``base_of``); about a fifth of the agent hop's CPU per request. None for
    anything else, and for anything the general path refuses (it then answers with its error):
    ``tests/proxy/test_plain_path.py`` holds the two byte-equal on generated requests."""
    config, signer, profiles = pipeline.config, pipeline.signer, pipeline.profiles
    host = target.host
    if config.hosts.unsigned and any(host_matches(p, host) for p in config.hosts.unsigned):
        return None
    if profiles is not None and profiles.select(host, target.scheme, target.port) is not SVC:
        return None
    if pipeline.requester is not None and pipeline.requester.is_exchange_call(method, target):
        return None
    if pipeline.transactions is not None and pipeline.transactions.bound_key(target) is not None:
        return None
    kept: list[tuple[str, str]] = []
    authorization: str | None = None
    for line in lines:
        lname = line[0].lower()
        if lname not in _DROPPED:
            kept.append(line)
        elif lname == "authorization":
            if authorization is not None:
                return None  # more than one: refused there
            authorization = line[1].strip(" \t")
        elif lname == "connection":
            return None  # it names more fields to drop
    credential = pipeline.bearers.for_target(target)
    if credential is not None and (credential[0].override or not authorization):
        authorization = f"Bearer {credential[1]}"
    authorization = authorization or ""
    now = signer.clock()
    key = signer.keys.current(now)
    if key is None or signer.validity_s <= 0:
        return None
    created = int(now)
    digest = content_digest(body)
    try:
        agent = _signature_agent(config.signing.signature_agent)
        values = (method, target.uri, digest, authorization, agent)

        def build(expires: int) -> tuple[str, bytes]:
            params = signing_params_value(SPEC_COMPONENTS, key.thumbprint, created, expires)
            return params, base_of(SPEC_COMPONENTS, values, params)

        params, base = signer.unrepeated(created, signer.expires(key, created, signer.validity_s), build)
    except (SigningError, FieldError):
        return None
    member = signer.member(key, signer.label, params, base)
    kept += [
        ("Content-Digest", digest),
        ("Authorization", authorization),
        ("Signature-Agent", agent),
        ("Signature-Input", member.input_member),
        ("Signature", member.signature_member),
    ]
    try:
        out = outgoing(
            method,
            target,
            kept,
            body,
            framed=framed,
            keyid=key.thumbprint,
            via=next_hop_target(config),
            profile=SVC.name,
        )
    except ProxyError:
        return None  # a value that cannot go out as HTTP/1.1 bytes: refused there
    if signer.metrics is not None:
        signer.metrics.signed(signer.label)
    return out
