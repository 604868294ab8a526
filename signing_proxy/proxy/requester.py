"""Requester injection: the agent's Requester (and delegation) added to exchange calls that lack it.

For a POST to ``{exchange}/svc.v1.ExchangeService/<Method>`` on a configured exchange whose body is
a JSON object without ``requester``, the proxy inserts the configured Requester in proto-JSON
(spec "Requester", "Delegation") before ``Content-Digest`` is computed, so digest and signature
cover the final body. Any other request, a body that is not a JSON object, or one that already
names a requester, passes untouched. The delegation chain is read from a file and checked at
start-up as far as its holder can without the owner's key (``core.delegation.check_chain``): a
chain whose final ``cnf.jkt`` is not the current signing key, an expired chain, or mirror fields
wider than the chain refuse start-up (``ProxyError`` 500, exit 2 from the CLI). Per request the
holder binding and expiry are re-checked cheaply: after a key rotation an injected request fails
closed with 503 ``delegation-holder-mismatch`` instead of carrying a delegation the exchange would
deny. A changed token file is picked up (checked at most once a second) when it passes the same
checks; otherwise the chain loaded before stays and the refusal is logged once.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..config import Config, DelegationConfig, RequesterConfig
from ..core.delegation import VerifiedLink, check_chain
from ..core.errors import DelegationError, KeyFormatError
from ..core.fields import Fields
from ..core.keys import KeyProvider, format_rfc3339, parse_rfc3339
from ..core.requester import (
    EXCHANGE_SERVICE,
    REQUESTER_MEMBER,
    DelegationDoc,
    RequesterDoc,
    insert_member,
    parse_duration_s,
    requester_type_name,
)
from ..core.scopes import narrows
from ..core.uri import Target, parse_absolute_uri
from ..errors import ProxyError

__all__ = [
    "RELOAD_CHECK_INTERVAL_S",
    "LoadedDelegation",
    "RequesterInjector",
    "holder_mismatch_detail",
    "injector_for",
    "load_delegation",
]

log = logging.getLogger("signing_proxy.requester")

RELOAD_CHECK_INTERVAL_S: Final = 1.0  # our choice, like the key store: how often the token file is looked at
MAX_TOKEN_FILE_BYTES: Final = 256 * 1024  # our choice: 8 links of at most 16 KiB each fit easily
_WHERE: Final = "requester.delegation"


def holder_mismatch_detail(bound_to: str, signing: str, token_file: str) -> str:
    """The refusal shown when the chain's final ``cnf.jkt`` is not our signing key (no secrets)."""
    return (
        f"{_WHERE}: the chain is bound to key {bound_to} (its final cnf.jkt) but this proxy signs with "
        f"{signing}; the holder must be the request-signing key (spec: Delegation verification 3). "
        "Re-issue it bound to the current signing key (needed after every key rotation): "
        "signing-proxy delegate extend @<the chain up to the principal> --principal-key <principal key> "
        f"--holder-config <this config> > {token_file}"
    )


@dataclass(frozen=True)
class LoadedDelegation:
    """A token file that passed the start-up checks, and what the Delegation message mirrors of it."""

    holder_jkt: str
    expires_at: float
    doc: DelegationDoc
    fingerprint: tuple[int, int, int]


