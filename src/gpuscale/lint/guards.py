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
  function in the script is itself guarded (a `save()` helper called under `if rank == 0`); a
  method's calls are those resolved to its class (`self.evaluate()`, `trainer.evaluate()` with
  `trainer = Trainer(...)`), not another object's method of the same name;
- it runs in the launching process: the same function (or module body) that calls `mp.spawn` (or starts
  the ranks' Processes; see `gpuscale.lint.launch`), unless it is in a function the ranks run: a spawn
  target is per-rank code even where the script also calls it directly for the single-GPU case, and so
  is what it calls;
- it is in the single-process branch of a distributed-or-not test (`if local_rank == -1:`);
- in a function `mp.spawn` runs, a test of its first parameter, the process index spawn passes
  whatever the parameter is called (`def main_worker(gpu, ...)`: `if gpu == 0:`).

A distributed-or-not test (`local_rank != -1`, `rank >= 0`, `local_rank is not None`, or a flag
assigned one: `is_dist = local_rank != -1`) is true on every rank of a distributed run: it is not
a rank guard.
"""

from __future__ import annotations

import ast
import re

from gpuscale.lint.launch import Launches
from gpuscale.lint.script import Script, dotted, last_name, names_in

RANKISH = re.compile(r"rank|is_main|main_process|is_master|master_process|local_master|process_zero|global_zero|is_primary"
                     r"|is_chief|is_leader|is_root|main_only|on_main|process_index|should_save|should_log|gpu_id|^master$",
                     re.IGNORECASE)
EXITS = ("exit", "_exit", "quit")


def mentions_rank(expr: ast.AST) -> bool:
    """Whether an expression mentions the rank or the main process."""
    return any(RANKISH.search(name) for name in names_in(expr))


def _constant(expr: ast.AST) -> object:
    """The value of a constant, -1 for `-1` (and for the string '-1'); a marker for anything else."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub) and isinstance(expr.operand, ast.Constant):
        return -expr.operand.value if type(expr.operand.value) is int else _NOT_CONSTANT
    if isinstance(expr, ast.Constant):
        return int(expr.value) if expr.value in ("-1", "0") else expr.value
    return _NOT_CONSTANT


_NOT_CONSTANT = object()


def is_distributed_test(expr: ast.AST) -> bool:
    """A test of whether the script runs distributed at all, true on every rank or on none: `local_rank != -1`,
    `rank >= 0`, `local_rank is not None`, `rank == -1` (the `-1` of launchers that pass no rank)."""
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return False
    left, op, right = expr.left, expr.ops[0], expr.comparators[0]
    if not mentions_rank(left):
        left, right = right, left
        op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
        if not mentions_rank(left) or mentions_rank(right):
            return False
    value = _constant(right)
    if value is None or value == -1:
        return isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.Gt, ast.LtE))
    if value == 0 and type(value) is int:
        return isinstance(op, (ast.GtE, ast.Lt))
    return False


