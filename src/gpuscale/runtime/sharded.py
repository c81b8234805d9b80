"""Reading sharded (torch.distributed.checkpoint) checkpoints without ever running full pickle.

DCP stores its ``.metadata`` with plain pickle and reads non-tensor items with
``torch.load(weights_only=False)``: a checkpoint directory from elsewhere could run code when
loaded. gpuscale loads checkpoints with ``weights_only=True`` only (docs/reliability.md), so here:

- `verify_metadata` unpickles ``.metadata`` with an allow-list of the classes DCP's metadata is
  made of (its own dataclasses, torch.Size, dtypes, paths) and refuses anything else;
- `SafeLoadPlanner` / `load_all` read non-tensor items with ``weights_only=True``.

Call `verify_metadata` before any DCP load; `load` and `load_all` do.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

__all__ = ["verify_metadata", "SafeLoadPlanner", "load", "load_all"]

_ALLOWED_PATHS = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint."):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return super().find_class(module, name)
        if module == "pathlib" and name in _ALLOWED_PATHS:
            return getattr(pathlib, name)
        if (module, name) == ("collections", "OrderedDict"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in checkpoint metadata: not part of a DCP checkpoint")


def verify_metadata(directory: str | Path) -> None:
    """Raise ValueError unless ``directory/.metadata`` exists and holds only DCP metadata classes."""
    path = Path(directory) / ".metadata"
    if not path.is_file():
        inside = sorted(p for folder in (Path(directory), Path(directory) / "checkpoints") for p in folder.glob("step-*")
                        if (p / ".metadata").is_file() or (p.is_file() and p.suffix == ".pt"))  # sharded, or one file
        if inside:  # a run's folder, or its checkpoints/: the checkpoints are below
            raise ValueError(f"{directory} is not a checkpoint but holds {len(inside)}: give one, e.g. the latest, {inside[-1]}")
        if Path(directory).name.startswith("step-"):
            raise ValueError(f"{directory} is not a complete sharded checkpoint (no .metadata: cut short?); use an older step-* directory")
        raise ValueError(f"{directory} is not a sharded checkpoint (no .metadata); give a step-* folder of a run's checkpoints")
    try:
        with path.open("rb") as f:
            _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise ValueError(f"{path} is not trustworthy DCP metadata ({exc}); refusing to load it") from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor items are read with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        super().load_bytes(read_item, _WeightsOnly(value))


class _SafeEmptyLoadPlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        super().load_bytes(read_item, _WeightsOnly(value))


class _WeightsOnly(io.BytesIO):
    """Bytes that, once handed to the base planner's torch.load, are read with weights_only=True.

    The base planners call ``torch.load(value, weights_only=False)``; loading here first and
    handing over a re-serialised plain copy means that call only ever sees safe data.
    """

    def __init__(self, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        super().__init__(buffer.getvalue())


def load(state: dict[str, Any], directory: str | Path, no_dist: bool) -> None:
    """`torch.distributed.checkpoint.load` into `state` (collective unless no_dist), safely."""
    import torch.distributed.checkpoint as dcp

    verify_metadata(directory)
    dcp.load(state, checkpoint_id=str(directory), planner=SafeLoadPlanner(), no_dist=no_dist)


def load_all(directory: str | Path) -> dict[str, Any]:
    """Everything in a sharded checkpoint as plain tensors on one process (for consolidation)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    verify_metadata(directory)
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(directory)), planner=_SafeEmptyLoadPlanner(), no_dist=True)
    return state
