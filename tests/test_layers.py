"""The package's shape, enforced: import-linter's contracts (pyproject.toml), no import cycle between
modules (imports inside functions and under TYPE_CHECKING counted), and no module over 500 lines."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "signing_proxy"
MAX_MODULE_LINES = 500
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_layering_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("storage/files.py", "from ..proxy import exchange"),  # a lower layer reaching up
        ("core/fields.py", "import asyncio"),  # core is sans-IO
        ("errors.py", "from .config import Config"),  # errors sits just above core
    ],
)
def test_a_violation_breaks_the_contracts(tmp_path: Path, module: str, line: str) -> None:
    shutil.copytree(PACKAGE, tmp_path / "signing_proxy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "signing_proxy" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module ``name`` imports, wherever the import statement stands."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            prefix = ".".join([*base, *([node.module] if node.module else [])])
            candidates = [prefix, *(f"{prefix}.{a.name}" for a in node.names)]
        else:
            continue
        for candidate in candidates:
            module = candidate
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module and module != name:
                out.add(module)
    # a package's __init__ re-exporting its own children is not a cycle of design
    if path.name == "__init__.py":
        out = {m for m in out if not m.startswith(name + ".")}
    return out


def test_no_module_imports_itself_round_a_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = []
    for start in graph:  # a path from start back to start through the graph
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert cycles == []


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
