"""Which signing profile a destination gets: the ``profiles`` rules, then hosts learned from challenges.

``ProfileSelector.select(host, scheme, port)`` is on the agent hop's hot path: with no rule, nothing
learned and the default ``svc`` (the default configuration) it returns ``SVC`` after one truth test.
Rules are host patterns, first match wins. With ``profiles.learn: true`` an origin whose
``Accept-Signature`` asks for ``tag="web-bot-auth"`` is remembered as a web-bot-auth origin (at most
``learn_max_hosts``, the oldest forgotten first): that origin only, scheme and port included, so a
challenge over plain http or on another port changes nothing for the https origin of the same name.
A rule naming the host still wins over what was learned. A learned host is signed with the
Dictionary form, whose member must be an https origin: the configuration refuses ``learn: true``
with a ``signing.signature_agent`` that is not one, and a challenge is then never retried either
(``proxy.challenges``), so nothing is learned.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict

from ..config import ProfileRule, ProfilesConfig, host_matches
from ..core.profiles import PROFILES, SVC, WEB_BOT_AUTH, SigningProfile, profile_params

__all__ = ["ProfileSelector", "fresh_params", "profile_for_rule"]


def profile_for_rule(name: str, rule: ProfileRule | None) -> SigningProfile:
    """The profile value a configuration names (a rule may ask for the legacy Signature-Agent form)."""
    profile = PROFILES[name]
    if rule is not None and profile is WEB_BOT_AUTH and rule.signature_agent != "dictionary":
        return dataclasses.replace(profile, signature_agent=rule.signature_agent)
    return profile


class ProfileSelector:
    """The profile per destination host, from ``profiles`` and (optionally) learned challenges."""

    __slots__ = ("_by_rule", "_default", "_learned", "_trivial", "config")

    def __init__(self, config: ProfilesConfig) -> None:
        self._learned: OrderedDict[tuple[str, str, int], SigningProfile] = OrderedDict()  # by origin
        self.configure(config)

    def configure(self, config: ProfilesConfig) -> None:
        """Apply a (reloaded) ``profiles`` section; learned hosts are kept while learning stays on."""
        self.config = config
        self._default = profile_for_rule(config.default, None)
        self._by_rule = [(rule, profile_for_rule(rule.profile, rule)) for rule in config.rules]
        if not config.learn:
            self._learned.clear()
        while len(self._learned) > config.learn_max_hosts:
            self._learned.popitem(last=False)
        self._trivial = not config.rules and self._default is SVC

    def select(self, host: str, scheme: str, port: int) -> SigningProfile:
        """The profile for a request to ``scheme://host:port``: the first rule naming the host, else
        what a challenge from that origin taught, else the default."""
        if self._trivial and not self._learned:
            return SVC
        for rule, profile in self._by_rule:  # first match wins
            if any(host_matches(p, host) for p in rule.hosts):
                return profile
        learned = self._learned.get((scheme, host.lower(), port))
        return learned if learned is not None else self._default

    def learn(self, host: str, profile: SigningProfile, scheme: str, port: int) -> bool:
        """Remember ``profile`` for the origin ``scheme://host:port`` when learning is on; True when
        something changed."""
        if not self.config.learn or self.config.rule_for(host) is not None:
            return False
        origin = (scheme, host.lower(), port)
        if self._learned.get(origin) is profile:
            return False
        self._learned[origin] = profile
        self._learned.move_to_end(origin)
        while len(self._learned) > self.config.learn_max_hosts:
            self._learned.popitem(last=False)
        return True

    @property
    def learned(self) -> int:
        return len(self._learned)


def fresh_params(profile: SigningProfile) -> tuple[tuple[str, str | int], ...]:
    """``profile``'s parameters after the spec's four, with a fresh random nonce when it has one."""
    return profile_params(profile, os.urandom(profile.nonce_bytes) if profile.nonce_bytes else None)
