"""Rules about data and numbers: who sees which samples, how batches and metrics add up.

GS101 DataLoader without a DistributedSampler, GS102 DistributedSampler without set_epoch,
GS107 metrics of one rank's shard never reduced, GS109 strong scaling by integer division.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpuscale.lint.findings import Hit
from gpuscale.lint.guards import Guards, mentions_rank
from gpuscale.lint.script import Script, dotted, is_world_size, keyword, last_name, names_in

PLAIN_SAMPLERS = ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler")
SHARDING = re.compile(r"rank|world_size|num_replicas|shard|split_dataset_by_node", re.IGNORECASE)
EVAL = re.compile(r"val|eval|test|dev", re.IGNORECASE)
# Collectives and helpers that combine values over ranks; one anywhere means metrics may be reduced.
# By name where the name says so; `gather` / `reduce` only where they are torch.distributed's or a
# library object's (accelerator.gather, fabric.all_reduce): `logits.gather(1, idx)` and
# functools.reduce combine nothing over ranks.
REDUCTIONS = frozenset({
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_reduce_sum", "all_reduce_max", "gather_for_metrics", "reduce_dict",
    "mesh_reduce", "all_reduce_mean", "allreduce", "allgather", "allgather_object", "Average", "Meter", "sync_dist",
})
RANK_COLLECTIVES = frozenset({"gather", "gather_object", "reduce", "broadcast_object_list"})
COLLECTIVE_OWNERS = re.compile(r"^(torch\.distributed|horovod|gpuscale|torch_xla)\b|accelerat|fabric|(^|[._])dist(ributed)?$|"
                               r"^(hvd|xm)$|strategy|(^|[._])state$", re.IGNORECASE)
# Accuracy-like counters: correct / n_correct / running_corrects / correct_k, accuracy, acc / acc1 / val_acc /
# top1_acc, top1 / top5. Not correct_bias, bias_correction1, grad_acc_steps, acc_steps.
METRIC = re.compile(r"(^|_)corrects?(_(?!bias)|$|\d)|accuracy|(^|_)acc\d*$|(^|_)top_?[15](_|$)", re.IGNORECASE)
NOT_BATCH = re.compile(r"cpu|core|worker|thread|mem", re.IGNORECASE)


def _sampler_is_plain(script: Script, sampler: ast.AST) -> bool:
    """Whether a sampler argument is certainly not distributed (RandomSampler(...), or a name only assigned one)."""
    values = [sampler] if isinstance(sampler, ast.Call) else script.assignments(dotted(sampler) or "")
    return bool(values) and all(isinstance(v, ast.Call) and last_name(v.func) in PLAIN_SAMPLERS for v in values)


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
    """Whether the dataset is already this rank's share (its expression or assignment mentions rank or shards)."""
    if dataset is None:
        return False
    exprs = [dataset, *script.assignments(dotted(dataset) or "")]
    return any(SHARDING.search(name) for e in exprs for name in names_in(e))


def check_loader_sampler(script: Script) -> Iterator[Hit]:
    """GS101: `DataLoader(...)` with no sampler, or a plain one, so every rank reads the whole dataset."""
    guards = Guards(script)
    for call in script.calls_named("DataLoader"):
        sampler = _argument(call, "sampler", 3)
        batch_sampler = _argument(call, "batch_sampler", 4)
        if batch_sampler is not None or (sampler is not None and not _sampler_is_plain(script, sampler)):
            continue
        dataset = keyword(call, "dataset") or (call.args[0] if call.args else None)
        if _sharded_dataset(script, dataset) or _handed_to_library(script, call) or guards.guarded(call):
            continue
        if _only_used_on_main(script, guards, call):
            continue
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
    uses = [n for n in script.nodes if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)
            and dotted(n) in names]
    return bool(uses) and all(guards.guarded(use) for use in uses)


