"""Our keys over time (spec "Key publication, rotation and revocation" 1): published -> signing ->
retiring -> expired, at the exact second of each boundary, with ``now`` injected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from signing_proxy.core.rotation import (
    ROTATION_MARGIN_S,
    KeyRecord,
    activation_delay,
    choose_signing_key,
    key_state,
    next_change,
    publishable,
)

T = 1_800_000_000
# A rotation at T + 100 with `--activate-in 300s --grace 50s`: the new key is published (valid) from
# T + 100, signs from T + 400; the old key ends at T + 450 (activation + grace).
OLD = KeyRecord("old", T, T + 450, created_at=T)
NEW = KeyRecord("new", T + 100, T + 1400, created_at=T + 100, activates_at=T + 400)
BOTH = [OLD, NEW]


def states(now: float) -> tuple[str, str]:
    return key_state(OLD, BOTH, now), key_state(NEW, BOTH, now)


@pytest.mark.parametrize(
    ("now", "old", "new", "signer"),
    [
        (T + 100, "signing", "published", OLD),  # published and valid at once: both in the directory
        (T + 399.999, "signing", "published", OLD),  # the old key signs up to the activation
        (T + 400, "retiring", "signing", NEW),  # activation is inclusive
        (T + 449.999, "retiring", "signing", NEW),  # the old key stays published for the grace
        (T + 450, "expired", "signing", NEW),  # not_after is exclusive
        (T + 1400, "expired", "expired", None),
    ],
)
def test_the_rotation_timeline_at_each_boundary(
    now: float, old: str, new: str, signer: KeyRecord | None
) -> None:
    assert states(now) == (old, new)
    assert choose_signing_key(BOTH, now) == signer


def test_the_new_key_is_published_before_it_signs_and_the_old_one_after_it_stopped() -> None:
    assert publishable(BOTH, T + 100) == (OLD, NEW)
    assert publishable(BOTH, T + 449) == (OLD, NEW)
    assert publishable(BOTH, T + 450) == (NEW,)
    assert NEW.valid_at(T + 100)  # verifiers accept it as soon as they hold it


def test_next_change_names_the_next_state_and_its_second() -> None:
    assert next_change(NEW, BOTH, T + 100) == (T + 400, "signing")
    assert next_change(OLD, BOTH, T + 100) == (T + 400, "retiring")
    assert next_change(OLD, BOTH, T + 400) == (T + 450, "expired")
    assert next_change(NEW, BOTH, T + 400) == (T + 1400, "expired")
    assert next_change(OLD, BOTH, T + 450) is None
    revoked = replace(NEW, revoked=True)
    assert next_change(revoked, [OLD, revoked], T + 100) is None


def test_activation_is_never_before_the_window_opens() -> None:
    assert KeyRecord("k", T, T + 10, T).activation == T
    assert KeyRecord("k", T + 5, T + 10, T, activates_at=T).activation == T + 5
    assert KeyRecord("k", T, T + 10, T, activates_at=T + 3).activation == T + 3


def test_the_newest_activated_key_signs() -> None:
    a = KeyRecord("a", T, T + 1000, created_at=T + 50)  # created later, activated earlier
    b = KeyRecord("b", T, T + 1000, created_at=T, activates_at=T + 10)
    assert choose_signing_key([a, b], T + 9) == a
    assert choose_signing_key([a, b], T + 10) == b


def test_with_no_activated_key_the_published_one_signs_early_rather_than_none() -> None:
    """The old key revoked (or expired) during a pending rotation: the new key is valid and published."""
    old_revoked = replace(OLD, revoked=True)
    assert choose_signing_key([old_revoked, NEW], T + 200) == NEW
    assert key_state(NEW, [old_revoked, NEW], T + 200) == "signing"
    assert next_change(NEW, [old_revoked, NEW], T + 200) == (T + 1400, "expired")
    future = KeyRecord("future", T + 300, T + 900, created_at=T)  # window not open: not even early
    assert choose_signing_key([old_revoked, future], T + 200) is None
    assert key_state(future, [old_revoked, future], T + 200) == "published"


def test_the_default_activation_waits_for_every_cached_directory() -> None:
    assert activation_delay([OLD], T + 100, 60) == 60 + ROTATION_MARGIN_S
    assert ROTATION_MARGIN_S <= 30  # issue 17: "a small margin (at most 30 s)"
    # never later than the window of the key signing now: no gap, no early switch
    assert activation_delay([OLD], T + 100.5, 3600) == OLD.not_after - (T + 101)
    assert activation_delay([OLD], T + 500, 60) == 0  # no key signs now: nothing to wait for
    assert activation_delay([replace(OLD, revoked=True), NEW], T + 200, 60) == 0  # signing early
    with pytest.raises(ValueError, match="max-age"):
        activation_delay([OLD], T, -1)
