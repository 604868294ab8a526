"""What a web-bot-auth label may cover beyond ``@authority`` and its Signature-Agent member: any whole
HTTP field (Cloudflare's signers take any list; their own default covers ``content-type``) and named
query parameters (``@query-param``, one of protocol-02's narrowing components). Signed here by a third
party (pyauth, ``tests/oracle.py``), verified by ours: what each covers must then be what arrived."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from signing_proxy.core import signature_components
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signature_components import signing_params_value
from signing_proxy.core.signature_verify import check_stack
from signing_proxy.core.signatures import (
    Component,
    Message,
    SignedMember,
    VerificationKey,
    VerifiedStack,
    attach_signature,
    component_value,
    sign_message,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri, parse_received_uri
from tests.oracle import oracle_sign, oracle_verify

KEY = SigningKey.generate()
NOW = 1_800_000_000
URL = "https://example.com/search?q=red+shoes&page=2&lang=fr%20FR"
AGENT = ("Signature-Agent", 'agent="https://agent.example"')
HEAD = (("User-Agent", "ExampleBot/1.0"), ("Accept", "text/html"), ("Accept", "*/*"), AGENT)
COVERED = (
    "@authority",
    '"signature-agent";key="agent"',
    "user-agent",
    "accept",
    '"@query-param";name="q"',
    '"@query-param";name="lang"',
    "@method",
)


def _lookup(entry: object, _index: int) -> VerificationKey | None:
    return (
        VerificationKey(KEY.public, source="test")
        if getattr(entry, "keyid", None) == KEY.thumbprint
        else None
    )


def _signed(
    url: str = URL, head: tuple[tuple[str, str], ...] = HEAD, covered: tuple[str, ...] = COVERED
) -> list[tuple[str, str]]:
    return oracle_sign(
        "GET",
        url,
        head,
        b"",
        keyid=KEY.thumbprint,
        private_key=KEY._private,
        now=NOW,
        components=covered,
        tag="web-bot-auth",
    )


def _verify(lines: list[tuple[str, str]], url: str = URL) -> VerifiedStack:
    message = Message("GET", parse_absolute_uri(url), Fields(lines))
    return verify_stack(message, None, _lookup, now=NOW + 1, max_validity_s=3600)


def _refusal(lines: list[tuple[str, str]], url: str = URL) -> str:
    with pytest.raises(VerificationError) as err:
        _verify(lines, url)
    return err.value.reason


def test_a_third_partys_label_over_fields_and_query_params_verifies() -> None:
    lines = _signed()
    stack = _verify(lines)
    assert stack.profile == "web-bot-auth"
    assert stack.signature_agent == 'agent="https://agent.example"'
    assert '"@query-param";name="lang"' in dict(lines)["Signature-Input"]
    # and pyauth checks its own signature the same way: the two agree on every base line
    public = {KEY.thumbprint: KEY.public.key}
    assert oracle_verify("GET", URL, lines, b"", public, check_time=False, require_components=()) == ["agent"]


def _replaced(lines: list[tuple[str, str]], name: str, value: str) -> list[tuple[str, str]]:
    return [(n, value if n.lower() == name else v) for n, v in lines]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda lines: (_replaced(lines, "user-agent", "OtherBot/2.0"), URL), "bad-signature"),
        (lambda lines: ([*lines, ("Accept", "application/json")], URL), "bad-signature"),
        (lambda lines: ([(n, v) for n, v in lines if n != "User-Agent"], URL), "missing-covered-header"),
        (lambda lines: (lines, URL.replace("red+shoes", "blue+shoes")), "bad-signature"),
        (lambda lines: (lines, URL.replace("lang=fr%20FR", "lang=fr+FR")), None),  # the same decoded value
        (lambda lines: (lines, URL.replace("page=2", "page=3")), None),  # not covered
        (lambda lines: (lines, URL.replace("&lang=fr%20FR", "")), "missing-query-param"),
        (lambda lines: (lines, f"{URL}&q=green"), "ambiguous-query-param"),
    ],
    ids=[
        "covered-field-changed",
        "covered-field-gained-a-line",
        "covered-field-removed",
        "covered-query-param-changed",
        "query-param-spelled-otherwise",
        "uncovered-query-param-changed",
        "covered-query-param-removed",
        "covered-query-param-repeated",
    ],
)
def test_what_a_label_covers_beyond_the_profile_is_checked(
    change: Callable[[list[tuple[str, str]]], tuple[list[tuple[str, str]], str]], reason: str | None
) -> None:
    lines, url = change(_signed())
    if reason is None:
        assert _verify(lines, url).profile == "web-bot-auth"
    else:
        assert _refusal(lines, url) == reason


@pytest.mark.parametrize(
    "covered",
    [
        ("@authority", '"signature-agent";key="agent"', '"user-agent";sf'),
        ("@authority", '"signature-agent";key="agent"', '"@query-param";name="q";key="q"'),
    ],
    ids=["field-with-sf", "query-param-with-key"],
)
def test_component_parameters_we_do_not_support_are_refused(covered: tuple[str, ...]) -> None:
    """``sf`` (and ``bs``, ``tr``, ``req``) change how a value is built; ``key`` belongs to fields."""
    lines = [
        (n, v) for n, v in _signed(covered=COVERED[:2]) if n.lower() not in {"signature", "signature-input"}
    ]
    inner = " ".join(c if c.startswith('"') else f'"{c}"' for c in covered)
    lines += [
        ("Signature-Input", f'agent=({inner});created={NOW};keyid="{KEY.thumbprint}";tag="web-bot-auth"'),
        ("Signature", "agent=:AAAA:"),
    ]
    assert _refusal(lines) == "unsupported-component-parameter"


@pytest.mark.parametrize(
    "identifier", ['"@query-param"', '"user-agent";name="q"', '"@query-param";name=q'], ids=str
)
def test_a_query_param_needs_a_string_name_and_only_it_takes_one(identifier: str) -> None:
    lines = [
        (n, v) for n, v in _signed(covered=COVERED[:2]) if n.lower() not in {"signature", "signature-input"}
    ]
    lines += [
        (
            "Signature-Input",
            f'agent=("@authority" "signature-agent";key="agent" {identifier});created={NOW};'
            f'keyid="{KEY.thumbprint}";tag="web-bot-auth"',
        ),
        ("Signature", "agent=:AAAA:"),
    ]
    assert _refusal(lines) == "unsupported-component-parameter"


def test_the_spec_profile_still_covers_exactly_its_five() -> None:
    """No tag: the spec's profile, whose covered set is exact; a query parameter more is refused."""
    lines = [
        (n, v) for n, v in _signed(covered=COVERED[:2]) if n.lower() not in {"signature", "signature-input"}
    ]
    lines.append(("Authorization", ""))  # pyauth adds the Content-Digest
    signed = oracle_sign(
        "GET",
        URL,
        lines,
        b"",
        keyid=KEY.thumbprint,
        private_key=KEY._private,
        now=NOW,
        components=(
            "@method",
            "@target-uri",
            "content-digest",
            "authorization",
            "signature-agent",
            '"@query-param";name="q"',
        ),
    )
    assert _refusal(signed) == "unexpected-covered-component"


