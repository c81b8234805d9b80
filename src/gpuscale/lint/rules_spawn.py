"""GS115: a function that runs in a spawned process reads a global that only `if __name__ == "__main__":` assigns.

A process started by the spawn method (torch.multiprocessing.spawn / mp.spawn, a Process or
DataLoader workers under `set_start_method("spawn")` or `multiprocessing_context="spawn"`) starts a
fresh interpreter that imports the script as `__mp_main__`: the `if __name__ == "__main__":` block
does not run there, so a name assigned only inside it (`args = parser.parse_args()`, a
`writer = SummaryWriter()`) does not exist, and the first function of the child that reads it stops
with a NameError. Under torchrun every rank runs the script as `__main__` and the name exists: the
rule speaks only where the script spawns, and only of the functions that run in the children (the
spawn target, what it calls or instantiates, and under a spawn start method the script's datasets,
worker_init_fn, collate_fn and Process targets).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpuscale.lint import calls
from gpuscale.lint.findings import Hit
from gpuscale.lint.launch import child_functions, spawn_targets
from gpuscale.lint.script import Script, keyword, last_name

CHILD_FUNCTIONS = ("worker_init_fn", "collate_fn", "target")


def is_main_block(node: ast.AST) -> bool:
    """Whether a statement is `if __name__ == "__main__":` (either order)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return False
    sides = [node.test.left, node.test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _bound(node: ast.AST) -> Iterator[str]:
    """The names a statement binds in the scope it runs in (not inside the functions or classes it defines)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
        return
    if isinstance(node, ast.Lambda):
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        yield node.id
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield alias.asname or alias.name.partition(".")[0]
    elif isinstance(node, ast.ExceptHandler) and node.name:
        yield node.name
    for child in ast.iter_child_nodes(node):
        yield from _bound(child)


def main_only_names(script: Script) -> set[str]:
    """Module-level names assigned only inside `if __name__ == "__main__":` (not elsewhere at module level, and
    not by a function declaring them `global`)."""
    main: set[str] = set()
    elsewhere: set[str] = set()
    for stmt in script.tree.body:
        (main if is_main_block(stmt) else elsewhere).update(_bound(stmt))
    for node in script.nodes:
        if isinstance(node, ast.Global):
            function = script.scope(node)
            assigned = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            elsewhere.update(set(node.names) & assigned)
    return main - elsewhere


def _spawn_start_method(script: Script) -> bool:
    """Whether the script asks for the spawn start method: set_start_method / get_context("spawn"), or a
    DataLoader with multiprocessing_context="spawn"."""
    for call in script.calls:
        if last_name(call.func) in ("set_start_method", "get_context") and call.args:
            value = call.args[0]
        else:
            value = keyword(call, "multiprocessing_context")  # type: ignore[assignment]  # an expression, or None
        if isinstance(value, ast.Constant) and value.value == "spawn":
            return True
    return False


def _child_entries(script: Script) -> tuple[list[ast.AST], str]:
    """The functions and classes the children start in, and how the children are started (for the message)."""
    entries: list[ast.AST] = []
    for target in spawn_targets(script):
        entries += calls.definitions(script, target.id)  # type: ignore[attr-defined]
    how = "mp.spawn"
    if _spawn_start_method(script):
        how = "mp.spawn" if entries else "the spawn start method"
        entries += [n for n in script.nodes if isinstance(n, ast.ClassDef)
                    and any(isinstance(m, calls.FUNCTIONS) and m.name in ("__getitem__", "__iter__") for m in n.body)]
        for call in script.calls:
            for name in CHILD_FUNCTIONS:
                value = keyword(call, name)
                if isinstance(value, ast.Name):
                    entries += calls.definitions(script, value.id)
    return entries, how


def _locals(function: ast.AST) -> set[str]:
    """The names a function binds itself: parameters, assignments, imports, nested definitions (those of
    nested functions too: a name bound anywhere inside is not the module's)."""
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.partition(".")[0] for a in node.names)
    return names


def check_main_only_globals(script: Script) -> Iterator[Hit]:
    """GS115: a function run by spawned children reads a name only `if __name__ == "__main__":` assigns."""
    missing = main_only_names(script)
    if not missing:
        return
    entries, how = _child_entries(script)
    flagged: set[ast.AST] = set()  # a nested function's read is its outer function's too: report it once
    for function in child_functions(script, entries):
        local = _locals(function)
        reported: set[str] = set()
        reads = sorted((n for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                        and n.id in missing and n.id not in local), key=lambda n: (n.lineno, n.col_offset))
        for read in reads:
            if read.id in reported or read in flagged:
                continue
            reported.add(read.id)
            flagged.add(read)
            where = f"{function.name}()"  # type: ignore[attr-defined]
            yield Hit(read, f"{where} reads {read.id!r}, assigned only under `if __name__ == \"__main__\":`; "
                            f"the processes {how} starts do not run that block: NameError")
