"""Signing profiles: the web-bot-auth drafts' vectors through our verifier, the profile's signing
shape, and one refusal per verification rule of each profile (and of mixing them)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import pytest
from http_sf import Token

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.profiles import (
    SVC,
    WEB_BOT_AUTH,
    entry_profile,
    profile_components,
    profile_params,
    signature_agent_field,
)
from signing_proxy.core.signatures import (
    Component,
    Message,
    VerificationKey,
    VerifiedStack,
    attach_signature,
    parse_signature_stack,
    sign_message,
    signature_base,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri
from tests.conftest import load_vector
from tests.oracle import WEB_BOT_AUTH_REQUIRED, oracle_verify

WBA = load_vector("web_bot_auth_drafts_ed25519.json")
VECTOR_NOW = 1735689600 + 10
KEY = SigningKey.from_pem(WBA["key"]["pem_private_pkcs8"].encode())
PUBLIC = PublicKey.from_pem(WBA["key"]["pem_public_spki"].encode())
OTHER = SigningKey.generate()
NOW = 1_800_000_000
NONCE = bytes(range(64))
URL = "https://example.com/foo?param=Value&Pet=dog"


def _lookup(*keys: PublicKey) -> Callable[[object, int], VerificationKey | None]:
    by_id = {k.thumbprint: k for k in keys}

    def lookup(entry: object, _index: int) -> VerificationKey | None:
        public = by_id.get(getattr(entry, "keyid", None) or "")
        return None if public is None else VerificationKey(public, source="test")

    return lookup


def _vector(vid: str) -> dict[str, object]:
    return next(v for v in WBA["vectors"] if v["id"] == vid)


def _vector_message(vector: dict[str, object]) -> Message:
    headers = vector["headers"]
    assert isinstance(headers, dict)
    return Message("POST", parse_absolute_uri(URL), Fields(tuple(headers.items())))


@pytest.mark.parametrize(
    "vid",
    [
        "protocol-02-sigagent-dict",
        "legacy-sigagent-string",
        "arch-05-no-sigagent",
        "cloudflare-v2-no-sigagent",
    ],
)
def test_draft_vectors_verify_under_the_web_bot_auth_profile(vid: str) -> None:
    vector = _vector(vid)
    message = _vector_message(vector)
    stack = verify_stack(message, None, _lookup(PUBLIC), now=VECTOR_NOW, max_validity_s=None)
    assert stack.profile == "web-bot-auth"
    assert stack.agent.signature_base == vector["signature_base"]
    expected_directory = "https://signature-agent.test" if "Signature-Agent" in vector["headers"] else None  # type: ignore[operator]
    assert stack.directory == expected_directory
    shown = {  # what the label covers: the member alone (keyed other than the label, as the WG's vector)
        "protocol-02-sigagent-dict": 'agent2="https://signature-agent.test"',
        "legacy-sigagent-string": '"https://signature-agent.test"',
    }
    assert stack.signature_agent == shown.get(vid, "")


def test_arch05_dictionary_vector_as_printed_is_refused() -> None:
    """The erratum: the printed signature was made over the member value without its quotes."""
    vector = _vector("arch-05-sigagent-dict-BROKEN")
    base = str(vector["signature_base"])
    params_value = base.rsplit('"@signature-params": ', 1)[1]
    headers = dict(vector["headers"])  # type: ignore[call-overload]
    headers["Signature-Input"] = f"sig2={params_value}"
    headers["Signature"] = f"sig2=:{vector['expected_signature_b64']}:"
    message = Message("POST", parse_absolute_uri(URL), Fields(tuple(headers.items())))
    with pytest.raises(VerificationError) as err:
        verify_stack(message, None, _lookup(PUBLIC), now=VECTOR_NOW, max_validity_s=None)
    assert err.value.reason == "bad-signature"
    unquoted = base.replace(': "https://signature-agent.test"', ": https://signature-agent.test")
    assert PUBLIC.verify(base64.b64decode(str(vector["expected_signature_b64"])), unquoted.encode())


# --- signing under a profile ---------------------------------------------------------------------------


def _signed(
    profile_label: str = "agent",
    *,
    agent_url: str = "https://agent.example",
    profile: object = WEB_BOT_AUTH,
    key: SigningKey = KEY,
    created: int = NOW,
    validity: int = 300,
    fields: tuple[tuple[str, str], ...] = (),
) -> Message:
    assert profile is WEB_BOT_AUTH or profile is SVC
    message = Message("GET", parse_absolute_uri(URL), Fields(fields))
    value, agent = signature_agent_field(profile, profile_label, agent_url)
    if value is not None:
        message.fields.add("Signature-Agent", value)
    components = profile_components(profile, previous=None, agent=agent)
    member = sign_message(
        message,
        key,
        created=created,
        expires=created + validity,
        label=profile_label,
        components=components,
        extra_params=profile_params(profile, NONCE),
    )
    attach_signature(message.fields, member)
    return message


def _verify(message: Message, *keys: PublicKey, max_validity_s: int | None = 3600) -> VerifiedStack:
    return verify_stack(
        message, None, _lookup(*(keys or (KEY.public,))), now=NOW + 1, max_validity_s=max_validity_s
    )


def test_web_bot_auth_signature_has_the_drafts_shape() -> None:
    message = _signed()
    assert message.fields.combined("signature-agent") == 'agent="https://agent.example"'
    params = message.fields.combined("signature-input") or ""
    assert params.startswith('agent=("@authority" "signature-agent";key="agent");keyid=')
    nonce = base64.b64encode(NONCE).decode()
    assert params.endswith(f';nonce="{nonce}";tag="web-bot-auth"')
    stack = _verify(message)
    assert stack.profile == "web-bot-auth"
    assert stack.directory == "https://agent.example"


def test_web_bot_auth_without_signature_agent_covers_authority_only() -> None:
    message = _signed(agent_url="")
    assert message.fields.combined("signature-agent") is None
    assert (message.fields.combined("signature-input") or "").startswith('agent=("@authority");')
    assert _verify(message).directory is None


def test_svc_profile_components_are_the_spec_tuple_itself() -> None:
    assert profile_components(SVC, previous=None, agent=None) is SVC.components
    assert profile_params(SVC, None) == ()
    assert signature_agent_field(SVC, "agent", "") == ("", Component("signature-agent"))


def test_outer_web_hop_covers_the_inner_signature_input_and_components() -> None:
    message = _signed()
    inner = (Component("@authority"), Component("signature-agent", key="agent"))
    outer = profile_components(WEB_BOT_AUTH, previous="agent", agent=None, inner=inner)
    assert outer == (
        *inner,
        Component("signature", key="agent"),
        Component("signature-input", key="agent"),
    )
    member = sign_message(
        message,
        OTHER,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=outer,
        extra_params=profile_params(WEB_BOT_AUTH, NONCE),
    )
    attach_signature(message.fields, member)
    assert _verify(message, KEY.public, OTHER.public).hops == 2


def _outer_hop(message: Message, member: str | None, label: str = "broker", key: str | None = None) -> None:
    """Stack a web-bot-auth label by OTHER on the stack, adding ``<key>=<member>`` to Signature-Agent
    (``key``: the label) and covering it as our relay does (no member when ``member`` is None)."""
    entry = parse_signature_stack(message.fields)[-1]
    agent = None
    if member is not None:
        key = key or label
        raw = message.fields.combined("signature-agent")
        added = f'{key}="{member}"'
        message.fields.set("Signature-Agent", added if raw is None else f"{raw}, {added}")
        agent = Component("signature-agent", key=key)
    components = profile_components(WEB_BOT_AUTH, previous=entry.label, agent=agent, inner=entry.components)
    signed = sign_message(
        message,
        OTHER,
        created=NOW,
        expires=NOW + 60,
        label=label,
        components=components,
        extra_params=WEB_PARAMS,
    )
    attach_signature(message.fields, signed)


def test_a_relays_member_on_an_agent_without_signature_agent_is_no_refusal() -> None:
    """arch-05 lets an agent sign without a Signature-Agent (its key pinned where it is verified);
    each signer then provides its own member. Refused before: the agent's label "does not cover the
    Signature-Agent sent", which holds only the relay's member, covered by the relay's label. The
    drafts: a verifier MUST NOT attribute a signature to a member it does not cover, not refuse it."""
    message = _signed(agent_url="")
    _outer_hop(message, "https://broker.example")
    _outer_hop(message, "https://edge.example", "edge")
    assert message.fields.combined("signature-agent") == (
        'broker="https://broker.example", edge="https://edge.example"'
    )
    stack = _verify(message, KEY.public, OTHER.public)
    assert [s.label for s in stack.signatures] == ["agent", "broker", "edge"]
    assert (stack.signature_agent, stack.directory) == ("", None)  # the agent's key: a pinned one


@pytest.mark.parametrize("member", ["https://agent.example", "https://evil.example"])
def test_a_later_labels_member_is_never_the_agents_directory(member: str) -> None:
    """A later signer's member, even keyed by the agent's label, names no directory for the agent."""
    message = _signed(agent_url="")
    _outer_hop(message, member, key="agent")
    assert message.fields.combined("signature-agent") == f'agent="{member}"'
    stack = _verify(message, KEY.public, OTHER.public)
    assert (stack.signature_agent, stack.directory) == ("", None)


@pytest.mark.parametrize(
    "extra",
    [
        ', evil="https://evil.example"',  # appended on the path: covered by no label
        ', agent="https://evil.example"',  # named like the agent's label, covered by none
    ],
)
def test_a_member_no_label_covers_is_still_refused_when_the_agent_covers_none(extra: str) -> None:
    message = _signed(agent_url="")
    _outer_hop(message, "https://broker.example")
    message.fields.set("Signature-Agent", (message.fields.combined("signature-agent") or "") + extra)
    with pytest.raises(VerificationError) as err:
        _verify(message, KEY.public, OTHER.public)
    assert (err.value.reason, err.value.label) == ("signature-agent-not-covered", "agent")


def test_a_signature_agent_no_label_covers_by_its_key_is_refused() -> None:
    """The agent covers none and no later label covers a member by its key: refused as before,
    whether the later label covers none, or the whole field plain (no member of it is its own)."""
    message = _signed(agent_url="")
    _outer_hop(message, None)
    message.fields.set("Signature-Agent", 'broker="https://broker.example"')
    assert _refusal_of_stack(message) == "signature-agent-not-covered"
    message = _signed(agent_url="")
    message.fields.set("Signature-Agent", '"https://broker.example"')
    entry = parse_signature_stack(message.fields)[-1]
    components = (*entry.components, Component("signature-agent"), Component("signature", key="agent"))
    attach_signature(
        message.fields,
        sign_message(
            message,
            OTHER,
            created=NOW,
            expires=NOW + 60,
            label="broker",
            components=(*components, Component("signature-input", key="agent")),
            extra_params=WEB_PARAMS,
        ),
    )
    assert _refusal_of_stack(message) == "signature-agent-not-covered"


def _refusal_of_stack(message: Message) -> str:
    with pytest.raises(VerificationError) as err:
        _verify(message, KEY.public, OTHER.public)
    return err.value.reason


# --- one refusal per rule ------------------------------------------------------------------------------


def _resign(
    message: Message, components: tuple[Component, ...], params: tuple[tuple[str, str | int], ...]
) -> None:
    """Replace the one signature with one over ``components`` and ``params``."""
    message.fields.remove("signature", "signature-input")
    member = sign_message(
        message,
        KEY,
        created=NOW,
        expires=NOW + 300,
        label="agent",
        components=components,
        extra_params=params,
    )
    attach_signature(message.fields, member)


def _refusal(message: Message, *, max_validity_s: int | None = 3600) -> str:
    with pytest.raises(VerificationError) as err:
        _verify(message, max_validity_s=max_validity_s)
    return err.value.reason


WEB_PARAMS = profile_params(WEB_BOT_AUTH, NONCE)
AGENT_MEMBER = Component("signature-agent", key="agent")


def test_web_refuses_a_label_covering_neither_authority_nor_target_uri() -> None:
    message = _signed()
    _resign(message, (Component("@method"), AGENT_MEMBER), WEB_PARAMS)
    assert _refusal(message) == "missing-covered-component"


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (Component("x-dict", key="a"), "unexpected-covered-component"),
        (Component("X-Dict"), "unexpected-covered-component"),
        (Component("signature-agent", key="other"), "duplicate-component"),
    ],
    ids=["another-fields-member", "upper-case-field-name", "a-second-signature-agent-member"],
)
def test_web_refuses_a_component_beyond_the_profile(extra: Component, reason: str) -> None:
    """Any whole field and any query parameter may be covered (tests/core/test_web_components.py);
    not another field's member, a name that is no lower-case field name, a second agent member."""
    message = _signed(fields=(("X-Dict", "a=1"),))
    message.fields.set("Signature-Agent", 'agent="https://agent.example", other="https://b.example"')
    _resign(message, (Component("@authority"), AGENT_MEMBER, extra), WEB_PARAMS)
    assert _refusal(message) == reason


