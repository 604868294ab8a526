"""Scope matching exactly as the spec's "Scopes" table, plus the choices made where it is silent."""

from __future__ import annotations

import pytest

from signing_proxy.core import scopes
from signing_proxy.core.scopes import (
    Scope,
    format_scope_list,
    narrows,
    parse_scope_list,
    scope_covers,
    scopes_cover,
)

# spec "Scopes" table: (granted, covers) and (granted, does not cover), one pair per cell entry.
TABLE_COVERS = [
    ("dist:*", "dist:US"),
    ("dist:*", "dist:US:CA"),
    ("dist:US:*", "dist:US:CA"),
    ("dist", "dist"),
    ("dist:US:CA", "dist:US:CA"),
    ("*", "dist"),
    ("*", "dist:US:CA"),
    ("*", "subscription:news"),
    ("*", "*"),
]
TABLE_DOES_NOT_COVER = [
    ("dist:US:*", "dist:EU"),
    ("dist", "dist:US"),  # no implicit prefix match
    ("dist:US:CA", "dist:US"),  # a grant narrower than the requirement
]


def test_public_api_is_pinned() -> None:
    assert set(scopes.__all__) == {
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
    }


@pytest.mark.parametrize(("granted", "required"), TABLE_COVERS)
def test_spec_scopes_table_covers(granted: str, required: str) -> None:
    assert scope_covers(granted, required)
    assert Scope.parse(granted).covers(required)


@pytest.mark.parametrize(("granted", "required"), TABLE_DOES_NOT_COVER)
def test_spec_scopes_table_does_not_cover(granted: str, required: str) -> None:
    assert not scope_covers(granted, required)
    assert not Scope.parse(granted).covers(Scope.parse(required))


@pytest.mark.parametrize(("granted", "required"), [(g, r) for g, r in TABLE_COVERS if g != r])
def test_spec_scopes_table_reverse_direction_does_not_cover(granted: str, required: str) -> None:
    # The narrower side never covers the wider one: matching is not symmetric.
    assert not scope_covers(required, granted)


@pytest.mark.parametrize(("granted", "required"), TABLE_DOES_NOT_COVER)
def test_spec_scopes_table_reverse_direction_of_non_cover(granted: str, required: str) -> None:
    expected = {("dist:US:*", "dist:EU"): False, ("dist", "dist:US"): False, ("dist:US:CA", "dist:US"): False}
    assert scope_covers(required, granted) is expected[(granted, required)]


def test_spec_scopes_terminal_wildcard_needs_at_least_one_segment() -> None:
    # Our choice where the table is silent: dist:* grants what is below dist, not dist itself.
    assert not scope_covers("dist:*", "dist")
    assert not scope_covers("dist:US:*", "dist:US")
    assert scope_covers("dist:US:*", "dist:US:CA:SF")


def test_spec_scopes_inner_wildcard_matches_exactly_one_segment() -> None:
    assert scope_covers("dist:*:CA", "dist:US:CA")
    assert not scope_covers("dist:*:CA", "dist:US:NY")
    assert not scope_covers("dist:*:CA", "dist:US:CA:SF")
    assert not scope_covers("dist:*:CA", "dist:CA")


def test_spec_scopes_single_wildcard_covers_everything() -> None:
    for required in ["a", "a:b", "a:b:c:d:e", "revshare:pub.example", "dist:*"]:
        assert scope_covers("*", required)


def test_spec_scopes_wildcard_in_required_scope_is_compared_as_a_set() -> None:
    assert scope_covers("dist:*", "dist:*")
    assert scope_covers("dist:*", "dist:*:CA")
    assert not scope_covers("dist:US", "dist:*")
    assert not scope_covers("dist:US:*", "dist:*")
    assert not scope_covers("dist:*", "*")


@pytest.mark.parametrize("bad", ["", ":", "a:", ":a", "a::b", "di*", "*a", "a b", 'a"b', "a\\b", "a\tb", "é"])
def test_malformed_scopes_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the defect
        scope_covers(bad, "dist")
    with pytest.raises(ValueError):  # noqa: PT011
        scope_covers("dist", bad)


def test_scopes_cover_any_grant() -> None:
    assert scopes_cover(["dist:EU", "dist:US:*"], "dist:US:CA")
    assert not scopes_cover(["dist:EU", "dist:US:*"], "dist:US")
    assert not scopes_cover([], "dist")


def test_rfc6749_3_3_scope_list_parsing() -> None:
    assert parse_scope_list("dist:US subscription:news *") == ("dist:US", "subscription:news", "*")
    assert parse_scope_list("dist") == ("dist",)


@pytest.mark.parametrize("bad", ["", " ", " dist", "dist ", "dist  news", "dist\tnews", "dist a::b"])
def test_rfc6749_3_3_malformed_scope_list_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        parse_scope_list(bad)


def test_format_scope_list_round_trips_and_refuses_empty() -> None:
    assert format_scope_list(["dist:US", "*"]) == "dist:US *"
    assert parse_scope_list(format_scope_list(("a", "b:c"))) == ("a", "b:c")
    with pytest.raises(ValueError, match="at least one"):
        format_scope_list([])
    with pytest.raises(ValueError, match="empty segments"):
        format_scope_list(["a:"])


def test_narrows_returns_child_scopes_the_parent_does_not_cover() -> None:
    assert narrows(["dist:US", "dist:US:CA"], ["dist:*"]) == []
    assert narrows(["dist:US", "news", "dist"], ["dist:*"]) == ["news", "dist"]
    assert narrows(["dist:US"], []) == ["dist:US"]
    assert narrows([], ["dist"]) == []
    assert narrows(["*"], ["dist:*"]) == ["*"]
    assert narrows(["dist:*"], ["*"]) == []


@pytest.mark.parametrize(
    ("raw", "kind", "name"),
    [
        ("subscription:news", "subscription", "news"),
        ("revshare:pub.example", "revshare", "pub.example"),
        ("*", "wildcard", None),
        ("dist:US", "plain", None),
        ("subscription:*", "plain", None),  # a pattern over subscriptions, not one subscription
        ("subscription:news:extra", "plain", None),
        ("revshare", "plain", None),
    ],
)
def test_spec_scopes_subscription_and_revshare_shapes(raw: str, kind: str, name: str | None) -> None:
    scope = Scope.parse(raw)
    assert (scope.kind, scope.name, str(scope)) == (kind, name, raw)
    assert scope.segments == tuple(raw.split(":"))


def test_subscription_pattern_covers_a_subscription() -> None:
    assert Scope.parse("subscription:*").covers(Scope.parse("subscription:news"))
    assert not Scope.parse("subscription:news").covers("subscription:sports")
