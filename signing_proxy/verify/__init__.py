"""The public verifier: what an exchange, a publisher edge or a relay imports to check signed requests.

Check, resolve, then verify: ``core`` checks the stack without I/O, ``directory`` and ``revocation``
fetch what it names through ``net.client`` under an ``EgressPolicy`` (bounded caches, one revoked
set per directory, pollers that fail closed), and ``core`` verifies with ``now`` given; the frozen
result is the only thing a caller should trust. ``build_verifier`` assembles all of it the one way
every verifier of the package uses. ``__all__`` below is the API, pinned by a test.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..config import TimeoutsConfig, UpstreamConfig, VerifyConfig
from ..core.disclosure import SCOPE_INSUFFICIENT, apply_disclosure, covers
from ..core.errors import VerificationError
from ..core.signatures import VerifiedSignature, VerifiedStack
from ..errors import DirectoryError
from ..net.client import FetchedResponse, HttpClient
from ..net.egress import EgressPolicy
from .build import build_verifier
from .counters import CounterStore, SqliteCounterStore, Taken
from .directory import DirectoryResolver, Fetcher, FetchResult, directory_url, http_fetcher
from .gateway import GatewayPolicy, GatewayRefusal, GatewayVerdict, GatewayVerifier
from .gateway_build import build_gateway_verifier
from .issuers import IssuerAnchor
from .revocation import RevocationPoller
from .stores import open_counter_store
from .verifier import RequestVerifier, VerifierPolicy, stack_summary

if TYPE_CHECKING:
    from .delivery import (
        DeliveryPolicy,
        DeliveryVerifier,
        VerifiedRetrieval,
        build_delivery_verifier,
        verify_delivery_request,
    )
    from .gateway_aiohttp import GATEWAY, gateway_middleware, gateway_refusal, verify_gateway_request
    from .middleware import SIGNATURE, refusal, signature_middleware, verify_aiohttp_request
    from .origin import build_verify_origin

# The aiohttp faces of the verifier, imported on first use: a relay or a gateway process, which
# verifies on the package's own engine, never loads aiohttp (about 25 MiB) for them.
_ON_AIOHTTP = {
    **dict.fromkeys(
        (
            "DeliveryPolicy",
            "DeliveryVerifier",
            "VerifiedRetrieval",
            "build_delivery_verifier",
            "verify_delivery_request",
        ),
        "delivery",
    ),
    **dict.fromkeys(
        ("GATEWAY", "gateway_middleware", "gateway_refusal", "verify_gateway_request"), "gateway_aiohttp"
    ),
    **dict.fromkeys(("SIGNATURE", "refusal", "signature_middleware", "verify_aiohttp_request"), "middleware"),
    "build_verify_origin": "origin",
}


def __getattr__(name: str) -> Any:
    module = _ON_AIOHTTP.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


__all__ = [
    "GATEWAY",
    "SCOPE_INSUFFICIENT",
    "SIGNATURE",
    "CounterStore",
    "DeliveryPolicy",
    "DeliveryVerifier",
    "DirectoryError",
    "DirectoryResolver",
    "EgressPolicy",
    "FetchResult",
    "FetchedResponse",
    "Fetcher",
    "GatewayPolicy",
    "GatewayRefusal",
    "GatewayVerdict",
    "GatewayVerifier",
    "HttpClient",
    "IssuerAnchor",
    "RequestVerifier",
    "RevocationPoller",
    "SqliteCounterStore",
    "Taken",
    "TimeoutsConfig",
    "UpstreamConfig",
    "VerificationError",
    "VerifiedRetrieval",
    "VerifiedSignature",
    "VerifiedStack",
    "VerifierPolicy",
    "VerifyConfig",
    "apply_disclosure",
    "build_delivery_verifier",
    "build_gateway_verifier",
    "build_verifier",
    "build_verify_origin",
    "covers",
    "directory_url",
    "gateway_middleware",
    "gateway_refusal",
    "http_fetcher",
    "open_counter_store",
    "refusal",
    "signature_middleware",
    "stack_summary",
    "verify_aiohttp_request",
    "verify_delivery_request",
    "verify_gateway_request",
]
