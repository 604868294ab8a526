"""A token key is the key it claims to be, against a real SoftHSM2 token: the probe that clears a
token failure for ``/readyz`` keeps ``token-key-mismatch`` while another key sits under the label,
a private key object that is not its public key object's pair is refused at open, and a blank PIN
(``signing.pkcs11.pin`` or the URI's ``pin-value``) is refused before any login."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.errors import TokenError
from signing_proxy.service.tokenkeys import token_provider_for
from signing_proxy.storage.keystore import KeyStore
from signing_proxy.storage.pkcs11 import (
    Pkcs11KeyProvider,
    TokenKey,
    TokenSlot,
    generate_token_key,
    module_for,
    open_token_key,
    read_pin,
)
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider
from tests.softhsm import PIN, SoftHsm

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")


def slot(hsm: SoftHsm, obj: str = "agent", pin: str | None = PIN) -> TokenSlot:
    return TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri(obj)), pin)


def rw_session(hsm: SoftHsm) -> Any:
    """The token's pooled read-write session (hold the module's lock while using it)."""
    return slot(hsm).session(rw=True)


def replace_key(hsm: SoftHsm, label: str) -> None:
    """Another key pair under ``label``, as after re-initialising the token elsewhere."""
    with module_for(hsm.module).lock:
        for found in list(rw_session(hsm).get_objects({p11.Attribute.LABEL: label})):
            found.destroy()
    generate_token_key(slot(hsm, label), parse_pkcs11_uri(hsm.uri(label)))


def test_the_probe_keeps_a_mismatch_while_another_key_sits_under_the_label(hsm: SoftHsm) -> None:
    """The probe read whatever public key sat under the label and cleared the failure: /readyz
    said ready while every signature was refused with token-key-mismatch."""
    uri = parse_pkcs11_uri(hsm.uri("agent"))
    generate_token_key(slot(hsm), uri)
    key = open_token_key(slot(hsm), uri)  # by label, as signing.key names it
    provider = Pkcs11KeyProvider(key)
    assert key.public.verify(key.sign(b"base"), b"base")
    replace_key(hsm, "agent")
    with pytest.raises(TokenError) as caught:
        key.sign(b"base")
    assert caught.value.reason == "token-key-mismatch"
    assert provider.unavailable() == "token-key-mismatch"
    for _ in range(3):
        provider.probe()
        assert provider.unavailable() == "token-key-mismatch"  # the token answers, not with our key
    with pytest.raises(TokenError) as again:
        key.sign(b"base")
    assert again.value.reason == "token-key-mismatch"


def test_a_store_probe_clears_the_failure_through_its_signing_key(tmp_path: Path, hsm: SoftHsm) -> None:
    """One slot per token: a retired key whose label now holds another key keeps failing, but the
    probe asks through the signing key (the one /readyz reports on), so the token is ready again."""
    token_slot = slot(hsm, "old")

    def open_key(uri: str, public: Any) -> TokenKey:
        return TokenKey(token_slot, parse_pkcs11_uri(uri), public)

    now = time.time()
    generate_token_key(token_slot, parse_pkcs11_uri(hsm.uri("old")))
    old = open_token_key(token_slot, parse_pkcs11_uri(hsm.uri("old")))
    new = generate_token_key(token_slot, parse_pkcs11_uri(hsm.uri("new")))
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(now - 60, lifetime_s=86_400, key=old)
    store.rotate(now - 30, activate_in_s=0, grace_s=3600, lifetime_s=86_400, key=new)
    provider = TokenStoreKeyProvider(store)
    current = provider.current(time.time())
    assert current is not None
    assert current.thumbprint == new.thumbprint
    retired = provider.state().private[old.thumbprint]
    assert isinstance(retired, TokenKey)
    replace_key(hsm, "old")
    with pytest.raises(TokenError) as caught:
        retired.sign(b"directory proof")
    assert caught.value.reason == "token-key-mismatch"
    assert provider.unavailable() == "token-key-mismatch"  # the slot is shared
    provider.probe()
    assert provider.unavailable() is None
    assert current.public.verify(current.sign(b"base"), b"base")


def mismatched_pair(hsm: SoftHsm) -> None:
    """Under the label ``agent``: the private key of one pair and the public key of another."""
    generate_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    generate_token_key(slot(hsm, "other"), parse_pkcs11_uri(hsm.uri("other")))
    public = p11.ObjectClass.PUBLIC_KEY
    with module_for(hsm.module).lock:
        session = rw_session(hsm)
        (ours,) = session.get_objects({p11.Attribute.CLASS: public, p11.Attribute.LABEL: "agent"})
        ours.destroy()
        (theirs,) = session.get_objects({p11.Attribute.CLASS: public, p11.Attribute.LABEL: "other"})
        theirs[p11.Attribute.LABEL] = "agent"


def test_a_private_key_of_another_pair_is_refused_at_open(hsm: SoftHsm) -> None:
    """The keyid came from the public key object alone: with the private key of pair A and the
    public key of pair B under one label, the proxy started ready and every signature was invalid."""
    mismatched_pair(hsm)
    with pytest.raises(TokenError) as caught:
        open_token_key(slot(hsm), parse_pkcs11_uri(hsm.uri("agent")))
    assert caught.value.reason == "token-key-mismatch"
    assert "object 'agent'" in str(caught.value)
    assert PIN not in str(caught.value)
    config = parse_config({"signing": {"key": hsm.uri("agent"), "pkcs11": hsm.pkcs11_config()}})
    with pytest.raises(TokenError) as at_start:
        token_provider_for(config)  # `run` prints it and exits 2
    assert at_start.value.reason == "token-key-mismatch"
    assert str(at_start.value).startswith("signing.key: ")


def test_a_key_store_entry_of_another_pair_never_signs_and_stays_unready(hsm: SoftHsm) -> None:
    """A key store's token entry is not opened at start (the index gives its public key): the pair
    was never proved, so it signed invalid signatures while /readyz said ready. The challenge is now
    made whenever a handle is taken, and by the probe."""
    mismatched_pair(hsm)
    entry_slot = slot(hsm)
    uri = parse_pkcs11_uri(hsm.uri("agent"))
    entry = TokenKey(entry_slot, uri, entry_slot.public_key(uri))  # as the key store makes it
    with pytest.raises(TokenError) as caught:
        entry.sign(b"base")
    assert caught.value.reason == "token-key-mismatch"
    assert entry_slot.failure == "token-key-mismatch"
    assert entry.probe() is False  # the probe proves the pair too: never ready again
    assert entry_slot.failure == "token-key-mismatch"


def counted_logins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per login the token is asked for (each session opened logs in with the PIN)."""
    logins: list[str] = []
    real_open = p11.Token.open

    def counted(token: Any, *args: Any, **kwargs: Any) -> Any:
        logins.append("login" if kwargs.get("user_pin") is not None else "no login")
        return real_open(token, *args, **kwargs)

    monkeypatch.setattr(p11.Token, "open", counted)
    return logins


