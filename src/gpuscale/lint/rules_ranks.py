"""Rules about code that runs on every rank but should run once: printing, logging, saving.

GS103 print() on every rank, GS104 INFO logging on every rank, GS105 torch.save/save_pretrained on
every rank, GS106 the DDP wrapper's state_dict saved (every key starts with `module.`), by torch.save or by
a helper of the script (`gpuscale.lint.saves` follows the value there).
Each accepts the rank guards of `gpuscale.lint.guards`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpuscale.lint import saves
from gpuscale.lint.findings import Hit
from gpuscale.lint.guards import RANKISH, Guards, mentions_rank
from gpuscale.lint.script import Script, dotted, keyword, last_name

QUIET_LEVELS = ("debug", "info")  # warnings and errors from every rank are right: each rank's own trouble
LOG_CONFIG = ("setLevel", "basicConfig", "disable", "addFilter", "set_verbosity", "set_verbosity_error",
              "set_verbosity_warning", "get_process_log_level")


def check_print(script: Script) -> Iterator[Hit]:
    """GS103: `print(...)` outside any rank guard (not to a file or stderr, not while handling an error).

    A script that replaces the built-in print (`builtins.print = ...`, as the torchvision reference
    scripts' setup_for_distributed does to silence every rank but the first), itself or in a module of its
    own it imports, is left alone.
    """
    if _replaces_print(script):
        return
    guards = Guards(script)
    for call in script.calls:
        if not (isinstance(call.func, ast.Name) and call.func.id == "print"):
            continue
        if keyword(call, "file") is not None or script.in_except(call) or tells_rank(call) or guards.guarded(call):
            continue
        yield Hit(call, "print() runs on every rank")


def _replaces_print(script: Script) -> bool:
    """Whether print is the script's own: it assigns `builtins.print` (or Python 2's `__builtin__.print`), a module of
    its own that it imports does (`utils.init_distributed_mode(args)`, whose module replaces print on every rank but
    the first), or a call passes `force=` (the replacement's keyword to print on every rank anyway)."""
    return _assigns_print(script) or any(_assigns_print(module) for module in script.own_modules) or any(
        isinstance(c.func, ast.Name) and c.func.id == "print" and keyword(c, "force") is not None for c in script.calls)


def _assigns_print(script: Script) -> bool:
    return any(isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "print" and script.qualname(t.value) in ("builtins", "__builtin__")
        for t in node.targets) for node in script.nodes)


def tells_rank(call: ast.Call) -> bool:
    """Whether a print's text includes the rank (`f"rank {rank} ready"`, `"[%d]" % dist.get_rank()`,
    `print("rank", rank)`): a deliberate message from each rank, as a per-rank file name is for GS105.
    Only values count, not the words of the text: `print("rank 0 is slow")` is an ordinary print."""
    for arg in call.args:
        for node in ast.walk(arg):
            if isinstance(node, ast.Name) and RANKISH.search(node.id):
                return True
            if isinstance(node, ast.Attribute) and RANKISH.search(node.attr):
                return True
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str) and RANKISH.search(node.slice.value):
                return True  # os.environ["RANK"]
    return False


def _stdlib_loggers(script: Script) -> set[str]:
    """Names and attributes assigned a standard-library logger (`log = logging.getLogger(__name__)`)."""
    names: set[str] = set()
    for node in script.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and script.qualname(node.value) == "logging.getLogger":
            names.update(name for name in (dotted(t) for t in node.targets) if name)
    return names


def _rank_aware_logging(script: Script, guards: Guards) -> bool:
    """Whether the script configures logging per rank (a level chosen by rank, a filter, HF's per-process level)."""
    for call in script.calls_named(*LOG_CONFIG):
        if last_name(call.func) in ("addFilter", "get_process_log_level") or guards.guarded(call):
            return True
        if any(mentions_rank(a) for a in [*call.args, *(k.value for k in call.keywords)]):
            return True
    return False


def check_logging(script: Script) -> Iterator[Hit]:
    """GS104: `logging.info(...)` or a standard logger's `.info/.debug` outside any rank guard; a message that
    includes the rank (`log.info("process %d ready", rank)`) is a deliberate line from each rank."""
    guards = Guards(script)
    if _rank_aware_logging(script, guards):
        return
    loggers = _stdlib_loggers(script)
    for call in script.calls:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr in QUIET_LEVELS):
            continue
        receiver = dotted(func.value)
        if not (script.qualname(func.value) == "logging" or receiver in loggers):
            continue
        if not guards.guarded(call) and not tells_rank(call):
            yield Hit(call, f"{receiver}.{func.attr}() logs on every rank")


def check_save(script: Script) -> Iterator[Hit]:
    """GS105: `torch.save` or `.save_pretrained(...)` (without `is_main_process=`) outside any rank guard.

    A path that mentions the rank (one file per rank) is deliberate and accepted.
    """
    guards = Guards(script)
    for call in script.calls:
        if script.qualname(call) == "torch.save":
            what = "torch.save() writes on every rank"
        elif last_name(call.func) == "save_pretrained" and keyword(call, "is_main_process") is None:
            what = "save_pretrained() writes on every rank"
        else:
            continue
        if any(mentions_rank(a) for a in [*call.args, *(k.value for k in call.keywords)]) or guards.guarded(call):
            continue
        yield Hit(call, what)


NOT_MODELS = ("optim", "Optimizer", "SGD", "Adam", "DataLoader", "loader", "schedul", "Schedul", "lr_")
"""Words in what an argument of `Accelerator.prepare` was made by (or named) that say it is no model."""