def test_a_label_covering_too_many_components_is_refused_before_any_value_is_read() -> None:
    """Thousands of "@query-param" components over a query of thousands of pairs held the loop for
    15 s before any key was looked up; now a label covers at most 64 of its own."""
    names = [f"p{i}" for i in range(65)]
    url = "https://example.com/search?" + "&".join(f"{n}=1" for n in names)
    covered = ("@authority", '"signature-agent";key="agent"', *(f'"@query-param";name="{n}"' for n in names))
    lines = _signed(url, covered=covered[:63])  # and pyauth's content-digest: 64, verified
    assert _verify(lines, url).profile == "web-bot-auth"
    assert _refusal(_signed(url, covered=covered), url) == "too-many-components"


def test_the_query_is_parsed_once_for_all_its_params() -> None:
    """Each "@query-param" value is a lookup in the query parsed once (per query string)."""
    query = "?" + "&".join(f"k{i}=v{i}" for i in range(3000))
    message = Message("GET", parse_absolute_uri(f"https://example.com/{query}"), Fields())
    calls = 0
    real = signature_components._form_encoded

    def counted(raw: str) -> str:
        nonlocal calls
        calls += 1
        return real(raw)

    signature_components._query_values.cache_clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(signature_components, "_form_encoded", counted)
        for i in range(0, 3000, 10):
            assert component_value(message, Component("@query-param", query_name=f"k{i}")) == f"v{i}"
    assert calls == 2 * 3000  # each name and value encoded once, not once per component


