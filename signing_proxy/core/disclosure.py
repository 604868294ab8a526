"""An exchange's disclosure policy for resources the requester's scopes do not cover (spec
"DiscoverResources"): ``hide`` omits them silently, ``reveal`` returns the group with
``absence_reason`` ``OFFER_ABSENCE_REASON_SCOPE_INSUFFICIENT``. Sans-IO.

``covers(granted, required)`` is the spec's scope check: ``granted`` None means the exchange's
default access policy applies (``default_scopes``), as for a requester declaring no scopes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from .scopes import scopes_cover

__all__ = ["SCOPE_INSUFFICIENT", "DisclosurePolicy", "apply_disclosure", "covers"]

SCOPE_INSUFFICIENT = (
    "OFFER_ABSENCE_REASON_SCOPE_INSUFFICIENT"  # spec "Other names": OfferGroup.absence_reason
)
DisclosurePolicy = Literal["hide", "reveal"]


def covers(granted: Iterable[str] | None, required: str, *, default_scopes: Sequence[str] = ()) -> bool:
    """Whether the granted scopes (None or empty: ``default_scopes``) cover ``required``."""
    scopes = tuple(granted) if granted is not None else ()
    return scopes_cover(scopes or default_scopes, required)


def apply_disclosure(
    groups: Iterable[dict[str, Any]],
    granted: Iterable[str] | None,
    required_scope: Callable[[dict[str, Any]], str | None],
    *,
    policy: DisclosurePolicy,
    default_scopes: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The OfferGroups a requester may see: covered groups unchanged, the others hidden or revealed as
    ``{"uri": ..., "absence_reason": SCOPE_INSUFFICIENT}``. ``required_scope`` None: not gated."""
    if policy not in ("hide", "reveal"):
        raise ValueError(f"disclosure policy is hide or reveal, got {policy!r}")
    scopes = tuple(granted) if granted is not None else None
    out = []
    for group in groups:
        required = required_scope(group)
        if required is None or covers(scopes, required, default_scopes=default_scopes):
            out.append(group)
        elif policy == "reveal":
            out.append({"uri": group.get("uri"), "absence_reason": SCOPE_INSUFFICIENT})
    return out
