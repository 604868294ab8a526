"""Requester injection: the agent's Requester (and delegation) added to exchange calls that lack it.

For a POST to ``{exchange}/svc.v1.ExchangeService/<Method>`` on a configured exchange whose body is
a JSON object without ``requester``, the proxy inserts the configured Requester in proto-JSON
(spec "Requester", "Delegation") before ``Content-Digest`` is computed, so digest and signature
cover the final body. Any other request, a body that is not a JSON object, or one that already
names a requester, passes untouched. The delegation chain is read from a file and checked at
start-up as far as its holder can without the owner's key (``core.delegation.check_chain``): a
chain whose final ``cnf.jkt`` is not a key of ours that may sign now, an expired chain, or mirror
fields wider than the chain refuse start-up (``ProxyError`` 500, exit 2 from the CLI).

An exchange call carrying the chain is signed with the key it is bound to (``holder_for``), even
after a rotation made another key the signing key, for as long as that key's window lasts (spec
"Delegation verification" 3: the holder must be the request-signing key). Ahead of that key's end
the proxy warns (log, ``signing_proxy_delegation_key_remaining_seconds``, ``/readyz``); once it may
no longer sign, a delegated call fails closed with 503 ``delegation-key-expired`` (or
``delegation-holder-mismatch`` for a key of unknown window) instead of being signed with a key the
chain does not name. A changed token file is picked up (checked at most once a second) when it passes
the same checks; otherwise the chain loaded before stays and the refusal is logged once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

from ..config import Config, RequesterConfig
from ..core.fields import Fields
from ..core.keys import KeyProvider, format_rfc3339
from ..core.requester import (
    EXCHANGE_SERVICE,
    REQUESTER_MEMBER,
    RequesterDoc,
    insert_member,
    requester_type_name,
)
from ..core.uri import Target, parse_absolute_uri
from ..errors import ConfigError, ProxyError
from .delegation_file import (
    WHERE,
    LoadedDelegation,
    file_fingerprint,
    holder_mismatch_detail,
    load_delegation,
    reissue_hint,
)

__all__ = [
    "DELEGATION_KEY_WARN_S",
    "RELOAD_CHECK_INTERVAL_S",
    "LoadedDelegation",
    "RequesterInjector",
    "holder_mismatch_detail",
    "injector_for",
    "load_delegation",
]

log = logging.getLogger("signing_proxy.requester")

RELOAD_CHECK_INTERVAL_S: Final = 1.0  # our choice, like the key store: how often the token file is looked at
# our choice: warn this long before the bound key stops signing; the spec's grace is "typically 24 to
# 48 hours", so a rotation with the default grace warns at once
DELEGATION_KEY_WARN_S: Final = 48 * 3600


class _Failed(Enum):
    """What ``_failed`` holds while no reload has failed: not None, the fingerprint of a token file
    that is gone (so that its removal is logged like any other refusal)."""

    NOTHING = 0


# the token file's fingerprint a reload refused (None: the file could not be stat'ed), or NOTHING
_FailedFile = tuple[int, int, int] | None | Literal[_Failed.NOTHING]


class RequesterInjector:
    """Adds the configured Requester to exchange calls; ``document()`` is that Requester in proto-JSON."""

    def __init__(
        self,
        config: RequesterConfig,
        keys: KeyProvider,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.keys = keys
        self.clock = clock
        try:
            self._type = requester_type_name(config.type)
        except ValueError as exc:  # config validation makes this unreachable
            raise ConfigError(f"requester.type: {exc}", reason="requester-invalid") from None
        self._prefixes: list[tuple[str, str, int, str]] = []
        for base in config.exchanges:
            target = parse_absolute_uri(base)
            prefix = f"{target.path.rstrip('/')}/{EXCHANGE_SERVICE}/"
            self._prefixes.append((target.scheme, target.host, target.port, prefix))
        self._previous: LoadedDelegation | None = None  # replaced by a reload: a body built before it
        self._failed: _FailedFile = _Failed.NOTHING  # a token file refused on reload (logged once)
        self._warned: tuple[str, str] | None = None
        self._warned_ahead: str | None = None  # the bound key already warned about (logged once)
        loaded = None
        if config.delegation is not None:
            loaded = load_delegation(config.delegation, config.scopes, keys, clock())
        # the chain and its rendered member in one reference, replaced whole: a reload storing them one
        # after the other let a request insert the old chain after checking the new one
        self._pair: tuple[LoadedDelegation | None, str] = (loaded, self._render_with(loaded))

    @property
    def _loaded(self) -> LoadedDelegation | None:
        return self._pair[0]

    # --- what is sent ---

    def _render_with(self, loaded: LoadedDelegation | None) -> str:
        doc = self._requester(loaded).proto_json()
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    def _requester(self, loaded: LoadedDelegation | None) -> RequesterDoc:
        c = self.config
        return RequesterDoc(
            id=c.id,
            domain=c.domain,
            type=self._type,
            name=c.name,
            scopes=c.scopes,
            delegation=None if loaded is None else loaded.doc,
            ext=dict(c.ext),
            ext_critical=c.ext_critical,
        )

    def document(self, *, delegation: bool = True) -> dict[str, Any]:
        """The proto-JSON Requester as it is sent now (a fresh copy).

        Raises ProxyError 503 when the delegation cannot be sent now (expired, or bound to a key
        that no longer signs): a caller building its own exchange body fails closed like injection.
        ``delegation=False``: the Requester without its ``delegation`` member (never checked then),
        for an exchange the operator did not list in ``requester.exchanges``.
        """
        loaded, member = self._pair
        doc: dict[str, Any] = json.loads(member)  # parsed anew: the caller's to change
        if not delegation:
            doc.pop("delegation", None)
            return doc
        self._check_live(self.clock(), loaded)
        return doc

    # --- which requests ---
    def is_exchange_call(self, method: str, target: Target) -> bool:
        """A POST to ``{exchange}/svc.v1.ExchangeService/<Method>`` on a configured exchange."""
        if method != "POST":
            return False
        path = target.path
        for scheme, host, port, prefix in self._prefixes:
            if (target.scheme, target.host, target.port) == (scheme, host, port) and path.startswith(prefix):
                method_name = path[len(prefix) :]
                if method_name and "/" not in method_name:
                    return True
        return False

    def apply(self, method: str, target: Target, fields: Fields, body: bytes) -> bytes:
        """The body to digest and sign: with the Requester inserted, or ``body`` itself untouched."""
        if not self.is_exchange_call(method, target) or not _json_media(fields):
            return body
        loaded, member = self._pair  # the chain checked is the chain inserted, whatever reloads
        injected = insert_member(body, REQUESTER_MEMBER, member)
        if injected is None:
            return body
        self._check_live(self.clock(), loaded)
        log.debug("requester %s inserted into POST %s", self.config.id, target.uri)
        return injected

    # --- the delegation, re-checked per request (memory only: ``reload`` reads the file, off the loop) ---
    def _check_live(self, now: float, loaded: LoadedDelegation | None) -> None:
        if self.config.delegation is None:
            return
        assert loaded is not None
        if now >= loaded.expires_at:
            raise ProxyError(
                503,
                "delegation-expired",
                f"{WHERE}: the delegation expired at {format_rfc3339(loaded.expires_at)}; issue a new one",
            )
        if self.keys.key_for(loaded.holder_jkt, now) is None:
            raise self._key_refusal(loaded, now)

    def key_refusal(self) -> ProxyError:
        """Why a delegated call cannot be signed now (503): the bound key's window ended
        (``delegation-key-expired``), or it is no key of ours that may sign (``-holder-mismatch``)."""
        loaded = self._loaded
        assert loaded is not None
        return self._key_refusal(loaded, self.clock())

    def _key_refusal(self, loaded: LoadedDelegation, now: float) -> ProxyError:
        assert self.config.delegation is not None
        token_file = self.config.delegation.token_file
        current = self.keys.current(now)
        signing = "no key" if current is None else current.thumbprint
        ends = self.keys.not_after_of(loaded.holder_jkt)
        if ends is not None and now >= ends:
            error = ProxyError(
                503,
                "delegation-key-expired",
                f"{WHERE}: the chain is bound to key {loaded.holder_jkt} (its final cnf.jkt), whose window "
                f"ended at {format_rfc3339(ends)}; a delegated call is never signed with another key (this "
                f"proxy now signs with {signing}). " + reissue_hint(token_file),
            )
        else:
            error = ProxyError(
                503,
                "delegation-holder-mismatch",
                holder_mismatch_detail(loaded.holder_jkt, signing, token_file),
            )
        if self._warned != (loaded.holder_jkt, error.reason):
            self._warned = (loaded.holder_jkt, error.reason)
            log.error("delegated exchange calls refused: %s", error.detail)
        return error

    def holder_for(self, method: str, target: Target, body: bytes) -> str | None:
        """The key an exchange call carrying our delegation must be signed with (the chain's holder),
        or None when ``body`` carries none of ours (it is signed like any other request)."""
        current, previous = self._loaded, self._previous
        if current is None or not self.is_exchange_call(method, target):
            return None
        for loaded in (current, previous):
            if loaded is not None and loaded.token_b64 in body:
                return loaded.holder_jkt
        return None

    # --- ahead of the bound key's end (memory only) ---
    def bound_key_remaining(self, now: float) -> float | None:
        """Seconds until the bound key stops signing (None: no delegation, or a key without window)."""
        loaded = self._loaded
        if loaded is None:
            return None
        ends = self.keys.not_after_of(loaded.holder_jkt)
        return None if ends is None else ends - now

    def key_status(self) -> dict[str, object] | None:
        """The bound key for ``/readyz``: keyid, state (``ok``, ``expiring``: within
        ``DELEGATION_KEY_WARN_S`` or no longer the signing key, ``unusable``), not_after, remaining_s."""
        loaded = self._loaded
        if loaded is None:
            return None
        now = self.clock()
        remaining = self.bound_key_remaining(now)
        current = self.keys.current(now)
        if self.keys.key_for(loaded.holder_jkt, now) is None:
            state = "unusable"
        elif (remaining is not None and remaining <= DELEGATION_KEY_WARN_S) or (
            current is not None and current.thumbprint != loaded.holder_jkt
        ):
            state = "expiring"
        else:
            state = "ok"
        return {
            "keyid": loaded.holder_jkt,
            "state": state,
            "not_after": None if remaining is None else format_rfc3339(now + remaining),
            "remaining_s": None if remaining is None else max(0, math.floor(remaining)),
        }

    def _warn_ahead(self) -> None:
        status = self.key_status()
        if status is None or status["state"] != "expiring" or self._warned_ahead == status["keyid"]:
            return
        self._warned_ahead = str(status["keyid"])
        assert self.config.delegation is not None
        log.warning(
            "%s: the chain is bound to key %s, which stops signing at %s (another key signs other requests "
            "already, or soon); delegated exchange calls will be refused then. %s",
            WHERE,
            status["keyid"],
            status["not_after"] or "an unknown time",
            reissue_hint(self.config.delegation.token_file),
        )

    def reload(self, now: float | None = None) -> bool:
        """Adopt a changed token file if it passes the start-up checks; True when one was adopted.

        Blocking (stat and read): the service calls it from a worker thread every
        ``RELOAD_CHECK_INTERVAL_S`` and on SIGHUP, never from a request.
        """
        delegation = self.config.delegation
        if delegation is None or self._loaded is None:
            return False
        self._warn_ahead()
        now = self.clock() if now is None else now
        try:
            fingerprint = file_fingerprint(Path(os.path.expanduser(delegation.token_file)))
        except OSError:
            fingerprint = None
        if fingerprint is not None and fingerprint == self._loaded.fingerprint:
            self._failed = _Failed.NOTHING  # back as loaded: a later refusal is logged again
            return False
        try:
            loaded = load_delegation(delegation, self.config.scopes, self.keys, now)
        except ConfigError as exc:
            if fingerprint != self._failed:
                self._failed = fingerprint
                log.error(
                    "delegation not reloaded from %s, keeping the one loaded before: %s",
                    delegation.token_file,
                    exc.detail,
                )
            return False
        member_json = self._render_with(loaded)
        self._failed, self._warned, self._warned_ahead = _Failed.NOTHING, None, None
        self._previous = self._loaded  # first: a request may hold a body built with the old chain
        self._pair = (loaded, member_json)  # what a request reads, in one store
        log.info(
            "reloaded the delegation from %s: holder %s, expires %s",
            delegation.token_file,
            loaded.holder_jkt,
            format_rfc3339(loaded.expires_at),
        )
        return True

    def check(self) -> str:
        """``ok``, or the reason injected requests are refused now (for ``/readyz``)."""
        try:
            self._check_live(self.clock(), self._loaded)
        except ProxyError as exc:
            return exc.reason
        return "ok"


def _json_media(fields: Fields) -> bool:
    """No Content-Type, or a JSON one; and no Content-Encoding other than identity."""
    encoding = fields.combined("content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        return False
    content_type = fields.combined("content-type")
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def injector_for(
    config: Config, keys: KeyProvider, *, clock: Callable[[], float] = time.time
) -> RequesterInjector | None:
    """The injector for ``config.requester`` (None when not configured); ProxyError 500 if unusable."""
    if config.requester is None or config.mode != "agent":
        return None
    return RequesterInjector(config.requester, keys, clock=clock)
