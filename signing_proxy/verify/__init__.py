"""The public verifier: what an exchange, a publisher edge or a relay imports to check signed requests.

Resolve, then verify: ``core`` parses the stack, ``directory`` and ``revocation`` fetch what it names
through ``net.client``, and ``core`` verifies with ``now`` given; the frozen result is the only thing
a caller should trust. ``__all__`` below is the API, pinned by a test.
"""

from ..config import TimeoutsConfig, UpstreamConfig
from ..core.errors import VerificationError
from ..core.signatures import VerifiedSignature, VerifiedStack
from ..errors import DirectoryError
from ..net.client import FetchedResponse, HttpClient
from .directory import DirectoryResolver, Fetcher, FetchResult, directory_url, http_fetcher
from .middleware import SIGNATURE, refusal, signature_middleware, verify_aiohttp_request
from .origin import build_verify_origin
from .revocation import RevocationPoller
from .verifier import RequestVerifier, VerifierPolicy, stack_summary

__all__ = [
    "SIGNATURE",
    "DirectoryError",
    "DirectoryResolver",
    "FetchResult",
    "FetchedResponse",
    "Fetcher",
    "HttpClient",
    "RequestVerifier",
    "RevocationPoller",
    "TimeoutsConfig",
    "UpstreamConfig",
    "VerificationError",
    "VerifiedSignature",
    "VerifiedStack",
    "VerifierPolicy",
    "build_verify_origin",
    "directory_url",
    "http_fetcher",
    "refusal",
    "signature_middleware",
    "stack_summary",
    "verify_aiohttp_request",
]
