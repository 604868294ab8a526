"""What our web-bot-auth verifier reads of a Signature-Agent Dictionary: at most ``MAX_AGENT_MEMBERS``
members, refused before any parse, and only an https origin (empty path or ``/``, spec-notes 6.2) as
a key directory; an http member or one with a path is ignored (protocol-02 5.5), its label verified
by a pinned key only (``tests/verify/test_signature_agent_http_member.py``). The signer side holds
its configured member to the same rule (``member_refusal``)."""

from __future__ import annotations

import pytest

from signing_proxy.core import profiles
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.profiles import member_refusal, web_signature_agent
from signing_proxy.core.signatures import Component

AGENT_MEMBER = Component("signature-agent", key="agent")
FIRST = ("agent", (Component("@authority"), AGENT_MEMBER))


def _members(count: int, first: str = 'agent="https://agent.example"') -> str:
    return ", ".join([first, *(f"m{i}=1" for i in range(1, count))])


def test_a_dictionary_of_the_bound_is_read() -> None:
    fields = Fields((("Signature-Agent", _members(profiles.MAX_AGENT_MEMBERS)),))
    assert web_signature_agent(fields, [FIRST]) == ('agent="https://agent.example"', "https://agent.example")


@pytest.mark.parametrize("count", [65, 5_000])  # MAX_AGENT_MEMBERS + 1, and the review's head
def test_a_dictionary_past_the_bound_is_refused_before_it_is_parsed(count: int) -> None:
    """5,000 members (59 KB, under the head limit) were parsed by every reader of the request, and a
    relay searched its label among them all: ~0.3 s of the event loop per request."""
    fields = Fields((("Signature-Agent", _members(count)),))
    with pytest.raises(VerificationError) as refused:
        web_signature_agent(fields, [FIRST])
    assert (refused.value.reason, refused.value.label) == ("too-many-agent-members", "agent")


def test_members_only_later_labels_cover_are_bounded_too() -> None:
    """An agent that covers none (its key pinned) behind relays that each cover their own member."""
    later = ("relay", (Component("@authority"), Component("signature-agent", key="m1")))
    fine = Fields((("Signature-Agent", "m1=1"),))
    assert web_signature_agent(fine, [("agent", (Component("@authority"),)), later]) == ("", None)
    fields = Fields((("Signature-Agent", _members(65, "m0=1")),))  # MAX_AGENT_MEMBERS + 1
    with pytest.raises(VerificationError) as refused:
        web_signature_agent(fields, [("agent", (Component("@authority"),)), later])
    assert refused.value.reason == "too-many-agent-members"


@pytest.mark.parametrize(
    "member",
    [
        "http://agent.example",  # protocol-02: values MUST be https URIs
        "http://agent.example/",
        "https://agent.example//",  # a path, which directory_base would strip to the origin
        "https://agent.example/agents/a",
    ],
)
def test_a_member_that_is_no_https_origin_names_no_directory(member: str) -> None:
    fields = Fields((("Signature-Agent", f'agent="{member}"'),))
    assert web_signature_agent(fields, [FIRST]) == (f'agent="{member}"', None)


@pytest.mark.parametrize("member", ["https://agent.example", "https://agent.example/"])
def test_an_https_origin_names_its_directory(member: str) -> None:
    fields = Fields((("Signature-Agent", f'agent="{member}"'),))
    assert web_signature_agent(fields, [FIRST])[1] == "https://agent.example"


@pytest.mark.parametrize("url", ["https://agent.example//", "https://agent.example/agents/alice"])
def test_a_signer_refuses_a_configured_member_with_a_path(url: str) -> None:
    """``https://agent.example//`` passed (its directory base is the origin) and went out verbatim."""
    assert member_refusal(url) is not None


@pytest.mark.parametrize("url", ["https://agent.example", "https://agent.example/", ""])
def test_a_signer_sends_an_origin(url: str) -> None:
    assert member_refusal(url) is None
