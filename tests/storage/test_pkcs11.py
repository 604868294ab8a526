"""``storage.pkcs11`` against a real SoftHSM2 token: key pairs made on the token, CKM_EDDSA
signatures that verify with the public key read from it, the private key never extractable,
clear refusals (PIN, token, key), a token that goes away and comes back, and a busy token that
never holds up the event loop."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.pkcs11_uri import Pkcs11Uri, parse_pkcs11_uri
from signing_proxy.errors import TokenError
from signing_proxy.service.tokenkeys import token_provider_for
from signing_proxy.storage.pkcs11 import (
    Pkcs11KeyProvider,
    TokenKey,
    TokenSlot,
    generate_token_key,
    module_for,
    open_token_key,
    read_pin,
)
from tests.softhsm import PIN, PIN_ENV, SoftHsm

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")


def slot(hsm: SoftHsm, obj: str = "agent", pin: str = PIN, timeout_s: float = 5.0) -> TokenSlot:
    return TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri(obj)), pin, timeout_s)


def test_generated_key_signs_on_the_token_and_verifies_with_its_public_key(hsm: SoftHsm) -> None:
    made = generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    opened = open_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    assert opened.thumbprint == made.thumbprint  # read back from the token: the same key
    signature = opened.sign(b"signature base")
    assert len(signature) == 64
    assert opened.public.verify(signature, b"signature base")
    assert not opened.public.verify(signature, b"another base")
    assert opened.blocking


def test_the_private_key_is_sensitive_and_never_extractable(hsm: SoftHsm) -> None:
    key = generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    with pytest.raises(KeyFormatError) as caught:
        key.to_pem()
    assert caught.value.reason == "key-not-extractable"
    with pytest.raises(KeyFormatError):
        key.to_jwk()
    module = module_for(hsm.module)
    with module.lock:
        session = key.slot.session()
        private = session.get_key(object_class=p11.ObjectClass.PRIVATE_KEY, label="agent")
        assert private[p11.Attribute.EXTRACTABLE] is False
        assert private[p11.Attribute.SENSITIVE] is True
        assert private[p11.Attribute.KEY_TYPE] == p11.KeyType.EC_EDWARDS


def test_generate_refuses_a_key_that_exists(hsm: SoftHsm) -> None:
    generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    with pytest.raises(TokenError) as caught:
        generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    assert caught.value.reason == "token-key-exists"


def test_wrong_pin_is_refused_by_name_and_never_shown(hsm: SoftHsm) -> None:
    with pytest.raises(TokenError) as caught:
        open_token_key(slot(hsm, pin="9999-wrong"), parse_pkcs11_uri(hsm.uri("agent")))
    assert caught.value.reason == "token-pin-incorrect"
    assert "refused the PIN" in str(caught.value)
    assert "9999-wrong" not in str(caught.value)


def test_missing_token_and_missing_key_are_named(hsm: SoftHsm) -> None:
    uri = parse_pkcs11_uri("pkcs11:token=no-such-token;object=agent")
    with pytest.raises(TokenError) as caught:
        open_token_key(TokenSlot(module_for(hsm.module), uri, PIN), uri)
    assert caught.value.reason == "token-missing"
    assert "no-such-token" in str(caught.value)
    with pytest.raises(TokenError) as caught:
        open_token_key(slot(hsm, "absent"), parse_pkcs11_uri(hsm.uri("absent")))
    assert caught.value.reason == "token-key-missing"


def test_unloadable_module_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-module.so"
    bogus.write_bytes(b"not ELF")
    uri = parse_pkcs11_uri("pkcs11:token=t;object=k")
    with pytest.raises(TokenError) as caught:
        open_token_key(TokenSlot(module_for(str(bogus)), uri, PIN), uri)
    assert caught.value.reason == "token-module-unloadable"


def test_a_removed_token_fails_then_recovers(hsm: SoftHsm) -> None:
    key = generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    provider = Pkcs11KeyProvider(key)
    assert provider.unavailable() is None
    with hsm.removed():
        with pytest.raises(TokenError) as caught:
            key.sign(b"base")
        assert caught.value.reason in ("token-unavailable", "token-missing")
        assert provider.unavailable() is not None
        provider.probe()
        assert provider.unavailable() is not None  # still gone
    provider.probe()
    assert provider.unavailable() is None
    assert key.public.verify(key.sign(b"base"), b"base")


def test_a_busy_token_never_holds_up_the_loop_and_times_out(hsm: SoftHsm) -> None:
    key = generate_token_key(slot(hsm, timeout_s=0.5), parse_pkcs11_uri(hsm.uri("agent")))
    busy = key.slot.module.lock
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:  # another caller is inside the module: our signature must wait
        with busy:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)

    async def scenario() -> tuple[int, str, str | None]:
        ticks = 0
        signing = asyncio.ensure_future(key.sign_async(b"base"))
        while not signing.done():  # the loop keeps running other work meanwhile
            ticks += 1
            await asyncio.sleep(0)
        try:
            signing.result()
        except TokenError as exc:
            return ticks, exc.reason, key.slot.failure  # not ready while the token does not answer
        return ticks, "signed", key.slot.failure

    try:
        ticks, outcome, failure = asyncio.run(scenario())
    finally:
        release.set()
        holder.join(10)
    stalled = key.slot.module.stalled  # the call that timed out, now free to finish
    assert stalled is not None
    futures.wait([stalled], timeout=10)
    assert outcome == "token-unavailable"
    assert failure == "token-timeout"
    assert ticks > 0
    # once the module is free again, the same key signs (and the failure is cleared)
    signature = asyncio.run(key.sign_async(b"base"))
    assert key.public.verify(signature, b"base")
    assert key.slot.failure is None


def test_nothing_piles_up_behind_a_token_that_hangs(hsm: SoftHsm) -> None:
    """Each signature that timed out left its call queued behind the hung one (a future and a
    signature base per request, for as long as the token hung); now, while a call that timed out
    still runs, the next are refused at once and nothing is queued."""
    key = generate_token_key(slot(hsm, timeout_s=0.2), parse_pkcs11_uri(hsm.uri("agent")))
    release, held = threading.Event(), threading.Event()

    def hold() -> None:  # the token hangs: a call is inside the module and never returns meanwhile
        with key.slot.module.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    try:
        with pytest.raises(TokenError):
            key.sign_within(b"base")  # times out, still running: the module is stalled
        for _ in range(200):
            with pytest.raises(TokenError, match="has not finished a call that timed out"):
                key.sign_within(b"base")
            with pytest.raises(TokenError, match="has not finished a call that timed out"):
                asyncio.run(key.sign_async(b"base"))
        assert key.slot.module.executor._queue.qsize() == 0
    finally:
        release.set()
        holder.join(10)
    stalled = key.slot.module.stalled
    assert stalled is not None
    futures.wait([stalled], timeout=10)  # the hung call ends: the token is asked again
    assert key.public.verify(key.sign_within(b"base"), b"base")


def test_pin_sources(tmp_path: Path) -> None:
    uri = parse_pkcs11_uri("pkcs11:token=t;object=k")
    assert read_pin(pin="1", pin_env=None, pin_file=None, uri=uri) == "1"
    assert read_pin(pin=None, pin_env="P", pin_file=None, uri=uri, environ={"P": "2\n"}) == "2"
    with pytest.raises(TokenError) as caught:
        read_pin(pin=None, pin_env="P", pin_file=None, uri=uri, environ={})
    assert caught.value.reason == "token-pin-missing"
    pin_file = tmp_path / "pin"
    pin_file.write_text("3\n")
    pin_file.chmod(0o600)
    assert read_pin(pin=None, pin_env=None, pin_file=str(pin_file), uri=uri) == "3"
    from_uri = parse_pkcs11_uri(f"pkcs11:token=t;object=k?pin-source=file:{pin_file}")
    assert read_pin(pin=None, pin_env=None, pin_file=None, uri=from_uri) == "3"
    pin_file.chmod(0o644)  # readable by others: refused, like a key file
    with pytest.raises(TokenError) as caught:
        read_pin(pin=None, pin_env=None, pin_file=str(pin_file), uri=uri)
    assert caught.value.reason == "token-pin-missing"
    assert read_pin(pin=None, pin_env=None, pin_file=None, uri=uri) is None
    # RFC 7512 allows "|" in a query value (its example of a PIN from a command); no command is run
    command = parse_pkcs11_uri("pkcs11:token=t;object=k?pin-source=|/usr/bin/get-pin")
    with pytest.raises(TokenError) as caught:
        read_pin(pin=None, pin_env=None, pin_file=None, uri=command)
    assert caught.value.reason == "token-pin-missing"
    assert "names a command" in caught.value.detail


def counted_logins(module: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One "login" appended each time ``module`` opens a session (each logs in)."""
    logins: list[str] = []
    real_session = module.session

    def counted(uri: object, pin: str | None, *, rw: bool = False) -> object:
        logins.append("login")
        return real_session(uri, pin, rw=rw)

    monkeypatch.setattr(module, "session", counted)
    return logins


