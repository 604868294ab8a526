"""A real SoftHSM2 token in a temporary directory, for the PKCS#11 tests.

``SoftHsm(tmp)`` writes its own ``softhsm2.conf`` (tokens under ``tmp/tokens``), initialises one
token with ``softhsm2-util`` and gives the environment (``SOFTHSM2_CONF``, the PIN variable) that a
child process or this process needs. ``removed()`` takes the token away (its directory moved aside,
as if the device were unplugged) and brings it back on exit. The tests skip when Debian's
``softhsm2`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.keys import KeyProvider
from signing_proxy.errors import TokenError

MODULE_CANDIDATES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)
PIN = "4711-user"
SO_PIN = "0815-so-pin"
PIN_ENV = "TEST_TOKEN_PIN"


def softhsm_module() -> str:
    """The SoftHSM2 module path, or skip the test (the Debian package is not installed)."""
    pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")
    if shutil.which("softhsm2-util") is None:
        pytest.skip("softhsm2 is not installed (apt-get install softhsm2)")
    for path in MODULE_CANDIDATES:
        if Path(path).exists():
            return path
    pytest.skip("libsofthsm2.so not found")
    raise AssertionError("unreachable")


class SoftHsm:
    """One initialised token (label ``label``) in its own token directory under ``tmp``."""

    def __init__(self, tmp: Path, label: str = "agent-keys") -> None:
        self.module = softhsm_module()
        self.tmp = tmp
        self.label = label
        self.tokens = tmp / "tokens"
        self.tokens.mkdir(parents=True)
        self.conf = tmp / "softhsm2.conf"
        self.conf.write_text(
            f"directories.tokendir = {self.tokens}\nobjectstore.backend = file\nlog.level = ERROR\n"
        )
        self.add_token(label)
        self._aside = tmp / "unplugged"

    def add_token(self, label: str) -> None:
        """Initialise one more token, ``label``, in the same token directory (the same module)."""
        result = subprocess.run(
            ["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", SO_PIN, "--pin", PIN],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**os.environ, "SOFTHSM2_CONF": str(self.conf)},
        )
        assert result.returncode == 0, result.stderr

    def env(self, pin: str = PIN) -> dict[str, str]:
        return {"SOFTHSM2_CONF": str(self.conf), PIN_ENV: pin}

    def uri(self, obj: str) -> str:
        return f"pkcs11:token={self.label};object={obj}"

    def pkcs11_config(self) -> dict[str, Any]:
        """The ``signing.pkcs11`` section: this module, the PIN from ``PIN_ENV``."""
        return {"module": self.module, "pin_env": PIN_ENV}

    @contextlib.contextmanager
    def removed(self) -> Iterator[None]:
        """The token is gone (its directory moved aside) until the block ends."""
        (entry,) = list(self.tokens.iterdir())
        entry.rename(self._aside)
        try:
            yield
        finally:
            self._aside.rename(entry)


def use_in_this_process(hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this process's PKCS#11 modules at ``hsm``: SoftHSM reads SOFTHSM2_CONF at C_Initialize,
    and python-pkcs11 keeps one initialised module per process, so it is re-initialised here."""
    import pkcs11  # optional: only when softhsm_module() did not skip

    from signing_proxy.storage import pkcs11 as token_keys

    for name, value in hsm.env().items():
        monkeypatch.setenv(name, value)
    for module in list(token_keys._modules.values()):
        with module.lock:
            module.reset()
    token_keys._modules.clear()
    pkcs11.lib(hsm.module).reinitialize()


def two_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsm:
    """Two tokens, ``tok-a`` and ``tok-b``, of one SoftHSM module (one ``Pkcs11Module``, one lock),
    used in this process."""
    hsm = SoftHsm(tmp_path / "hsm", label="tok-a")
    hsm.add_token("tok-b")
    use_in_this_process(hsm, monkeypatch)
    return hsm


async def signing_outcomes(keys: KeyProvider, thumbprint: str, times: int = 3) -> list[str]:
    """``times`` signatures by ``keys``' current key, which must be the token key ``thumbprint``:
    each ``"signed"``, ``"invalid"`` or the reason of the TokenError that refused it."""
    from signing_proxy.storage.pkcs11 import TokenKey

    outcomes = []
    for _ in range(times):
        key = keys.current(time.time())
        assert isinstance(key, TokenKey)
        assert key.thumbprint == thumbprint
        try:
            signature = await key.sign_async(b"base")
        except TokenError as exc:
            outcomes.append(exc.reason)
        else:
            outcomes.append("signed" if key.public.verify(signature, b"base") else "invalid")
    return outcomes
