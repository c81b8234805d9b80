"""examples/gptneo_imdb.py with a trace, for tests: per rank and step, digests of the batches the rank trained on
and of its weights, one JSON line per event in TRACE/rank{RANK}.jsonl.

argv: the example's options plus ``--trace TRACE``; launched as the example is (gpuscale run, torchrun).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import gptneo_imdb  # noqa: E402


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Trace(TrainerCallback):
    """Writes a "begin" event (the weights as training starts: a resumed run's are the checkpoint's) and a "step"
    event per optimizer step (the micro-batches of the step, then the weights)."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.batches: list[str] = []
        self.model: torch.nn.Module | None = None

    def record(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if module.training:  # not the evaluations
            self.batches.append(_digest(kwargs["input_ids"] if "input_ids" in kwargs else args[0]))

    def write(self, args: Any, entry: dict[str, Any]) -> None:
        with open(self.directory / f"rank{args.process_index}.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self.model = model
        model.register_forward_pre_hook(self.record, with_kwargs=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write(args, {"event": "begin", "step": state.global_step, "weights": weights_digest(model)})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.write(args, {"event": "step", "step": state.global_step, "batches": self.batches, "weights": weights_digest(self.model)})
        self.batches = []


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--trace", required=True)
    ours, example_argv = parser.parse_known_args()
    raise SystemExit(gptneo_imdb.main(example_argv, callbacks=[Trace(ours.trace)]))
