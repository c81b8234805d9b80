"""GS107: an accuracy of one rank's shard, never reduced over the ranks, reported as the dataset's.

A counter (`correct += (pred == y).sum()`, `acc = correct / total`) is followed through the names
computed from it in its function, into what the function returns and the names its callers assign
that to (`val_loss, val_acc = self.evaluate()`). It is reduced when a collective (all_reduce,
torch.distributed's gather/reduce, accelerator.gather, gpuscale's Average...) or a helper of the
script that calls one (`reduce_tensor(acc)`, `meter.synchronize_between_processes()`) takes one of
those names, or when the counter is counted from values a collective returned. A reduction of
something else (the loss) does not reduce the accuracy.

It counts one rank's shard only when the loop that counts it may iterate a sharded loader: over a
DataLoader without a DistributedSampler every rank counts the whole dataset (GS101's business when
every rank does it), and the number is right. The finding points at the print or log line that
reports the number, one under a rank guard first (rank 0 reporting its own shard as the dataset's),
else at the counter itself. A number printed with its rank (`print(f"rank {rank}: {correct} right")`)
is each rank's own, on purpose.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator

from gpuscale.lint import calls
from gpuscale.lint.findings import Hit
from gpuscale.lint.guards import Guards
from gpuscale.lint.rules_data import loader_is_unsharded
from gpuscale.lint.rules_ranks import tells_rank
from gpuscale.lint.script import Script, dotted, keyword, last_name, names_in

# Collectives and helpers that combine values over ranks. By name where the name says so;
# `gather` / `reduce` only where they are torch.distributed's or a library object's (accelerator.gather,
# fabric.all_reduce): `logits.gather(1, idx)` and functools.reduce combine nothing over ranks.
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
# Calls that show a number to the user: print, logging, TensorBoard, Weights & Biases, progress bars.
REPORTS = frozenset({"print", "print0", "info", "debug", "warning", "log", "add_scalar", "add_scalars", "set_postfix",
                     "set_description", "write"})
# Methods that store a value in the object they are called on (a meter, a list, a dict of meters).
STORING = frozenset({"update", "append", "extend", "add", "add_", "insert", "add_batch", "setdefault", "put"})
LOOP_WRAPPERS = ("enumerate", "tqdm", "iter")
CALLER_DEPTH = 2


def metric_statement(node: ast.AST) -> bool:
    """An accuracy-like counter being computed: `correct += ...`, `acc = correct / total`, `acc = (p == y).mean()`."""
    if isinstance(node, ast.AugAssign):
        return any(METRIC.search(n) for n in names_in(node.target))
    if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Constant):
        if not any(METRIC.search(last_name(t) or "") for t in node.targets):
            return False
        return any(isinstance(n, (ast.Compare, ast.BinOp)) or (isinstance(n, ast.Call) and last_name(n.func) in ("sum", "mean", "item", "eq"))
                   for n in ast.walk(node.value))
    return False


def is_reduction(script: Script, call: ast.Call) -> bool:
    """Whether a call combines values over ranks: a collective by its name, or torch.distributed's (or an
    accelerator's, fabric's) gather / reduce."""
    name = last_name(call.func)
    if name in REDUCTIONS:
        return True
    sync = keyword(call, "sync_dist")  # Lightning's self.log(..., sync_dist=True) reduces over the ranks
    if sync is not None and not (isinstance(sync, ast.Constant) and not sync.value):
        return True
    if name not in RANK_COLLECTIVES:
        return False
    if script.qualname(call).startswith("torch.distributed."):
        return True
    owner = call.func.value if isinstance(call.func, ast.Attribute) else None
    names = {script.qualname(owner), dotted(owner) or ""} if owner is not None else set()
    return any(name and COLLECTIVE_OWNERS.search(name) for name in names)


def reducing_helpers(script: Script) -> set[ast.AST]:
    """The script's functions that reduce what they are given: they call a collective, or another such helper."""
    helpers: set[ast.AST] = set()
    functions = [n for n in script.nodes if isinstance(n, calls.FUNCTIONS)]
    changed = True
    while changed:
        changed = False
        for function in functions:
            if function not in helpers and any(
                    isinstance(n, ast.Call) and (is_reduction(script, n) or calls.callee(script, n) in helpers)
                    for n in calls.scope_nodes(script, function)):
                helpers.add(function)
                changed = True
    return helpers


