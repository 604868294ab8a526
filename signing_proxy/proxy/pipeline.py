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
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..config import Config, CredentialRule, host_matches
from ..core.challenge import RetryPlan
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.fields import Fields
from ..core.jwk import SigningKey
from ..core.keys import KeyProvider
from ..core.profiles import SVC, SigningProfile, profile_components, profile_params, signature_agent_field
from ..core.signature_key import SIGNATURE_KEY, SIGNATURE_KEY_COMPONENT, signature_key_member
from ..core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    attach_signature,
    serialize_sf_string,
    sign_message,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ConfigError, ProxyError
from ..net.framing import Outgoing, drop_hop_by_hop, outgoing
from ..storage.files import PrivateFileError, read_private
from .profiles import ProfileSelector
from .transactions import TransactionKeys

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .requester import RequesterInjector

__all__ = ["BearerStore", "SignedFields", "Signer", "next_hop_target", "prepare_request", "sign_fields"]

log = logging.getLogger(__name__)

# What the agent may not forge: our signature and what it vouches for.
_AGENT_STRIPPED = frozenset(
    {"signature", "signature-input", "signature-agent", "signature-key", "content-digest"}
)


class BearerStore:
    """Bearer credentials per host pattern, read once from files or the environment (never logged).

    A rule's token goes only where the rule allows (``https`` unless ``allow_plaintext``, its
    ``ports``); the first rule allowing the target wins. A rule that names the host but not the
    scheme or port sends nothing, logged once per rule and origin.
    """

    def __init__(self, rules: Sequence[CredentialRule], environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if environ is None else environ
        self._rules: list[tuple[CredentialRule, str]] = []
        self._told: set[tuple[int, str]] = set()  # (rule index, origin) already logged as withheld
        for i, rule in enumerate(rules):
            if rule.bearer_file is not None:
                token = _read_bearer_file(
                    Path(rule.bearer_file).expanduser(), f"credentials[{i}].bearer_file"
                )
            else:
                token = env.get(rule.bearer_env or "", "").strip()
                if not token:
                    detail = f"credentials[{i}].bearer_env: {rule.bearer_env} is not set"
                    raise ConfigError(detail, reason="credential-missing")
            if not token.isascii() or any(c in token for c in "\r\n"):
                detail = f"credentials[{i}]: bearer token must be one ASCII line"
                raise ConfigError(detail, reason="credential-malformed")
            self._rules.append((rule, token))

    def for_target(self, target: Target) -> tuple[CredentialRule, str] | None:
        """The first rule whose hosts, scheme and ports all admit ``target``, with its token."""
        withheld: list[tuple[int, str]] = []
        for i, (rule, token) in enumerate(self._rules):
            if not any(host_matches(p, target.host) for p in rule.hosts):
                continue
            why = rule.refusal(target.scheme, target.port)
            if why is None:
                return rule, token
            withheld.append((i, why))
        for i, why in withheld:  # nothing is sent: say why each rule naming the host stayed silent
            self._withheld(i, target, why)
        return None

    def _withheld(self, index: int, target: Target, why: str) -> None:
        origin = f"{target.scheme}://{target.host}:{target.port}"
        if (index, origin) in self._told:
            return
        if len(self._told) >= _TOLD_MAX:
            self._told.clear()  # bounded: an agent choosing many origins cannot grow it without end
        self._told.add((index, origin))
        log.warning("credentials[%d] not sent to %s: %s", index, origin, why)


_TOLD_MAX = 4096  # our choice: distinct (rule, origin) pairs remembered as already logged
MAX_BEARER_FILE_BYTES = 16 * 1024  # our choice: far above any real token, far below a header limit


def _read_bearer_file(path: Path, where: str) -> str:
    """One owner-only file's token, stripped; ConfigError naming ``where`` with a stable reason."""
    try:
        data = read_private(path, max_bytes=MAX_BEARER_FILE_BYTES)
    except PrivateFileError as exc:
        if exc.reason == "too-open":
            raise ConfigError(
                f"{where}: {path} mode is {exc.mode:04o}; it must be readable by its owner only "
                f"(run: chmod 600 {path})",
                reason="credential-permissions",
            ) from None
        raise ConfigError(f"{where}: {path} {exc.detail}", reason="credential-unreadable") from None
    if len(data) > MAX_BEARER_FILE_BYTES:
        raise ConfigError(
            f"{where}: {path} is larger than {MAX_BEARER_FILE_BYTES} bytes", reason="credential-malformed"
        )
    try:
        return data.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path} is not text", reason="credential-malformed") from None


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
        now = self.clock()
        key = self._key(now, keyid, missing)
        label = label or self.label
        if present:
            message.fields.add(SIGNATURE_KEY, signature_key_member(label, key.public))
            components = (*components, SIGNATURE_KEY_COMPONENT)
        created = int(now)
        validity = self.validity_s if max_validity_s is None else min(self.validity_s, max_validity_s)
        try:
            member = sign_message(
                message,
                key,
                created=created,
                expires=created + validity,
                label=label,
                components=components,
                extra_params=extra_params,
            )
        except SigningError as exc:
            if self.metrics is not None:
                self.metrics.signing_failure(exc.reason)
            raise ProxyError(400, exc.reason, f"cannot sign this request: {exc.detail}") from None
        attach_signature(message.fields, member)
        if self.metrics is not None:
            self.metrics.signed(member.label)
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


