"""core.sfv: the fast reading of the common Signature-Input / Signature shapes is http-sf's reading.

Every Dictionary Hypothesis makes (common shapes and every other kind of member), and every
mutation of one, must parse to what http-sf returns or be refused as http-sf refuses it; every
member must re-serialize to http-sf's bytes. The fast path must also be taken for the shapes the
signers emit, or it would be dead weight.
"""

from __future__ import annotations

import base64
from typing import Any

import http_sf
import pytest
from http_sf.innerlist import ser_item_or_inner_list
from http_sf.types import Token
from hypothesis import given, settings
from hypothesis import strategies as st

from signing_proxy.core import sfv

KEYS = st.from_regex(r"[a-z*][a-z0-9_\-.*]{0,6}", fullmatch=True)
PLAIN = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=12)
ANY_STRING = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
INTEGERS = st.integers(min_value=-999_999_999_999_999, max_value=999_999_999_999_999)
TOKENS = st.from_regex(r"[A-Za-z*][A-Za-z0-9:/!#$%&'*+\-.^_`|~]{0,8}", fullmatch=True).map(Token)
COMMON_VALUES = st.one_of(PLAIN, INTEGERS)
OTHER_VALUES = st.one_of(ANY_STRING, TOKENS, st.booleans(), st.binary(max_size=8))


def params(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(KEYS, values, max_size=4)


COMMON_MEMBER = st.one_of(
    st.tuples(st.lists(st.tuples(PLAIN, params(COMMON_VALUES)), max_size=6), params(COMMON_VALUES)),
    st.tuples(st.binary(max_size=80), params(COMMON_VALUES)),
)
ANY_MEMBER = st.one_of(
    COMMON_MEMBER,
    st.tuples(
        st.lists(st.tuples(st.one_of(ANY_STRING, TOKENS, INTEGERS), params(OTHER_VALUES)), max_size=4),
        params(st.one_of(COMMON_VALUES, OTHER_VALUES)),
    ),
    st.tuples(st.one_of(ANY_STRING, TOKENS, INTEGERS, st.booleans()), params(OTHER_VALUES)),
)
SPECIAL = st.sampled_from([",", ";", "=", "(", ")", '"', ":", " ", "\t", "\\", "a", "1", "-", "*", ".", "é"])


def http_sf_verdict(text: str) -> Any:
    """http-sf's own reading of ``text``, or the name of its refusal."""
    try:
        parsed = http_sf.parse(text.encode("ascii"), tltype="dictionary")
    except (ValueError, UnicodeEncodeError) as exc:
        return type(exc).__name__
    assert isinstance(parsed, dict)  # tltype="dictionary": http-sf's parse_dictionary, always a dict
    return dict(parsed)


def our_verdict(text: str) -> Any:
    try:
        return sfv.parse_dictionary(text)
    except (ValueError, UnicodeEncodeError) as exc:
        return type(exc).__name__


def serialized(members: dict[str, Any]) -> str:
    return ", ".join(f"{key}={ser_item_or_inner_list(member)}" for key, member in members.items())


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, COMMON_MEMBER, min_size=1, max_size=4))
def test_common_shapes_take_the_fast_path_and_read_as_http_sf_reads_them(members: dict[str, Any]) -> None:
    text = serialized(members)
    fast = sfv._parse_common_dictionary(text)
    assert fast is not None, text
    assert fast == http_sf_verdict(text) == members


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, ANY_MEMBER, min_size=1, max_size=4))
def test_every_dictionary_reads_as_http_sf_reads_it(members: dict[str, Any]) -> None:
    text = serialized(members)
    assert our_verdict(text) == http_sf_verdict(text)


@settings(max_examples=1500, deadline=None)
@given(
    st.dictionaries(KEYS, COMMON_MEMBER, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(min_value=0, max_value=400), SPECIAL, st.booleans()), max_size=3),
)
def test_mutated_fields_get_http_sfs_verdict(
    members: dict[str, Any], edits: list[tuple[int, str, bool]]
) -> None:
    text = serialized(members)
    for where, char, replace in edits:
        at = where % (len(text) + 1)
        text = text[:at] + char + text[at + (1 if replace else 0) :]
    assert our_verdict(text) == http_sf_verdict(text), text


@settings(max_examples=400, deadline=None)
@given(ANY_MEMBER)
def test_members_serialize_to_http_sfs_bytes(member: Any) -> None:
    assert sfv.serialize_member(member) == str(ser_item_or_inner_list(member))


@pytest.mark.parametrize(
    "text",
    [
        "a=:AAE=:,",  # a trailing comma
        "a=:AAE=:b=:AA==:",  # two members without a comma
        " a=:AA==:",
        "a=:AA==: ",
        'a=("x");created=1234567890123456',  # an Integer of 16 digits
        "a=:AA==:, a=:AA==:",  # a repeated key: http-sf reports it to on_duplicate
        "a=:AA=:",  # padding that does not fit
        "a=:QR==:",  # non-zero bits past the last byte
        'a=("x";key="a";key="b")',
        "",
    ],
)
def test_edge_shapes_are_left_to_http_sf(text: str) -> None:
    assert sfv._parse_common_dictionary(text) is None
    assert our_verdict(text) == http_sf_verdict(text)


def test_a_repeated_label_still_reaches_on_duplicate() -> None:
    seen: list[str] = []
    sfv.parse_dictionary("a=:AA==:, a=:AA==:", lambda key, _where: seen.append(key))
    assert seen == ["a"]


def test_the_signers_fields_take_the_fast_path() -> None:
    signature_input = (
        'agent=("@method" "@target-uri" "content-digest" "authorization" "signature-agent")'
        ';keyid="NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs";alg="ed25519";created=1700000000'
        ';expires=1700000300, broker=("@method" "signature";key="agent");keyid="k";alg="ed25519"'
        ";created=1700000001;expires=1700000301"
    )
    signature = (
        f"agent=:{base64.b64encode(bytes(64)).decode()}:, broker=:{base64.b64encode(b'x' * 64).decode()}:"
    )
    for text in (signature_input, signature):
        fast = sfv._parse_common_dictionary(text)
        assert fast is not None
        assert fast == http_sf_verdict(text)
        for member in fast.values():
            assert sfv._serialize_common_member(member) == str(ser_item_or_inner_list(member))
