"""What ends in `torch.save`: a value followed into the call that saves it, through the script's own helpers.

A value is saved when it is an argument of torch.save (inside a dict or a list too), when it is assigned to
a local that is saved, or when it is handed to one of the script's functions whose parameter is saved
there: the PyTorch ImageNet example's `save_checkpoint(state, is_best)` (`torch.save(state, filename)`),
the torchvision references' `save_on_master(*args, **kwargs)` (`torch.save(*args, **kwargs)` under a
rank check). A model is saved by a helper that saves its parameter's `state_dict()`. Helpers are followed
`DEPTH` calls deep; calls resolve as `gpuscale.lint.calls` resolves them (by name).
"""

from __future__ import annotations

import ast

from gpuscale.lint import calls
from gpuscale.lint.script import Script, dotted

DEPTH = 3


def _parameter(script: Script, call: ast.Call, function: calls.Function, arg: ast.AST) -> str | None:
    """The parameter of `function` that `arg` (an argument of `call`, or its keyword) becomes: a named one, or the
    `*args` / `**kwargs` that collects it; None when a splat before it hides where it lands."""
    if isinstance(arg, ast.keyword):
        if arg.arg is None:
            return None
        named = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
        if arg.arg in named:
            return arg.arg
        return function.args.kwarg.arg if function.args.kwarg else None
    if isinstance(arg, ast.Starred) or arg not in call.args:
        return None
    named_parameter = calls.parameter_of(script, call, function, arg)
    if named_parameter is not None:
        return named_parameter
    if any(isinstance(a, ast.Starred) for a in call.args[: call.args.index(arg)]):
        return None
    return function.args.vararg.arg if function.args.vararg else None


def _handed_to_saver(script: Script, call: ast.Call, arg: ast.AST, depth: int) -> bool:
    """Whether `call` runs a function of the script that saves the parameter `arg` is passed as."""
    function = calls.callee(script, call)
    if function is None:
        return False
    parameter = _parameter(script, call, function, arg)
    return parameter is not None and name_saved(script, function, parameter, depth - 1)


def flows_to_save(script: Script, expr: ast.AST, depth: int = DEPTH) -> bool:
    """Whether the value of `expr` ends in torch.save: inside its arguments, assigned to a name that is saved in
    the same function, or handed to a helper of the script that saves it."""
    child = expr
    for ancestor in script.ancestors(expr):
        if isinstance(ancestor, ast.Call) and child is not ancestor.func:
            if script.qualname(ancestor) == "torch.save":
                return True
            if depth > 0 and _handed_to_saver(script, ancestor, child, depth):
                return True
        if isinstance(ancestor, (ast.Assign, ast.AnnAssign)):
            targets = ancestor.targets if isinstance(ancestor, ast.Assign) else [ancestor.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            return depth > 0 and any(name_saved(script, script.scope(ancestor), n, depth - 1) for n in names)
        if isinstance(ancestor, ast.stmt):
            return False
        child = ancestor
    return False


def name_saved(script: Script, scope: ast.AST, name: str, depth: int) -> bool:
    """Whether a name of a function (or of the module body) is read somewhere there into torch.save."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               and flows_to_save(script, n, depth) for n in script.scope_nodes(scope))


def model_saved_by(script: Script, call: ast.Call, arg: ast.AST, depth: int = DEPTH) -> bool:
    """Whether the model passed as `arg` of `call` has its own `state_dict()` saved inside the script's function
    that `call` runs (`export(model, path)` with `torch.save(net.state_dict(), path)`), or deeper."""
    function = calls.callee(script, call)
    parameter = _parameter(script, call, function, arg) if function is not None else None
    if function is None or parameter is None or depth <= 0:
        return False
    for node in script.scope_nodes(function):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "state_dict" and dotted(func.value) == parameter
                and flows_to_save(script, node, depth - 1)):
            return True
        for passed in [*node.args, *node.keywords]:
            value = passed.value if isinstance(passed, ast.keyword) else passed
            if dotted(value) == parameter and model_saved_by(script, node, passed, depth - 1):
                return True
    return False
