"""core/ stays sans-IO: no I/O modules imported, no clock or file calls (DESIGN "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "signing_proxy" / "core"
FORBIDDEN_MODULES = {
    "aiohttp",
    "asyncio",
    "socket",
    "ssl",
    "yaml",
    "os",
    "pathlib",
    "time",
    "datetime.datetime.now",
    "subprocess",
    "threading",
    "urllib.request",
    "http.client",
    "select",
    "selectors",
    "io",
    "shutil",
    "tempfile",
    "random",
    "secrets",
    "logging",
}
FORBIDDEN_CALLS = {
    "open",
    "print",
    "input",
    "now",
    "utcnow",
    "today",
    "time",
    "monotonic",
    "perf_counter",
    "urandom",
    "getrandbits",
    "randbytes",
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
}


def violations(source: str) -> list[str]:
    """Every forbidden import and call in ``source``, as ``"imports X"`` / ``"line N calls Y()"``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        found.extend(
            f"imports {name}"
            for name in names
            if name in FORBIDDEN_MODULES or name.split(".")[0] in FORBIDDEN_MODULES
        )
        if isinstance(node, ast.Call):
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if called in FORBIDDEN_CALLS:
                found.append(f"line {node.lineno} calls {called}()")
    return found


def _modules() -> list[Path]:
    return sorted(CORE.glob("*.py"))


def test_core_has_modules() -> None:
    assert len(_modules()) >= 5


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_core_module_is_sans_io(path: Path) -> None:
    assert violations(path.read_text()) == [], path.name


def test_the_checker_catches_imports_and_calls() -> None:
    bad = "import asyncio\nfrom os import path\nimport time\nx = time.time()\ny = open('f')\nz = 1\n"
    assert violations(bad) == [
        "imports asyncio",
        "imports os",
        "imports time",
        "line 4 calls time()",
        "line 5 calls open()",
    ]
    assert violations("import hashlib\nfrom .b64 import b64_encode\nx = hashlib.sha256(b'')\n") == []
