"""From the request the agent sent to the exact bytes that go upstream, signed last.

Order matters (lessons from peers: sign after every other change): drop hop-by-hop fields and
anything the agent sent that our signature would vouch for (``Signature*``, ``Signature-Agent``,
``Content-Digest``), settle ``Authorization``, set ``Content-Digest`` and ``Signature-Agent``, then
sign ``@target-uri`` = the URI whose origin-form and ``Host`` go on the wire, and serialize once.
Nothing here awaits; the caller owns sockets and clocks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.schema import Config, CredentialRule, host_matches
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.fields import Fields
from ..core.jwk import SigningKey
from ..core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    attach_signature,
    serialize_sf_string,
    sign_message,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .requester import RequesterInjector

__all__ = [
    "HOP_BY_HOP",
    "BearerStore",
    "KeyProvider",
    "Outgoing",
    "Signer",
    "StaticKeyProvider",
    "drop_hop_by_hop",
    "next_hop_target",
    "outgoing",
    "prepare_request",
]

# RFC 9110 section 7.6.1 plus the proxy-only fields; never covered, never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
    }
)
# Regenerated for every request: framing, Host (RFC 9112 section 3.2.2), Expect (we answer 100 ourselves).
_REGENERATED = frozenset({"host", "content-length", "expect"})
# What the agent may not forge: our signature and what it vouches for.
_AGENT_STRIPPED = frozenset({"signature", "signature-input", "signature-agent", "content-digest"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class KeyProvider:
    """Where the signing key comes from; ``current`` returns None when no key may sign now."""

    def current(self, now: float) -> SigningKey | None:
        raise NotImplementedError

    def not_after(self, now: float) -> float | None:
        """When the key that signs now stops being valid (None: no window, or no key)."""
        return None


class StaticKeyProvider(KeyProvider):
    """One key, always valid (the key store with windows and rotation replaces it when configured)."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key

    def current(self, now: float) -> SigningKey | None:
        return self.key


class BearerStore:
    """Bearer credentials per host pattern, read once from files or the environment (never logged)."""

    def __init__(self, rules: Sequence[CredentialRule], environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if environ is None else environ
        self._rules: list[tuple[CredentialRule, str]] = []
        for i, rule in enumerate(rules):
            if rule.bearer_file is not None:
                try:
                    token = open(os.path.expanduser(rule.bearer_file)).read().strip()  # noqa: SIM115
                except OSError as exc:
                    raise ProxyError(
                        500, "credential-unreadable", f"credentials[{i}].bearer_file: {exc.strerror}"
                    ) from None
            else:
                token = env.get(rule.bearer_env or "", "").strip()
                if not token:
                    raise ProxyError(
                        500,
                        "credential-missing",
                        f"credentials[{i}].bearer_env: {rule.bearer_env} is not set",
                    )
            if not token.isascii() or any(c in token for c in "\r\n"):
                raise ProxyError(
                    500, "credential-malformed", f"credentials[{i}]: bearer token must be one ASCII line"
                )
            self._rules.append((rule, token))

    def for_host(self, host: str) -> tuple[CredentialRule, str] | None:
        for rule, token in self._rules:
            if any(host_matches(p, host) for p in rule.hosts):
                return rule, token
        return None


class Signer:
    """Signs messages with the current key; the window is ``[now, now + validity_s)``."""

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
        self, message: Message, *, label: str | None = None, components: Sequence[Component] = SPEC_COMPONENTS
    ) -> str:
        """Sign and attach; return the keyid. Raises ProxyError (503/400) instead of ever skipping."""
        now = self.clock()
        key = self.keys.current(now)
        if key is None:
            if self.metrics is not None:
                self.metrics.signing_failure("no-valid-signing-key")
            raise ProxyError(
                503, "no-valid-signing-key", "no signing key is valid now; see `signing-proxy keys list`"
            )
        created = int(now)
        try:
            member = sign_message(
                message,
                key,
                created=created,
                expires=created + self.validity_s,
                label=label or self.label,
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


@dataclass(slots=True)
class Outgoing:
    """A request ready for the wire: head bytes, body, and what we did to it."""

    target: Target
    method: str
    head: bytes
    body: bytes
    keyid: str | None  # None when forwarded unsigned by a host rule
    connect_to: Target  # where the bytes go: the target's origin, or the next-hop relay


def drop_hop_by_hop(lines: Sequence[tuple[str, str]]) -> Fields:
    named: set[str] = set()
    for name, value in lines:
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    drop = HOP_BY_HOP | _REGENERATED | named
    return Fields((n, v) for n, v in lines if n.lower() not in drop)


def serialize_head(
    method: str, target: Target, fields: Fields, body_len: int, framed: bool, *, absolute_form: bool = False
) -> bytes:
    """Request line, Host, the fields in order, Content-Length when there is (or may be) a body.

    ``absolute_form`` is for a next-hop relay (RFC 9112 section 3.2.2), which then sees the full URI.
    """
    request_target = target.uri if absolute_form else target.path_query
    parts = [f"{method} {request_target} HTTP/1.1\r\nHost: {target.authority}\r\n"]
    parts.extend(f"{name}: {value}\r\n" for name, value in fields)
    if body_len or framed or method in _BODY_METHODS:
        parts.append(f"Content-Length: {body_len}\r\n")
    parts.append("\r\n")
    try:
        return "".join(parts).encode("latin-1")
    except UnicodeEncodeError:
        raise ProxyError(400, "malformed-header", "a header value cannot be sent as HTTP/1.1 bytes") from None


def next_hop_target(config: Config) -> Target | None:
    """The configured next-hop relay as a connect target, or None."""
    if config.upstream.next_hop is None:
        return None
    return parse_absolute_uri(config.upstream.next_hop.rstrip("/") + "/")


def outgoing(
    method: str,
    target: Target,
    fields: Fields,
    body: bytes,
    *,
    framed: bool,
    keyid: str | None,
    via: Target | None,
) -> Outgoing:
    """Serialize for the wire: origin-form to the target's origin, absolute-form to a next-hop relay."""
    head = serialize_head(method, target, fields, len(body), framed, absolute_form=via is not None)
    return Outgoing(target, method, head, body, keyid, via or target)


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
) -> Outgoing:
    """Apply the signing pipeline (agent mode) and serialize the request for ``target``."""
    fields = drop_hop_by_hop(lines)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return outgoing(method, target, fields, body, framed=framed, keyid=None, via=next_hop_target(config))
    agent_auth = fields.get_all("authorization")
    if len(agent_auth) > 1:
        raise ProxyError(400, "duplicate-authorization", "the request has more than one Authorization line")
    fields.remove("authorization", *_AGENT_STRIPPED)
    authorization = agent_auth[0].strip() if agent_auth else ""
    credential = bearers.for_host(target.host)
    if credential is not None and (credential[0].override or not authorization):
        authorization = f"Bearer {credential[1]}"
    if requester is not None:  # before the digest: digest and signature cover the final body
        body = requester.apply(method, target, fields, body)
    fields.add("Content-Digest", content_digest(body))
    fields.add("Authorization", authorization)
    agent = config.signing.signature_agent
    try:
        fields.add("Signature-Agent", serialize_sf_string(agent) if agent else "")
    except (SigningError, FieldError) as exc:  # config validation makes this unreachable in practice
        raise ProxyError(500, exc.reason, "signing.signature_agent cannot be serialized") from None
    keyid = signer.sign(Message(method, target, fields))
    return outgoing(method, target, fields, body, framed=framed, keyid=keyid, via=next_hop_target(config))
