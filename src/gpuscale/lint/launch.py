"""Where the ranks start: the functions each started process runs, and the code that starts them.

A script that starts its own processes hands each one a function:

- `torch.multiprocessing.spawn(fn, ...)` / `mp.spawn` / `start_processes`: `fn` (its first argument or
  `fn=`, a name or `functools.partial(name, ...)`) runs once in every process it starts: it is a rank;
- `Process(target=fn, ...)` (multiprocessing or torch.multiprocessing, a context's Process too): `fn` is a
  rank when what it runs joins the process group or wraps a model for it (the PyTorch tutorial's
  `init_process(rank, size, fn)`); a Process for other work (a prefetcher, a writer) is not.

The function (or module body) that calls spawn, or starts the rank Processes, is the launching process:
it runs once. A rank's function stays per-rank code even where the script also calls it directly for the
single-GPU case (the PyTorch ImageNet example's `main_worker`), and so does everything it calls.
"""

from __future__ import annotations

import ast
from functools import cached_property

from gpuscale.lint import calls
from gpuscale.lint.script import DISTRIBUTED_NAMES, DISTRIBUTED_QUALNAMES, Script, keyword, last_name

SPAWN_CALLS = ("spawn", "start_processes")


def is_spawn(script: Script, call: ast.Call) -> bool:
    """Whether a call starts one process per rank: torch.multiprocessing's spawn (under any alias) or start_processes."""
    if last_name(call.func) not in SPAWN_CALLS:
        return False
    qualname = script.qualname(call)
    return "multiprocessing" in qualname or qualname.startswith("mp.") or last_name(call.func) == "start_processes"


def _function_name(expr: ast.AST | None) -> ast.Name | None:
    """The function a target expression names: `worker`, or `worker` in `functools.partial(worker, cfg)`."""
    if isinstance(expr, ast.Call) and last_name(expr.func) == "partial" and expr.args:
        expr = expr.args[0]
    return expr if isinstance(expr, ast.Name) else None


def spawn_targets(script: Script) -> list[ast.Name]:
    """The names of the functions spawn / start_processes run in each child (their first argument or `fn=`)."""
    targets = []
    for call in script.calls:
        if is_spawn(script, call):
            name = _function_name(keyword(call, "fn") or (call.args[0] if call.args else None))
            if name is not None:
                targets.append(name)
    return targets


def child_functions(script: Script, entries: list[ast.AST]) -> list[ast.AST]:
    """The script's functions a process runs from its entries: the entries, and what they call, instantiate or
    refer to (a class brings all its methods; `obj.method()` the script's one method of that name)."""
    seen: list[ast.AST] = []
    todo = list(entries)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.append(node)
        if isinstance(node, ast.ClassDef):
            todo += [m for m in node.body if isinstance(m, calls.FUNCTIONS)]
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
                todo += calls.definitions(script, inner.id)
            elif isinstance(inner, ast.Call) and (function := calls.callee(script, inner)) is not None:
                todo.append(function)
    return [n for n in seen if isinstance(n, calls.FUNCTIONS)]


def joins_group(script: Script, function: ast.AST) -> bool:
    """Whether a function, or one it runs, starts or joins the process group or wraps a model for it."""
    return any(script.callee(c) in DISTRIBUTED_NAMES or script.qualname(c) in DISTRIBUTED_QUALNAMES
               for f in child_functions(script, [function]) for c in ast.walk(f) if isinstance(c, ast.Call))


class Launches:
    """The rank functions of one script (what every started process runs) and the scopes that start them."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def _defined(self, name: ast.Name) -> list[ast.AST]:
        """The script's functions a target name names (a class is no process entry here)."""
        return [d for d in calls.definitions(self.script, name.id) if isinstance(d, calls.FUNCTIONS)]

    @cached_property
    def _process_starts(self) -> list[tuple[ast.Call, list[ast.AST]]]:
        """Each `Process(target=f)` whose `f` is a rank (it joins the process group), with f's definitions."""
        found = []
        for call in self.script.calls_named("Process"):
            name = _function_name(keyword(call, "target"))
            functions = self._defined(name) if name is not None else []
            if functions and any(joins_group(self.script, f) for f in functions):
                found.append((call, functions))
        return found

    @cached_property
    def rank_functions(self) -> frozenset[ast.AST]:
        """The functions every started process runs as its entry: spawn targets and rank Process targets."""
        entries = [f for name in spawn_targets(self.script) for f in self._defined(name)]
        entries += [f for _, functions in self._process_starts for f in functions]
        return frozenset(entries)

    @cached_property
    def process_indexes(self) -> dict[ast.AST, str]:
        """Each spawn target's first parameter, whatever its name (`gpu`, `proc_id`): spawn passes the process's
        index there, so a test of it (`if gpu == 0:`) tells the first process from the others."""
        found: dict[ast.AST, str] = {}
        for name in spawn_targets(self.script):
            for function in self._defined(name):
                if not isinstance(function, calls.FUNCTIONS):  # _defined keeps only these
                    continue
                params = [*function.args.posonlyargs, *function.args.args]
                if params:
                    found[function] = params[0].arg
        return found

    @cached_property
    def launching_scopes(self) -> frozenset[ast.AST]:
        """The functions (or the module body) that start the ranks: they run once, in the launching process; a
        rank function that starts processes itself stays a rank."""
        starts = [c for c in self.script.calls if is_spawn(self.script, c)]
        starts += [call for call, _ in self._process_starts]
        return frozenset(self.script.scope(c) for c in starts) - self.rank_functions
