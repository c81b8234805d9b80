"""Rules about data and numbers: who sees which samples, how batches add up.

GS101 DataLoader without a DistributedSampler, GS102 DistributedSampler without set_epoch,
GS109 strong scaling by integer division. `loader_is_unsharded` tells GS107 (rules_metrics) which
loaders give every rank the whole dataset.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpuscale.lint import calls
from gpuscale.lint.findings import Hit
from gpuscale.lint.guards import Guards, is_distributed_test, mentions_rank
from gpuscale.lint.launch import child_functions
from gpuscale.lint.script import Script, dotted, is_world_size, keyword, last_name, names_in

PLAIN_SAMPLERS = ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler")
SHARDING = re.compile(r"rank|world_size|num_replicas|shard|split_dataset_by_node", re.IGNORECASE)
EVAL = re.compile(r"val|eval|test|dev", re.IGNORECASE)
NOT_BATCH = re.compile(r"cpu|core|worker|thread|mem", re.IGNORECASE)
FOLLOW_DEPTH = 3  # how many calls deep a loader handed to the script's functions is followed


def _sampler_is_plain(script: Script, sampler: ast.AST) -> bool:
    """Whether a sampler argument is not distributed on a distributed run: RandomSampler(...), a name only assigned
    one, or a choice between a DistributedSampler and a plain one made by an option other than whether the run is
    distributed (`DistributedSampler(...) if args.dist_eval else SequentialSampler(...)`: plain by default)."""
    choices = _sampler_choices(script, sampler)
    plain = [(b, t) for b, t in choices if _is_plain(b)]
    if not choices or not plain:
        return False
    if len(plain) == len(choices):
        return True
    distributed = [b for b, _ in choices if _is_distributed(b)]
    return len(plain) + len(distributed) == len(choices) and any(t is not None and not _distributed_switch(t) for _, t in plain)


def _plain_sampler_chooser(script: Script, sampler: ast.AST | None) -> str | None:
    """The option that picks a DistributedSampler over a plain sampler (`args.dist_eval`), as written; None when the
    sampler is not chosen by one."""
    if sampler is None:
        return None
    tests = [t for b, t in _sampler_choices(script, sampler) if t is not None and _is_distributed(b)]
    return ast.unparse(tests[0]) if tests else None


def _is_plain(sampler: ast.AST) -> bool:
    return isinstance(sampler, ast.Call) and last_name(sampler.func) in PLAIN_SAMPLERS


def _is_distributed(sampler: ast.AST) -> bool:
    return isinstance(sampler, ast.Call) and last_name(sampler.func).endswith("DistributedSampler")


def _sampler_choices(script: Script, sampler: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """Every sampler a sampler argument may be (the call itself, or each value its name is assigned), each with the
    test that chooses it (see `_branches`)."""
    values = [sampler] if isinstance(sampler, (ast.Call, ast.IfExp)) else script.assignments(dotted(sampler) or "")
    return [choice for value in values for choice in _branches(script, value)]


def _branches(script: Script, value: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """A sampler value's possible samplers, each with the test that chooses it (None: unconditional): the branches
    of a conditional expression, or the value of an assignment made inside an `if`."""
    if isinstance(value, ast.IfExp):
        return [(value.body, value.test), (value.orelse, value.test)]
    test = next((a.test for a in script.ancestors(value) if isinstance(a, ast.If)), None)
    return [(value, test)]


DISTRIBUTED_SWITCH = re.compile(r"distributed|is_dist|^dist$|ddp|world_size|multi_?gpu|n_?gpus?$|num_gpus|use_dist$",
                                re.IGNORECASE)


def _distributed_switch(test: ast.AST) -> bool:
    """Whether a test asks if the run is distributed at all (`args.distributed`, `world_size > 1`, `local_rank != -1`):
    its plain branch is the single-process run's, which is right."""
    return is_distributed_test(test) or any(DISTRIBUTED_SWITCH.search(name) for name in names_in(test))


def _handed_to_library(script: Script, call: ast.Call) -> bool:
    """Whether a loader is sharded by a library: passed to accelerate's prepare() or held by Lightning."""
    if script.imports("lightning") or script.imports("pytorch_lightning"):
        return True
    prepares = [c for c in script.calls_named("prepare", "prepare_data_loader")]
    if any(any(a is p for a in script.ancestors(call)) for p in prepares):
        return True
    stmt = script.statement(call)
    targets = [dotted(t) for t in getattr(stmt, "targets", [])]
    return any(dotted(arg) in targets for p in prepares for arg in p.args if dotted(arg))


def _sharded_dataset(script: Script, dataset: ast.AST | None) -> bool:
    """Whether the dataset is already this rank's share: its expression, or an assignment of it or of a
    variable it is computed from (`train.with_format("torch")` after `train = split_dataset_by_node(...)`),
    mentions the rank or shards."""
    if dataset is None:
        return False
    variables = {dotted(dataset) or ""} | {n.id for n in ast.walk(dataset) if isinstance(n, ast.Name)}
    exprs = [dataset, *(value for name in variables if name for value in script.assignments(name))]
    return any(SHARDING.search(name) for e in exprs for name in names_in(e))


