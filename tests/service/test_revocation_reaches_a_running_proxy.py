"""``keys revoke`` reaches a running ``signing-proxy run`` that cannot open a key another configuration
added to its store (``keys rotate --pkcs11`` with ``signing.pkcs11``; the proxy has none).

The fault: the proxy's reload failed on the token entry and kept its whole previous state, so the
revoked key went on signing and the publication listener served the old, empty revocation list,
while ``keys revoke`` had printed "it never signs again".
"""

from __future__ import annotations

import time
from pathlib import Path

import requests

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import parse_directory, parse_revocation_list
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.storage.keystore import KeyStore
from signing_proxy.storage.pkcs11 import TokenKey, TokenSlot, module_for
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, free_port, run_cli, wait_for

DIRECTORY = "/.well-known/http-message-signatures-directory"
REVOCATIONS = "/.well-known/http-message-signatures-revocations.json"


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def test_a_revoked_key_stops_signing_and_is_listed_though_a_token_key_cannot_be_opened(
    tmp_path: Path,
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "signing": {"key": None, "signature_agent": base},  # the key store signs; no signing.pkcs11
        "publish": {"listen": f"127.0.0.1:{port}", "domain": "agent.example", "public_url": base},
    }
    with VerifyingOrigin(resolve_directories=True) as origin, ProxyProcess(tmp_path, config) as proxy:
        http = session()
        through = {"http": proxy.url}
        assert http.get(origin.url("/a"), proxies=through, timeout=WAIT_S).status_code == 200
        (first,) = origin.arrivals[-1].keyids

        # another configuration (with the token's module and PIN) adds a key on a token
        uri = parse_pkcs11_uri("pkcs11:token=agent-keys;object=agent-2")
        slot = TokenSlot(module_for("/nonexistent/libtoken.so"), uri)
        on_token = TokenKey(slot, uri, SigningKey.generate().public)
        KeyStore(tmp_path / "data").rotate(time.time(), key=on_token, activate_in_s=3600)

        revoked = run_cli("keys", "revoke", "--config", str(tmp_path / "config.yaml"), "--", first)
        assert revoked.returncode == 0, revoked.stderr
        assert "it never signs again" in revoked.stdout

        def listed() -> bool:
            body = http.get(base + REVOCATIONS, timeout=WAIT_S).content
            return first in parse_revocation_list(body).revoked

        wait_for(listed, "the running proxy's revocation list to list the revoked key")
        directory = parse_directory(http.get(base + DIRECTORY, timeout=WAIT_S).content)
        assert [k.thumbprint for k in directory.keys] == [on_token.thumbprint]
        arrived = len(origin.arrivals)
        refused = http.get(origin.url("/b"), proxies=through, timeout=WAIT_S)
        assert refused.status_code == 503  # the token key cannot sign here; nothing unsigned leaves
        assert refused.json()["reason"] == "no-valid-signing-key"
        assert len(origin.arrivals) == arrived
        assert any(on_token.thumbprint in line and "not opened" in line for line in proxy.stderr_lines)