def test_a_refused_pin_is_never_tried_again(hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch) -> None:
    made = generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    module = module_for(hsm.module)
    with module.lock:
        module.reset()  # no pooled login left: the next session logs in again
    refused = slot(hsm, pin="1111-wrong")
    logins = counted_logins(module, monkeypatch)
    key = TokenKey(refused, made.uri, made.public)
    with pytest.raises(TokenError) as caught:
        key.sign(b"base")
    assert caught.value.reason == "token-pin-incorrect"
    assert logins == ["login"]  # refused once, not retried by the module either
    provider = Pkcs11KeyProvider(key)
    for _ in range(3):
        provider.probe()
        with pytest.raises(TokenError):
            key.sign(b"base")
    assert logins == ["login"]  # neither probes nor signatures try the PIN again
    assert provider.unavailable() == "token-pin-incorrect"


@pytest.mark.parametrize("blank", ["", "  ", "\n", " \t\n"])
def test_a_blank_pin_file_is_refused(tmp_path: Path, blank: str) -> None:
    """As a blank pin_env: a PIN file of blanks was read as the empty PIN and tried."""
    pin_file = tmp_path / "pin"
    pin_file.write_text(blank)
    pin_file.chmod(0o600)
    uri = parse_pkcs11_uri(f"pkcs11:token=t;object=k?pin-source=file:{pin_file}")
    for given, named in ((str(pin_file), None), (None, uri)):
        with pytest.raises(TokenError) as caught:
            read_pin(pin=None, pin_env=None, pin_file=given, uri=named or parse_pkcs11_uri("pkcs11:object=k"))
        assert (caught.value.reason, caught.value.detail) == (
            "token-pin-missing",
            f"the PIN file {pin_file} is empty or blank",
        )