def prepare_request(
    method: str,
    target: Target,
    lines: Sequence[tuple[str, str]],
    body: bytes,
    *,
    framed: bool,
    config: Config,
    signer: Signer,
    bearers: BearerStore,
    requester: RequesterInjector | None = None,
    transactions: TransactionKeys | None = None,
    profiles: ProfileSelector | None = None,
    retry: RetryPlan | None = None,
) -> Outgoing:
    """Apply the signing pipeline (agent mode) and serialize the request for ``target``.

    ``profiles`` picks the destination's signing profile; without it (or for ``svc``) the spec's.
    ``retry``: sign as an origin's Accept-Signature challenge asked (its profile, components, nonce).
    """
    signed = sign_fields(
        method,
        target,
        lines,
        body,
        config=config,
        signer=signer,
        bearers=bearers,
        requester=requester,
        transactions=transactions,
        profiles=profiles,
        retry=retry,
    )
    return outgoing(
        method,
        target,
        signed.fields,
        signed.body,
        framed=framed,
        keyid=signed.keyid,
        via=next_hop_target(config),
        profile=signed.profile,
    )


class SignedFields(NamedTuple):
    """What the pipeline made of a request: the fields and body to send, the keyid that signed them
    and the profile it signed under (both None: a ``hosts.unsigned`` host, fields minus hop-by-hop)."""

    fields: Fields
    body: bytes
    keyid: str | None
    profile: str | None


def sign_fields(
    method: str,
    target: Target,
    lines: Sequence[tuple[str, str]],
    body: bytes,
    *,
    config: Config,
    signer: Signer,
    bearers: BearerStore,
    requester: RequesterInjector | None = None,
    transactions: TransactionKeys | None = None,
    profiles: ProfileSelector | None = None,
    retry: RetryPlan | None = None,
) -> SignedFields:
    """The pipeline without the wire. The in-process adapters (``signing_proxy.client``) sign
    through this too, so both produce the same bytes."""
    fields = drop_hop_by_hop(lines)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return SignedFields(fields, body, None, None)
    agent_auth = fields.get_all("authorization")
    if len(agent_auth) > 1:
        raise ProxyError(400, "duplicate-authorization", "the request has more than one Authorization line")
    fields.remove("authorization", *_AGENT_STRIPPED)
    authorization = agent_auth[0].strip() if agent_auth else ""
    credential = bearers.for_target(target)
    if credential is not None and (credential[0].override or not authorization):
        authorization = f"Bearer {credential[1]}"
    if profiles is not None or retry is not None:
        if retry is not None:
            profile = retry.profile
        else:
            assert profiles is not None
            profile = profiles.select(target.host)
        if profile is not SVC:
            return _sign_profiled(
                Message(method, target, fields),
                body,
                authorization=authorization,
                profile=profile,
                config=config,
                signer=signer,
                retry=retry,
            )
    delegated: str | None = None
    if requester is not None:  # before the digest: digest and signature cover the final body
        body = requester.apply(method, target, fields, body)
        delegated = requester.holder_for(method, target, body)
    fields.add("Content-Digest", content_digest(body))
    fields.add("Authorization", authorization)
    agent = config.signing.signature_agent
    try:
        fields.add("Signature-Agent", serialize_sf_string(agent) if agent else "")
    except (SigningError, FieldError) as exc:  # config validation makes this unreachable in practice
        raise ProxyError(500, exc.reason, "signing.signature_agent cannot be serialized") from None
    message = Message(method, target, fields)
    bound = None if delegated is not None or transactions is None else transactions.bound_key(target)
    if delegated is not None and requester is not None:  # never a key the chain does not name
        keyid = signer.sign(message, keyid=delegated, missing=requester.key_refusal)
    elif bound is not None:  # a retrieval URL: its transaction's key, presented
        keyid = signer.sign(
            message, keyid=bound, present=True, missing=partial(TransactionKeys.refusal, bound)
        )
    else:
        keyid = signer.sign(message)
    return SignedFields(fields, body, keyid, SVC.name)


def _sign_profiled(
    message: Message,
    body: bytes,
    *,
    authorization: str,
    profile: SigningProfile,
    config: Config,
    signer: Signer,
    retry: RetryPlan | None = None,
    nonce: Callable[[int], bytes] = os.urandom,
) -> SignedFields:
    """A destination under another profile than the spec's (web-bot-auth): its components,
    parameters and Signature-Agent form. No Requester or transaction key: those are the spec's."""
    fields = message.fields
    digest = profile.content_digest or (retry is not None and retry.digest)
    if digest:
        fields.add("Content-Digest", content_digest(body))
    if profile.covers_authorization or authorization:
        fields.add("Authorization", authorization)
    label = signer.label
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
        params = profile_params(profile, nonce(profile.nonce_bytes) if profile.nonce_bytes else None)
    keyid = signer.sign(
        message,
        components=components,
        extra_params=params,
        max_validity_s=profile.max_validity_s,
    )
    return SignedFields(fields, body, keyid, profile.name)
