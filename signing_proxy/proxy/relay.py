"""Relay mode: a broker hop that verifies the stack it receives, caps the hops and adds its label.

Spec "Multi-hop forwarding": each broker adds its own label covering the five components plus
``"signature";key="<previous label>"``, and ``Signature-Agent`` stays the agent's, forwarded
unchanged. A relay never rewrites a covered component — ``Authorization``, ``Content-Digest``,
``Signature-Agent`` and the earlier members of ``Signature``/``Signature-Input`` leave byte-for-byte
as they arrived — and never adds its label to a stack that failed verification or that would
exceed the hop cap (counted as signatures, ours included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence

from ..config import Config, VerifyConfig
from ..core.errors import FieldError, VerificationError
from ..core.fields import Fields
from ..core.profiles import (
    SVC,
    SigningProfile,
    agent_members,
    entry_profile,
    profile_components,
    signature_agent_field,
)
from ..core.signatures import MAX_HOPS, Message, SignatureEntry, hop_components, parse_signature_stack
from ..core.uri import Target
from ..errors import ProxyError
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from ..net.framing import Outgoing, drop_hop_by_hop, outgoing, regenerated
from ..verify.build import build_verifier, load_pinned_keys
from ..verify.revocation import RevocationPoller
from ..verify.verifier import RequestVerifier, VerifierPolicy, refusal_answer
from .pipeline import Signer, next_hop_target
from .profiles import ProfileSelector, fresh_params
from .signer import SignOptions

__all__ = ["RelayPipeline", "unique_label"]

# the verifier's policy keys: a reload applies them at once (the other ``verify`` keys are built into
# its caches and fetch budget, and ``egress`` into its fetchers, by ``build_verifier``)
_LIVE_VERIFY = ("max_validity_s", "skew_s", "web_bot_auth")


def unique_label(wanted: str, taken: Collection[str]) -> str:
    """``wanted``, or ``wanted2``, ``wanted3``… — labels must be unique in the dictionaries (RFC 9421 4.3).
    ``taken``: a set, as the search looks each candidate up in it."""
    if wanted not in taken:
        return wanted
    n = 2
    while f"{wanted}{n}" in taken:
        n += 1
    return f"{wanted}{n}"


def _agent_members(fields: Fields) -> set[str]:
    """The keys of a Signature-Agent Dictionary (none when it is absent or not a Dictionary);
    ProxyError ``too-many-agent-members`` (as a verifier answers it) for one that may hold more than
    ``MAX_AGENT_MEMBERS``, before any parse: a stranger's thousands once held the event loop."""
    raw = fields.combined("signature-agent")
    if raw is None:
        return set()
    try:
        return set(agent_members(raw))  # the verifier's parse of the same value, when it verified
    except FieldError as exc:
        if exc.reason != "too-many-agent-members":  # a String (the legacy form) or malformed: none
            return set()
        refused = VerificationError(exc.reason, exc.detail)
    status, headers = refusal_answer(refused)
    raise ProxyError(status, refused.reason, f"a relay does not forward this: {refused.detail}", headers)


