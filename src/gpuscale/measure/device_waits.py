"""Find the calls in a training step that would wait for the GPU, on any machine (a CPU included).

A step that reads a device tensor on the host (``.item()``, ``float(t)``, ``bool(t)`` in an ``if``, ``.tolist()``,
``.cpu()``, ``.numpy()``, printing it) or asks for data-dependent shapes (``nonzero``, boolean indexing,
``masked_select``) makes the host wait until the GPU has caught up: the GPU then idles while the host prepares the
next step. On a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` names such calls; `find_device_waits` names them
on a CPU too, where a test or a benchmark can run the step:

    with gpuscale.measure.device_waits.find_device_waits(model) as found:
        for _ in range(3):
            train_one_step()
    for site in found.sites():        # [{"kind": ".item() / float() / bool()", "where": "train.py:42", "calls": 3, ...}]
        print(site)

What counts as a device tensor: the model's parameters and buffers, every tensor the script moves to the training
device (``.to(device)``, ``.cuda()``, a factory with ``device=``; on a CPU the device must be named by a `torch.device`
such as ``rt.device``, since the string "cpu" names the host on purpose), and every tensor computed from one of these,
in the forward, the backward and the optimizer alike (followed through torch's dispatcher). A tensor the code keeps on
the host on purpose (a counter, a flag for a gloo all-reduce, torch's own optimizer step counts) is not one, as on a
GPU. Each finding names the first frame outside torch: the file and line to change.

Not seen here: code that synchronises only on a GPU (``if device.type == "cuda": torch.cuda.synchronize()``), and work
in other threads or processes (loader workers). bench/step_profile.py counts what a GPU really did.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DeviceWaits", "find_device_waits", "KINDS"]

_aten = torch.ops.aten
# ATen operators that read a tensor's values on the host or need them for an output's shape
_WAITING_OPS = {
    _aten._local_scalar_dense.default: ".item() / float() / int() / bool() of a tensor",
    _aten.is_nonzero.default: "bool() of a tensor",
    _aten.nonzero.default: "nonzero() / boolean indexing",
    _aten.masked_select.default: "masked_select() / boolean indexing",
}
_INDEXING = (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default)  # with a boolean mask: nonzero inside
# Tensor methods that copy a device tensor to the host (on a CPU they do not reach the dispatcher)
_HOST_COPIES = {
    torch.Tensor.cpu: ".cpu()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__repr__: "printing a tensor",
    torch.Tensor.__format__: "printing a tensor",
    torch.Tensor.__str__: "printing a tensor",
}
KINDS = tuple(dict.fromkeys([*_WAITING_OPS.values(), "boolean indexing", *_HOST_COPIES.values(), ".to('cpu')"]))
"""Every kind of call reported."""

_MARK = "_gpuscale_device_waits"
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_THIS_FILE = str(Path(__file__).resolve())


def _call_site() -> tuple[str, str]:
    """(file:line, function) of the first frame outside torch and this module."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = str(Path(frame.f_code.co_filename).resolve()) if not frame.f_code.co_filename.startswith("<") else frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != _THIS_FILE:
            return f"{_short(name)}:{frame.f_lineno}", frame.f_code.co_name
        frame = frame.f_back
    return "(torch)", ""


