"""The architecture of docs/architecture.md holds: import-linter's contracts in pyproject.toml pass on
the package, and they do catch what they forbid (an upward import, a cycle) in a copy where one was put."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
                           "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          capture_output=True, text=True, env=env, cwd=src, timeout=120)


def test_the_import_contracts_hold():
    result = _lint_imports(SRC)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_the_contracts_catch_an_upward_import_and_a_cycle(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC / "gpuscale", copy / "gpuscale", ignore=shutil.ignore_patterns("__pycache__"))
    env_module = copy / "gpuscale" / "env.py"
    # env is near the bottom and runtime imports it: this is both an upward import and a cycle (even hidden in a function)
    env_module.write_text(env_module.read_text() + "\n\ndef _later():\n    from gpuscale.runtime import current\n\n    return current\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert "Contracts: 0 kept, 2 broken." in result.stdout, result.stdout[-3000:]
    assert "gpuscale.env -> gpuscale.runtime" in result.stdout


def test_code_cites_only_what_the_repository_holds():
    """No citation of a document outside the repository; every docs/ page the code cites exists; no untyped Runtime."""
    cited = set()
    for path in [*SRC.rglob("*.py"), *(ROOT / "examples").rglob("*.py")]:
        text = path.read_text()
        assert "FACTS §" not in text, f"{path} cites a document that is not in this repository"
        assert not re.search(r"\brt: Any\b", text), f"{path} types a Runtime as Any"
        cited.update(re.findall(r"docs/[\w-]+\.md", text))
    assert cited and all((ROOT / page).is_file() for page in cited), sorted(p for p in cited if not (ROOT / p).is_file())


def test_nothing_inside_the_package_imports_its_public_api():
    """gpuscale/__init__.py re-exports the library for scripts; a module importing it would pull the whole library
    (and hide which layer it really depends on)."""
    code = ("import grimp; g = grimp.build_graph('gpuscale', cache_dir=None); "
            "print(sorted(g.find_modules_that_directly_import('gpuscale')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_every_module_has_its_layer():
    """A new module must be placed in the layers (an unplaced one would escape the contract)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    children = {p.stem if p.is_file() else p.name for p in (SRC / "gpuscale").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert children == placed, f"not placed: {sorted(children - placed)}; placed but gone: {sorted(placed - children)}"


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LONG_BECAUSE = "Long because"  # how a longer function says, at the top of its docstring's last paragraph, why it is one piece


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def test_modules_and_functions_stay_readable():
    """No module over 400 lines; no function over 60 lines of code (its docstring is the manual and does not count)
    unless its docstring says why it is one piece ("Long because ...")."""
    too_long = []
    for path in sorted((SRC / "gpuscale").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(SRC)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                if length > MAX_FUNCTION_LINES and LONG_BECAUSE not in (ast.get_docstring(node) or ""):
                    too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "split these, or say in the function's docstring why it is one piece (\"Long because ...\"):\n" + "\n".join(too_long)
