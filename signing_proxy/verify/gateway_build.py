"""One assembly of the gateway's verifier, for the gateway mode and for exchanges that embed it.

``build_gateway_verifier`` wires ``build_verifier`` (directories, revocation, egress, bounds), the
issuers' keys on the same resolver and pollers, and a counter store. Close it with
``await gateway.close()`` (the verifier, its pollers, an owned client, the store).
``load_pinned_keys`` reads ``gateway.pinned_agent_keys`` and ``gateway.pinned_broker_keys`` (public
key files, as the relay reads its own) for ``VerifierPolicy``: an agent that sends an empty
``Signature-Agent`` has no key directory, its key is pinned in configuration (DESIGN 5).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..config import GatewayConfig, VerifyConfig
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from .build import build_verifier, load_pinned_keys, policy_from_config
from .counters import CounterStore
from .directory import FETCH_TIMEOUT_S
from .gateway import GatewayPolicy, GatewayVerifier
from .issuers import IssuerAnchor, IssuerKeys
from .verifier import VerifierPolicy

__all__ = ["DEFAULT_ISSUER_KEY_GRACE_S", "build_gateway_verifier", "load_pinned_keys"]

DEFAULT_ISSUER_KEY_GRACE_S = GatewayConfig.issuer_key_grace_s  # one default: gateway.issuer_key_grace_s


def build_gateway_verifier(
    policy: VerifierPolicy | None = None,
    gateway: GatewayPolicy | None = None,
    *,
    store: CounterStore | None = None,
    trusted_issuers: Mapping[str, IssuerAnchor] | None = None,
    trusted_issuers_only: bool = False,
    issuer_key_grace_s: int = DEFAULT_ISSUER_KEY_GRACE_S,
    client: HttpClient | None = None,
    egress: EgressPolicy | None = None,
    limits: VerifyConfig | None = None,
    fetch_timeout_s: float = FETCH_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
) -> GatewayVerifier:
    """Steps 1-5 over one resolver; ``store`` None refuses capped chains and replay checks (503).
    ``policy`` defaults to ``limits``' as a gateway takes them (web-bot-auth labels only when
    ``verify.web_bot_auth`` is true)."""
    egress = egress if egress is not None else EgressPolicy()
    if policy is None:
        policy = policy_from_config(limits if limits is not None else VerifyConfig(), gateway=True)
    verifier = build_verifier(
        policy, client=client, egress=egress, limits=limits, fetch_timeout_s=fetch_timeout_s, clock=clock
    )
    assert verifier.revocations is not None  # RequestVerifier makes one when not given
    issuers = IssuerKeys(
        verifier.resolver,
        verifier.revocations,
        egress,
        trusted=dict(trusted_issuers or {}),
        grace_s=issuer_key_grace_s,
        trusted_only=trusted_issuers_only,
    )
    return GatewayVerifier(verifier, issuers, store, gateway or GatewayPolicy(), clock=clock)
