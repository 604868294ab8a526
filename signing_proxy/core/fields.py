"""Header fields as ordered field lines, not a dict.

Order, repeated lines and "absent" versus "present but empty" all matter to RFC 9421 and to the
spec: a covered field that is absent is refused, one that is present and empty is the value ``""``,
and repeated lines are joined with ``", "`` (RFC 9421 section 2.1) so a second line changes the
covered value. Names keep their wire spelling; lookups are case-insensitive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["Fields"]


class Fields:
    """An ordered list of (name, value) field lines with case-insensitive lookup."""

    __slots__ = ("_lines",)

    def __init__(self, lines: Iterable[tuple[str, str]] = ()) -> None:
        self._lines: list[tuple[str, str]] = list(lines)

    def __repr__(self) -> str:
        return f"Fields({[name for name, _ in self._lines]!r})"  # names only: values may be secret

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._lines)

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        lname = name.lower()
        return any(n.lower() == lname for n, _ in self._lines)

    def copy(self) -> Fields:
        return Fields(self._lines)

    def get_all(self, name: str) -> list[str]:
        """Every line's value, in order (raw, untrimmed)."""
        lname = name.lower()
        return [v for n, v in self._lines if n.lower() == lname]

    def count(self, name: str) -> int:
        lname = name.lower()
        return sum(1 for n, _ in self._lines if n.lower() == lname)

    def combined(self, name: str) -> str | None:
        """RFC 9421 section 2.1 value: each line trimmed, obs-fold -> SP, lines joined by ", ".

        ``None`` means absent; ``""`` means present and empty. Never confuse the two.
        """
        lname = name.lower()
        values = [v for n, v in self._lines if n.lower() == lname]
        if not values:
            return None
        if len(values) == 1:
            return _canonical_line(values[0])
        return ", ".join(_canonical_line(v) for v in values)

    def add(self, name: str, value: str) -> None:
        self._lines.append((name, value))

    def remove(self, *names: str) -> int:
        """Drop every line of these names; return how many were dropped."""
        lnames = {n.lower() for n in names}
        before = len(self._lines)
        self._lines = [(n, v) for n, v in self._lines if n.lower() not in lnames]
        return before - len(self._lines)

    def set(self, name: str, value: str) -> None:
        """Replace every line of this name by one line at the end."""
        self.remove(name)
        self._lines.append((name, value))


def _canonical_line(value: str) -> str:
    if "\r" in value or "\n" in value:  # obs-fold: CRLF followed by whitespace becomes one SP
        value = " ".join(part.strip(" \t") for part in value.replace("\r\n", "\n").split("\n"))
    return value.strip(" \t")