class RelayPipeline:
    """Verify, cap, stack our label, serialize. One per proxy in relay mode."""

    # what a reload keeps and names as needing a restart, beyond the sections that always do (relay,
    # upstream): a verifier rebuilt would drop its cached directories and revocation lists, and one
    # still verifying a request in flight would have to be closed under it
    RESTART_ONLY = (
        "egress",
        *(f"verify.{f.name}" for f in dataclasses.fields(VerifyConfig) if f.name not in _LIVE_VERIFY),
    )

    def __init__(
        self,
        config: Config,
        signer: Signer,
        *,
        profiles: ProfileSelector | None = None,
    ) -> None:
        self.config = config
        self.profiles = profiles if profiles is not None else ProfileSelector(config.profiles)
        # the live parts, replaced together by a configuration reload (SIGHUP): ``reload``
        self.signer = signer
        self.label = config.signing.label
        relay = config.relay
        self.policy = _live_policy(
            VerifierPolicy(
                broker_directories=relay.broker_directories,
                pinned_agent_keys=load_pinned_keys(relay.pinned_agent_keys, "relay.pinned_agent_keys"),
                pinned_broker_keys=load_pinned_keys(relay.pinned_broker_keys, "relay.pinned_broker_keys"),
            ),
            config,
        )
        self._client: HttpClient | None = None
        self.verifier: RequestVerifier | None = None
        self.poller: RevocationPoller | None = None

    def reload(self, config: Config, signer: Signer) -> None:
        """Apply a reloaded configuration whose restart-only parts (``RESTART_ONLY``, ``relay``,
        ``upstream``) are the running ones: the verifier's policy, our label, signer and
        ``signing.signature_agent``. A request in flight keeps the ones it started with."""
        self.config, self.signer, self.label = config, signer, config.signing.label
        self.policy = _live_policy(self.policy, config)
        if self.verifier is not None:  # each verification reads the policy once, as it starts
            self.verifier.policy = self.policy
            self.verifier.resolver.skew_s = self.policy.skew_s  # a directory proof's, like a signature's

    def _get_verifier(self) -> RequestVerifier:
        if self.verifier is None:  # created lazily: relays that never verify open no pool
            # not via upstream.next_hop: the next relay forwards only signed requests
            self._client = HttpClient.standalone(self.config.upstream, self.config.timeouts)
            egress = self.config.egress
            self.verifier = build_verifier(
                self.policy,
                client=self._client,
                egress=EgressPolicy.from_config(egress),
                limits=self.config.verify,
                fetch_timeout_s=egress.fetch_timeout_s,
            )
            self.poller = self.verifier.revocations
        return self.verifier

    async def prepare(
        self, method: str, target: Target, lines: Sequence[tuple[str, str]], body: bytes, *, framed: bool
    ) -> Outgoing:
        config, signer, label = self.config, self.signer, self.label  # a reload swaps them meanwhile
        fields = drop_hop_by_hop(lines)
        try:
            entries = parse_signature_stack(fields)
        except VerificationError as exc:
            if exc.reason == "too-many-hops":  # past MAX_HOPS: refused as any stack too long for us
                raise ProxyError(403, exc.reason, exc.detail) from None
            status, headers = refusal_answer(exc)  # a 401 names the scheme it wants
            raise ProxyError(
                status, exc.reason, f"a relay only forwards signed requests: {exc.detail}", headers
            ) from None
        cap = config.relay.max_hops
        if len(entries) + 1 > (MAX_HOPS if cap is None else cap):  # ours too: the next verifier counts it
            named = (
                f"relay.max_hops={cap}" if cap is not None else f"the cap of {MAX_HOPS} (no relay.max_hops)"
            )
            raise ProxyError(
                403, "too-many-hops", f"{len(entries)} signatures plus ours would exceed {named}"
            )
        profile = self.profiles.select(target.host, target.scheme, target.port)  # before any await: a
        # reload reconfigures the selector, and a request keeps what it started with
        _check_profiles(entries, profile)
        received: Fields | None = None  # the fields as they came (made once, when needed)
        if config.relay.verify:  # over the fields as they came: a label may cover Host or Content-Length
            try:
                received = Fields(lines)
                await self._get_verifier().verify(method, target.wire_uri, received, body, entries=entries)
            except VerificationError as exc:
                if signer.metrics is not None:
                    signer.metrics.verification_failure(exc.reason)
                where = f" (label {exc.label!r})" if exc.label else ""
                status, headers = refusal_answer(exc)
                raise ProxyError(
                    status, exc.reason, f"incoming signature refused{where}: {exc.detail}", headers
                ) from None
        labels = [e.label for e in entries]
        # a web-bot-auth hop keys its Signature-Agent member by its label too: unique among those as
        # well (an agent may add members it does not cover); a spec hop adds none, so parses none
        taken = set(labels) if profile is SVC else {*labels, *_agent_members(fields)}
        label = unique_label(label, taken)
        message = Message(method, target, fields)
        carried: list[tuple[str, str]] = []
        if profile is SVC:  # our label covers the previous one's signature: all theirs must arrive
            _check_forwarded(entries, received or lines, fields)
            how: SignOptions = {"label": label, "components": hop_components(labels[-1])}
        else:
            written = regenerated(method, target, len(body), framed)
            carried = _as_regenerated(entries[-1], received or Fields(lines), fields, written)
            for name, value in carried:  # what the wire will carry, for our base (written by the head)
                fields.add(name, value)
            how = _profiled(message, entries[-1], label, profile, config.signing.signature_agent)
        if signer.keys.blocking:  # a key on a token: signed off the event loop
            keyid = await signer.sign_off_loop(message, **how)
        else:
            keyid = signer.sign(message, **how)
        if carried:
            fields.remove(*(name for name, _ in carried))
        return outgoing(
            method,
            target,
            fields,
            body,
            framed=framed,
            keyid=keyid,
            via=next_hop_target(config),
            profile=profile.name,
        )

    async def close(self) -> None:
        if self.verifier is not None:
            await self.verifier.close()  # pollers and fetches in flight
        if self._client is not None:
            await self._client.close()


