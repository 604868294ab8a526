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


def _modules() -> list[Path]:
    return sorted(CORE.glob("*.py"))


def test_core_has_modules() -> None:
    assert len(_modules()) >= 5


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_core_module_is_sans_io(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            root = name.split(".")[0]
            assert root not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
            assert name not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
        if isinstance(node, ast.Call):
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            assert called not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {called}()"


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nimport time\nx = time.time()\n")
    tree = ast.parse(bad.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported & FORBIDDEN_MODULES == {"asyncio", "time"}