def _names(expr: ast.AST) -> set[str]:
    """Every name, attribute name and dotted chain an expression mentions."""
    found = set(names_in(expr))
    found.update(d for n in ast.walk(expr) if (d := dotted(n)))
    return found


def _base(target: ast.AST) -> str | None:
    """The variable a target writes into: `x` for `x`, `x[0]`, `x.y[k]`; 'self.x' for `self.x`."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return dotted(target)


def _targets(target: ast.AST) -> set[str]:
    """The variables an assignment target writes into (each element of a tuple target)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_targets(e) for e in target.elts))
    base = _base(target)
    return {base} if base else set()


def follow(script: Script, scope: ast.AST, seeds: set[str]) -> set[str]:
    """The names of `scope` computed from `seeds`: assigned from them, looped over them, or a container
    that stores them (`meters["acc"].update(acc)`, `accs.append(acc)` make `meters` and `accs` ones)."""
    tainted = set(seeds)
    nodes = list(calls.scope_nodes(script, scope))
    changed = True
    while changed:
        changed = False
        for node in nodes:
            new: set[str] = set()
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None \
                    and _names(node.value) & tainted:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                new = set().union(*(_targets(t) for t in targets))
            elif isinstance(node, (ast.For, ast.comprehension)) and _names(node.iter) & tainted:
                new = _targets(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STORING \
                    and any(_names(a) & tainted for a in [*node.args, *(k.value for k in node.keywords)]):
                new = {b for b in [_base(node.func.value)] if b}
            if new - tainted:
                tainted |= new
                changed = True
    return tainted


def _reduced(script: Script, scope: ast.AST, tainted: set[str], helpers: set[ast.AST]) -> bool:
    """Whether a collective (or a reducing helper) of `scope` takes one of the tainted names, as an argument
    or as the object it is called on (`meter.synchronize_between_processes()`)."""
    for node in calls.scope_nodes(script, scope):
        if not isinstance(node, ast.Call):
            continue
        if not (is_reduction(script, node) or calls.callee(script, node) in helpers):
            continue
        taken = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(node.func, ast.Attribute):
            taken.append(node.func.value)
        if any(_names(a) & tainted for a in taken):
            return True
    return False


def _counted_from_reduced(script: Script, scope: ast.AST, counters: list[ast.AST], helpers: set[ast.AST]) -> bool:
    """Whether a counter is counted from values a collective returned or filled (`correct += (gather(p) ==
    gather(y)).sum()`, `acc1 = reduce_tensor(acc1)`, `dist.all_gather(predictions, p)`)."""
    def reduces(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and (is_reduction(script, node) or calls.callee(script, node) in helpers)

    def reducing(expr: ast.AST) -> bool:
        return any(reduces(n) for n in ast.walk(expr))

    reduced_names: set[str] = set()
    for node in calls.scope_nodes(script, scope):
        if isinstance(node, ast.Assign) and reducing(node.value):
            reduced_names |= set().union(*(_targets(t) for t in node.targets))
        elif reduces(node):
            reduced_names |= {b for a in node.args if (b := _base(a))}  # type: ignore[attr-defined]
    return any(reducing(c.value) or _names(c.value) & reduced_names for c in counters)  # type: ignore[attr-defined]


def _loop_source(script: Script, node: ast.AST) -> ast.AST | None:
    """What the innermost enclosing `for` loop of a counter iterates, `enumerate(...)` and `tqdm(...)` peeled."""
    loop = next((a for a in script.ancestors(node) if isinstance(a, (ast.For, ast.AsyncFor))), None)
    if loop is None:
        return None
    source = loop.iter
    while isinstance(source, ast.Call) and last_name(source.func) in LOOP_WRAPPERS and source.args:
        source = source.args[0]
    return source


def _loaders(script: Script, expr: ast.AST, scope: ast.AST, depth: int = 3) -> list[ast.Call] | None:
    """The DataLoader(...) calls an expression may be (through assignments, `self.x` and the callers' arguments
    for a parameter); None when any of its values is something else or cannot be told."""
    if isinstance(expr, ast.Call):
        return [expr] if last_name(expr.func) == "DataLoader" else None
    name = dotted(expr)
    if name is None or depth < 0:
        return None
    if isinstance(scope, calls.FUNCTIONS) and name in {a.arg for a in scope.args.args + scope.args.kwonlyargs}:
        found: list[ast.Call] = []
        sites = calls.call_sites(script, scope)
        for site in sites:
            argument = calls.argument_for(script, site, scope, name)
            values = _loaders(script, argument, script.scope(site), depth - 1) if argument is not None else None
            if values is None:
                return None
            found += values
        return found or None
    assigned = script.assignments(name)
    if not assigned:
        return None
    found = []
    for value in assigned:
        loaders = _loaders(script, value, script.scope(value), depth - 1)
        if loaders is None:
            return None
        found += loaders
    return found


def _whole_dataset(script: Script, counters: list[ast.AST]) -> bool:
    """Whether the counters are counted in loops over loaders that give every rank the whole dataset (those
    outside any loop, `acc = correct / total`, only divide what the loops counted)."""
    looped = [(source, c) for c in counters if (source := _loop_source(script, c)) is not None]
    for source, counter in looped:
        loaders = _loaders(script, source, script.scope(counter))
        if not loaders or not all(loader_is_unsharded(script, loader) for loader in loaders):
            return False
    return bool(looped)


def _gathered_by_library(script: Script, scope: ast.AST) -> bool:
    """Whether `scope` is a function a library hands the predictions of every rank, gathered: HF's Trainer calls
    its `compute_metrics=` with the whole evaluation set's (`gather_for_metrics`), on every rank."""
    if not isinstance(scope, calls.FUNCTIONS) or isinstance(scope, ast.Lambda):
        return False
    return any(k.arg == "compute_metrics" and isinstance(k.value, ast.Name) and k.value.id == scope.name
               for call in script.calls for k in call.keywords)


def _reports(script: Script, scope: ast.AST, tainted: set[str]) -> list[ast.Call]:
    """The calls of `scope` that show one of the tainted names: print, logging, TensorBoard, W&B, progress bars."""
    return [n for n in calls.scope_nodes(script, scope) if isinstance(n, ast.Call) and last_name(n.func) in REPORTS
            and any(_names(a) & tainted for a in [*n.args, *(k.value for k in n.keywords)])]


def _returned(function: ast.AST, tainted: set[str]) -> list[bool] | None:
    """Which parts of what a function returns are tainted: one flag per element of a returned tuple (the same
    length in every return), or a single flag; None when nothing tainted is returned."""
    returns = [n.value for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
    if not any(_names(r) & tainted for r in returns):
        return None
    tuples = [r for r in returns if isinstance(r, ast.Tuple)]
    if len(tuples) == len(returns) and len({len(r.elts) for r in tuples}) == 1:
        return [any(_names(r.elts[i]) & tainted for r in tuples) for i in range(len(tuples[0].elts))]
    return [True]


def _caller_names(script: Script, site: ast.Call, parts: list[bool]) -> set[str]:
    """The names a caller assigns the tainted parts of a call's result to (`val_loss, val_acc = evaluate()`)."""
    stmt = script.statement(site)
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return set()
    target, value = stmt.targets[0], stmt.value
    if value is not site and isinstance(value, ast.Tuple) and site in value.elts and isinstance(target, ast.Tuple) \
            and len(target.elts) == len(value.elts):  # a, b = f(), g()
        return _targets(target.elts[value.elts.index(site)]) if any(parts) else set()
    if value is site and isinstance(target, ast.Tuple) and len(parts) == len(target.elts) > 1:
        return set().union(*(_targets(t) for t, part in zip(target.elts, parts, strict=False) if part))
    return _targets(target) if value is site or site in list(ast.walk(value)) else set()


def _sibling_methods(script: Script, scope: ast.AST, tainted: set[str]) -> list[tuple[ast.AST, set[str]]]:
    """For counters kept on `self` (`self.correct += ...`): the other methods of the class, each with the names
    computed there from those attributes (a `result()` method may reduce what `step()` counted)."""
    attributes = {name for name in tainted if name.startswith("self.")}
    cls = script.parent(scope)
    if not attributes or not isinstance(cls, ast.ClassDef):
        return []
    return [(m, follow(script, m, attributes)) for m in cls.body if isinstance(m, calls.FUNCTIONS) and m is not scope]


def _flows(script: Script, scope: ast.AST, tainted: set[str], helpers: set[ast.AST],
           depth: int) -> tuple[bool, list[ast.Call]]:
    """(reduced, reports) for tainted names of `scope` and, through its return value, of its callers (and, for
    counters kept on `self`, of the class's other methods)."""
    if _reduced(script, scope, tainted, helpers):
        return True, []
    reports = _reports(script, scope, tainted)
    for method, names in _sibling_methods(script, scope, tainted):
        if _reduced(script, method, names, helpers):
            return True, []
        reports += _reports(script, method, names)
    parts = _returned(scope, tainted) if isinstance(scope, calls.FUNCTIONS) and depth > 0 else None
    if parts is None:
        return False, reports
    for site in calls.call_sites(script, scope):  # type: ignore[arg-type]
        caller = script.scope(site)
        report = next((a for a in script.ancestors(site) if isinstance(a, ast.Call) and last_name(a.func) in REPORTS), None)
        if report is not None:
            reports.append(report)
        names = _caller_names(script, site, parts)
        if names:
            reduced, more = _flows(script, caller, follow(script, caller, names), helpers, depth - 1)
            if reduced:
                return True, []
            reports += more
    return False, reports


def _prints_once(report: ast.Call) -> bool:
    """Whether a report prints on the main rank only by itself: accelerator.print / fabric.print, print0."""
    name = last_name(report.func)
    return name == "print0" or (name == "print" and isinstance(report.func, ast.Attribute))


def _counters_by_scope(script: Script, guards: Guards) -> dict[ast.AST, list[ast.AST]]:
    """The unguarded accuracy counters of each function (or the module body), in source order."""
    found: dict[ast.AST, list[ast.AST]] = {}
    for node in script.nodes:
        if metric_statement(node) and not guards.guarded(node):
            found.setdefault(script.scope(node), []).append(node)
    for counters in found.values():
        counters.sort(key=lambda n: (n.lineno, n.col_offset))  # type: ignore[attr-defined]
    return found


def _counter_names(counters: Iterable[ast.AST]) -> set[str]:
    """The variables the counters count into."""
    names: set[str] = set()
    for counter in counters:
        targets = [counter.target] if isinstance(counter, ast.AugAssign) else counter.targets  # type: ignore[attr-defined]
        names |= set().union(*(_targets(t) for t in targets))
    return names


def check_metrics_reduced(script: Script) -> Iterator[Hit]:
    """GS107: accuracy-like counters of a rank's shard that nothing reduces over the ranks; the finding points
    at the line that reports them (rank-guarded first), else at the first counter."""
    if script.imports("torchmetrics"):
        return
    guards = Guards(script)
    helpers = reducing_helpers(script)
    for scope, counters in _counters_by_scope(script, guards).items():
        if _gathered_by_library(script, scope) or _whole_dataset(script, counters) or \
                _counted_from_reduced(script, scope, counters, helpers):
            continue
        seeds = _counter_names(counters)
        reduced, reports = _flows(script, scope, follow(script, scope, seeds), helpers, CALLER_DEPTH)
        if reduced:
            continue
        name = " / ".join(sorted(seeds)) or "metric"
        if reports and all(tells_rank(r) for r in reports):
            continue  # `print(f"rank {rank}: {correct} right")`: each rank's own number, on purpose
        reports = [r for r in reports if not tells_rank(r)]
        guarded = [r for r in reports if guards.guarded(r) or _prints_once(r)]
        if guarded or reports:
            where = (guarded or reports)[0]
            whose = "rank 0 reports" if guarded else "every rank reports"
            yield Hit(where, f"{whose} {name} of its own shard only: nothing reduces it over the ranks")
        else:
            yield Hit(counters[0], f"{name} counts this rank's shard only and is never reduced over ranks")
