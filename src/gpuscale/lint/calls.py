"""Calls between the functions of one script: which function a call runs, and which argument becomes which parameter.

Resolution is by name, as far as the text tells without running it: `f(...)` calls the script's one
function `f` (or, for a class, its `__init__`); `obj.m(...)` and `self.m(...)` call the script's one
method `m`. A name the script defines more than once, or not at all, resolves to nothing; the rules
that ask then assume the worst for a finding they would drop (and nothing for one they would make).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpuscale.lint.script import Script

Function = ast.FunctionDef | ast.AsyncFunctionDef
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def definitions(script: Script, name: str) -> list[ast.AST]:
    """The functions and classes of the script named `name` (at any depth)."""
    return script.defined.get(name, [])


def is_method(script: Script, function: ast.AST) -> bool:
    """Whether a function is defined directly in a class body."""
    return isinstance(script.parent(function), ast.ClassDef)


def constructor(cls: ast.ClassDef) -> Function | None:
    """A class's own `__init__`, if it defines one."""
    return next((n for n in cls.body if isinstance(n, FUNCTIONS) and n.name == "__init__"), None)


def callee(script: Script, call: ast.Call) -> Function | None:
    """The script's function a call runs: `f(...)`, `Class(...)` (its __init__), `obj.method(...)`; None if unknown."""
    func = call.func
    if isinstance(func, ast.Name):
        found = definitions(script, func.id)
        if len(found) != 1:
            return None
        target = found[0]
        return constructor(target) if isinstance(target, ast.ClassDef) else target  # type: ignore[return-value]
    if isinstance(func, ast.Attribute):
        found = [d for d in definitions(script, func.attr) if isinstance(d, FUNCTIONS) and is_method(script, d)]
        return found[0] if len(found) == 1 else None  # type: ignore[return-value]
    return None


def call_sites(script: Script, function: Function) -> list[ast.Call]:
    """The calls of the script that run `function` (outside its own body: recursion is not a caller)."""
    name = function.name
    if name == "__init__" and isinstance(cls := script.parent(function), ast.ClassDef):
        name = cls.name
    return [c for c in script.calls_named(name) if callee(script, c) is function
            and not any(a is function for a in script.ancestors(c))]


def parameters(function: Function, bound: bool) -> list[str]:
    """A function's positional parameter names; without `self`/`cls` when the call binds it."""
    names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    return names[1:] if bound and names else names


def _bound(script: Script, call: ast.Call, function: Function) -> bool:
    """Whether calling `function` through `call` binds its first parameter (a method or a class's __init__)."""
    return is_method(script, function) and (isinstance(call.func, ast.Attribute) or function.name == "__init__")


def parameter_of(script: Script, call: ast.Call, function: Function, arg: ast.AST) -> str | None:
    """The parameter of `function` that argument `arg` of `call` becomes; None after a `*args` splat."""
    for kw in call.keywords:
        if kw.value is arg:
            return kw.arg
    names = parameters(function, _bound(script, call, function))
    for index, value in enumerate(call.args):
        if isinstance(value, ast.Starred):
            return None
        if value is arg:
            return names[index] if index < len(names) else None
    return None


def argument_for(script: Script, call: ast.Call, function: Function, parameter: str) -> ast.AST | None:
    """The expression `call` passes for `parameter` of `function`, None when not passed (a default) or unknown."""
    for kw in call.keywords:
        if kw.arg == parameter:
            return kw.value
    names = parameters(function, _bound(script, call, function))
    if parameter in names:
        index = names.index(parameter)
        if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
            return call.args[index]
    return None


def scope_nodes(script: Script, scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes whose innermost function (or module) is `scope`, in source order."""
    yield from script.scope_nodes(scope)
