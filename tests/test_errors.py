"""Issue 14: one error tree for the whole package. Every exception class any module of the package
defines descends from ``core.errors.Error`` (so it carries ``reason`` and ``detail`` and
``errors.http_status`` answers it), and the tree's own statuses are the documented ones."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import signing_proxy
from signing_proxy.core.errors import Error
from signing_proxy.errors import (
    CAError,
    CliError,
    DirectoryError,
    EgressError,
    KeyFileError,
    ProxyError,
    VerificationError,
    http_status,
)

# Control-flow signals, not errors: never shown to a client or an operator, never given a status.
SIGNALS = {
    "signing_proxy.core.requester._Duplicate",  # json object_pairs_hook: the body is left untouched
    "signing_proxy.net.request.AbortConnection",  # the response started: close is the only answer
    "signing_proxy.net.upstream._HeadTooLarge",  # -> 502 upstream-header-too-large in the same module
}


def package_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(signing_proxy.__path__, "signing_proxy."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _name, value in inspect.getmembers(module, inspect.isclass):
            name = f"{value.__module__}.{value.__qualname__}"
            if issubclass(value, BaseException) and name.startswith("signing_proxy.") and name not in SIGNALS:
                found[name] = value
    return [found[name] for name in sorted(found)]


def test_the_walk_finds_the_trees_own_classes() -> None:
    found = package_exceptions()
    assert {Error, VerificationError, DirectoryError, EgressError, CliError} <= set(found)


@pytest.mark.parametrize("kind", package_exceptions(), ids=lambda k: f"{k.__module__}.{k.__qualname__}")
def test_every_exception_of_the_package_is_in_the_one_tree(kind: type[BaseException]) -> None:
    assert issubclass(kind, Error), f"{kind.__module__}.{kind.__qualname__} is outside core.errors.Error"


def test_the_one_status_map() -> None:
    assert http_status(VerificationError("bad-signature", "x")) == 401
    assert http_status(DirectoryError("directory-unavailable", "x")) == 502
    assert http_status(EgressError("egress-private-address", "x")) == 403
    assert http_status(ProxyError(429, "slow-down", "x")) == 429
    assert http_status(CAError("ca-invalid", "x")) == 500
    assert http_status(KeyFileError("key-file-missing", None, "x")) == 500
