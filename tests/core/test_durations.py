"""``core.durations.parse_duration``: the operator's durations, at their exact boundaries."""

from __future__ import annotations

import pytest

from signing_proxy.core.durations import MAX_DURATION_S, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600s", 3600),
        ("30m", 1800),
        ("48h", 172_800),
        ("90d", 7_776_000),
        ("0s", 0),  # the lower bound: zero is a duration (``--activate-in 0s``)
        (" 48h\n", 172_800),  # surrounding whitespace is ignored
        ("048h", 172_800),
        ("999999999s", 999_999_999),  # nine digits, the most the number may have
        ("36500d", MAX_DURATION_S),  # the upper bound itself: 100 years of 365 days
    ],
)
def test_a_duration_is_read_as_whole_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_the_upper_bound_is_100_years() -> None:
    assert MAX_DURATION_S == 100 * 365 * 86_400
    assert parse_duration("52560000m") == MAX_DURATION_S  # the bound in minutes
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_duration("36501d")  # one day past the bound
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_duration("52560001m")  # one minute past it


@pytest.mark.parametrize(
    "text",
    ["", "48", "h", "1.5h", "-1h", "+1h", "1w", "48H", "48 h", "1h30m", "1234567890s", "99999999999d"],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration such as 30m, 48h, 90d or 3600s"):
        parse_duration(text)
