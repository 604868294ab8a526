"""``signing_proxy.client`` is what an agent imports: its ``__all__`` is pinned, each name resolves,
it imports without the optional HTTP libraries (and says which extra to install when one is used),
and nothing else in the package imports it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from signing_proxy import client
from signing_proxy.core.jwk import SigningKey
from tests.verify.test_public_api import PACKAGE, _imported_modules

PUBLIC = [
    "PROFILES",
    "HttpxAuth",
    "KeyProvider",
    "NotSigned",
    "RequestsAuth",
    "SignedRequest",
    "Signer",
    "SigningMiddleware",
    "key_file",
    "key_store",
]

BLOCKED_IMPORT = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("httpx", "requests"):
            raise ImportError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
import signing_proxy.client as c

signer = c.Signer(c.key_file(sys.argv[1]))
print("signed", signer.sign("GET", "https://a.example/", [], b"").keyid)
print("aiohttp", c.SigningMiddleware(signer).signer is signer)
for name in ("HttpxAuth", "RequestsAuth"):
    try:
        getattr(c, name)
    except ImportError as exc:
        print(exc)
print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in ("httpx", "requests")))
exec("from signing_proxy.client import *")  # every name of __all__ resolves: the adapters are left out
print("star", sorted(n for n in c.__all__ if n.endswith("Auth")))
"""


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert client.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(client, name) is not None, name


def test_the_package_imports_and_signs_without_httpx_or_requests(tmp_path: Path) -> None:
    key = SigningKey.from_seed(b"\x41" * 32)
    path = tmp_path / "agent-key.pem"
    path.write_bytes(key.to_pem())
    path.chmod(0o600)
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=PACKAGE.parent,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        f"signed {key.thumbprint}",
        "aiohttp True",
        "HttpxAuth needs the httpx package: pip install 'signing-proxy[httpx]'",
        "RequestsAuth needs the requests package: pip install 'signing-proxy[requests]'",
        "loaded []",
        "star []",
    ]


def test_nothing_else_in_the_package_imports_the_client() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "client":
            continue
        upward = {m for m in _imported_modules(path) if m.startswith("signing_proxy.client")}
        assert upward == set(), f"{path} imports {upward}"
