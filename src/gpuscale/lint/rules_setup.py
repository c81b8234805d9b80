"""Rules about setting up processes, devices and models.

GS108 parameters unfrozen after the model was wrapped, GS110 a hard-coded rendezvous port,
GS111 a hard-coded GPU index, GS112 a process group that is never destroyed, GS116 the current GPU used and never
chosen per rank.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpuscale.lint.findings import Hit
from gpuscale.lint.script import Script, environ_key, int_constant, keyword, last_name, names_in

PARAMETER_WORDS = re.compile(r"param|weight|bias|model|module|layer|net|encoder|decoder|backbone|head|block|embed|"
                             r"features|classifier|fc|lm_head|transformer", re.IGNORECASE)
# Names of what a script makes trainable on purpose: parameters and modules (a bare name, or a chain's last part).
PARAMETER_NAME = re.compile(r"^(p|w|b|params?|parameters?|weights?|biases?)$|param|weight|bias|model|module|layer|"
                            r"net|encoder|decoder|backbone|block|classifier|lm_head|transformer", re.IGNORECASE)
# Names of input tensors and outputs: asking for their gradient is attribution or adversarial code, not unfreezing.
INPUT_WORDS = re.compile(r"^(x\d*|xs|inp|inputs?|input_\w+|inputs_\w+|images?|imgs?|pixel_values|batch|data|samples?|"
                         r"tensors?|targets?|labels?|tokens?|noise|delta|perturbations?|adv\w*|out|outputs?|logits|loss|"
                         r"activations?|hidden_states?|grads?|y|z|h)$|embeds$|masks?$|_ids$|^ids$",
                         re.IGNORECASE)
MODULE_GETTERS = ("get_input_embeddings", "get_output_embeddings", "get_submodule", "get_parameter", "get_encoder",
                  "get_decoder", "getattr")
TENSOR_FACTORIES = frozenset({
    "zeros", "ones", "randn", "rand", "randint", "empty", "full", "tensor", "as_tensor", "from_numpy", "arange",
    "zeros_like", "ones_like", "randn_like", "rand_like", "empty_like", "full_like", "clone", "detach", "new_zeros",
    "new_ones", "new_empty", "new_full", "new_tensor", "stack", "cat",
})
MODULE_NAMES = ("model", "net", "module", "encoder", "decoder", "backbone", "embed", "embedding", "embeddings")
PARAMETER_SOURCES = ("parameters", "named_parameters", "modules", "children", "named_modules", "named_children")
TCP_PORT = re.compile(r"^tcp://.*:\d+/?$")
CUDA_INDEX = re.compile(r"^cuda:\d+$")
VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
DEVICE_CHOOSERS = ("set_device", "set_device_index")  # torch.cuda.set_device, torch.accelerator.set_device_index


def _unfreezes(node: ast.AST) -> ast.AST | None:
    """The parameter (or module) a statement or call makes trainable, if it does."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                return target.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_":
        arg = node.args[0] if node.args else keyword(node, "requires_grad")
        if arg is None or (isinstance(arg, ast.Constant) and arg.value is True):
            return node.func.value
    return None


def _loop_over_parameters(script: Script, name: str, node: ast.AST) -> bool:
    """Whether `name` is the variable of an enclosing loop over `.parameters()` (or modules)."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (ast.For, ast.comprehension)) and name in names_in(ancestor.target):
            return any(isinstance(n, ast.Call) and last_name(n.func) in PARAMETER_SOURCES for n in ast.walk(ancestor.iter))
    return False


def _is_parameter(script: Script, expr: ast.AST, node: ast.AST) -> bool:
    """Whether the thing made trainable is a parameter or module, not an input tensor.

    Parameters: a loop variable over `.parameters()` / `.named_parameters()` (or modules), names like
    `param`, `p`, `weight`, `bias`, `model`, `net.head`, `model.encoder.layer[0]`, a name assigned one of
    those or `nn.Parameter(...)`. Not: input tensors (`x`, `inputs*`, `*embeds`, `*mask*`, `*_ids`, outputs)
    and tensors created in the function (`emb = model.embed(ids)`, `delta = torch.zeros_like(x)`), as in
    attribution and adversarial code that asks for the gradient of an input.
    """
    if isinstance(expr, ast.Subscript):  # params[name], dict(model.named_parameters())["fc.weight"]
        return _is_parameter(script, expr.value, node)
    if isinstance(expr, ast.Call):  # model.get_input_embeddings().requires_grad_(), getattr(model, "fc")
        return last_name(expr.func) in MODULE_GETTERS
    if isinstance(expr, ast.Attribute):
        if expr.attr == "data":  # param.data: the tensor of whatever it is
            return _is_parameter(script, expr.value, node)
        if INPUT_WORDS.search(expr.attr):
            return False
        return any(PARAMETER_WORDS.search(name) for name in names_in(expr)) or _is_parameter(script, expr.value, node)
    if not isinstance(expr, ast.Name):
        return False
    if _loop_over_parameters(script, expr.id, node):
        return True
    if INPUT_WORDS.search(expr.id):
        return False
    scope = script.scope(node)
    values = [v for v in script.assignments(expr.id) if script.scope(v) is scope]
    if values and all(_creates_tensor(script, v) for v in values):
        return False  # weights = torch.ones(n), emb = model.embed(ids): a tensor of this function
    if PARAMETER_NAME.search(expr.id):
        return True
    return any(_is_parameter_value(script, v, node) for v in values)


def _creates_tensor(script: Script, value: ast.AST) -> bool:
    """Whether a value is certainly a tensor computed here: `torch.zeros(...)`, `x.clone()`, `torch.ones_like(w)`,
    or a module's output (`model(x)`, `model.embed_tokens(ids)`); not `Net()`, `nn.Parameter(...)`,
    `accelerator.prepare(model)` or `build_model(cfg)`."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = last_name(func)
    if name in ("to", "cuda", "cpu", "float", "half", "bfloat16", "double") and isinstance(func, ast.Attribute):
        return _creates_tensor(script, func.value)
    if name in TENSOR_FACTORIES:
        return True
    if isinstance(func, ast.Name):
        return func.id in MODULE_NAMES
    return isinstance(func, ast.Attribute) and bool(PARAMETER_WORDS.search(name)) and not name.startswith(
        ("get_", "named_", "parameters", "modules", "children", "from_", "build", "create", "load", "make", "prepare"))