def _fingerprint(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _min_or_none(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _refuse(reason: str, detail: str) -> ProxyError:
    return ProxyError(500, reason, detail)


def load_delegation(
    config: DelegationConfig, scopes: tuple[str, ...], signing_jkt: str | None, now: float
) -> LoadedDelegation:
    """Read and check the token file; ProxyError 500 with a precise detail on any refusal."""
    path = Path(os.path.expanduser(config.token_file))
    try:
        fingerprint = _fingerprint(path)
        with path.open("rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise _refuse(
            "delegation-unreadable", f"{_WHERE}.token_file: cannot read {path}: {exc.strerror}"
        ) from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise _refuse(
            "delegation-invalid", f"{_WHERE}.token_file: {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes"
        )
    try:
        chain = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise _refuse(
            "delegation-invalid", f"{_WHERE}.token_file: {path} is not an ASCII JWS chain"
        ) from None
    try:
        links = check_chain(chain, now=now)
    except DelegationError as exc:
        reason = "delegation-expired" if exc.reason == "expired" else "delegation-invalid"
        raise _refuse(
            reason, f"{_WHERE}.token_file {path}: {exc.denial_reason}: {exc.reason}: {exc.detail}"
        ) from None
    final = links[-1]
    if signing_jkt is None:
        raise _refuse(
            "no-valid-signing-key",
            f"{_WHERE}: no signing key is valid now, so the holder binding cannot be checked; "
            "see `signing-proxy keys list`",
        )
    if final.cnf_jkt != signing_jkt:
        raise _refuse(
            "delegation-holder-mismatch", holder_mismatch_detail(final.cnf_jkt, signing_jkt, str(path))
        )
    expires_at = _expiry(config, links, now)
    spend, accesses, period = _caps(config, links)
    if final.scope is not None:
        wider = narrows(scopes, final.scope)
        if wider:
            raise _refuse(
                "delegation-scope-mismatch",
                f"requester.scopes: {wider[:8]} not covered by the delegation's scope "
                f"{list(final.scope)[:8]}",
            )
    doc = DelegationDoc(
        principal_domain=config.principal_domain,
        principal_id=config.principal_id,
        expires_at=expires_at,
        token=chain,
        scopes=final.scope or (),
        max_spend_cents=spend,
        token_format=config.token_format,
        revocation_uri=config.revocation_uri,
        max_accesses=accesses,
        quota_period_s=period,
        issuer=config.issuer,
        ext=dict(config.ext),
        ext_critical=config.ext_critical,
    )
    return LoadedDelegation(final.cnf_jkt, expires_at, doc, fingerprint)


def _expiry(config: DelegationConfig, links: list[VerifiedLink], now: float) -> float:
    exps = [link.exp for link in links if link.exp is not None]
    chain_exp = min(exps) if exps else None
    if config.expires_at is None:
        if chain_exp is None:
            raise _refuse(
                "delegation-invalid",
                f"{_WHERE}.expires_at: the chain carries no exp, so set expires_at (Delegation.expires_at "
                "is required)",
            )
        return math.floor(chain_exp)
    try:
        configured = parse_rfc3339(config.expires_at)
    except KeyFormatError as exc:  # config validation makes this unreachable
        raise _refuse("delegation-invalid", f"{_WHERE}.expires_at: {exc.detail}") from None
    if chain_exp is not None and configured > chain_exp:
        raise _refuse(
            "delegation-invalid",
            f"{_WHERE}.expires_at: {config.expires_at} is later than the chain's earliest exp "
            f"{format_rfc3339(chain_exp)}",
        )
    if configured <= now:
        raise _refuse("delegation-expired", f"{_WHERE}.expires_at: {config.expires_at} has passed")
    return configured


def _caps(config: DelegationConfig, links: list[VerifiedLink]) -> tuple[int | None, int | None, int | None]:
    """The mirrored caps: the configured ones (never above the chain's) or the chain's own."""
    out: list[int | None] = []
    for name in ("max_spend_cents", "max_accesses"):
        chain_cap = _min_or_none([getattr(link.caps, name) for link in links])
        configured = getattr(config, name)
        if configured is not None and chain_cap is not None and configured > chain_cap:
            raise _refuse(
                "delegation-invalid",
                f"{_WHERE}.{name}: {configured} is above the chain's svc_{name} {chain_cap}",
            )
        out.append(configured if configured is not None else chain_cap)
    final = links[-1].caps
    chain_period = final.quota_period_s
    period = parse_duration_s(config.quota_period) if config.quota_period is not None else None
    capped = any(link.caps.capped for link in links)
    if period is not None and capped and period != chain_period:
        shown = f"{chain_period}s" if chain_period is not None else "absent (lifetime)"
        raise _refuse(
            "delegation-invalid",
            f"{_WHERE}.quota_period: {period}s differs from the chain's svc_quota_period, {shown}",
        )
    out.append(period if period is not None else chain_period)
    return out[0], out[1], out[2]


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
            raise ProxyError(500, "requester-invalid", f"requester.type: {exc}") from None
        self._prefixes: list[tuple[str, str, int, str]] = []
        for base in config.exchanges:
            target = parse_absolute_uri(base)
            prefix = f"{target.path.rstrip('/')}/{EXCHANGE_SERVICE}/"
            self._prefixes.append((target.scheme, target.host, target.port, prefix))
        self._loaded: LoadedDelegation | None = None
        self._failed: tuple[int, int, int] | None = None  # a token file refused on reload (logged once)
        self._warned: tuple[str, str] | None = None
        if config.delegation is not None:
            now = clock()
            key = keys.current(now)
            self._loaded = load_delegation(
                config.delegation, config.scopes, None if key is None else key.thumbprint, now
            )
        self._member_json = self._render()

    # --- what is sent ---
    def _render(self) -> str:
        return self._render_with(self._loaded)

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

    def document(self) -> dict[str, Any]:
        """The proto-JSON Requester as it is sent now (a fresh copy).

        Raises ProxyError 503 when the delegation cannot be sent now (expired, or bound to a key
        that no longer signs): a caller building its own exchange body fails closed like injection.
        """
        self._check_live(self.clock())
        return copy.deepcopy(json.loads(self._member_json))

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
        member = self._member_json
        injected = insert_member(body, REQUESTER_MEMBER, member)
        if injected is None:
            return body
        self._check_live(self.clock())
        if self._member_json != member:  # a reload swapped the delegation in the meantime
            injected = insert_member(body, REQUESTER_MEMBER, self._member_json) or body
        log.debug("requester %s inserted into POST %s", self.config.id, target.uri)
        return injected

    # --- the delegation, re-checked per request (memory only: ``reload`` reads the file, off the loop) ---
    def _check_live(self, now: float) -> None:
        if self.config.delegation is None:
            return
        loaded = self._loaded
        assert loaded is not None
        if now >= loaded.expires_at:
            raise ProxyError(
                503,
                "delegation-expired",
                f"{_WHERE}: the delegation expired at {format_rfc3339(loaded.expires_at)}; issue a new one",
            )
        key = self.keys.current(now)
        if key is not None and key.thumbprint != loaded.holder_jkt:
            if self._warned != (loaded.holder_jkt, key.thumbprint):
                self._warned = (loaded.holder_jkt, key.thumbprint)
                log.error("exchange calls refused: %s", self._mismatch(loaded, key.thumbprint))
            raise ProxyError(503, "delegation-holder-mismatch", self._mismatch(loaded, key.thumbprint))

    def _mismatch(self, loaded: LoadedDelegation, signing: str) -> str:
        assert self.config.delegation is not None
        return holder_mismatch_detail(loaded.holder_jkt, signing, self.config.delegation.token_file)

    def reload(self, now: float | None = None) -> bool:
        """Adopt a changed token file if it passes the start-up checks; True when one was adopted.

        Blocking (stat and read): the service calls it from a worker thread every
        ``RELOAD_CHECK_INTERVAL_S`` and on SIGHUP, never from a request.
        """
        delegation = self.config.delegation
        if delegation is None or self._loaded is None:
            return False
        now = self.clock() if now is None else now
        try:
            fingerprint = _fingerprint(Path(os.path.expanduser(delegation.token_file)))
        except OSError:
            fingerprint = None
        if fingerprint is not None and fingerprint == self._loaded.fingerprint:
            return False
        key = self.keys.current(now)
        try:
            loaded = load_delegation(
                delegation, self.config.scopes, None if key is None else key.thumbprint, now
            )
        except ProxyError as exc:
            if fingerprint != self._failed:
                self._failed = fingerprint
                log.error("delegation not reloaded, keeping the one loaded before: %s", exc.detail)
            return False
        member_json = self._render_with(loaded)
        self._failed, self._warned = None, None
        self._loaded, self._member_json = loaded, member_json  # a request reads both together
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
            self._check_live(self.clock())
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