def test_web_refuses_a_signature_agent_it_does_not_cover() -> None:
    message = _signed()
    _resign(message, (Component("@authority"),), WEB_PARAMS)
    assert _refusal(message) == "signature-agent-not-covered"


def test_web_refuses_a_covered_member_that_is_absent() -> None:
    message = _signed()
    message.fields.set("Signature-Agent", 'other="https://agent.example"')
    assert _refusal(message) == "missing-dictionary-member"


def test_web_refuses_a_member_that_is_not_an_http_url() -> None:
    message = _signed()
    message.fields.set("Signature-Agent", 'agent="ftp://agent.example"')
    _resign(message, (Component("@authority"), AGENT_MEMBER), WEB_PARAMS)
    assert _refusal(message) == "malformed-signature-agent"


@pytest.mark.parametrize(
    "field",
    [
        'agent="https://agent.example", evil="https://evil.example"',
        'evil="https://evil.example", agent="https://agent.example"',
    ],
)
def test_the_verdict_holds_only_the_member_the_agent_covers(field: str) -> None:
    """Anyone on the path can add a member; the verdict held the whole field, so the member nobody
    signed read as verified (protocol-02: "A verifier MUST NOT attribute a signature to a member that
    signature does not cover"). It holds the covered member, as the signature base has it."""
    message = _signed()
    message.fields.set("Signature-Agent", field)
    stack = _verify(message)
    assert stack.signature_agent == 'agent="https://agent.example"'
    assert stack.directory == "https://agent.example"
    assert '"signature-agent";key="agent": "https://agent.example"\n' in stack.agent.signature_base


