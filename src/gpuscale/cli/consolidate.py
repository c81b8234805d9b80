"""`gpuscale consolidate CHECKPOINT OUT`: one plain state dict from any gpuscale checkpoint, or a DeepSpeed one.

A sharded checkpoint (a step-NNNNNNNNN directory written by the fsdp or deepspeed strategy, one shard
file per rank), a full one (a step-NNNNNNNNN.pt file), or a checkpoint DeepSpeed's own save_checkpoint
wrote (the HF Trainer's checkpoint-N under DeepSpeed, or the global_stepN inside it) becomes OUT, a
state dict with the model's own keys that loads on one process for inference:

    model.load_state_dict(torch.load("model.pt", weights_only=True))
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from gpuscale.cli.verbs import verb_parser
from gpuscale.train.checkpoint import NOT_A_PICKLE, consolidate

EPILOG = """examples:
  gpuscale consolidate runs/vit/checkpoints/step-000001000 model.pt
  gpuscale consolidate runs/dvc/checkpoints/step-000000496.pt model.pt
  gpuscale consolidate runs/gptneo_imdb/checkpoint-500 model.pt     # the HF Trainer's, under DeepSpeed
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "consolidate", __doc__, EPILOG)
    parser.add_argument("checkpoint", help="a step-* file or directory written by gpuscale.Checkpointer, or a DeepSpeed "
                        "checkpoint folder (the HF Trainer's checkpoint-N)")
    parser.add_argument("out", help="where to write the state dict (.pt)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        # torch warns about the "pickle protocol" of whatever byte a file that is not a checkpoint starts with
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        try:
            path = consolidate(args.checkpoint, args.out)
        except NOT_A_PICKLE as exc:  # from a sharded or DeepSpeed directory's own files: refused in one line too
            raise ValueError(f"{args.checkpoint!r} is not a checkpoint ({type(exc).__name__} reading it); "
                             "give a step-* file or directory written by gpuscale.Checkpointer") from None
    print(f"wrote {path}")
    return 0