def _check_profiles(entries: Sequence[SignatureEntry], profile: SigningProfile) -> None:
    """Refuse, before any key is fetched or anything signed, a stack whose labels are not all under
    the destination's ``profile``: a mix (401 from a verifier) gets no label of ours whether or not
    the relay verifies (``profile-mix``, 403 as README has it); an unknown tag is the verifier's 401."""
    for entry in entries:
        try:
            incoming = entry_profile(entry.param("tag"), entry.label)
        except VerificationError as exc:
            status, headers = refusal_answer(exc)
            raise ProxyError(
                status, exc.reason, f"incoming signature refused: {exc.detail}", headers
            ) from None
        if incoming.name != profile.name:  # a stack of one profile, or none: never a mix
            raise ProxyError(
                403,
                "profile-mix",
                f"label {entry.label!r} is signed under {incoming.name}; this destination is signed "
                f"under {profile.name}",
            )


def _check_forwarded(
    entries: Sequence[SignatureEntry], received: Iterable[tuple[str, str]], forwarded: Fields
) -> None:
    """Refuse (400 ``covered-field-not-forwarded``) a field a label of ``entries`` covers that the
    relay does not forward (hop-by-hop, ``Expect``, one ``Connection`` names): the next verifier could
    never check it. ``Host`` and ``Content-Length`` are written anew, never dropped."""
    kept = {n.lower() for n, _ in forwarded} | {"host", "content-length"}
    dropped = {n.lower() for n, _ in received} - kept
    if not dropped:
        return
    for entry in entries:
        lost = sorted({c.name for c in entry.components if not c.is_derived} & dropped)
        if lost:
            raise ProxyError(
                400,
                "covered-field-not-forwarded",
                f"label {entry.label!r} covers {lost[0]!r}, which a relay does not forward",
            )


def _as_regenerated(
    previous: SignatureEntry,
    received: Fields,
    forwarded: Fields,
    written: list[tuple[str, str]],
) -> list[tuple[str, str]]:
    """The ``Host`` and ``Content-Length`` a label before ours covers, as our head will write them
    (our label covers what it covered, over what the next hop receives); any other covered field we
    do not forward (hop-by-hop, ``Expect``, one ``Connection`` names) is refused: the next verifier
    could never check it."""
    # a member's field too: a Signature-Agent one ``Connection`` names is lost with its members
    names = {c.name for c in previous.components if not c.is_derived}
    _check_forwarded((previous,), received, forwarded)
    carried = [(name, value) for name, value in written if name.lower() in names]
    for name, value in carried:  # as sent, or the label before ours could never verify downstream
        if received.combined(name) != value:
            raise ProxyError(
                400,
                "covered-field-not-forwarded",
                f"label {previous.label!r} covers {name.lower()!r}, which a relay writes as {value!r}",
            )
    return carried


def _profiled(
    message: Message,
    previous: SignatureEntry,
    label: str,
    profile: SigningProfile,
    url: str | None,
) -> SignOptions:
    """An outer web-bot-auth hop: our own Signature-Agent member (dictionary form, when the stack
    uses it or has none; ``url``: ``signing.signature_agent``), the previous label's components,
    ``signature`` and ``signature-input``; returns how to sign it (``Signer.sign``'s keyword arguments)."""
    fields = message.fields
    agent = None
    raw = fields.combined("signature-agent")
    if url and profile.signature_agent == "dictionary":
        keyed = raw is None or any(c.name == "signature-agent" and c.key for c in previous.components)
        if keyed:
            member, agent = signature_agent_field(profile, label, url)
            assert member is not None
            fields.set("Signature-Agent", member if raw is None else f"{raw}, {member}")
    components = profile_components(profile, previous=previous.label, agent=agent, inner=previous.components)
    params = fresh_params(profile)
    return {
        "label": label,
        "components": components,
        "extra_params": params,
        "max_validity_s": profile.max_validity_s,
    }


def _live_policy(policy: VerifierPolicy, config: Config) -> VerifierPolicy:
    """``policy`` with ``config``'s values of the keys that follow a reload (``_LIVE_VERIFY``)."""
    verify = config.verify
    return dataclasses.replace(
        policy,
        # two keys name the tolerance (relay.skew_s, verify.skew_s): the stricter one applies
        skew_s=min(config.relay.skew_s, verify.skew_s),
        max_validity_s=verify.max_validity_s,
        web_bot_auth=verify.accepts_web_bot_auth(gateway=False),
    )
