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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config import Config, host_matches
from ..core.challenge import RetryPlan
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.fields import Fields
from ..core.jwk import SigningKey
from ..core.keys import KeyProvider
from ..core.profiles import SVC, SigningProfile, profile_components, signature_agent_field
from ..core.signature_components import base_of, signature_base, signing_params_value
from ..core.signature_key import SIGNATURE_KEY, SIGNATURE_KEY_COMPONENT, signature_key_member
from ..core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    SignedMember,
    attach_signature,
    serialize_sf_string,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError, TokenError
from ..net.framing import NOT_FORWARDED, Outgoing, drop_hop_by_hop, outgoing
from ..storage.pkcs11 import TokenKey
from .credentials import BearerStore
from .profiles import ProfileSelector, fresh_params
from .transactions import TransactionKeys

if TYPE_CHECKING:
    from ..metrics import Metrics
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


class Signer:
    """Signs messages with the current key, or a named one; the window is ``[now, now + validity_s)``."""

    def __init__(
        self,
        keys: KeyProvider,
        *,
        label: str,
        validity_s: int,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ):
        self.keys = keys
        self.label = label
        self.validity_s = validity_s
        self.clock = clock
        self.metrics = metrics

    def sign(
        self,
        message: Message,
        *,
        label: str | None = None,
        components: Sequence[Component] = SPEC_COMPONENTS,
        keyid: str | None = None,
        present: bool = False,
        missing: Callable[[], ProxyError] | None = None,
        extra_params: Sequence[tuple[str, str | int]] = (),
        max_validity_s: int | None = None,
    ) -> str:
        """Sign and attach; return the keyid. Raises ProxyError (503/400) instead of ever skipping.

        ``keyid``: sign with that key of ours only, or raise ``missing()`` when it may not sign now.
        ``present``: add a ``Signature-Key`` member for the label and cover it (a retrieval fetch).
        ``extra_params`` follow the spec's four (a profile's ``nonce``, ``tag``); ``max_validity_s``
        caps ``signing.validity_s`` (a profile's longest validity).
        """
        key, label, params, base = self._prepare(
            message, label, components, keyid, present, missing, extra_params, max_validity_s
        )
        return self._attach(message, key, SignedMember(label, params, key.sign(base), base))

    async def sign_off_loop(
        self,
        message: Message,
        *,
        label: str | None = None,
        components: Sequence[Component] = SPEC_COMPONENTS,
        keyid: str | None = None,
        present: bool = False,
        missing: Callable[[], ProxyError] | None = None,
        extra_params: Sequence[tuple[str, str | int]] = (),
        max_validity_s: int | None = None,
    ) -> str:
        """``sign`` for keys that wait on a device (``key.blocking``: a PKCS#11 token): the signature
        is made on the token's thread, so the loop serves other requests meanwhile. A token that
        fails or does not answer in time raises ProxyError 503 ``signing-token-unavailable``: the
        request is refused, never forwarded unsigned. Other keys sign in-line, as ``sign`` does."""
        key, label, params, base = self._prepare(
            message, label, components, keyid, present, missing, extra_params, max_validity_s
        )
        if not isinstance(key, TokenKey):
            return self._attach(message, key, SignedMember(label, params, key.sign(base), base))
        try:
            signature = await key.sign_async(base)
        except TokenError as exc:
            if self.metrics is not None:
                self.metrics.signing_failure("signing-token-unavailable")
            raise ProxyError(
                503, "signing-token-unavailable", f"the signing key's token did not sign ({exc.reason})"
            ) from None
        return self._attach(message, key, SignedMember(label, params, signature, base))

    def _prepare(  # noqa: PLR0917 - the keyword arguments of sign, passed on
        self,
        message: Message,
        label: str | None,
        components: Sequence[Component],
        keyid: str | None,
        present: bool,
        missing: Callable[[], ProxyError] | None,
        extra_params: Sequence[tuple[str, str | int]],
        max_validity_s: int | None,
    ) -> tuple[SigningKey, str, str, bytes]:
        """The key, label, ``@signature-params`` value and signature base of one signature."""
        now = self.clock()
        key = self._key(now, keyid, missing)
        label = label or self.label
        if present:
            message.fields.add(SIGNATURE_KEY, signature_key_member(label, key.public))
            components = (*components, SIGNATURE_KEY_COMPONENT)
        created = int(now)
        validity = self.validity_s if max_validity_s is None else min(self.validity_s, max_validity_s)
        try:
            if validity <= 0:
                raise SigningError("bad-signature-window", "expires must be after created")
            params = signing_params_value(
                components, key.thumbprint, created, created + validity, extra_params
            )
            base = signature_base(message, components, params)
        except (SigningError, FieldError) as exc:  # a field the base cannot be built from
            if self.metrics is not None:
                self.metrics.signing_failure(exc.reason)
            raise ProxyError(400, exc.reason, f"cannot sign this request: {exc.detail}") from None
        return key, label, params, base

    def _attach(self, message: Message, key: SigningKey, member: SignedMember) -> str:
        attach_signature(message.fields, member)
        if self.metrics is not None:  # the configured label: a relay's made unique (broker2, ...) is not
            self.metrics.signed(self.label)  # a metric label a request may choose
        return key.thumbprint

    def _key(self, now: float, keyid: str | None, missing: Callable[[], ProxyError] | None) -> SigningKey:
        key = self.keys.current(now) if keyid is None else self.keys.key_for(keyid, now)
        if key is not None:
            return key
        if keyid is None:
            error = ProxyError(
                503, "no-valid-signing-key", "no signing key is valid now; see `signing-proxy keys list`"
            )
        elif missing is not None:
            error = missing()
        else:
            error = ProxyError(503, "signing-key-unavailable", f"key {keyid} may not sign now")
        if self.metrics is not None:
            self.metrics.signing_failure(error.reason)
        raise error


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
    ) -> SignedFields:
        """The pipeline without the wire."""
        built = _build(self, method, target, lines, body, retry=retry)
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


_CURRENT_KEY: dict[str, Any] = {}  # sign with the current key (shared, never changed)


class _ToSign(NamedTuple):
    message: Message
    body: bytes
    how: dict[str, Any]  # Signer.sign's keyword arguments: keyid, present, missing; a profile's
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
) -> _ToSign | SignedFields:
    """Everything before the signature; the fields as they go for a host sent unsigned."""
    config, bearers, requester = pipeline.config, pipeline.bearers, pipeline.requester
    transactions, profiles, label = pipeline.transactions, pipeline.profiles, pipeline.signer.label
    fields = drop_hop_by_hop(lines)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return SignedFields(fields, body, None, None)
    agent_auth = fields.get_all("authorization")
    if len(agent_auth) > 1:
        raise ProxyError(400, "duplicate-authorization", "the request has more than one Authorization line")
    fields.remove("authorization", *AGENT_STRIPPED)
    authorization = agent_auth[0].strip() if agent_auth else ""
    credential = bearers.for_target(target)
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
        how = {"keyid": bound, "present": True, "missing": partial(TransactionKeys.refusal, bound)}
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
    how = {"components": components, "extra_params": params, "max_validity_s": profile.max_validity_s}
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
            authorization = line[1].strip()
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
        params = signing_params_value(SPEC_COMPONENTS, key.thumbprint, created, created + signer.validity_s)
        base = base_of(SPEC_COMPONENTS, (method, target.uri, digest, authorization, agent), params)
    except (SigningError, FieldError):
        return None
    member = SignedMember(signer.label, params, key.sign(base), base)
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