def loader_is_unsharded(script: Script, call: ast.Call) -> bool:
    """Whether a `DataLoader(...)` call gives every rank the whole dataset: no sampler (or a plain one), no
    batch sampler, a dataset that is not this rank's share, and no library (Accelerate, Lightning) to shard it."""
    sampler = _argument(call, "sampler", 3)
    if _argument(call, "batch_sampler", 4) is not None or (sampler is not None and not _sampler_is_plain(script, sampler)):
        return False
    dataset = keyword(call, "dataset") or (call.args[0] if call.args else None)
    return not (_sharded_dataset(script, dataset) or _handed_to_library(script, call))


def check_loader_sampler(script: Script) -> Iterator[Hit]:
    """GS101: `DataLoader(...)` with no sampler, or a plain one, so every rank reads the whole dataset.

    A loader only the main rank reads is right: one created under a rank guard, or assigned to a
    name that is read only under one, also where it is handed to a function or class of the script
    (`Trainer(model, val_loader)`, then `self.val_loader` iterated only in an `if rank == 0:` branch).
    """
    guards = Guards(script)
    for call in script.calls_named("DataLoader"):
        if not loader_is_unsharded(script, call) or guards.guarded(call):
            continue
        if _only_used_on_main(script, guards, call):
            continue
        chooser = _plain_sampler_chooser(script, _argument(call, "sampler", 3))
        if chooser is not None:
            yield Hit(call, f"DataLoader whose sampler is a plain one unless {chooser}: every rank reads the whole dataset")
        else:
            yield Hit(call, "DataLoader without a DistributedSampler: every rank reads the whole dataset")


def _argument(call: ast.Call, name: str, position: int) -> ast.AST | None:
    """A call's argument by keyword or position; None when absent or passed as None (`sampler=None`)."""
    value = keyword(call, name) or (call.args[position] if len(call.args) > position else None)
    if isinstance(value, ast.Constant) and value.value is None:
        return None
    return value


def _only_used_on_main(script: Script, guards: Guards, call: ast.Call) -> bool:
    """Whether the loader is assigned to a name (`val_loader = DataLoader(...)`) that is only ever read under
    a rank-0 guard (`if rank == 0: evaluate(val_loader)`): only the main rank reads it, once, which is right."""
    stmt = script.statement(call)
    if not (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is call):
        return False
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    names = {dotted(t) for t in targets}
    if None in names or not names:
        return False
    return all(_read_only_on_main(script, guards, name, script.tree, FOLLOW_DEPTH) for name in names)  # type: ignore[arg-type]


def _read_only_on_main(script: Script, guards: Guards, name: str, where: ast.AST, depth: int) -> bool:
    """Whether every read of `name` inside `where` (the module, a function, a class) runs on the main rank only,
    following the value where it is handed on: an argument of the script's own function or class (its
    parameter is followed there), or stored as `self.x` (every read of `self.x` in the class is followed)."""
    uses = [n for n in ast.walk(where) if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)
            and dotted(n) == name]
    if not uses:
        return False
    for use in uses:
        if guards.guarded(use):
            continue
        handed = _handed_on(script, use) if depth > 0 else None
        if handed is None or not _read_only_on_main(script, guards, *handed, depth - 1):
            return False
    return True


def _handed_on(script: Script, use: ast.AST) -> tuple[str, ast.AST] | None:
    """Where a read value goes next: (parameter, function) for an argument of the script's function or class,
    ('self.x', class) for `self.x = value` in a method; None for any other use."""
    parent = script.parent(use)
    if isinstance(parent, ast.keyword):
        parent = script.parent(parent)
    if isinstance(parent, ast.Call) and use is not parent.func:
        function = calls.callee(script, parent)
        parameter = calls.parameter_of(script, parent, function, use) if function else None
        return (parameter, function) if parameter and function else None
    if isinstance(parent, ast.Assign) and parent.value is use and len(parent.targets) == 1:
        target = dotted(parent.targets[0]) or ""
        cls = next((a for a in script.ancestors(parent) if isinstance(a, ast.ClassDef)), None)
        if target.startswith("self.") and cls is not None:
            return target, cls
    return None


def is_eval_loader(script: Script, call: ast.Call) -> bool:
    """Whether a loader or sampler is for evaluation: its target or dataset is named val, eval, test or dev."""
    stmt = script.statement(call)
    words = [name for t in getattr(stmt, "targets", []) for name in names_in(t)]
    words += [name for a in call.args[:1] for name in names_in(a)]
    return any(EVAL.search(w) for w in words)


