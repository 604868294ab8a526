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
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config import Config, CredentialRule, host_matches
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.jwk import SigningKey
from ..core.keys import KeyProvider
from ..core.signature_components import signature_base, signing_params_value
from ..core.signature_key import SIGNATURE_KEY, SIGNATURE_KEY_COMPONENT, signature_key_member
from ..core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    SignedMember,
    attach_signature,
    serialize_sf_string,
    sign_message,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ConfigError, ProxyError, TokenError
from ..net.framing import Outgoing, drop_hop_by_hop, outgoing
from ..storage.files import PrivateFileError, read_private
from ..storage.pkcs11 import TokenKey
from .transactions import TransactionKeys

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .requester import RequesterInjector

__all__ = ["BearerStore", "Signer", "next_hop_target", "prepare_request", "prepare_request_off_loop"]

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
    ) -> str:
        """Sign and attach; return the keyid. Raises ProxyError (503/400) instead of ever skipping.

        ``keyid``: sign with that key of ours only, or raise ``missing()`` when it may not sign now.
        ``present``: add a ``Signature-Key`` member for the label and cover it (a retrieval fetch).
        """
        now = self.clock()
        key = self._key(now, keyid, missing)
        label = label or self.label
        if present:
            message.fields.add(SIGNATURE_KEY, signature_key_member(label, key.public))
            components = (*components, SIGNATURE_KEY_COMPONENT)
        created = int(now)
        try:
            member = sign_message(
                message,
                key,
                created=created,
                expires=created + self.validity_s,
                label=label,
                components=components,
            )
        except SigningError as exc:
            if self.metrics is not None:
                self.metrics.signing_failure(exc.reason)
            raise ProxyError(400, exc.reason, f"cannot sign this request: {exc.detail}") from None
        attach_signature(message.fields, member)
        if self.metrics is not None:
            self.metrics.signed(member.label)
        return key.thumbprint

    async def sign_off_loop(
        self,
        message: Message,
        *,
        label: str | None = None,
        components: Sequence[Component] = SPEC_COMPONENTS,
        keyid: str | None = None,
        present: bool = False,
        missing: Callable[[], ProxyError] | None = None,
    ) -> str:
        """``sign`` for keys that wait on a device (``key.blocking``: a PKCS#11 token): the signature
        is made on the token's thread, so the loop serves other requests meanwhile. A token that
        fails or does not answer in time raises ProxyError 503 ``signing-token-unavailable``: the
        request is refused, never forwarded unsigned. Other keys sign in-line, as ``sign`` does."""
        now = self.clock()
        key = self._key(now, keyid, missing)
        if not isinstance(key, TokenKey):
            return self.sign(
                message, label=label, components=components, keyid=keyid, present=present, missing=missing
            )
        label = label or self.label
        if present:
            message.fields.add(SIGNATURE_KEY, signature_key_member(label, key.public))
            components = (*components, SIGNATURE_KEY_COMPONENT)
        created = int(now)
        try:
            params = signing_params_value(components, key.thumbprint, created, created + self.validity_s)
            base = signature_base(message, components, params)
        except SigningError as exc:
            if self.metrics is not None:
                self.metrics.signing_failure(exc.reason)
            raise ProxyError(400, exc.reason, f"cannot sign this request: {exc.detail}") from None
        try:
            signature = await key.sign_async(base)
        except TokenError as exc:
            if self.metrics is not None:
                self.metrics.signing_failure("signing-token-unavailable")
            raise ProxyError(
                503, "signing-token-unavailable", f"the signing key's token did not sign ({exc.reason})"
            ) from None
        member = SignedMember(label, params, signature, base)
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
) -> Outgoing:
    """Apply the signing pipeline (agent mode) and serialize the request for ``target``."""
    built = _build(
        method,
        target,
        lines,
        body,
        framed=framed,
        config=config,
        bearers=bearers,
        requester=requester,
        transactions=transactions,
    )
    if isinstance(built, Outgoing):
        return built
    keyid = signer.sign(built.message, **built.how)
    return outgoing(
        method,
        target,
        built.message.fields,
        built.body,
        framed=framed,
        keyid=keyid,
        via=next_hop_target(config),
    )


async def prepare_request_off_loop(
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
) -> Outgoing:
    """``prepare_request`` whose signature is made off the event loop (keys on a token)."""
    built = _build(
        method,
        target,
        lines,
        body,
        framed=framed,
        config=config,
        bearers=bearers,
        requester=requester,
        transactions=transactions,
    )
    if isinstance(built, Outgoing):
        return built
    keyid = await signer.sign_off_loop(built.message, **built.how)
    return outgoing(
        method,
        target,
        built.message.fields,
        built.body,
        framed=framed,
        keyid=keyid,
        via=next_hop_target(config),
    )


_CURRENT_KEY: dict[str, Any] = {}  # sign with the current key (shared, never changed)


class _ToSign(NamedTuple):
    message: Message
    body: bytes
    how: dict[str, Any]  # Signer.sign's keyword arguments: keyid, present, missing


def _build(
    method: str,
    target: Target,
    lines: Sequence[tuple[str, str]],
    body: bytes,
    *,
    framed: bool,
    config: Config,
    bearers: BearerStore,
    requester: RequesterInjector | None,
    transactions: TransactionKeys | None,
) -> _ToSign | Outgoing:
    """Everything before the signature; an Outgoing for a host sent unsigned by configuration."""
    fields = drop_hop_by_hop(lines)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return outgoing(method, target, fields, body, framed=framed, keyid=None, via=next_hop_target(config))
    agent_auth = fields.get_all("authorization")
    if len(agent_auth) > 1:
        raise ProxyError(400, "duplicate-authorization", "the request has more than one Authorization line")
    fields.remove("authorization", *_AGENT_STRIPPED)
    authorization = agent_auth[0].strip() if agent_auth else ""
    credential = bearers.for_target(target)
    if credential is not None and (credential[0].override or not authorization):
        authorization = f"Bearer {credential[1]}"
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
        return _ToSign(message, body, {"keyid": delegated, "missing": requester.key_refusal})
    if bound is not None:  # a retrieval URL: its transaction's key, presented
        return _ToSign(
            message,
            body,
            {"keyid": bound, "present": True, "missing": partial(TransactionKeys.refusal, bound)},
        )
    return _ToSign(message, body, _CURRENT_KEY)
