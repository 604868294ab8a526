"""Challenge-driven signing: one signed retry when an origin asks for a signature we did not send.

An origin answering 401, 403 or 429 with ``Accept-Signature`` asking for ``tag="web-bot-auth"``
(``core.challenge.plan_retry``) gets the request once more, signed as it asked, when the request is
idempotent (RFC 9110 section 9.2.2: a POST may have been processed) and was signed the first time
(never for ``hosts.unsigned``). The refused response is held at its head and drained unread; the
retry's answer goes to the agent whatever it is (no loop). Otherwise the challenge is passed back to
the agent untouched. With ``profiles.learn: true`` the host is then remembered as web-bot-auth.

The retry carries our Signature-Agent as a Dictionary member, which protocol-02 requires to be an
https origin: with a ``signing.signature_agent`` that is not one (a registry path such as
``https://registry.example/agents/alice``, right for the spec's profile) the retry is declined
(``core.challenge.retry_refusal``; a warning says why, at most once every ``DECLINE_WARN_EVERY_S``
with the number declined since: an origin chooses how often it challenges), nothing is learned, and
the challenge goes back to the agent: never a signature whose Signature-Agent a verifier ignores,
never one unsigned.
(``profiles.learn: true`` with such a URL is refused at start-up.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from ..core.challenge import CHALLENGE_STATUSES, RetryPlan, plan_retry, retry_refusal
from ..core.profiles import PROFILES
from ..core.uri import Target
from ..net.forward import IDEMPOTENT
from ..net.framing import Outgoing
from ..net.upstream import ResponseHead
from ..ratelog import RateGate

__all__ = ["DECLINE_WARN_EVERY_S", "ChallengeHold", "challenge_hold"]

log = logging.getLogger("signing_proxy.challenges")

# our choice: the cause is our configuration, the same for every origin, so one line a minute for all
# of them (one clock reading and one count: nothing a stranger's origins can grow), with a count
DECLINE_WARN_EVERY_S: Final = 60.0


_declines = RateGate(DECLINE_WARN_EVERY_S)  # for the process: every proxy's holds share the one rate


class ChallengeHold:
    """A ``net.forward`` hold for one request: True (hold) for a challenge it will retry."""

    __slots__ = ("agent", "learn", "other", "plan", "sent")

    def __init__(
        self,
        sent: str,
        other: Callable[[ResponseHead, Target], bool] | None,
        learn: Callable[[Target], object] | None,
        agent: str,
    ) -> None:
        self.sent = sent  # the profile the first attempt was signed under
        self.agent = agent  # signing.signature_agent as the first attempt was signed: a retry sends it
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
        refusal = retry_refusal(plan, self.agent)
        if refusal is not None:  # its member would be ignored: the challenge goes back, unanswered
            declined = _declines.due()
            if declined is not None:
                log.warning(
                    "%s://%s asked for a web-bot-auth signature; retry declined, the challenge goes "
                    "back to the agent: signing.signature_agent %s (%d declined since the last line, "
                    "logged at most once a minute)",
                    target.scheme,
                    target.authority,
                    refusal,
                    declined,
                )
            return False
        if self.learn is not None:
            self.learn(target)  # this origin's: scheme, host and port
        self.plan = plan
        return True


def challenge_hold(
    outgoing: Outgoing,
    other: Callable[[ResponseHead, Target], bool] | None,
    learn: Callable[[Target], object] | None,
    agent: str,
) -> ChallengeHold | None:
    """A hold for ``outgoing`` when a challenge may be retried (signed, idempotent), else None.
    ``agent``: the ``signing.signature_agent`` of the configuration that signed ``outgoing``."""
    if outgoing.profile is None or outgoing.method not in IDEMPOTENT:
        return None
    return ChallengeHold(outgoing.profile, other, learn, agent)