def distributed_when_true(expr: ast.AST) -> bool | None:
    """For a distributed-or-not test: True when the test holds exactly when distributed (`local_rank != -1`),
    False when it holds exactly when not (`local_rank == -1`, `rank is None`); None for any other test."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = distributed_when_true(expr.operand)
        return None if inner is None else not inner
    if not is_distributed_test(expr):
        return None
    assert isinstance(expr, ast.Compare)
    op = expr.ops[0]
    if not mentions_rank(expr.left):  # -1 != local_rank: mirror the order
        op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
    return isinstance(op, (ast.IsNot, ast.NotEq, ast.Gt, ast.GtE))


def is_rank_test(expr: ast.AST) -> bool:
    """Whether a test tells the main rank from the others: it mentions the rank or the main process other
    than in a distributed-or-not test (`is_dist = local_rank != -1` is true on every rank)."""
    if is_distributed_test(expr):
        return False
    if isinstance(expr, ast.BoolOp):
        return any(is_rank_test(v) for v in expr.values)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return is_rank_test(expr.operand)
    return mentions_rank(expr)


def _tests_index(test: ast.AST, index: str) -> bool:
    """Whether a test compares the spawned process's index with a constant (`gpu == 0`, `not proc_id`): it tells
    the first process from the others, as a rank test does."""
    if isinstance(test, ast.BoolOp):
        return any(_tests_index(v, index) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, ast.Name) and test.operand.id == index or _tests_index(test.operand, index)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and not isinstance(test.ops[0], (ast.Is, ast.IsNot)):
        sides = (test.left, test.comparators[0])
        return any(isinstance(a, ast.Name) and a.id == index for a in sides) and any(
            isinstance(b, ast.Constant) and type(b.value) is int for b in sides)
    return False


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
        self._class_names: dict[str, ast.ClassDef] | None = None
        self._launches = Launches(script)

    def rankish(self, test: ast.AST) -> bool:
        """Whether a test mentions the rank, directly or through a flag assigned a rank test (`verbose = rank == 0`)."""
        if is_rank_test(test):
            return True
        for name in {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}:
            if name not in self._variables:
                self._variables[name] = False  # a variable assigned from itself does not guard
                self._variables[name] = any(isinstance(v, (ast.Compare, ast.BoolOp, ast.UnaryOp)) and is_rank_test(v)
                                            for v in self.script.assignments(name))
            if self._variables[name]:
                return True
        return False

    def guarded(self, node: ast.AST) -> bool:
        """Whether `node` runs only on the main rank (or only in the launching process)."""
        script = self.script
        if script.scope(node) in self._launches.launching_scopes:
            return True
        child = node
        index = self._process_index(node)
        for ancestor in script.ancestors(node):
            if isinstance(ancestor, (ast.If, ast.While, ast.IfExp)) and child is not ancestor.test:
                if self.rankish(ancestor.test) or self._single_process_branch(ancestor, child) \
                        or (index is not None and _tests_index(ancestor.test, index)):
                    return True
            if isinstance(ancestor, ast.BoolOp):
                before = ancestor.values[:ancestor.values.index(child)]  # type: ignore[arg-type]  # child is one of them
                if any(self.rankish(v) for v in before):
                    return True
            if isinstance(child, ast.stmt) and self._early_exit_before(child):
                return True
            if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self._function_guarded(ancestor)
            child = ancestor
        return False

    def _process_index(self, node: ast.AST) -> str | None:
        """The name of the process index in the spawn target that holds `node` (its first parameter), if any."""
        indexes = self._launches.process_indexes
        return next((indexes[a] for a in self.script.ancestors(node) if a in indexes), None) if indexes else None

    def _single_process_branch(self, branch: ast.If | ast.While | ast.IfExp, child: ast.AST) -> bool:
        """Whether `child` is in the branch of a distributed-or-not test that runs only without a process group
        (`if local_rank == -1: print(...)`, the else of `if local_rank != -1:`): one process, printing once."""
        when = self._distributed_when_true(branch.test)
        if when is None:
            return False
        in_body = child in branch.body if isinstance(branch.body, list) else child is branch.body
        return in_body != when

    def _distributed_when_true(self, test: ast.AST) -> bool | None:
        """`distributed_when_true`, also through `not` and a flag assigned such a test (`is_dist = rank != -1`)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._distributed_when_true(test.operand)
            return None if inner is None else not inner
        if isinstance(test, ast.Name):
            whens = {distributed_when_true(v) for v in self.script.assignments(test.id)}
            return whens.pop() if len(whens) == 1 else None
        return distributed_when_true(test)

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
        if function in self._launches.rank_functions:
            result = False  # every started process runs it, whoever else calls it
        elif RANKISH.search(function.name) or any(mentions_rank(d) for d in function.decorator_list):
            result = True
        else:
            result = self._sites_guarded(function)
        self._functions[function] = result
        return result

    def _sites_guarded(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Whether the function is only called under a rank guard.

        A function's calls are found by name (`f(...)`). A method's calls are resolved where the
        receiver says whose method it is: `self.f()` in its own class (or a subclass), `obj.f()` where
        `obj` was assigned an instance of its class, `Class.f(...)`; calls on an instance of another
        class of the script or on an imported module (`torch.save`) are not its calls. Calls on a
        receiver that cannot be resolved (`other.evaluate()`) only count when there is no resolved call,
        and then one guarded call is enough: a missed guard is a false alarm.
        """
        cls = self.script.parent(function)
        if not isinstance(cls, ast.ClassDef):
            sites = [c for c in self.script.calls_named(function.name)
                     if isinstance(c.func, ast.Name) and not self._inside(c, function)]
            return bool(sites) and all(self.guarded(c) for c in sites)
        resolved, unresolved = [], []
        for call in self.script.calls_named(function.name):
            if not isinstance(call.func, ast.Attribute) or self._inside(call, function):
                continue
            owner = self._receiver_class(call.func.value, call)
            if owner is None:
                unresolved.append(call)
            elif isinstance(owner, ast.ClassDef) and self._resolves_to(owner, cls, function.name):
                resolved.append(call)
        if resolved:
            return all(self.guarded(c) for c in resolved)
        return any(self.guarded(c) for c in unresolved)

    def _classes(self) -> dict[str, ast.ClassDef]:
        if self._class_names is None:
            self._class_names = {n.name: n for n in self.script.nodes if isinstance(n, ast.ClassDef)}
        return self._class_names

    def _receiver_class(self, receiver: ast.AST, call: ast.Call) -> ast.AST | None:
        """The class a method call's receiver is an instance of (or is): a ClassDef of the script, the
        Module for an imported module or something not of this script, None when unknown."""
        classes = self._classes()
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            for ancestor in self.script.ancestors(call):
                if isinstance(ancestor, ast.ClassDef):
                    return ancestor
            return None
        name = dotted(receiver)
        if name is None:
            if isinstance(receiver, ast.Call) and last_name(receiver.func) in classes:  # Trainer(...).evaluate()
                return classes[last_name(receiver.func)]
            return None
        if name in classes:
            return classes[name]
        if name.partition(".")[0] in self.script.aliases or self.script.imports(name.partition(".")[0]):
            return self.script.tree  # torch.save, np.mean: a module's function
        owners = set()
        for value in self.script.assignments(name):
            if isinstance(value, ast.Call) and last_name(value.func) in classes:
                owners.add(classes[last_name(value.func)])
            else:
                return None
        return owners.pop() if len(owners) == 1 else None

    def _resolves_to(self, owner: ast.ClassDef, cls: ast.ClassDef, method: str) -> bool:
        """Whether calling `method` on an instance of `owner` calls the one `cls` defines: `owner` is `cls`, or
        a subclass of it (by the base names written in the script) that does not define it again."""
        seen: set[ast.AST] = set()
        classes = self._classes()
        current: ast.ClassDef | None = owner
        while current is not None and current not in seen:
            if current is cls:
                return True
            seen.add(current)
            if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method for n in current.body):
                return False
            current = next((classes[last_name(b)] for b in current.bases if last_name(b) in classes), None)
        return False

    def _inside(self, node: ast.AST, function: ast.AST) -> bool:
        return any(a is function for a in self.script.ancestors(node))
