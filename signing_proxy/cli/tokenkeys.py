"""``keys generate --pkcs11 URI`` and ``keys show --pkcs11 URI``: Ed25519 key pairs on a PKCS#11 token.

The module and the PIN come from ``signing.pkcs11`` (``--config``, ``SIGNING_PROXY_*``) or the URI
(``module-path``, ``pin-source``). The private key is created sensitive and non-extractable; only
its thumbprint and public JWK are ever printed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from ..config import Config
from ..core.pkcs11_uri import Pkcs11Uri
from ..errors import CliError, ConfigError, TokenError
from ..service.tokenkeys import token_slot_for
from ..storage.pkcs11 import TokenKey, TokenSlot, generate_token_key, open_token_key
from .common import config_from

__all__ = ["cmd_token_generate", "cmd_token_show", "token_key_at", "token_key_for_store"]


def cmd_token_generate(args: argparse.Namespace) -> int:
    return _print_token_key(args, generate_token_key)


def cmd_token_show(args: argparse.Namespace) -> int:
    return _print_token_key(args, open_token_key)


def _print_token_key(args: argparse.Namespace, get: Callable[[TokenSlot, Pkcs11Uri], TokenKey]) -> int:
    """``keys generate|show --pkcs11 URI``: the key pair ``get`` finds (or makes) on the token."""
    config = config_from(args)
    try:
        slot = token_slot_for(config, args.pkcs11, where="--pkcs11")
        key = get(slot, slot.uri)
    except (TokenError, ConfigError) as exc:
        raise CliError(f"{exc} ({exc.reason})" if isinstance(exc, TokenError) else str(exc)) from None
    print_token_key(key)
    return 0


def token_key_at(config: Config, uri_text: str, where: str) -> TokenKey:
    """The key pair ``uri_text`` (the value of ``where``) names on the token, its public half read
    now as ``keys show --pkcs11`` reads it; CliError names ``where`` and the reason, never the PIN."""
    try:
        slot = token_slot_for(config, uri_text, where=where)
    except (TokenError, ConfigError) as exc:
        raise CliError(f"{exc} ({exc.reason})" if isinstance(exc, TokenError) else str(exc)) from None
    try:
        return open_token_key(slot, slot.uri)
    except TokenError as exc:
        raise CliError(f"{where}: {exc.detail} ({exc.reason})") from None


def token_key_for_store(config: Config, uri_text: str) -> TokenKey:
    """``keys rotate --pkcs11 URI``: the key pair ``uri_text`` names, made on the token when absent."""
    try:
        slot = token_slot_for(config, uri_text, where="--pkcs11")
        try:
            key = open_token_key(slot, slot.uri)
        except TokenError as exc:
            if exc.reason != "token-key-missing":
                raise
            key = generate_token_key(slot, slot.uri)
            print(f"generated {key.thumbprint} on the token: {key.uri}")
    except (TokenError, ConfigError) as exc:
        raise CliError(f"{exc} ({exc.reason})" if isinstance(exc, TokenError) else str(exc)) from None
    return key


def print_token_key(key: TokenKey) -> None:
    print(f"thumbprint: {key.thumbprint}")
    print(f"pkcs11:     {key.uri}")
    print(f"public jwk: {json.dumps(key.public.jwk())}")