@pytest.mark.parametrize("blank", ["", "  ", "\n", " \t\n"])
def test_a_blank_pin_env_is_refused_and_never_tried(
    hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """``pin_env`` naming a variable set to blanks was stripped after the emptiness check: the token
    was asked to log in with an empty PIN (refused as ``token-pin-incorrect``, a login a token may
    count against the PIN) instead of the documented ``token-pin-missing`` before any login."""
    uri = parse_pkcs11_uri(hsm.uri("agent"))
    with pytest.raises(TokenError) as caught:
        read_pin(pin=None, pin_env="P", pin_file=None, uri=uri, environ={"P": blank})
    assert caught.value.reason == "token-pin-missing"

    generate_token_key(slot(hsm), uri)
    module = module_for(hsm.module)
    with module.lock:
        module.reset()  # no pooled login left: opening the key would log in again
    logins = counted_logins(module, monkeypatch)
    monkeypatch.setenv(PIN_ENV, blank)
    config = parse_config({"signing": {"key": hsm.uri("agent"), "pkcs11": hsm.pkcs11_config()}})
    with pytest.raises(TokenError) as caught:
        token_provider_for(config)
    assert caught.value.reason == "token-pin-missing"
    assert logins == []  # refused before the token is asked


def test_a_pin_in_a_label_is_never_in_a_token_error(hsm: SoftHsm) -> None:
    """The messages naming the key (no such key: storage.pkcs11 ``_read_public``) or the token (no
    such token: ``Pkcs11Module.session``) printed a label verbatim; ``parse_pkcs11_uri`` now refuses
    such a label, and ``describe()`` hides a pin-value in one made otherwise."""
    module = module_for(hsm.module)
    for uri, reason in (
        (Pkcs11Uri(token=hsm.label, object=f"agent&pin-value={PIN}"), "token-key-missing"),
        (Pkcs11Uri(token=f"{hsm.label}&pin-value={PIN}", object="agent"), "token-missing"),
    ):
        with pytest.raises(TokenError) as caught:
            open_token_key(TokenSlot(module, uri, PIN), uri)
        assert caught.value.reason == reason
        assert "pin-value=(not shown)" in str(caught.value)
        assert PIN not in str(caught.value) + repr(TokenSlot(module, uri, PIN))