def _is_parameter_value(script: Script, value: ast.AST, node: ast.AST) -> bool:
    """Whether an assigned value is a parameter or module: `nn.Parameter(...)`, `model.fc.weight`, `model.fc`."""
    if isinstance(value, ast.Call):
        return last_name(value.func) in ("Parameter", *MODULE_GETTERS)
    if isinstance(value, (ast.Attribute, ast.Subscript)):
        return _is_parameter(script, value, node)
    return False


def check_unfreeze_after_wrap(script: Script) -> Iterator[Hit]:
    """GS108: `p.requires_grad = True` / `requires_grad_()` after DDP, FSDP, deepspeed.initialize or gpuscale.setup/wrap
    in the same function (or module body), with no second wrap after it."""
    wraps: dict[ast.AST, list[int]] = {}
    for call in script.calls:
        if script.is_wrap(call):
            wraps.setdefault(script.scope(call), []).append(call.lineno)
    for node in script.nodes:
        expr = _unfreezes(node)
        if expr is None:
            continue
        lines = wraps.get(script.scope(node), [])
        at = getattr(node, "lineno", 0)
        if any(line < at for line in lines) and not any(line > at for line in lines) \
                and _is_parameter(script, expr, node):
            yield Hit(node, f"{ast.unparse(expr)} made trainable after the model was wrapped")


