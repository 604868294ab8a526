"""``signing.pkcs11``: how to reach a key held on a PKCS#11 token (``signing.key: pkcs11:...``).

The module (the vendor's ``.so``) and the user PIN come from here, or from the URI's
``module-path`` and ``pin-source``/``pin-value`` (RFC 7512); this section wins where both say. The PIN
is read at start-up from exactly one place and is never logged (``pin`` is declared a secret: masked
by ``config check``, left out of repr(), see ``masking.py``).
"""

from __future__ import annotations

from ..core.errors import KeyFormatError
from ..core.pkcs11_uri import is_pkcs11_uri, parse_pkcs11_uri
from ..errors import ConfigError
from .checks import positive
from .masking import ENV_NAME, PIN, secret, section

__all__ = ["Pkcs11Config", "check_pkcs11_key"]


@section
class Pkcs11Config:
    """Where the PKCS#11 module and the token's user PIN come from (``signing.key: pkcs11:...``)."""

    module: str | None = None  # path of the PKCS#11 module; None: the URI's module-path
    pin_env: str | None = secret(ENV_NAME, None)  # environment variable holding the user PIN
    pin_file: str | None = None  # owner-only (0600) file holding the user PIN
    # the PIN itself (prefer pin_env or pin_file); masked by `config check`, left out of repr()
    pin: str | None = secret(PIN, None)
    timeout_s: float = 5.0  # one signature on the token; slower: 503 signing-token-unavailable

    def _check(self, path: str) -> None:
        given = [name for name in ("pin_env", "pin_file", "pin") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"{path}: set at most one of pin_env, pin_file and pin (got {', '.join(given)})"
            )
        if self.pin_env is not None and not self.pin_env:
            raise ConfigError(f"{path}.pin_env: must name an environment variable")
        positive(self.timeout_s, f"{path}.timeout_s", maximum=60)


def check_pkcs11_key(key: str | None, path: str) -> None:
    """Refuse a ``signing.key`` that uses the ``pkcs11:`` scheme but is not a valid key URI."""
    if key is None or not is_pkcs11_uri(key):
        return
    try:
        parse_pkcs11_uri(key)
    except KeyFormatError as exc:
        raise ConfigError(f"{path}: {exc.detail} (RFC 7512 PKCS#11 URI)") from None