def check_set_epoch(script: Script) -> Iterator[Hit]:
    """GS102: a shuffling DistributedSampler in a script that never calls `set_epoch`, or calls it only with a
    constant (``sampler.set_epoch(0)``, in the epoch loop or once before it): the same seed, the same shuffle."""
    calls = [c for c in script.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch"]
    constant = bool(calls) and all(c.args and isinstance(c.args[0], ast.Constant) for c in calls) and \
        any(_epoch_loop(script, script.scope(c)) for c in calls)
    if script.mentions("set_epoch") and not constant:
        return
    why = "set_epoch() is only called with a constant" if constant else "set_epoch() is never called"
    for call in script.calls:
        if not last_name(call.func).endswith("DistributedSampler"):
            continue
        shuffle = keyword(call, "shuffle")
        if isinstance(shuffle, ast.Constant) and shuffle.value is False:
            continue
        if not is_eval_loader(script, call):
            yield Hit(call, f"DistributedSampler shuffles, but {why}")


def _epoch_loop(script: Script, scope: ast.AST) -> bool:
    """Whether `scope` has an epoch loop around another loop: a ``while``, or a ``for`` over ``range(...)`` or
    with a target named for epochs (``for epoch in ...``). A single pass (its batches' loop around micro-batches
    included) needs no new epoch."""
    loops = (ast.For, ast.While, ast.AsyncFor)

    def epochs(node: ast.AST) -> bool:
        if isinstance(node, ast.While):
            return True
        return isinstance(node, (ast.For, ast.AsyncFor)) and (
            "epoch" in ast.unparse(node.target).lower()
            or (isinstance(node.iter, ast.Call) and last_name(node.iter.func) in ("range", "count", "trange")))
    return any(epochs(node) and any(isinstance(inner, loops) for stmt in getattr(node, "body", []) for inner in ast.walk(stmt))
               for node in script.scope_nodes(scope))


def _same_value(script: Script, a: ast.AST, b: ast.AST) -> bool:
    """Whether two expressions hold the same value: the same text, or a name only ever assigned the other
    (`ws = dist.get_world_size()`, then `batch % ws` and `batch // dist.get_world_size()`)."""
    if ast.unparse(a) == ast.unparse(b):
        return True
    for name, other in ((dotted(a), b), (dotted(b), a)):
        values = script.assignments(name) if name else []
        if values and all(ast.unparse(v) == ast.unparse(other) for v in values):
            return True
    return False


def _on_path(script: Script, check: ast.AST, division: ast.AST) -> bool:
    """Whether a check runs on the way to a division: in the same function, in one that encloses it (the module
    body), or in one that runs the other, directly or through the script's functions (a launcher that checks
    the batch before mp.spawn hands it to the worker; a `validate(args)` the division's function calls)."""
    where, there = script.scope(check), script.scope(division)
    if where is there or any(a is where for a in script.ancestors(division)):
        return True
    return there in child_functions(script, [where]) or where in child_functions(script, [there])


def _is_check(script: Script, node: ast.AST, batch: ast.AST, divisor: ast.AST, share: set[str]) -> bool:
    """Whether `node` checks that `batch` divides by `divisor`: `batch % divisor` (an assert, an `if ... != 0:
    raise`, or a remainder handed out by hand), or `share * divisor == batch` for the share the division gives."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _same_value(script, node.left, batch) and _same_value(script, node.right, divisor)
    if not (isinstance(node, ast.Compare) and len(node.comparators) == 1):
        return False
    for product, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
        if isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult) and _same_value(script, other, batch):
            factors = [ast.unparse(product.left), ast.unparse(product.right)]
            if any(f in share for f in factors) and any(_same_value(script, f, divisor) for f in (product.left, product.right)):
                return True
    return False


def _checks_division(script: Script, node: ast.AST, batch: ast.AST, divisor: ast.AST) -> bool:
    """Whether the script checks that this batch divides by this divisor, on the division's path."""
    share = _target_values(script, node)
    return any(_is_check(script, other, batch, divisor, share) and _on_path(script, other, node) for other in script.nodes)


def _target_values(script: Script, node: ast.AST) -> set[str]:
    """The texts of what the statement holding `node` assigns (`per_rank` in `per_rank = batch // world`)."""
    stmt = script.statement(node)
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return {ast.unparse(t) for t in targets if t is not None}


def _target_words(script: Script, node: ast.AST) -> list[str]:
    stmt = script.statement(node)
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return [name for t in targets if t is not None for name in names_in(t)]


def check_integer_division(script: Script) -> Iterator[Hit]:
    """GS109: `x // world_size` or `int(x / world_size)`: a global batch that does not divide shrinks silently.

    Divisions of CPU cores, workers, threads or memory are not batches and are left alone, as are
    divisions the script checks: the same batch's remainder by the same divisor, on the division's path
    (not any `% world_size` of the file: `args.rank % ngpus_per_node` checks nothing about the batch).
    """
    for node in script.nodes:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            left, right = node.left, node.right
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.FloorDiv):
            left, right = node.target, node.value
        elif (isinstance(node, ast.Call) and last_name(node.func) in ("int", "floor") and len(node.args) == 1
              and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div)):
            left, right = node.args[0].left, node.args[0].right
        else:
            continue
        if not is_world_size(right) or _checks_division(script, node, left, right):
            continue
        words = [*names_in(left), *_target_words(script, node)]
        if any(NOT_BATCH.search(w) for w in words) or mentions_rank(left):
            continue
        yield Hit(node, f"{ast.unparse(node)}: integer division by the number of ranks drops the remainder")
