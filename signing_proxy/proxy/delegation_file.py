"""The delegation token file: read, checked as far as its holder can, mirrored in the Delegation message.

``load_delegation`` reads the chain (``~``-joined compact JWS, authority first) and checks it without
the owner's key (``core.delegation.check_chain``): expiry, linkage, the holder (the final ``cnf.jkt``
must be a key of ours that may sign now), and the mirror fields of the configuration (never wider
than the chain). A refusal is a ``ConfigError`` whose reason the proxy reports (start-up, reload).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Final

from ..config import DelegationConfig
from ..core.b64 import b64_encode
from ..core.delegation import NUMERIC_DATE_MAX, VerifiedLink, check_chain
from ..core.errors import DelegationError, KeyFormatError
from ..core.keys import KeyProvider, format_rfc3339, parse_rfc3339
from ..core.requester import DelegationDoc, parse_duration_s
from ..core.scopes import narrows
from ..errors import ConfigError

__all__ = [
    "MAX_TOKEN_FILE_BYTES",
    "WHERE",
    "LoadedDelegation",
    "file_fingerprint",
    "holder_mismatch_detail",
    "load_delegation",
    "read_token_file",
    "reissue_hint",
]

MAX_TOKEN_FILE_BYTES: Final = 256 * 1024  # our choice: 8 links of at most 16 KiB each fit easily
WHERE: Final = "requester.delegation"


def holder_mismatch_detail(bound_to: str, signing: str, token_file: str) -> str:
    """The refusal shown when the chain's final ``cnf.jkt`` is not our signing key (no secrets)."""
    return (
        f"{WHERE}: the chain is bound to key {bound_to} (its final cnf.jkt), which is not a key of this "
        f"proxy that may sign now (it signs with {signing}); the holder must be the request-signing key "
        "(spec: Delegation verification 3). " + reissue_hint(token_file)
    )


def reissue_hint(token_file: str) -> str:
    return (
        "Re-issue it bound to the current signing key (needed after every key rotation, before the old "
        "key's grace period ends): signing-proxy delegate extend @<the chain up to the principal> "
        f"--principal-key <principal key> --holder-config <this config> > {token_file}"
    )


@dataclass(frozen=True)
class LoadedDelegation:
    """A token file that passed the start-up checks, and what the Delegation message mirrors of it."""

    holder_jkt: str
    expires_at: float
    doc: DelegationDoc
    fingerprint: tuple[int, int, int]

    @cached_property
    def token_b64(self) -> bytes:
        """The chain as the Delegation message carries it (base64): how a body is seen to carry it."""
        return b64_encode(self.doc.token.encode("ascii")).encode("ascii")


