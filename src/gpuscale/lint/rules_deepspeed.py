"""GS113: a DeepSpeed config whose batch sizes disagree with the script's DataLoader.

The loader's batch is a constant, or an `args.batch_size`-like option whose argparse default is one
(what a run without that option trains with).

DeepSpeed's `train_batch_size` is global (micro batch x gradient accumulation x ranks) and
`train_micro_batch_size_per_gpu` is per rank. The loader feeds the per-rank batch, so a config
batch is wrong when its micro batch differs from the loader's constant `batch_size`, or when its
global batch is the very constant or variable the loader uses per rank.

The config is a dict literal in the script (`{"train_batch_size": ...}` or `dict(...)`), or a JSON
file named by a string constant and found next to the script (`"ds_config.json"`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from typing import Any

from gpuscale.lint.findings import Hit
from gpuscale.lint.rules_data import is_eval_loader
from gpuscale.lint.script import Script, dotted, keyword

GLOBAL, MICRO = "train_batch_size", "train_micro_batch_size_per_gpu"
MAX_CONFIG_BYTES = 1 << 20


def _value(expr: ast.AST | None) -> Any:
    """A comparable batch value: an int constant, ('name', 'args.batch_size') for a name, else None."""
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    name = dotted(expr) if expr is not None else None
    return ("name", name) if name else None


def _literal_configs(script: Script) -> Iterator[dict[str, Any]]:
    for node in script.nodes:
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values, strict=True)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            pairs = [(kw.arg, kw.value) for kw in node.keywords if kw.arg]
        config = {k: _value(v) for k, v in pairs if k in (GLOBAL, MICRO)}
        if config:
            yield config


def _file_configs(script: Script) -> Iterator[dict[str, Any]]:
    """JSON configs named by a string constant, read from the script's folder (never executed, only parsed)."""
    folder = script.directory
    if folder is None:
        return
    for node in script.nodes:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".json")):
            continue
        path = folder / node.value
        try:
            if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not a config we can read: nothing to compare
        if isinstance(data, dict):
            config = {k: v for k, v in data.items() if k in (GLOBAL, MICRO) and type(v) is int}
            if config:
                yield config


def check_deepspeed_batch(script: Script) -> Iterator[Hit]:
    """GS113: the DeepSpeed config's micro batch differs from the train loader's, or its global batch is the loader's."""
    if not (script.imports("deepspeed") or any(script.qualname(c).startswith("deepspeed.") for c in script.calls)):
        return
    configs = [*_literal_configs(script), *_file_configs(script)]
    if not configs:
        return
    for call in script.calls_named("DataLoader"):
        batch = _value(keyword(call, "batch_size") or (call.args[1] if len(call.args) > 1 else None))
        if batch is None or is_eval_loader(script, call):
            continue
        shown = batch if isinstance(batch, int) else batch[1]
        per_rank = batch if isinstance(batch, int) else _value(script.argparse_default(batch[1]))
        if isinstance(per_rank, int) and per_rank is not batch:
            shown = f"{shown} (default {per_rank})"
        for config in configs:
            micro, total = config.get(MICRO), config.get(GLOBAL)
            if isinstance(micro, int) and isinstance(per_rank, int) and micro != per_rank:
                yield Hit(call, f"DataLoader batch_size={shown} but {MICRO}={micro}")
                break
            if total is not None and total == batch:
                yield Hit(call, f"{GLOBAL} (global) is the DataLoader's per-rank batch_size={shown}")
                break