def test_the_verdict_shows_a_covered_member_with_its_parameters_as_signed() -> None:
    message = _signed()
    message.fields.set(
        "Signature-Agent", 'evil="https://evil.example", agent="https://agent.example";type=directory'
    )
    _resign(message, (Component("@authority"), AGENT_MEMBER), WEB_PARAMS)
    stack = _verify(message)
    assert stack.signature_agent == 'agent="https://agent.example";type=directory'
    assert stack.directory == "https://agent.example"


def test_a_member_keyed_other_than_the_label_is_the_one_attributed() -> None:
    """protocol-02 asks the signer to cover the member keyed by its label; the drafts' own vector
    (Appendix E: label sig2, member agent2) and arch-04/05 (the key only RECOMMENDED) do not, so it
    is accepted: the verifier's duty is to attribute the member the signature covers, no other."""
    message = _signed()
    message.fields.set("Signature-Agent", 'agent="https://evil.example", other="https://agent.example"')
    _resign(message, (Component("@authority"), Component("signature-agent", key="other")), WEB_PARAMS)
    stack = _verify(message)
    assert stack.signature_agent == 'other="https://agent.example"'
    assert stack.directory == "https://agent.example"


def test_web_refuses_a_validity_beyond_24_hours() -> None:
    message = _signed(validity=86_401)
    assert _refusal(message, max_validity_s=7 * 86_400) == "validity-too-long"