def _short(path: str) -> str:
    """A path from the package root down (site-packages/x/y.py -> x/y.py; .../src/gpuscale/m.py -> gpuscale/m.py)."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages", "src"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker):])
    return "/".join(parts[-2:])


def _is_host_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


class DeviceWaits:
    """The calls found while `find_device_waits` watched (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.calls: Counter[tuple[str, str, str]] = Counter()  # (kind, where, function) -> calls
        self._token = object()  # a device tensor carries it in _MARK (an id can be reused, a weak set compares values)
        self._reporting = False  # inside a host copy already reported: its own operators are not counted again
        self._thread = threading.get_ident()

    def mark(self, tensors: Iterable[Any]) -> None:
        """Count `tensors` (and what is computed from them) as device tensors."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                try:
                    setattr(t, _MARK, self._token)
                except (AttributeError, RuntimeError):  # a tensor type without a __dict__
                    pass

    def is_device_tensor(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and getattr(t, _MARK, None) is self._token

    def note(self, kind: str) -> None:
        if self._reporting or threading.get_ident() != self._thread:
            return
        where, function = _call_site()
        self.calls[(kind, where, function)] += 1

    def sites(self) -> list[dict[str, Any]]:
        """Every call site found, most calls first: kind, file:line, function, number of calls."""
        return [{"kind": kind, "where": where, "function": function, "calls": n}
                for (kind, where, function), n in self.calls.most_common()]

    def total(self) -> int:
        return sum(self.calls.values())


class _FollowTensors(TorchDispatchMode):
    """Marks every output computed from a device tensor; notes the operators that read values on the host."""

    def __init__(self, found: DeviceWaits) -> None:
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        from_device = any(self.found.is_device_tensor(t) for t in pytree.arg_tree_leaves(*args, **kwargs))
        if from_device and func in _WAITING_OPS:
            self.found.note(_WAITING_OPS[func])
        elif from_device and func in _INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                         for i in pytree.tree_leaves(args[1] if len(args) > 1 else ())):
            self.found.note("boolean indexing")
        out = func(*args, **kwargs)
        if from_device:
            self.found.mark(pytree.tree_leaves(out))
        return out


class _SeeHostCopies(TorchFunctionMode):
    """Notes host copies of device tensors; marks tensors the script moves or makes on the training device."""

    def __init__(self, found: DeviceWaits) -> None:
        super().__init__()
        self.found = found

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        found = self.found
        first = args[0] if args else None
        kind = _HOST_COPIES.get(func)
        if kind is None and func is torch.Tensor.to and found.device.type != "cpu":  # on a CPU .to("cpu") is .to(device)
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
            kind = ".to('cpu')" if _is_host_device(target) else None
        if kind is not None and found.is_device_tensor(first):
            found.note(kind)
            found._reporting, before = True, found._reporting
            try:
                return func(*args, **kwargs)
            finally:
                found._reporting = before
        out = func(*args, **kwargs)
        if self._moves_to_device(func, args, kwargs):
            found.mark(pytree.tree_leaves(out))
        return out

    def _moves_to_device(self, func: Any, args: Any, kwargs: Any) -> bool:
        """`.to(device)`, `.cuda()` or a factory with ``device=`` naming the training device. The string "cpu" always
        names the host (torch's own optimizers keep their step counts there with ``device="cpu"``), so on a CPU only
        a `torch.device` object (``rt.device``, ``model.device``) names the training device."""
        if func is torch.Tensor.cuda:
            return True
        targets = [kwargs.get("device")]
        if func is torch.Tensor.to:
            targets += [a for a in args[1:] if isinstance(a, (str, torch.device))]
        wanted = self.found.device.type
        return any(t is not None and torch.device(t).type == wanted and (wanted != "cpu" or isinstance(t, torch.device))
                   for t in targets)


@contextmanager
def find_device_waits(model: torch.nn.Module | None = None, device: str | torch.device | None = None) -> Iterator[DeviceWaits]:
    """Watch the code in the block for calls that would wait for the device (see the module docstring).

    model: its parameters and buffers are device tensors from the start. device: the training device (default: the
    model's, else the CPU); tensors moved to it count as device tensors.
    """
    if device is None:
        first = next(iter(model.parameters()), None) if model is not None else None
        device = first.device if first is not None else torch.device("cpu")
    found = DeviceWaits(torch.device(device))
    held = [*model.parameters(), *model.buffers()] if model is not None else []
    found.mark(held)
    try:
        with _SeeHostCopies(found), _FollowTensors(found):
            yield found
    finally:
        for t in held:  # the model's tensors outlive the search: leave them as they were
            if getattr(t, _MARK, None) is found._token:
                delattr(t, _MARK)