def is_eval_loader(script: Script, call: ast.Call) -> bool:
    """Whether a loader or sampler is for evaluation: its target or dataset is named val, eval, test or dev."""
    stmt = script.statement(call)
    words = [name for t in getattr(stmt, "targets", []) for name in names_in(t)]
    words += [name for a in call.args[:1] for name in names_in(a)]
    return any(EVAL.search(w) for w in words)


def check_set_epoch(script: Script) -> Iterator[Hit]:
    """GS102: a shuffling DistributedSampler in a script that never calls `set_epoch`."""
    if script.mentions("set_epoch"):
        return
    for call in script.calls:
        if not last_name(call.func).endswith("DistributedSampler"):
            continue
        shuffle = keyword(call, "shuffle")
        if isinstance(shuffle, ast.Constant) and shuffle.value is False:
            continue
        if not is_eval_loader(script, call):
            yield Hit(call, "DistributedSampler shuffles, but set_epoch() is never called")


def _metric_statement(node: ast.AST) -> bool:
    """An accuracy-like counter being computed: `correct += ...`, `acc = correct / total`, `acc = (p == y).mean()`."""
    if isinstance(node, ast.AugAssign):
        return any(METRIC.search(n) for n in names_in(node.target))
    if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Constant):
        if not any(METRIC.search(last_name(t) or "") for t in node.targets):
            return False
        return any(isinstance(n, (ast.Compare, ast.BinOp)) or (isinstance(n, ast.Call) and last_name(n.func) in ("sum", "mean", "item", "eq"))
                   for n in ast.walk(node.value))
    return False


def _is_reduction(script: Script, call: ast.Call) -> bool:
    """Whether a call combines values over ranks: a collective by its name, or torch.distributed's (or an
    accelerator's, fabric's) gather / reduce."""
    name = last_name(call.func)
    if name in REDUCTIONS:
        return True
    if name not in RANK_COLLECTIVES:
        return False
    qualname = script.qualname(call)
    if qualname.startswith("torch.distributed."):
        return True
    owner = call.func.value if isinstance(call.func, ast.Attribute) else None
    names = {script.qualname(owner), dotted(owner) or ""} if owner is not None else set()
    return any(name and COLLECTIVE_OWNERS.search(name) for name in names)


def check_metrics_reduced(script: Script) -> Iterator[Hit]:
    """GS107: accuracy-like counters computed on this rank's shard, in a script with no reduction at all."""
    if any(_is_reduction(script, c) for c in script.calls) or script.imports("torchmetrics"):
        return
    guards = Guards(script)
    reported: set[ast.AST] = set()
    for node in script.nodes:
        if _metric_statement(node) and script.scope(node) not in reported and not guards.guarded(node):
            reported.add(script.scope(node))
            target = node.target if isinstance(node, ast.AugAssign) else node.targets[0]
            yield Hit(node, f"{dotted(target) or last_name(target) or 'metric'} counts this rank's shard only and is never reduced over ranks")


def _checks_remainder(script: Script, divisor: ast.AST) -> bool:
    """Whether the script also takes `x % <same divisor>` (it checks that the division is exact)."""
    text = ast.dump(divisor)
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and ast.dump(n.right) == text for n in script.nodes)


def _target_words(script: Script, node: ast.AST) -> list[str]:
    stmt = script.statement(node)
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return [name for t in targets if t is not None for name in names_in(t)]


def check_integer_division(script: Script) -> Iterator[Hit]:
    """GS109: `x // world_size` or `int(x / world_size)`: a global batch that does not divide shrinks silently.

    Divisions of CPU cores, workers, threads or memory are not batches and are left alone, as are
    divisions whose remainder the script also computes (it checks them).
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
        if not is_world_size(right) or _checks_remainder(script, right):
            continue
        words = [*names_in(left), *_target_words(script, node)]
        if any(NOT_BATCH.search(w) for w in words) or mentions_rank(left):
            continue
        yield Hit(node, f"{ast.unparse(node)}: integer division by the number of ranks drops the remainder")