def test_web_refuses_a_wrong_alg() -> None:
    message = _signed()
    raw = message.fields.combined("signature-input") or ""
    message.fields.set("Signature-Input", raw.replace('alg="ed25519"', 'alg="rsa-pss-sha512"'))
    assert _refusal(message) == "unsupported-algorithm"


def test_web_refuses_a_nonce_that_is_not_a_string() -> None:
    message = _signed()
    _resign(message, (Component("@authority"), AGENT_MEMBER), (("nonce", 7), ("tag", "web-bot-auth")))
    assert _refusal(message) == "malformed-signature-input"


def test_unknown_tag_is_refused() -> None:
    message = _signed()
    _resign(message, (Component("@authority"), AGENT_MEMBER), (("tag", "something-else"),))
    assert _refusal(message) == "unsupported-tag"


def _sign_as_written(message: Message, components: tuple[Component, ...], params: str) -> None:
    """Replace the one signature with one whose parameters are ``params`` as written (a Token where
    our signer writes a String), signed over the base a verifier rebuilds from them."""
    message.fields.remove("signature", "signature-input")
    params_value = "(" + " ".join(c.serialized for c in components) + ")" + params
    signature = KEY.sign(signature_base(message, components, params_value))
    message.fields.add("Signature-Input", f"agent={params_value}")
    message.fields.add("Signature", f"agent=:{base64.b64encode(signature).decode()}:")