def file_fingerprint(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _min_or_none(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _refuse(reason: str, detail: str) -> ConfigError:
    """A delegation refused at start-up or reload (no exchange to answer: the operator reads it)."""
    return ConfigError(detail, reason=reason)


def read_token_file(
    config: DelegationConfig, now: float
) -> tuple[Path, str, list[VerifiedLink], tuple[int, int, int]]:
    """The token file's path, chain, links (``check_chain``: as far as no key is needed) and
    fingerprint; ConfigError as ``load_delegation``. ``config check`` reads it so, keys aside."""
    path = Path(os.path.expanduser(config.token_file))
    try:
        fingerprint = file_fingerprint(path)
        with path.open("rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise _refuse(
            "delegation-unreadable", f"{WHERE}.token_file: cannot read {path}: {exc.strerror}"
        ) from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise _refuse(
            "delegation-invalid", f"{WHERE}.token_file: {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes"
        )
    try:
        chain = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise _refuse("delegation-invalid", f"{WHERE}.token_file: {path} is not an ASCII JWS chain") from None
    try:
        links = check_chain(chain, now=now)
    except DelegationError as exc:
        reason = "delegation-expired" if exc.reason == "expired" else "delegation-invalid"
        raise _refuse(
            reason, f"{WHERE}.token_file {path}: {exc.denial_reason}: {exc.reason}: {exc.detail}"
        ) from None
    return path, chain, links, fingerprint


def load_delegation(
    config: DelegationConfig, scopes: tuple[str, ...], keys: KeyProvider, now: float
) -> LoadedDelegation:
    """Read and check the token file; ConfigError (with the refusal's reason) and a precise detail.

    The chain's holder must be a key of ours that may sign now (``keys.key_for``): the current
    signing key, or one a rotation is retiring whose window has not ended."""
    path, chain, links, fingerprint = read_token_file(config, now)
    final = links[-1]
    signing = keys.current(now)
    if signing is None:
        raise _refuse(
            "no-valid-signing-key",
            f"{WHERE}: no signing key is valid now, so the holder binding cannot be checked; "
            "see `signing-proxy keys list`",
        )
    if keys.key_for(final.cnf_jkt, now) is None:
        raise _refuse(
            "delegation-holder-mismatch",
            holder_mismatch_detail(final.cnf_jkt, signing.thumbprint, str(path)),
        )
    expires_at, spend, accesses, period = check_mirrors(config, scopes, path, links, now)
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


def check_mirrors(
    config: DelegationConfig, scopes: tuple[str, ...], path: Path, links: list[VerifiedLink], now: float
) -> tuple[float, int | None, int | None, int | None]:
    """What the Delegation mirrors, checked against the chain as the gateway checks it (no key
    needed: ``config check`` runs it too): ``issuer``, ``expires_at``, the caps and period, and
    ``requester.scopes``. Returns the expiry, spend cap, access cap and period to send."""
    if config.issuer is not None and config.issuer != links[0].iss:  # a mirror, never another issuer
        raise _refuse(
            "delegation-invalid",
            f"{WHERE}.issuer: {config.issuer!r} is not the iss of the chain in {path} "
            f"({links[0].iss!r}); set it to that, or leave it out",
        )
    expires_at = _expiry(config, links, now)
    spend, accesses, period = _caps(config, links)
    final = links[-1]
    if final.scope is not None:
        wider = narrows(scopes, final.scope)
        if wider:
            raise _refuse(
                "delegation-scope-mismatch",
                f"requester.scopes: {wider[:8]} not covered by the delegation's scope "
                f"{list(final.scope)[:8]}",
            )
    return expires_at, spend, accesses, period


def _expiry(config: DelegationConfig, links: list[VerifiedLink], now: float) -> float:
    exps = [link.exp for link in links if link.exp is not None]
    chain_exp = min(exps) if exps else None
    if config.expires_at is None:
        if chain_exp is None:
            raise _refuse(
                "delegation-invalid",
                f"{WHERE}.expires_at: the chain carries no exp, so set expires_at (Delegation.expires_at "
                "is required)",
            )
        return math.floor(chain_exp)
    try:
        configured = parse_rfc3339(config.expires_at)
    except KeyFormatError as exc:  # config validation makes this unreachable
        raise _refuse("delegation-invalid", f"{WHERE}.expires_at: {exc.detail}") from None
    if configured > NUMERIC_DATE_MAX:  # Delegation.expires_at is RFC 3339: four-digit years
        raise _refuse(
            "delegation-invalid",
            f"{WHERE}.expires_at: {config.expires_at} is after 9999-12-31T23:59:59Z (offset applied)",
        )
    if chain_exp is not None and configured > chain_exp:
        raise _refuse(
            "delegation-invalid",
            f"{WHERE}.expires_at: {config.expires_at} is later than the chain's earliest exp "
            f"{format_rfc3339(chain_exp)}",
        )
    if configured <= now:
        raise _refuse("delegation-expired", f"{WHERE}.expires_at: {config.expires_at} has passed")
    return configured


def _caps(config: DelegationConfig, links: list[VerifiedLink]) -> tuple[int | None, int | None, int | None]:
    """The mirrored caps: the configured ones or the chain's own. Refused as the gateway's
    ``check_mirror`` refuses them, so that no proxy starts whose every delegated call is denied: a
    cap above the chain's, a cap the chain does not carry (absent is no cap: wider than any), a
    ``quota_period`` other than the final link's (absent there: lifetime, which none equals)."""
    out: list[int | None] = []
    for name in ("max_spend_cents", "max_accesses"):
        chain_cap = _min_or_none([getattr(link.caps, name) for link in links])
        configured = getattr(config, name)
        if configured is not None and chain_cap is None:
            raise _refuse(
                "delegation-invalid",
                f"{WHERE}.{name}: the chain carries no svc_{name}, so a mirrored cap is wider than it; "
                "leave it out (the chain decides)",
            )
        if configured is not None and chain_cap is not None and configured > chain_cap:
            raise _refuse(
                "delegation-invalid",
                f"{WHERE}.{name}: {configured} is above the chain's svc_{name} {chain_cap}",
            )
        out.append(configured if configured is not None else chain_cap)
    chain_period = links[-1].caps.quota_period_s  # the verified claim: the final link's
    period = parse_duration_s(config.quota_period) if config.quota_period is not None else None
    if period is not None and period != chain_period:
        if chain_period is None:
            detail = "the chain carries no svc_quota_period (its quota is lifetime); leave it out"
        else:
            detail = f"{period}s differs from the chain's svc_quota_period, {chain_period}s"
        raise _refuse("delegation-invalid", f"{WHERE}.quota_period: {detail}")
    out.append(period if period is not None else chain_period)
    return out[0], out[1], out[2]
