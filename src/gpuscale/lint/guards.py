"""Rank guards: does this line run on every rank, or only on the main one?

Read generously, because a missed guard is a false alarm: a node is guarded when

- an enclosing `if`/`while`, conditional expression or `and`/`or` tests something that mentions
  the rank or the main process (`rank == 0`, `rt.is_main`, `dist.get_rank() == 0`, `local_rank in
  (-1, 0)`, `trainer.is_world_process_zero()`, `accelerator.is_main_process`, `os.environ["RANK"]`,
  Lightning's `is_global_zero`, HF's `args.should_save`, the tutorials' `gpu_id == 0`), whichever
  branch holds it; a variable assigned from such a test counts too (`verbose = rank == 0`,
  then `if verbose:`);
- an earlier statement of an enclosing block leaves early under such a test (`if not rt.is_main:
  return`, `continue`, `break`, `raise`, `sys.exit()`);
- its function is decorated with something rank-ish (`@rank_zero_only`), or every call of its
  function in the script is itself guarded (a `save()` helper called under `if rank == 0`);
- it runs in the launching process: the same function (or module body) that calls `mp.spawn`.
"""

from __future__ import annotations

import ast
import re

from gpuscale.lint.script import Script, last_name, names_in

RANKISH = re.compile(r"rank|is_main|main_process|is_master|master_process|local_master|process_zero|global_zero|is_primary"
                     r"|is_chief|is_leader|is_root|main_only|on_main|process_index|should_save|should_log|gpu_id|^master$",
                     re.IGNORECASE)
EXITS = ("exit", "_exit", "quit")
SPAWNS = ("spawn", "start_processes")


def mentions_rank(expr: ast.AST) -> bool:
    """Whether an expression mentions the rank or the main process."""
    return any(RANKISH.search(name) for name in names_in(expr))


def _leaves(body: list[ast.stmt]) -> bool:
    """Whether a block ends by leaving: return, continue, break, raise, or sys.exit()."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Continue, ast.Break, ast.Raise)):
        return True
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and last_name(last.value.func) in EXITS


class Guards:
    """Answers `guarded(node)` for one script, remembering what it worked out about functions."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._functions: dict[ast.AST, bool] = {}
        self._variables: dict[str, bool] = {}
        self._spawning = {script.scope(c) for c in script.calls_named(*SPAWNS)
                          if "multiprocessing" in script.qualname(c) or last_name(c.func) == "start_processes"
                          or script.qualname(c).startswith("mp.")}

    def rankish(self, test: ast.AST) -> bool:
        """Whether a test mentions the rank, directly or through a flag assigned a rank test (`verbose = rank == 0`)."""
        if mentions_rank(test):
            return True
        for name in {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}:
            if name not in self._variables:
                self._variables[name] = False  # a variable assigned from itself does not guard
                self._variables[name] = any(isinstance(v, (ast.Compare, ast.BoolOp, ast.UnaryOp)) and mentions_rank(v)
                                            for v in self.script.assignments(name))
            if self._variables[name]:
                return True
        return False

    def guarded(self, node: ast.AST) -> bool:
        """Whether `node` runs only on the main rank (or only in the launching process)."""
        script = self.script
        if script.scope(node) in self._spawning:
            return True
        child = node
        for ancestor in script.ancestors(node):
            if isinstance(ancestor, (ast.If, ast.While, ast.IfExp)) and child is not ancestor.test and self.rankish(ancestor.test):
                return True
            if isinstance(ancestor, ast.BoolOp):
                index = ancestor.values.index(child)
                if any(self.rankish(v) for v in ancestor.values[:index]):
                    return True
            if isinstance(child, ast.stmt) and self._early_exit_before(child):
                return True
            if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self._function_guarded(ancestor)
            child = ancestor
        return False

    def _early_exit_before(self, stmt: ast.stmt) -> bool:
        """Whether a statement before `stmt`, in a block that holds it, leaves early under a rank test."""
        parent = self.script.parent(stmt)
        if parent is None:
            return False
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and stmt in block:
                for earlier in block[: block.index(stmt)]:
                    if isinstance(earlier, ast.If) and self.rankish(earlier.test) and (_leaves(earlier.body) or _leaves(earlier.orelse)):
                        return True
        return False

    def _function_guarded(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        if function in self._functions:
            return self._functions[function]
        self._functions[function] = False  # recursion: a function calling itself does not guard itself
        if RANKISH.search(function.name) or any(mentions_rank(d) for d in function.decorator_list):
            result = True
        else:
            sites = [c for c in self._call_sites(function) if not self._inside(c, function)]
            result = bool(sites) and all(self.guarded(c) for c in sites)
        self._functions[function] = result
        return result

    def _call_sites(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """Calls of a function by its name (`f(...)`), or of a method by attribute (`obj.f(...)`)."""
        method = isinstance(self.script.parent(function), ast.ClassDef)
        kind = ast.Attribute if method else ast.Name
        return [c for c in self.script.calls_named(function.name) if isinstance(c.func, kind)]

    def _inside(self, node: ast.AST, function: ast.AST) -> bool:
        return any(a is function for a in self.script.ancestors(node))