def test_a_token_tag_names_no_profile() -> None:
    """RFC 9421 2.3: "tag: ... as a String value"; the drafts: tag MUST be web-bot-auth. http-sf's
    Token compares equal to its text, so the Token web-bot-auth named the web profile and its
    signature verified (Cloudflare's verifier refuses it: "tag must be 'web-bot-auth'")."""
    message = _signed()
    params = f';keyid="{KEY.thumbprint}";alg="ed25519";created={NOW};expires={NOW + 300};tag='
    _sign_as_written(message, (Component("@authority"), AGENT_MEMBER), params + "web-bot-auth")
    with pytest.raises(VerificationError) as err:
        _verify(message)
    assert (err.value.reason, err.value.label) == ("unsupported-tag", "agent")
    assert "must be a String" in err.value.detail
    _sign_as_written(message, (Component("@authority"), AGENT_MEMBER), params + '"web-bot-auth"')
    assert _verify(message).profile == "web-bot-auth"  # the same signature with the String
    with pytest.raises(VerificationError) as token:
        entry_profile(Token("web-bot-auth"), "relayed")  # what a relay asks of the stack it receives
    assert token.value.reason == "unsupported-tag"
    assert entry_profile("web-bot-auth", "relayed") is WEB_BOT_AUTH
    assert entry_profile(None, "relayed") is SVC


def test_outer_web_hop_must_cover_the_inner_signature_input() -> None:
    message = _signed()
    half = (Component("@authority"), AGENT_MEMBER, Component("signature", key="agent"))
    member = sign_message(
        message,
        OTHER,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=half,
        extra_params=WEB_PARAMS,
    )
    attach_signature(message.fields, member)
    with pytest.raises(VerificationError) as err:
        _verify(message, KEY.public, OTHER.public)
    assert err.value.reason == "predecessor-not-covered"


def test_a_stack_mixing_profiles_is_refused() -> None:
    message = _signed()
    member = sign_message(
        message,
        OTHER,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=(Component("@authority"), Component("signature", key="agent")),
    )
    attach_signature(message.fields, member)
    with pytest.raises(VerificationError) as err:
        _verify(message, KEY.public, OTHER.public)
    assert err.value.reason == "profile-mix"


def test_svc_rules_still_refuse_a_web_shaped_label_without_tag() -> None:
    """Without the tag a label is held to the spec's five components (a mix within one label)."""
    message = _signed()
    _resign(message, (Component("@authority"), AGENT_MEMBER), (("nonce", base64.b64encode(NONCE).decode()),))
    assert _refusal(message) == "missing-covered-component"


def test_a_web_tag_on_the_spec_five_is_a_web_bot_auth_label() -> None:
    """The five cover @target-uri, and fields the web profile lets a signer add: the tag decides."""
    message = _signed(
        profile=SVC,
        agent_url="https://agent.example",
        fields=(
            ("Authorization", ""),
            ("Content-Digest", "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"),
        ),
    )
    _resign(message, SVC.components, (("tag", "web-bot-auth"),))
    stack = _verify(message)
    assert stack.profile == "web-bot-auth"
    assert stack.signature_agent == '"https://agent.example"'  # the drafts' legacy String form


