"""Sign inside a Python agent: the proxy's signing, one import away, for httpx, requests and aiohttp.

One ``Signer`` (the proxy's pipeline: profile, ``Content-Digest``, bearer credentials, Requester
injection, key choice) and one adapter per HTTP library, each signing the request as the library
sends it::

    signer = Signer.from_config("signing-proxy.yaml")          # or Signer(key_file("agent-key.pem"))
    httpx.Client(auth=HttpxAuth(signer))                       # pip install 'signing-proxy[httpx]'
    requests.get(url, auth=RequestsAuth(signer))               # pip install 'signing-proxy[requests]'
    aiohttp.ClientSession(middlewares=(SigningMiddleware(signer),))

``HttpxAuth`` and ``RequestsAuth`` are imported on first use, so this package imports without httpx
or requests installed. ``__all__`` below is the API, pinned by a test; it names an adapter only when
its library is installed, so ``from signing_proxy.client import *`` works without it too.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ..core.keys import KeyProvider
from .aiohttp_middleware import SigningMiddleware
from .signer import PROFILES, NotSigned, SignedRequest, Signer, key_file, key_store

if TYPE_CHECKING:
    from .httpx_auth import SignatureAuth as HttpxAuth
    from .requests_auth import SignatureAuth as RequestsAuth

__all__ = [
    "PROFILES",
    "HttpxAuth",
    "KeyProvider",
    "NotSigned",
    "RequestsAuth",
    "SignedRequest",
    "Signer",
    "SigningMiddleware",
    "key_file",
    "key_store",
]

# name -> (module, the extra that installs its library)
_OPTIONAL = {"HttpxAuth": ("httpx_auth", "httpx"), "RequestsAuth": ("requests_auth", "requests")}


def _installed(library: str) -> bool:
    try:
        return importlib.util.find_spec(library) is not None
    except ImportError:  # a finder that refuses it
        return False


# a star import resolves every name in __all__: one whose library is missing raised ImportError there
__all__ = [n for n in __all__ if n not in _OPTIONAL or _installed(_OPTIONAL[n][1])]


def __getattr__(name: str) -> Any:
    if name not in _OPTIONAL:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, extra = _OPTIONAL[name]
    try:
        found = importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:
        raise ImportError(
            f"{name} needs the {extra} package: pip install 'signing-proxy[{extra}]'", name=exc.name
        ) from exc
    value = found.SignatureAuth
    globals()[name] = value
    return value
