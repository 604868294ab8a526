"""Challenge-driven signing: one signed retry when an origin asks for a signature we did not send.

An origin answering 401, 403 or 429 with ``Accept-Signature`` asking for ``tag="web-bot-auth"``
(``core.challenge.plan_retry``) gets the request once more, signed as it asked, when the request is
idempotent (RFC 9110 section 9.2.2: a POST may have been processed) and was signed the first time
(never for ``hosts.unsigned``). The refused response is held at its head and drained unread; the
retry's answer goes to the agent whatever it is (no loop). Otherwise the challenge is passed back to
the agent untouched. With ``profiles.learn: true`` the host is then remembered as web-bot-auth.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.challenge import CHALLENGE_STATUSES, RetryPlan, plan_retry
from ..core.profiles import PROFILES
from ..core.uri import Target
from ..net.forward import IDEMPOTENT
from ..net.framing import Outgoing
from ..net.upstream import ResponseHead

__all__ = ["ChallengeHold", "challenge_hold"]


class ChallengeHold:
    """A ``net.forward`` hold for one request: True (hold) for a challenge it will retry."""

    __slots__ = ("learn", "other", "plan", "sent")

    def __init__(
        self,
        sent: str,
        other: Callable[[ResponseHead, Target], bool] | None,
        learn: Callable[[Target], object] | None,
    ) -> None:
        self.sent = sent  # the profile the first attempt was signed under
        self.other = other  # discovery's hold, consulted first
        self.learn = learn
        self.plan: RetryPlan | None = None

    def __call__(self, head: ResponseHead, target: Target) -> bool:
        if self.other is not None and self.other(head, target):
            return True
        if head.status not in CHALLENGE_STATUSES or self.plan is not None:
            return False
        values = [v.decode("latin-1") for n, v in head.headers if n.lower() == b"accept-signature"]
        if not values:
            return False
        plan = plan_retry(", ".join(values), PROFILES.get(self.sent))
        if plan is None:
            return False
        if self.learn is not None:
            self.learn(target)  # this origin's: scheme, host and port
        self.plan = plan
        return True


def challenge_hold(
    outgoing: Outgoing,
    other: Callable[[ResponseHead, Target], bool] | None,
    learn: Callable[[Target], object] | None,
) -> ChallengeHold | None:
    """A hold for ``outgoing`` when a challenge may be retried (signed, idempotent), else None."""
    if outgoing.profile is None or outgoing.method not in IDEMPOTENT:
        return None
    return ChallengeHold(outgoing.profile, other, learn)
