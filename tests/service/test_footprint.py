"""A proxy, relay or gateway process loads aiohttp (about 25 MiB of its memory, issue 21's idle RSS
target) only when it runs a listener built on it: the publication or admin listener, verify-origin."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUN_PATH = (
    "signing_proxy.cli.main",
    "signing_proxy.service.app",
    "signing_proxy.proxy.relay",
    "signing_proxy.proxy.gateway",
    "signing_proxy.verify",
)


def loaded_after(code: str) -> bool:
    """Whether aiohttp is in sys.modules after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint('aiohttp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip() == "True"


def test_the_run_path_does_not_import_aiohttp() -> None:
    assert not loaded_after("\n".join(f"import {module}" for module in RUN_PATH))


@pytest.mark.parametrize(
    "code",
    [
        "from signing_proxy.verify import signature_middleware",  # the public API, on first use
        "import signing_proxy.service.admin_app",  # admin.listen
        "import signing_proxy.service.publish",  # publish.listen
    ],
)
def test_the_listeners_and_the_middleware_still_bring_it(code: str) -> None:
    assert loaded_after(code)


def test_no_public_name_turns_into_its_module_once_that_module_is_imported() -> None:
    """The lazy names of ``signing_proxy.verify`` stay the functions and classes they name even when
    a submodule of the same name was imported first (the import system sets a package attribute)."""
    probe = (
        "import importlib, pkgutil, types, signing_proxy.verify as v\n"
        "for m in pkgutil.iter_modules(v.__path__):\n"
        "    importlib.import_module(f'signing_proxy.verify.{m.name}')\n"
        "bad = [n for n in v.__all__ if isinstance(getattr(v, n), types.ModuleType)]\n"
        "print(bad)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
