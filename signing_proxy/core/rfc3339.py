"""RFC 3339 date-times to and from unix seconds (the spec's key windows and revocation snapshots).

Sans-IO: nothing here reads a clock. Re-exported by ``keys``, where callers find them.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone

from .errors import KeyFormatError

__all__ = ["format_rfc3339", "parse_rfc3339"]

# RFC 3339 section 5.6 date-time; ASCII digits only, `T`/`Z` in either case, any fraction length.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_MAX_TIMESTAMP_CHARS = 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# what format_rfc3339 writes: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z. A value read beyond it
# (9999-12-31T23:59:60Z, or an offset past either end) could never be written back: refused on read
_FIRST_S = -62_135_596_800
_LAST_S = 253_402_300_799


def format_rfc3339(ts: float) -> str:
    """UTC RFC 3339 with ``Z`` and whole seconds (a fraction is floored), e.g. ``2026-11-21T09:00:00Z``."""
    try:
        moment = datetime.fromtimestamp(math.floor(ts), tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise KeyFormatError("malformed-timestamp", f"{ts!r} is outside the RFC 3339 range") from exc
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}Z"
    )


def parse_rfc3339(value: object, *, round_up: bool = False, bounded: bool = True) -> int:
    """RFC 3339 date-time to unix seconds; a fraction is floored, or ceiled with ``round_up``.

    ``Z`` and numeric offsets are accepted (``-00:00`` as UTC); a leap second ``:60`` counts as the
    following second (unix time has none). Naive, space-separated or otherwise malformed values raise,
    and so does a moment ``format_rfc3339`` could not write back (before 0001-01-01T00:00:00Z or after
    9999-12-31T23:59:59Z once its offset, leap second or fraction is applied), unless not ``bounded``
    (a caller that says so in its own words).
    """
    if not isinstance(value, str) or len(value) > _MAX_TIMESTAMP_CHARS:
        raise KeyFormatError("malformed-timestamp", "an RFC 3339 timestamp is a short string")
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise KeyFormatError("malformed-timestamp", f"{value!r} is not an RFC 3339 date-time with offset")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction, zulu, sign, off_h, off_m = match.group(7, 8, 9, 10, 11)
    leap = second == 60
    try:
        if zulu is not None:
            tz = UTC
        else:
            if int(off_h) > 23 or int(off_m) > 59:
                raise ValueError("offset out of range")
            offset = timedelta(hours=int(off_h), minutes=int(off_m))
            tz = timezone(-offset if sign == "-" else offset)
        moment = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=tz)
        seconds = (moment - _EPOCH) // timedelta(seconds=1) + (1 if leap else 0)
    except (ValueError, OverflowError) as exc:
        raise KeyFormatError("malformed-timestamp", f"{value!r} is not a valid date-time") from exc
    if round_up and fraction is not None and fraction.strip(".0"):
        seconds += 1
    if bounded and not _FIRST_S <= seconds <= _LAST_S:
        raise KeyFormatError(
            "malformed-timestamp", f"{value!r} is outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z"
        )
    return seconds
