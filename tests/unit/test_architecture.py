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


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_import_contracts_hold():
    result = _lint_imports(SRC)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


def test_the_contracts_catch_upward_imports_and_a_cycle(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC / "gpuscale", copy / "gpuscale", ignore=shutil.ignore_patterns("__pycache__"))
    # detect/env is near the bottom and runtime/init imports it: an upward import between layer folders, and a
    # cycle (even hidden in a function)
    env_module = copy / "gpuscale" / "detect" / "env.py"
    env_module.write_text(env_module.read_text() + "\n\ndef _later():\n    from gpuscale.runtime.init import current\n\n    return current\n")
    # pinning is the lowest module of runtime/ (the start-up hook imports it without torch): an upward import
    # inside one layer folder
    pinning = copy / "gpuscale" / "runtime" / "pinning.py"
    pinning.write_text(pinning.read_text() + "\n\ndef _later():\n    from gpuscale.runtime.data import plan_batch\n\n    return plan_batch\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    # detect's own order breaks too: env now reaches log (above it in detect/) through runtime.init
    broken = ["Layers: entry", "runtime: loaders above init()", "detect: logs above", "No import cycles"]
    assert f"Contracts: {len(_contracts()) - len(broken)} kept, {len(broken)} broken." in result.stdout, result.stdout[-3000:]
    said = " ".join(result.stdout.split())  # import-linter wraps long contract names
    for contract in _contracts():
        verdict = "BROKEN" if any(contract["name"].startswith(name) for name in broken) else "KEPT"
        assert f"{contract['name']} {verdict}" in said, said[-3000:]
    assert "gpuscale.detect.env -> gpuscale.runtime.init" in result.stdout
    assert "gpuscale.runtime.pinning -> gpuscale.runtime.data" in result.stdout


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


def _children(folder: Path) -> set[str]:
    return {p.stem if p.is_file() else p.name for p in folder.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}


def test_the_tree_is_the_layers():
    """Every folder and module of the package has its layer, and every module of a layer folder its place in that
    folder's own contract (an unplaced one would escape the contracts); `ls src/gpuscale` shows only the layers'
    folders, the entry points and the version."""
    layered = {container: {name.strip() for layer in contract["layers"] for name in layer.split("|")}
               for contract in _contracts() if contract["type"] == "layers" for container in contract["containers"]}
    assert _children(SRC / "gpuscale") == layered["gpuscale"], f"not placed or gone: {_children(SRC / 'gpuscale') ^ layered['gpuscale']}"
    modules = {p.stem for p in (SRC / "gpuscale").glob("*.py")} - {"__init__"}
    assert modules == {"__main__", "agent", "_version"}, f"modules beside the layer folders: {sorted(modules)}"
    for container, placed in layered.items():
        folder = SRC.joinpath(*container.split("."))
        assert _children(folder) == placed, f"{container}: not placed or gone: {sorted(_children(folder) ^ placed)}"
    # the folders a layer folder holds that have no contract of their own are packages of one job (cli, study,
    # slurm, strategy, the probe...): the acyclic contract covers them


def test_the_architecture_page_shows_the_tree():
    """docs/architecture.md's diagram is what scripts/architecture_diagram.py makes of the tree and the contracts."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import architecture_diagram
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert architecture_diagram.page_with(page, architecture_diagram.diagram()) == page, \
        "docs/architecture.md's diagram is out of date: python scripts/architecture_diagram.py --write"
    for layer_folder in ("base/", "detect/", "runtime/", "measure/", "strategy/", "train/", "integrations/", "launch/", "slurm/", "cli/"):
        assert f"  {layer_folder} " in page


def test_moved_deep_paths_still_import():
    """The deep paths the README and the examples showed before the layers became folders give the module itself."""
    code = ("import importlib, gpuscale; "
            "print(all(importlib.import_module(old) is importlib.import_module(new) for old, new in gpuscale.MOVED.items()))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.stdout.strip() == "True", result.stderr[-2000:]
    from gpuscale.device_waits import find_device_waits
    from gpuscale.measure.device_waits import find_device_waits as at_home

    assert find_device_waits is at_home


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
