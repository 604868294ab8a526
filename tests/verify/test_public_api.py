"""``signing_proxy.verify`` is what an exchange imports: its ``__all__`` is pinned, each name resolves,
and it stands below the proxy (no import from proxy/, service/ or cli/)."""

from __future__ import annotations

import ast
from pathlib import Path

from signing_proxy import verify

PUBLIC = [
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

PACKAGE = Path(verify.__file__).resolve().parents[1]
HIGHER = ("proxy", "service", "cli")


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert verify.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(verify, name) is not None, name


def test_the_client_factory_builds_a_standalone_client() -> None:
    client = verify.HttpClient.standalone(
        verify.UpstreamConfig(), verify.TimeoutsConfig(connect_s=2, read_s=3)
    )
    assert (client.pool.connect_timeout_s, client.pool.read_timeout_s, client.via) == (2, 3, None)


def _imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of every package module ``path`` imports (functions and TYPE_CHECKING too)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1]  # a module's package; an __init__'s own package
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("signing_proxy")}


def test_verify_and_the_client_import_nothing_above_them() -> None:
    files = [*sorted((PACKAGE / "verify").glob("*.py")), PACKAGE / "net" / "client.py"]
    for path in files:
        upward = {m for m in _imported_modules(path) if m.split(".")[1] in HIGHER}
        assert upward == set(), f"{path.name} imports {upward}"
    client_imports = _imported_modules(PACKAGE / "net" / "client.py")
    assert not {m for m in client_imports if m.split(".")[1] == "verify"}