@pytest.mark.parametrize("blank", ["", " ", " \t\n"])
def test_a_blank_pin_is_refused_before_any_login(
    hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """``signing.pkcs11.pin`` or ``pin-value=`` blank was sent to the token as the PIN (a wrong PIN
    counts toward its lockout), while a blank pin_env or pin_file was refused as token-pin-missing."""
    uri = parse_pkcs11_uri(hsm.uri("agent"))
    generate_token_key(slot(hsm), uri)
    with module_for(hsm.module).lock:
        module_for(hsm.module).reset()  # no pooled login left: opening the key would log in again
    plain = parse_pkcs11_uri("pkcs11:token=t;object=k")
    with pytest.raises(TokenError) as caught:
        read_pin(pin=blank, pin_env=None, pin_file=None, uri=plain)
    assert (caught.value.reason, caught.value.detail) == (
        "token-pin-missing",
        "signing.pkcs11.pin is empty or blank",
    )
    in_uri = parse_pkcs11_uri(f"pkcs11:token=t;object=k?pin-value={quote(blank)}")
    with pytest.raises(TokenError) as caught:
        read_pin(pin=None, pin_env=None, pin_file=None, uri=in_uri)
    assert caught.value.reason == "token-pin-missing"

    logins = counted_logins(monkeypatch)
    pkcs11 = {"module": hsm.module, "pin": blank}
    by_pin = {"signing": {"key": hsm.uri("agent"), "pkcs11": pkcs11}}
    by_uri = {"signing": {"key": f"{hsm.uri('agent')}?pin-value=", "pkcs11": {"module": hsm.module}}}
    for raw in (by_pin, by_uri):
        with pytest.raises(TokenError) as refused:
            token_provider_for(parse_config(raw))
        assert refused.value.reason == "token-pin-missing"
        assert str(refused.value).endswith("(token-pin-missing)")  # run's line names the reason
    assert logins == []  # refused before the token is asked
    assert read_pin(pin=f" {PIN}\n", pin_env=None, pin_file=None, uri=plain) == PIN  # stripped, as the others