def _constant_text(expr: ast.AST) -> str | None:
    """The text of a constant (str, int, str(<constant>), an f-string without fields), else None."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, (str, int)) and not isinstance(expr.value, bool):
        return str(expr.value)
    if isinstance(expr, ast.Call) and last_name(expr.func) == "str" and len(expr.args) == 1:
        return _constant_text(expr.args[0])
    if isinstance(expr, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in expr.values):
        return "".join(str(v.value) for v in expr.values)  # type: ignore[attr-defined]
    return None


def _is_environ(script: Script, expr: ast.AST) -> bool:
    return script.qualname(expr) in ("os.environ", "environ")


def check_master_port(script: Script) -> Iterator[Hit]:
    """GS110: MASTER_PORT set to a constant, or a constant port in a `tcp://host:PORT` init_method."""
    for node in script.nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and _is_environ(script, target.value)
                        and _constant_text(target.slice) == "MASTER_PORT" and _constant_text(node.value) is not None):
                    yield Hit(node, f"MASTER_PORT is hard-coded to {_constant_text(node.value)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_environ(script, node.func.value):
            if node.func.attr == "setdefault" and len(node.args) == 2 and _constant_text(node.args[0]) == "MASTER_PORT" \
                    and _constant_text(node.args[1]) is not None:
                yield Hit(node, f"MASTER_PORT is hard-coded to {_constant_text(node.args[1])}")
            elif node.func.attr == "update":
                pairs = [(k, v) for a in node.args if isinstance(a, ast.Dict) for k, v in zip(a.keys, a.values, strict=True) if k is not None]
                pairs += [(ast.Constant(kw.arg), kw.value) for kw in node.keywords if kw.arg]
                for key, value in pairs:
                    if _constant_text(key) == "MASTER_PORT" and _constant_text(value) is not None:
                        yield Hit(node, f"MASTER_PORT is hard-coded to {_constant_text(value)}")
        elif isinstance(node, (ast.Constant, ast.JoinedStr)) and not script.is_docstring(node):
            if isinstance(script.parent(node), ast.JoinedStr):
                continue
            text = node.value if isinstance(node, ast.Constant) else "".join(
                str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if isinstance(text, str) and TCP_PORT.match(text):
                yield Hit(node, f"init_method {text!r} hard-codes the port")


def check_device_index(script: Script) -> Iterator[Hit]:
    """GS111: a hard-coded GPU: "cuda:0", torch.device("cuda", 0), .cuda(0), set_device(0), device_ids=[0]."""
    for node in script.nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_INDEX.match(node.value):
            parent = script.parent(node)
            if script.is_docstring(node) or isinstance(parent, ast.JoinedStr) or (isinstance(parent, ast.Dict) and node in parent.keys):
                continue  # map_location={"cuda:0": ...} maps from where a tensor was saved: right
            yield Hit(node, f'"{node.value}": every rank of the node uses the same GPU')
        elif isinstance(node, ast.Call):
            name = last_name(node.func)
            if name == "device" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value == "cuda" and int_constant(node.args[1]) is not None:
                yield Hit(node, f"{ast.unparse(node)}: every rank of the node uses the same GPU")
            elif name in ("cuda", "set_device") and isinstance(node.func, ast.Attribute) \
                    and int_constant(node.args[0] if node.args else keyword(node, "device")) is not None:
                yield Hit(node, f"{ast.unparse(node)}: every rank of the node uses the same GPU")
            for kw in node.keywords:
                value = kw.value
                if kw.arg == "device_ids" and isinstance(value, (ast.List, ast.Tuple)) and value.elts \
                        and all(int_constant(e) is not None for e in value.elts):
                    yield Hit(value, f"device_ids={ast.unparse(value)}: every rank of the node uses the same GPU")
                elif kw.arg == "output_device" and int_constant(value) is not None:
                    yield Hit(value, f"output_device={ast.unparse(value)}: every rank of the node uses the same GPU")


def check_destroy(script: Script) -> Iterator[Hit]:
    """GS112: `init_process_group` with no `destroy_process_group` anywhere (gpuscale.init() tears down by itself)."""
    if script.uses_gpuscale_init or script.mentions("destroy_process_group"):
        return
    for call in script.calls_named("init_process_group"):
        yield Hit(call, "init_process_group() without destroy_process_group()")
        return


def _current_gpu(script: Script, node: ast.AST) -> str | None:
    """What in `node` means "the current GPU" (cuda:0 until a rank chooses another): `.cuda()` without an index,
    `.to("cuda")`, `torch.device("cuda")`, `device="cuda"`; None for anything else."""
    if isinstance(node, ast.Call):
        name = last_name(node.func)
        if name == "cuda" and isinstance(node.func, ast.Attribute) and not node.args and keyword(node, "device") is None:
            return ast.unparse(node)
        if name == "device" and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cuda":
            return ast.unparse(node)
        if name == "to" and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cuda":
            return ast.unparse(node)
        device = keyword(node, "device")
        if isinstance(device, ast.Constant) and device.value == "cuda" and not script.qualname(node).startswith("torch.cuda."):
            return f'device="cuda" in {last_name(node.func)}(...)'
    return None


def _sets_visible_devices(script: Script) -> bool:
    """Whether the script sets CUDA_VISIBLE_DEVICES (or ROCm's) itself: `os.environ[...] = ...`, `.setdefault(...)`,
    `os.putenv(...)`; reading it sets nothing."""
    for node in script.nodes:
        if isinstance(node, ast.Assign) and any(environ_key(script, t) in VISIBLE_DEVICES for t in node.targets):
            return True
        if isinstance(node, ast.Call) and last_name(node.func) in ("setdefault", "putenv", "update") \
                and any(isinstance(a, ast.Constant) and a.value in VISIBLE_DEVICES for a in node.args):
            return True
    return False


def check_current_gpu(script: Script) -> Iterator[Hit]:
    """GS116: a script that starts its own process group and puts tensors on the current GPU (`.cuda()`, "cuda"),
    but never chooses each rank's (torch.cuda.set_device) nor gives each rank its own visible devices: the
    current GPU is cuda:0 on every rank of the node. gpuscale.init() chooses it; Accelerate, Lightning and HF's
    Trainer start the group themselves and choose it too."""
    if script.uses_gpuscale_init or not script.calls_named("init_process_group"):
        return
    if script.calls_named(*DEVICE_CHOOSERS) or any(script.qualname(c) == "torch.cuda.device" for c in script.calls) \
            or _sets_visible_devices(script):
        return  # chosen (set_device, `with torch.cuda.device(rank):`), or each rank sees only its own GPU
    uses = [(node, what) for node in script.nodes if (what := _current_gpu(script, node)) is not None]
    if uses:  # one finding, at the first use: one fix mends them all
        node, what = min(uses, key=lambda use: (use[0].lineno, use[0].col_offset))  # type: ignore[attr-defined]
        yield Hit(node, f"{what} with no torch.cuda.set_device(local_rank) anywhere: every rank of the node uses cuda:0")