def test_signature_base_of_a_web_label_matches_the_drafts_serialization() -> None:
    message = _vector_message(_vector("protocol-02-sigagent-dict"))
    components = (Component("@authority"), Component("signature-agent", key="agent2"))
    vector_base = str(_vector("protocol-02-sigagent-dict")["signature_base"])
    params_value = vector_base.rsplit('"@signature-params": ', 1)[1]
    assert signature_base(message, components, params_value).decode() == vector_base


# --- the independent verifier (http-message-signatures, PyPI) accepts both profiles -------------------


@pytest.mark.parametrize("agent_url", ["https://agent.example", ""])
def test_http_message_signatures_accepts_web_bot_auth_signatures(agent_url: str) -> None:
    message = _signed(agent_url=agent_url, created=int(time.time()))
    accepted = oracle_verify(
        "GET",
        URL,
        list(message.fields),
        b"",
        {KEY.thumbprint: KEY.public.key},
        require_components=WEB_BOT_AUTH_REQUIRED,
    )
    assert accepted == ["agent"]


def test_http_message_signatures_accepts_svc_signatures() -> None:
    digest = "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
    message = _signed(
        profile=SVC, created=int(time.time()), fields=(("Authorization", ""), ("Content-Digest", digest))
    )
    assert oracle_verify("GET", URL, list(message.fields), b"", {KEY.thumbprint: KEY.public.key}) == ["agent"]


def test_web_refuses_a_covered_signature_agent_that_is_absent() -> None:
    message = _signed()
    message.fields.remove("signature-agent")
    assert _refusal(message) == "missing-covered-header"


def test_web_refuses_a_component_covered_twice() -> None:
    message = _signed(agent_url="")
    raw = message.fields.combined("signature-input") or ""
    message.fields.set("Signature-Input", raw.replace('("@authority")', '("@authority" "@authority")'))
    assert _refusal(message) == "duplicate-component"


def test_web_refuses_a_legacy_signature_agent_that_is_not_a_string() -> None:
    message = _signed(agent_url="")
    message.fields.add("Signature-Agent", "https://agent.example")  # a bare URL: not an sf-String
    _resign(message, (Component("@authority"), Component("signature-agent")), WEB_PARAMS)
    assert _refusal(message) == "malformed-signature-agent"


def test_an_exchange_call_signed_under_web_bot_auth_is_refused_before_any_key() -> None:
    # a web-bot-auth label covers the authority only: signed as a GET, the same headers would
    # otherwise pass as a POST to an exchange method with a body nobody signed (spec "Request
    # signature": an exchange call covers exactly the five components)
    signed_get = _signed()
    call = Message(
        "POST",
        parse_absolute_uri("https://example.com/v1/svc.v1.ExchangeService/DiscoverResources"),
        signed_get.fields,
    )
    with pytest.raises(VerificationError) as err:
        verify_stack(call, b'{"ver":"1.0"}', lambda *_: pytest.fail("no key is looked up"), now=NOW + 1)
    assert err.value.reason == "exchange-call-profile"
    assert _verify(signed_get).profile == "web-bot-auth"  # the same label elsewhere: the profile's rules


def test_strangers_members_do_not_evict_the_signers_cached_url() -> None:
    """The signer asks about its configured Signature-Agent URL per web-bot-auth request (cached);
    the verifier asked the same cached function about every stranger's member, so twenty strangers
    evicted the signer's URL and each of its requests parsed it again."""
    from signing_proxy.core import profiles

    configured = "https://agent.example"
    profiles._configured_refusal.cache_clear()
    signature_agent_field(WEB_BOT_AUTH, "sig1", configured)
    for n in range(20):
        member = f"https://stranger{n}.example"
        fields = Fields([("Signature-Agent", f'sig1="{member}"')])
        covered = [("sig1", [Component("signature-agent", key="sig1")])]
        assert profiles.web_signature_agent(fields, covered) == (f'sig1="{member}"', member)
    before = profiles._configured_refusal.cache_info()
    signature_agent_field(WEB_BOT_AUTH, "sig1", configured)
    after = profiles._configured_refusal.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
