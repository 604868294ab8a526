"""Reading a stranger's JSON to show it again inside ours (core.json_bounds)."""

from __future__ import annotations

import json

import pytest

from signing_proxy.core.json_bounds import loads_bounded


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
