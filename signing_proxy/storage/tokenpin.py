"""The user PIN of a PKCS#11 token (``signing.pkcs11``: ``pin``, ``pin_env``, ``pin_file``, or the
URI's ``pin-value`` / ``pin-source``), read for each ``storage.pkcs11.TokenSlot`` configured.

A blank PIN is refused before any login, never tried as an empty one: a wrong PIN counts toward the
token's lockout. The PIN never appears in a message: a refusal names where it was looked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from ..core.pkcs11_uri import Pkcs11Uri
from ..errors import TokenError
from .files import PrivateFileError, read_private

__all__ = ["MAX_PIN_FILE_BYTES", "read_pin"]

MAX_PIN_FILE_BYTES: Final = 1024  # our choice: far above any PIN


def read_pin(
    *,
    pin: str | None,
    pin_env: str | None,
    pin_file: str | None,
    uri: Pkcs11Uri,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The user PIN from the configuration (``pin``, ``pin_env``, ``pin_file``), else the URI's
    ``pin-value`` or ``pin-source`` (a file path or ``file:`` URI); None when none is given.
    A file must be owner-only. Each is stripped, and a blank one is no PIN: refused, never tried as
    an empty one (a wrong PIN counts toward the token's lockout). Raises TokenError
    ``token-pin-missing``; the PIN is never in it."""
    env = os.environ if environ is None else environ
    if pin is not None:
        return _not_blank(pin, "signing.pkcs11.pin")
    if pin_env is not None:
        value = env.get(pin_env, "").strip()  # blank is no PIN: refused, never tried as an empty one
        if not value:
            raise TokenError("token-pin-missing", f"the environment variable {pin_env} is not set or blank")
        return value
    source = pin_file
    if source is None and uri.pin_value is not None:
        return _not_blank(uri.pin_value, "the URI's pin-value")
    if source is None and uri.pin_source is not None:
        if uri.pin_source.startswith("|"):  # RFC 7512's example of a command: never run from a URI
            raise TokenError(
                "token-pin-missing", "pin-source names a command ('|...'); give a PIN file (or pin_env)"
            )
        source = uri.pin_source.removeprefix("file://").removeprefix("file:")
    if source is None:
        return None
    path = Path(source).expanduser()
    try:
        data = read_private(path, max_bytes=MAX_PIN_FILE_BYTES)
    except PrivateFileError as exc:
        raise TokenError("token-pin-missing", f"the PIN file {path}: {exc.detail}") from None
    try:
        text = data[:MAX_PIN_FILE_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        raise TokenError("token-pin-missing", f"the PIN file {path} is not UTF-8 text") from None
    return _not_blank(text, f"the PIN file {path}")


def _not_blank(value: str, what: str) -> str:
    """``value`` stripped; refused (``token-pin-missing``) when nothing is left, before any login."""
    value = value.strip()
    if not value:
        raise TokenError("token-pin-missing", f"{what} is empty or blank")
    return value
