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

    __slots__ = ("_lines", "_lower")

    def __init__(self, lines: Iterable[tuple[str, str]] = ()) -> None:
        self._lines: list[tuple[str, str]] = list(lines)
        self._lower: list[str] = [name.lower() for name, _ in self._lines]  # parallel: C-speed lookups

    def __repr__(self) -> str:
        return f"Fields({[name for name, _ in self._lines]!r})"  # names only: values may be secret

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._lines)

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._lower

    def copy(self) -> Fields:
        return Fields(self._lines)

    def get_all(self, name: str) -> list[str]:
        """Every line's value, in order (raw, untrimmed)."""
        lname = name.lower()
        return [line[1] for line, ln in zip(self._lines, self._lower, strict=True) if ln == lname]

    def count(self, name: str) -> int:
        return self._lower.count(name.lower())

    def combined(self, name: str) -> str | None:
        """RFC 9421 section 2.1 value: each line trimmed, obs-fold -> SP, lines joined by ", ".

        ``None`` means absent; ``""`` means present and empty. Never confuse the two.
        """
        lname = name.lower()
        lower = self._lower
        if lname not in lower:
            return None
        if lower.count(lname) == 1:
            return _canonical_line(self._lines[lower.index(lname)][1])
        return ", ".join(_canonical_line(v) for v in self.get_all(name))

    def add(self, name: str, value: str) -> None:
        self._lines.append((name, value))
        self._lower.append(name.lower())

    def remove(self, *names: str) -> int:
        """Drop every line of these names; return how many were dropped."""
        lnames = {n.lower() for n in names}
        if lnames.isdisjoint(self._lower):
            return 0
        keep = [i for i, ln in enumerate(self._lower) if ln not in lnames]
        dropped = len(self._lines) - len(keep)
        self._lines = [self._lines[i] for i in keep]
        self._lower = [self._lower[i] for i in keep]
        return dropped

    def set(self, name: str, value: str) -> None:
        """Replace every line of this name by one line at the end."""
        self.remove(name)
        self.add(name, value)


def _canonical_line(value: str) -> str:
    if "\r" in value or "\n" in value:  # obs-fold: CRLF followed by whitespace becomes one SP
        value = " ".join(part.strip(" \t") for part in value.replace("\r\n", "\n").split("\n"))
    return value.strip(" \t")
