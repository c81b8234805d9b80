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
    "deepspeed.initialize", "gpuscale.init", "gpuscale.setup", "gpuscale.wrap", "gpuscale.runtime.init.init",
    "gpuscale.train.step.setup", "gpuscale.strategy.wrap", "horovod.torch.init", "torch.multiprocessing.spawn",
})
# Wrapping a model (or handing it to an engine) after which its trainable set is fixed.
WRAP_NAMES = frozenset({"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"})
WRAP_QUALNAMES = frozenset({"deepspeed.initialize", "gpuscale.setup", "gpuscale.wrap", "gpuscale.train.step.setup",
                            "gpuscale.strategy.wrap"})
# Trainers of libraries that run the script as one of several processes under a launcher, and shard, reduce and save
# for it (HF's Trainer and its kin in transformers and trl; Lightning's Trainer and Fabric): by qualified name, or a
# class of the script's own derived from one.
LIBRARY_TRAINER = re.compile(r"^(transformers|trl|lightning|lightning\.pytorch|lightning\.fabric|pytorch_lightning)\.(\w*Trainer|Fabric)$")
# Variables a launcher sets for each of several processes (torchrun, accelerate, deepspeed): a script
# that reads them runs as one of several processes, even when a library (HF's Trainer) starts the group.
LAUNCHER_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
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


def environ_key(script: Script, expr: ast.AST) -> str | None:
    """The variable an expression reads from the environment: `os.environ["RANK"]`, `os.environ.get("RANK")`,
    `os.getenv("RANK")` -> 'RANK'; None for anything else."""
    if isinstance(expr, ast.Subscript) and script.qualname(expr.value) in ("os.environ", "environ"):
        key = expr.slice
    elif isinstance(expr, ast.Call) and expr.args and (
            script.qualname(expr.func) in ("os.getenv", "getenv", "os.environ.get", "environ.get")):
        key = expr.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


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

    @cached_property
    def own_modules(self) -> list[Script]:
        """The modules of the script's own that it imports, parsed: files next to it (`import utils`,
        `from util import misc`, `import util.misc as misc`), where research code keeps its set-up helpers.
        One level deep; a module that is missing or does not parse is left out."""
        folder = self.directory
        if folder is None:
            return []
        names: set[str] = set()
        for node in self.nodes:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found = []
        for name in sorted(names):
            path = folder.joinpath(*name.split(".")).with_suffix(".py")
            if path.is_file() and path.resolve() != Path(self.path).resolve():
                try:
                    found.append(Script(path.read_text(encoding="utf-8"), str(path)))
                except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                    continue
        return found

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

    def callee(self, call: ast.Call) -> str:
        """The last name of what a call calls, through import aliases: `NativeDDP(...)` after
        `from torch.nn.parallel import DistributedDataParallel as NativeDDP` is 'DistributedDataParallel'."""
        return self.qualname(call).rpartition(".")[2] or last_name(call.func)

    def is_wrap(self, call: ast.Call) -> bool:
        """Whether a call wraps a model for data parallelism (DDP, FSDP, deepspeed.initialize, gpuscale.setup/wrap,
        accelerate's prepare)."""
        if last_name(call.func) == "prepare" and self.calls_named("Accelerator"):
            return True
        return self.callee(call) in WRAP_NAMES or self.qualname(call) in WRAP_QUALNAMES

    def is_ddp(self, call: ast.Call) -> bool:
        """Whether a call wraps a model in DistributedDataParallel (under any import alias)."""
        return self.callee(call) in ("DistributedDataParallel", "DDP")

    @cached_property
    def uses_gpuscale_init(self) -> bool:
        return any(self.qualname(c) in ("gpuscale.init", "gpuscale.runtime.init.init") for c in self.calls)

    @cached_property
    def is_distributed(self) -> bool:
        """Whether the script runs as several processes: it starts a process group, wraps a model for it, makes a
        library's trainer that does so under a launcher (HF's Trainer, Lightning's Trainer or Fabric: `library_trainers`),
        or reads the rank or world size a launcher sets (RANK, LOCAL_RANK, WORLD_SIZE)."""
        if any(self.callee(c) in DISTRIBUTED_NAMES or self.qualname(c) in DISTRIBUTED_QUALNAMES for c in self.calls):
            return True
        if self.library_trainers:
            return True
        return any(environ_key(self, n) in LAUNCHER_VARIABLES for n in self.nodes if isinstance(n, (ast.Subscript, ast.Call)))

    @cached_property
    def library_trainers(self) -> list[ast.Call]:
        """The calls that make a library's trainer for several processes (`LIBRARY_TRAINER`, or a class of the script's
        own derived from one), leaving out a Lightning Trainer or Fabric told `devices=1`: one process."""
        own = {node.name for node in self.nodes if isinstance(node, ast.ClassDef)
               and any(LIBRARY_TRAINER.match(self.qualname(base)) for base in node.bases)}
        made = [c for c in self.calls if LIBRARY_TRAINER.match(self.qualname(c)) or (isinstance(c.func, ast.Name) and c.func.id in own)]
        return [c for c in made if int_constant(keyword(c, "devices")) != 1]

    def argparse_default(self, name: str) -> ast.AST | None:
        """The default of the command-line option an `args.batch_size`-like name reads (`add_argument("--batch-size",
        default=64)` for 'args.batch_size'), when exactly one option of the script has that destination."""
        dest = name.rpartition(".")[2]
        if "." not in name or not dest:
            return None
        found = []
        for call in self.calls_named("add_argument"):
            options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            explicit = keyword(call, "dest")
            if isinstance(explicit, ast.Constant):
                names = {explicit.value}
            else:
                longs = [o for o in options if o.startswith("--")] or options
                names = {longs[0].lstrip("-").replace("-", "_")} if longs else set()
            if dest in names:
                found.append(keyword(call, "default"))
        return found[0] if len(found) == 1 else None

    @cached_property
    def defined(self) -> dict[str, list[ast.AST]]:
        """Name -> the functions and classes of the script so named (at any depth), in source order."""
        found: dict[str, list[ast.AST]] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append(node)
        for nodes in found.values():
            nodes.sort(key=lambda n: n.lineno)  # type: ignore[attr-defined]
        return found

    @cached_property
    def _scoped(self) -> dict[ast.AST, list[ast.AST]]:
        """Scope -> its nodes in source order (computed once: every rule asks)."""
        found: dict[ast.AST, list[ast.AST]] = {}
        for node in self.nodes:
            if node is not self.tree:
                found.setdefault(self.scope(node), []).append(node)
        for nodes in found.values():
            nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        return found

    def scope_nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes whose innermost function (or lambda, or the module) is `scope`, in source order."""
        return self._scoped.get(scope, [])

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        above = self.parents.get(node)
        while above is not None:
            yield above
            above = self.parents.get(above)

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
        values: list[ast.AST] = []
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
