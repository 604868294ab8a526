"""Scope strings and the spec's segment-wise matching rule (spec "Scopes").

A scope is a colon-separated list of segments (``dist:US:CA``). A granted scope covers a required
one when, segment by segment, each granted segment equals the required one or is ``*``; a terminal
``*`` matches all remaining segments, and there is no implicit prefix match. The same rule serves
two callers: an exchange asking "does this grant cover what the resource requires", and the
delegation chain asking "does the parent's grant cover everything the child claims" (narrowing).
Where the table is silent we decide: a terminal ``*`` matches one or more segments, so ``dist:*``
covers ``dist:US`` but not ``dist`` itself (a wildcard stands for a segment that must be there);
the lone ``*`` still covers every scope because every scope has at least one segment. A ``*`` in a
required scope is compared literally, which makes ``covers`` mean set inclusion when both sides
are patterns: ``dist:*`` covers ``dist:*``, but ``dist:US`` does not cover ``dist:*``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "LIST_SEPARATOR",
    "SEGMENT_SEPARATOR",
    "WILDCARD",
    "Scope",
    "format_scope_list",
    "narrows",
    "parse_scope_list",
    "scope_covers",
    "scope_segments",
    "scopes_cover",
]

SEGMENT_SEPARATOR = ":"  # spec "Scopes": multi-segment scopes are colon-separated
WILDCARD = "*"  # spec "Scopes": single * means unrestricted; a * segment matches any segment
LIST_SEPARATOR = " "  # spec "Delegation token claims": scope is space-delimited (RFC 6749 section 3.3)
SUBSCRIPTION_KIND = "subscription"  # spec "Scopes": subscription:<name>
REVSHARE_KIND = "revshare"  # spec "Scopes": revshare:<publisher>

# RFC 6749 section 3.3 scope-token characters (%x21 / %x23-5B / %x5D-7E), minus the separator.
_SEGMENT_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\:')


def scope_segments(scope: str) -> tuple[str, ...]:
    """Split a scope into segments; ValueError if it is empty or malformed."""
    if not isinstance(scope, str) or not scope:
        raise ValueError("a scope is a non-empty string")
    segments = tuple(scope.split(SEGMENT_SEPARATOR))
    for segment in segments:
        if not segment:
            raise ValueError("a scope has no empty segments")
        if not _SEGMENT_CHARS.issuperset(segment):
            raise ValueError("a scope segment uses only printable ASCII other than space, quote, backslash")
        # "di*" would look like a prefix glob, which the spec does not define.
        if WILDCARD in segment and segment != WILDCARD:
            raise ValueError("a wildcard is a whole segment")
    return segments


def _covers(granted: tuple[str, ...], required: tuple[str, ...]) -> bool:
    if granted[-1] == WILDCARD:
        head = granted[:-1]
        # Terminal * stands for one or more segments: R must reach past the wildcard's position.
        if len(required) < len(granted):
            return False
    else:
        head = granted
        if len(required) != len(granted):
            return False
    return all(g in (WILDCARD, r) for g, r in zip(head, required, strict=False))


def scope_covers(granted: str, required: str) -> bool:
    """True if the granted scope covers the required one (spec "Scopes"); ValueError if malformed."""
    return _covers(scope_segments(granted), scope_segments(required))


def scopes_cover(granted: Iterable[str], required: str) -> bool:
    """True if any granted scope covers ``required``."""
    needed = scope_segments(required)
    return any(_covers(scope_segments(g), needed) for g in granted)


def narrows(child: Iterable[str], parent: Iterable[str]) -> list[str]:
    """The child scopes not covered by any parent scope; an empty list means the child narrows."""
    parents = [scope_segments(p) for p in parent]
    return [c for c in child if not any(_covers(p, scope_segments(c)) for p in parents)]


def parse_scope_list(space_delimited: str) -> tuple[str, ...]:
    """Parse a space-delimited scope claim; ValueError on an empty list or a malformed entry."""
    if not isinstance(space_delimited, str) or not space_delimited:
        raise ValueError("a scope list holds at least one scope")
    # RFC 6749 section 3.3: scope-token *( SP scope-token ); no leading, trailing or double spaces.
    scopes = tuple(space_delimited.split(LIST_SEPARATOR))
    for scope in scopes:
        scope_segments(scope)
    return scopes


def format_scope_list(scopes: Iterable[str]) -> str:
    """Join scopes into the space-delimited claim form; ValueError if empty or malformed."""
    items = list(scopes)
    for scope in items:
        scope_segments(scope)
    if not items:
        raise ValueError("a scope list holds at least one scope")
    return LIST_SEPARATOR.join(items)


@dataclass(frozen=True)
class Scope:
    """A parsed scope: its segments and its kind (subscription, revshare, wildcard or plain)."""

    raw: str
    segments: tuple[str, ...]
    kind: str
    name: str | None = None

    @classmethod
    def parse(cls, scope: str) -> Scope:
        """Parse one scope; ``subscription:<name>`` and ``revshare:<publisher>`` are recognised."""
        segments = scope_segments(scope)
        if segments == (WILDCARD,):
            return cls(scope, segments, "wildcard")
        # A concrete two-segment shape only: subscription:* is a pattern over subscriptions.
        if (
            len(segments) == 2
            and segments[0] in (SUBSCRIPTION_KIND, REVSHARE_KIND)
            and segments[1] != WILDCARD
        ):
            return cls(scope, segments, segments[0], segments[1])
        return cls(scope, segments, "plain")

    def covers(self, required: Scope | str) -> bool:
        """True if this scope, as a grant, covers ``required``."""
        other = required.segments if isinstance(required, Scope) else scope_segments(required)
        return _covers(self.segments, other)

    def __str__(self) -> str:
        return self.raw
