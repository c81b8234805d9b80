"""A parsed training script and the questions every rule asks of it.

`Script` holds the syntax tree with parent links, resolves imported names (`dist.init_process_group`
is `torch.distributed.init_process_group` after `import torch.distributed as dist`), and answers:
is this script distributed at all, what does a call call, which function or module body does a node
belong to. Rank guards live in `gpuscale.lint.guards`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

# Calls that make a script a multi-process one: a process group, a data-parallel wrapper, or a
# library that sets both up (by last name where the name is unambiguous, else by qualified name).
DISTRIBUTED_NAMES = frozenset({
    "init_process_group", "DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard",
    "init_distributed", "Accelerator", "PartialState", "DistributedSampler",
})
DISTRIBUTED_QUALNAMES = frozenset({
    "deepspeed.initialize", "gpuscale.init", "gpuscale.setup", "gpuscale.wrap", "gpuscale.runtime.init",
    "gpuscale.training.setup", "gpuscale.strategy.wrap", "horovod.torch.init", "torch.multiprocessing.spawn",
})
# Wrapping a model (or handing it to an engine) after which its trainable set is fixed.
WRAP_NAMES = frozenset({"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"})
WRAP_QUALNAMES = frozenset({"deepspeed.initialize", "gpuscale.setup", "gpuscale.wrap", "gpuscale.training.setup",
                            "gpuscale.strategy.wrap"})
WORLD_SIZE = re.compile(
    r"(^|_)(world_?size|world|num_?gpus?|n_?gpus?|gpus|gpu_count|nprocs?|num_?procs|n_?procs|num_?processes|"
    r"num_?replicas|num_?devices|n_?devices|device_count|get_world_size)(_per_node)?$", re.IGNORECASE)


def dotted(expr: ast.AST) -> str | None:
    """'a.b.c' for a chain of names and attributes, None for anything else (calls, subscripts)."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def last_name(expr: ast.AST) -> str:
    """The last name of a callee or value: `x.y.save` -> 'save', `save` -> 'save', else ''."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return ""


def names_in(expr: ast.AST) -> Iterator[str]:
    """Every identifier, attribute name and short string constant in an expression (what a test 'mentions')."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
            yield node.value


def int_constant(expr: ast.AST | None) -> int | None:
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    return None


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    """The value of keyword argument `name`, or None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def is_world_size(expr: ast.AST) -> bool:
    """Whether an expression reads like the number of processes: world_size, get_world_size(), WORLD_SIZE, ngpus..."""
    if isinstance(expr, ast.Call):
        if last_name(expr.func) in ("int", "float") and expr.args:
            return is_world_size(expr.args[0])
        return bool(WORLD_SIZE.search(last_name(expr.func)))
    if isinstance(expr, ast.Subscript):  # os.environ["WORLD_SIZE"]
        key = expr.slice
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and bool(WORLD_SIZE.search(key.value))
    return bool(WORLD_SIZE.search(last_name(expr)))


class Script:
    """One script's syntax tree with parent links and import aliases."""

    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.tree = ast.parse(text, filename=path)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.aliases: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.nodes = list(ast.walk(self.tree))
        self.calls = [n for n in self.nodes if isinstance(n, ast.Call)]

    @property
    def directory(self) -> Path | None:
        """The script's folder when it is a real file (for config files named next to it)."""
        path = Path(self.path)
        return path.parent if path.is_file() else None

    def qualname(self, expr: ast.AST) -> str:
        """The fully qualified name of a callee: aliases of the script's imports resolved; '' if not a name."""
        if isinstance(expr, ast.Call):
            expr = expr.func
        name = dotted(expr)
        if name is None:
            return ""
        head, _, rest = name.partition(".")
        head = self.aliases.get(head, head)
        return f"{head}.{rest}" if rest else head

    def imports(self, module: str) -> bool:
        """Whether the script imports `module` or something inside it."""
        prefix = module + "."
        for node in self.nodes:
            if isinstance(node, ast.Import) and any(a.name == module or a.name.startswith(prefix) for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom) and node.module and (node.module == module or node.module.startswith(prefix)):
                return True
        return False

    def calls_named(self, *names: str) -> list[ast.Call]:
        """Calls whose callee's last name is one of `names` (`x.save_pretrained(...)` for 'save_pretrained')."""
        return [c for c in self.calls if last_name(c.func) in names]

    def mentions(self, name: str) -> bool:
        """Whether `name` appears as a name or attribute anywhere (a call, or a reference like atexit.register(f))."""
        return any((isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.Attribute) and n.attr == name)
                   for n in self.nodes)

    def is_wrap(self, call: ast.Call) -> bool:
        """Whether a call wraps a model for data parallelism (DDP, FSDP, deepspeed.initialize, gpuscale.setup/wrap,
        accelerate's prepare)."""
        if last_name(call.func) == "prepare" and self.calls_named("Accelerator"):
            return True
        return last_name(call.func) in WRAP_NAMES or self.qualname(call) in WRAP_QUALNAMES

    @cached_property
    def uses_gpuscale_init(self) -> bool:
        return any(self.qualname(c) in ("gpuscale.init", "gpuscale.runtime.init") for c in self.calls)

    @cached_property
    def is_distributed(self) -> bool:
        """Whether the script runs as several processes: it starts a process group or wraps a model for it."""
        return any(last_name(c.func) in DISTRIBUTED_NAMES or self.qualname(c) in DISTRIBUTED_QUALNAMES
                   for c in self.calls)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        node = self.parents.get(node)
        while node is not None:
            yield node
            node = self.parents.get(node)

    def scope(self, node: ast.AST) -> Scope:
        """The function (or lambda, or the module) whose body holds `node`."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, SCOPES):
                return ancestor
        return self.tree

    def statement(self, node: ast.AST) -> ast.stmt:
        """The statement that holds `node` (itself if it is one)."""
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def is_docstring(self, node: ast.AST) -> bool:
        """A string standing alone as a statement: a docstring or a string used as a comment."""
        return isinstance(self.parents.get(node), ast.Expr)

    def assignments(self, name: str) -> list[ast.AST]:
        """The values assigned to a name or attribute chain (`x = ...`, `self.x = ...`), in order."""
        values = []
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                if any(dotted(t) == name for t in node.targets):
                    values.append(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None and dotted(node.target) == name:
                values.append(node.value)
        return values

    def in_except(self, node: ast.AST) -> bool:
        """Whether `node` runs while handling an exception (error reports from every rank are right)."""
        return any(isinstance(a, ast.ExceptHandler) for a in self.ancestors(node))
