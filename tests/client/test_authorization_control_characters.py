"""The in-process ``Signer`` refuses an ``Authorization`` value holding a control character (NUL, CR,
LF, DEL, ...) as the proxy does: ``400 malformed-request``, never signed, never sent. It signed such
a value and handed it to the HTTP library to send, where the proxy's parser refuses the request.
RFC 9110 section 5.5: a field value holds no control character but HTAB."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from signing_proxy.client import NotSigned, Signer
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from tests.harness import WAIT_S, ProxyProcess

TOKEN = "SECRET-TOKEN"
CONTROLS = ["\x00", "\x01", "\x08", "\x0b", "\x1f", "\x7f", "\r", "\n", "\r\n X-Injected: 1"]


def signer() -> Signer:
    return Signer(StaticKeyProvider(SigningKey.generate()))


@pytest.mark.parametrize("control", CONTROLS, ids=repr)
def test_a_control_character_in_authorization_is_refused(control: str) -> None:
    with pytest.raises(NotSigned) as refused:
        signer().sign("GET", "https://example.com/", [("Authorization", f"Bearer {TOKEN}{control}x")], b"")
    assert refused.value.status == 400
    assert refused.value.reason == "malformed-request"
    assert TOKEN not in str(refused.value)


def test_a_tab_inside_authorization_is_signed_as_it_is() -> None:
    """HTAB is allowed inside a field value (RFC 9110 section 5.5): signed, as the proxy signs it."""
    signed = signer().sign("GET", "https://example.com/", [("Authorization", f"Bearer {TOKEN}\tx")], b"")
    assert signed is not None
    assert ("Authorization", f"Bearer {TOKEN}\tx") in signed.fields


@pytest.mark.integration
def test_the_proxy_answers_these_values_with_the_same_reason(tmp_path: Path) -> None:
    with ProxyProcess(tmp_path) as proxy:
        for control in ("\x00", "\x01", "\x7f", "\r", "\n"):
            request = (
                "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
                f"Authorization: Bearer {TOKEN}{control}x\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 400 "), answer
            assert b'"reason":"malformed-request"' in answer