def _raw_stack(labels: list[list[str]]) -> list[tuple[str, str]]:
    """A web-bot-auth stack as a stranger writes it: labels l0, l1, ... over these identifiers."""
    inputs = ", ".join(
        f'l{i}=({" ".join(covered)});created={NOW};expires={NOW + 60};keyid="{KEY.thumbprint}";'
        'tag="web-bot-auth"'
        for i, covered in enumerate(labels)
    )
    signatures = ", ".join(f"l{i}=:AAAA:" for i in range(len(labels)))
    return [("Signature-Input", inputs), ("Signature", signatures)]


def _deep_stack(first: int, own: int) -> list[list[str]]:
    """MAX_HOPS labels: the first over ``first`` fields, each later one over all of the one before,
    its two members and ``own`` fields of its own."""
    labels = [['"@authority"', *(f'"f0-{j}"' for j in range(first))]]
    for i in range(1, 16):
        chained = [f'"signature";key="l{i - 1}"', f'"signature-input";key="l{i - 1}"']
        labels.append([*labels[-1], *chained, *(f'"f{i}-{j}"' for j in range(own))])
    return labels


def test_a_stack_covering_more_than_1024_components_is_refused_before_they_are_read() -> None:
    stack = _deep_stack(first=40, own=1)  # 16 x 40 + 15 x 16 x 3 / 2 + 16 = 1,016: within the cap
    assert sum(map(len, stack)) <= 1024
    assert _refusal(_raw_stack(stack)) != "too-many-components"
    stack = _deep_stack(first=40, own=2)  # 1,136
    assert _refusal(_raw_stack(stack)) == "too-many-components"


def test_checking_a_deep_stack_costs_about_one_comparison_per_component(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each later label must cover all of the one before: checked by membership in a list, a stack
    of a thousand components cost millions of comparisons before any key was fetched (0.6 s)."""
    stack = _deep_stack(first=40, own=1)
    compared = 0
    real = Component.__eq__

    def counted(self: Component, other: object) -> bool:
        nonlocal compared
        compared += 1
        return real(self, other)

    monkeypatch.setattr(Component, "__eq__", counted)
    assert _refusal(_raw_stack(stack)) == "missing-covered-header"  # the web rules all passed
    assert compared < 3 * sum(map(len, stack))


def test_a_later_label_keying_a_signature_agent_that_is_a_string_is_refused_by_reason() -> None:
    """The first label covers the drafts' String form plainly; a stranger's later label covers a
    member of it as if it were a Dictionary: the parse error escaped the verifier as a FieldError
    (logged as an unexpected failure, with a traceback, and refused verification-failed)."""
    fields = Fields([("Signature-Agent", '"https://agent.example"')])
    message = Message("GET", parse_received_uri("https://svc.example/p"), fields)
    first = [Component("@authority"), Component("signature-agent")]
    web = [("tag", "web-bot-auth")]
    attach_signature(
        fields,
        sign_message(
            message, KEY, created=NOW, expires=NOW + 60, label="agent", components=first, extra_params=web
        ),
    )
    later = [
        *first,
        Component("signature", key="agent"),
        Component("signature-input", key="agent"),
        Component("signature-agent", key="relay"),
    ]
    params = signing_params_value(later, KEY.thumbprint, NOW, NOW + 60, web)
    attach_signature(fields, SignedMember("relay", params, bytes(64), b""))  # a stranger need not sign
    with pytest.raises(VerificationError) as refused:
        check_stack(message, None, now=NOW)
    assert refused.value.reason == "malformed-signature-agent"
    assert refused.value.label == "relay"
