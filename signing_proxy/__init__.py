"""signing-proxy: a forward proxy that signs every request an AI agent sends (RFC 9421, Ed25519)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("signing-proxy")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
