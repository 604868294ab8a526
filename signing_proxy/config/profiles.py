"""The ``profiles`` section: which signing profile each destination gets (first matching rule wins).

``svc`` is the spec's profile and the default; ``web-bot-auth`` is the IETF drafts' profile for the
open web (``core/profiles.py``). ``learn: true`` lets an origin's ``Accept-Signature`` challenge
choose the profile of its host, remembered for at most ``learn_max_hosts`` hosts. Whatever chooses
web-bot-auth in its Dictionary form (``default``, a rule, ``learn``) needs ``signing.signature_agent``
to be an https origin or empty (``Config._check``).
"""

from __future__ import annotations

from typing import Literal

from ..errors import ConfigError
from .checks import check_host_pattern, host_matches, positive
from .masking import section

__all__ = ["ProfileName", "ProfileRule", "ProfilesConfig"]

ProfileName = Literal["svc", "web-bot-auth"]


@section
class ProfileRule:
    """Destinations (host patterns) signed under ``profile``."""

    hosts: tuple[str, ...]
    profile: ProfileName
    # web-bot-auth only: "dictionary" (the drafts' form) or "string" (their legacy sf-String form)
    signature_agent: Literal["dictionary", "string"] = "dictionary"

    def _check(self, path: str) -> None:
        if not self.hosts:
            raise ConfigError(f"{path}.hosts: must list at least one host pattern")
        for i, pattern in enumerate(self.hosts):
            check_host_pattern(pattern, f"{path}.hosts[{i}]")
        if self.profile == "svc" and self.signature_agent != "dictionary":
            raise ConfigError(
                f"{path}.signature_agent: only for profile web-bot-auth (svc has the spec's form)"
            )


@section
class ProfilesConfig:
    default: ProfileName = "svc"  # destinations no rule names
    rules: tuple[ProfileRule, ...] = ()
    learn: bool = False  # an Accept-Signature challenge asking for tag="web-bot-auth" switches its host
    learn_max_hosts: int = 1024  # hosts remembered as learned (least recently learned dropped)

    def _check(self, path: str) -> None:
        positive(self.learn_max_hosts, f"{path}.learn_max_hosts", maximum=1_000_000)

    def rule_for(self, host: str) -> ProfileRule | None:
        """The first rule naming ``host``, or None."""
        for rule in self.rules:
            if any(host_matches(p, host) for p in rule.hosts):
                return rule
        return None
