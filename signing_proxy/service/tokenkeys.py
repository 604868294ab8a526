"""Opening the key of ``signing.key: pkcs11:...`` at start-up, with the module and PIN of ``signing.pkcs11``.

Every refusal is a ``TokenError`` whose message names the reason (no such token, PIN refused, no
such key, module not loadable) and the key path, never the PIN: ``run`` prints it and exits 2.
"""

from __future__ import annotations

import logging

from ..config import Config
from ..core.errors import KeyFormatError
from ..core.jwk import PublicKey, SigningKey
from ..core.pkcs11_uri import parse_pkcs11_uri
from ..errors import ConfigError, TokenError
from ..storage.keystore import TokenKeys
from ..storage.pkcs11 import Pkcs11KeyProvider, TokenKey, TokenSlot, module_for, open_token_key, read_pin

__all__ = ["token_keys_for", "token_provider_for", "token_slot_for"]

log = logging.getLogger("signing_proxy")


def token_slot_for(config: Config, uri_text: str, where: str = "signing.key") -> TokenSlot:
    """The token ``uri_text`` names, reached with ``signing.pkcs11``'s module and PIN (not yet opened)."""
    section = config.signing.pkcs11
    try:
        uri = parse_pkcs11_uri(uri_text)
    except KeyFormatError as exc:
        raise ConfigError(f"{where}: {exc.detail}") from None
    module = section.module or uri.module_path
    if not module:
        raise ConfigError(f"signing.pkcs11.module: required for {where} (or module-path in the URI)")
    try:
        pin = read_pin(pin=section.pin, pin_env=section.pin_env, pin_file=section.pin_file, uri=uri)
    except TokenError as exc:
        raise TokenError(exc.reason, f"{where}: {exc.detail} ({exc.reason})") from None
    return TokenSlot(module_for(module), uri, pin, section.timeout_s)


def token_provider_for(config: Config) -> Pkcs11KeyProvider:
    """``signing.key: pkcs11:...``: the token key, its public key read now (the token must answer)."""
    key_text = config.signing.key or ""
    slot = token_slot_for(config, key_text)
    try:
        key = open_token_key(slot, slot.uri)
    except TokenError as exc:
        raise TokenError(exc.reason, f"signing.key: {exc.detail} ({exc.reason})") from None
    log.info(
        "signing with %s, keyid %s (the private key stays on the token)", slot.uri.describe(), key.thumbprint
    )
    return Pkcs11KeyProvider(key)


def token_keys_for(config: Config) -> TokenKeys:
    """How the key store opens the token keys its index names: one ``TokenSlot`` per token (so one
    pooled session and one health state), reached with ``signing.pkcs11``'s module and PIN. The
    token is not contacted here: a key is checked against its public key when it first signs."""
    slots: dict[tuple[str | None, ...], TokenSlot] = {}

    def open_key(uri_text: str, public: PublicKey) -> SigningKey:
        slot = token_slot_for(config, uri_text, where="key store entry")
        token = (slot.module.path, slot.uri.token, slot.uri.serial, slot.uri.manufacturer, slot.uri.model)
        shared = slots.setdefault(token, slot)
        return TokenKey(shared, slot.uri, public)

    return open_key
