"""Reading a stranger's JSON to show it again inside ours, and the files an operator hands us
(core.json_bounds)."""

from __future__ import annotations

import json

import pytest

from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.json_bounds import loads_bounded, loads_strict
from signing_proxy.core.jwk import load_private_key


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1e999}',  # infinity: json.dumps writes Infinity, which is not JSON
        '{"a": -1e999}',
        '{"a": NaN}',
        '{"a": Infinity}',
        "[" * 65 + "]" * 65,  # past the bound
        "[" * 5000 + "]" * 5000,  # past the interpreter's recursion limit
        "not json",
        b"\xff",
    ],
)
def test_what_cannot_be_written_back_is_refused(text: str | bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the one error a caller handles
        loads_bounded(text, max_depth=64)


@pytest.mark.parametrize("depth", [0, 1, 2, 63, 64])
def test_nesting_up_to_the_bound_is_read_and_written_back(depth: int) -> None:
    """``depth`` objects, each inside the one before: the bound counts arrays and objects."""
    text = '{"k": ' * depth + "1.5" + "}" * depth
    value = loads_bounded(text, max_depth=64)
    assert value == json.loads(text)
    json.dumps({"outer": [value]}, allow_nan=False)  # room left to show it inside ours: no error


def test_width_is_not_depth() -> None:
    wide = {"a": [[1]] * 1000, "b": {"c": [2, [3]]}}  # four levels: object, object, array, array
    assert loads_bounded(json.dumps(wide), max_depth=4) == wide
    with pytest.raises(ValueError):  # noqa: PT011 - the one error a caller handles
        loads_bounded(json.dumps(wide), max_depth=3)


# --- loads_strict: the files an operator hands us ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x": "a", "x": "b"}', "member 'x' appears twice"),  # never "last wins"
        ('{"keys": [{"d": 1, "d": 2}]}', "member 'd' appears twice"),
        ("[" * 5000 + "]" * 5000, "nested too deep"),  # past the interpreter's recursion limit
        ('{"a":' * 3000 + "1" + "}" * 3000, "nested too deep"),
        ("[" * 33 + "]" * 33, "nested deeper than 32 levels"),  # past our bound
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": 1e999}', "out of range"),
        ('{"a": "\\ud800"}', "unpaired surrogate"),
        (b'{"a": "\xff"}', "not UTF-8"),
        ('{"a": 1', "not JSON"),
        ("", "not JSON"),
    ],
)
def test_loads_strict_refuses_every_fault_with_one_value_error(text: str | bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loads_strict(text)


def test_loads_strict_reads_strict_json_up_to_its_bound() -> None:
    doc = {"keys": [{"kty": "OKP", "x": "abc", "nbf": 1.5, "n": None, "ok": True}]}
    assert loads_strict(json.dumps(doc).encode()) == doc
    assert loads_strict("[" * 32 + "]" * 32) is not None
    assert loads_strict("[[1]]", max_depth=2) == [[1]]


@pytest.mark.parametrize(
    "data", [b'{"kty":"OKP","crv":"Ed25519","d":"a","d":"b"}', b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"]
)
def test_a_private_jwk_given_a_member_twice_or_nested_too_deep_is_malformed(data: bytes) -> None:
    with pytest.raises(KeyFormatError) as refused:
        load_private_key(data)
    assert refused.value.reason == "malformed-jwk"
    assert refused.value.detail.startswith("not valid JSON: ")
