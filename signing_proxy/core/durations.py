"""Durations an operator types: ``30m``, ``48h``, ``90d``, ``3600s`` -> whole seconds.

One parser for every human duration the command line reads (``keys rotate --grace``, ``--lifetime``,
``--activate-in``, ``delegate --expires``, ``--issuer-grace``). The spec's proto-JSON ``Duration``
(``svc_quota_period``, ``"86400s"``) has its own rules: ``core.requester.parse_duration_s``.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_DURATION_S", "parse_duration"]

MAX_DURATION_S: Final = 100 * 365 * 86_400  # our choice: windows stay far inside RFC 3339's range
_DURATION: Final = re.compile(r"([0-9]{1,9})([smhd])")  # 9 digits: 999999999d, refused by the cap
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> int:
    """``30m``, ``48h``, ``90d``, ``3600s`` -> seconds, from 0 (``0s``) to ``MAX_DURATION_S``.

    One number and one unit, surrounding whitespace ignored; anything else raises ValueError.
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30m, 48h, 90d or 3600s")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than 100 years")
    return seconds