def _ddp_names(script: Script) -> dict[ast.AST, dict[str, int]]:
    """Scope -> the names (or attribute chains) assigned the DDP wrapper there, with the line of the first wrap. An
    attribute of ``self`` belongs to its class (the DDP tutorial wraps in ``__init__`` and saves in another method),
    any line; a model `Accelerator.prepare` returns is the DDP wrapper on several processes too."""
    found: dict[ast.AST, dict[str, int]] = {}
    for node in script.nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        targets = list(node.targets) if script.is_ddp(node.value) else _prepared_models(script, node)
        for target in targets:
            if (name := dotted(target)) is None:
                continue
            owner = _class_of(script, node) if name.startswith("self.") else None
            names = found.setdefault(owner or script.scope(node), {})
            names[name] = 0 if owner else min(names.get(name, node.lineno), node.lineno)
    return found


def _prepared_models(script: Script, node: ast.Assign) -> list[ast.AST]:
    """The targets of ``model, optimizer, loader = accelerator.prepare(model, optimizer, loader)`` that receive a
    model: every one whose argument is neither made nor named as an optimizer, a loader or a scheduler."""
    call = node.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "prepare"
            and _an_accelerator(script, call.func.value)):
        return []
    targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
    if len(targets) != len(call.args):
        return []
    return [target for target, arg in zip(targets, call.args, strict=True) if not _names_no_model(script, arg)]


def _an_accelerator(script: Script, expr: ast.AST) -> bool:
    """Whether `expr` was made by ``Accelerator(...)`` (not torch.ao.quantization's or another library's prepare)."""
    return any(isinstance(value, ast.Call) and script.callee(value) == "Accelerator"
               for value in script.assignments(dotted(expr) or ""))


def _names_no_model(script: Script, arg: ast.AST) -> bool:
    made = [ast.unparse(value) for value in script.assignments(dotted(arg) or "")]
    return any(word in text for text in [ast.unparse(arg), *made] for word in NOT_MODELS)


def _class_of(script: Script, node: ast.AST) -> ast.ClassDef | None:
    return next((a for a in script.ancestors(node) if isinstance(a, ast.ClassDef)), None)


def _wrapper(script: Script, wrapped: dict[ast.AST, dict[str, int]], expr: ast.AST, node: ast.AST) -> str | None:
    """The name of `expr` when it holds the DDP wrapper at `node`: assigned one earlier in the same function, and not
    assigned anything else since (``model = accelerator.unwrap_model(model)``), or an attribute of ``self`` its
    class assigned one. Not in a branch on whether it is wrapped (``if isinstance(model, DDP)``, ``hasattr(model,
    "module")``): the other branch saves the plain model's."""
    name = dotted(expr)
    owner = _class_of(script, node) if name and name.startswith("self.") else None
    scope = owner or script.scope(node)
    line = wrapped.get(scope, {}).get(name or "")
    if name is None or line is None or line >= getattr(node, "lineno", 0) or _branches_on_wrapping(script, node):
        return None
    if owner is None and _reassigned(script, scope, name, line, getattr(node, "lineno", 0)):
        return None
    return name


ACCELERATE_FIX = ("save accelerator.unwrap_model(model).state_dict() (or accelerator.get_state_dict(model)): "
                  "on one process Accelerate hands back the plain model, which has no .module")


def _fix_for(script: Script, name: str) -> str:
    """Accelerate's way where `name` is a model `Accelerator.prepare` returned; "" for the rule's own fix."""
    prepared = any(dotted(target) == name for node in script.nodes if isinstance(node, ast.Assign)
                   for target in _prepared_models(script, node))
    return ACCELERATE_FIX if prepared else ""


def _branches_on_wrapping(script: Script, node: ast.AST) -> bool:
    tests = [a.test for a in script.ancestors(node) if isinstance(a, (ast.If, ast.IfExp))]
    return any(word in ast.unparse(test) for test in tests for word in ("module", "DDP", "DistributedDataParallel"))


def _reassigned(script: Script, scope: ast.AST, name: str, after: int, before: int) -> bool:
    """Whether `name` is assigned something other than a wrapper between the lines `after` and `before` in `scope`."""
    for stmt in script.scope_nodes(scope):
        if isinstance(stmt, ast.Assign) and after < stmt.lineno < before and isinstance(stmt.value, ast.Call) \
                and not script.is_ddp(stmt.value) and any(dotted(t) == name for t in stmt.targets):
            return True
    return False


def check_wrapper_state_dict(script: Script) -> Iterator[Hit]:
    """GS106: `model.state_dict()` saved where `model` was assigned the DDP wrapper (under any import alias)
    earlier in the same function: by torch.save there, or by a helper of the script it is handed to
    (`save_checkpoint({"state_dict": model.state_dict()}, ...)`, `save_on_master(checkpoint, path)`), or the
    wrapper itself handed to a helper that saves its state_dict. `model.module.state_dict()` is right."""
    wrapped = _ddp_names(script)
    if not wrapped:
        return
    for call in script.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "state_dict" and (name := _wrapper(script, wrapped, func.value, call)):
            if saves.flows_to_save(script, call):
                yield Hit(call, f"{name}.state_dict() of the DDP wrapper is saved: every key starts with 'module.'",
                          _fix_for(script, name))
            continue
        for arg in [*call.args, *call.keywords]:
            name = _wrapper(script, wrapped, arg.value if isinstance(arg, ast.keyword) else arg, call)
            if name and saves.model_saved_by(script, call, arg):
                yield Hit(call, f"{ast.unparse(call.func)}() saves the state_dict of the DDP wrapper {name}: every "
                                f"key starts with 'module.'")
