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
from typing import TYPE_CHECKING

from ..config import Config, CredentialRule, host_matches
from ..core.digest import content_digest
from ..core.errors import FieldError, SigningError
from ..core.keys import KeyProvider
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
from ..net.framing import Outgoing, drop_hop_by_hop, outgoing

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .requester import RequesterInjector

__all__ = ["BearerStore", "Signer", "next_hop_target", "prepare_request"]

# What the agent may not forge: our signature and what it vouches for.
_AGENT_STRIPPED = frozenset({"signature", "signature-input", "signature-agent", "content-digest"})


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
