"""GPT-neo on IMDB for `python -m bench gpu`: examples/gptneo_imdb.py with GPT-neo-125M's shape, on packed blocks.

The example's offline model is tiny, made to learn in minutes on a CPU; for throughput and model-FLOPs
utilisation on a GPU this trains instead a GPT-neo of GPT-neo-125M's shape (12 layers, width 768, 12 heads,
alternating global and local attention, 2,048 positions: 92.9 M parameters with the offline 8,192-token
vocabulary), on the reviews joined and cut into full --block-size blocks (HF's group_texts: no padding trained
on, so every token counted is a real one; --val-chunks and --test-chunks then count blocks). ``--model-size tiny``
keeps the example's own tiny model (packed: a check of the plumbing on a CPU). Every other option is the
example's, and it runs as the example does, --attention included (default: torch's scaled_dot_product_attention,
examples/gptneo_attention.py; ``--attention eager`` for transformers' own, ``flex`` for FlexAttention's local layers):

    gpuscale run --nproc-per-node 1 bench/gptneo_bench.py --block-size 512 --out runs/gptneo-125m
    gpuscale run --nproc-per-node 1 bench/gptneo_bench.py --block-size 1024 --attention eager --out runs/gptneo-125m-eager

summary.json gains ``model_shape`` and ``packed``, from which (with the example's ``parameters``) bench/gpu.py
counts the model FLOPs per token; the example's ``attention`` says which attention ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

import gpuscale
from gpuscale.base.files import atomic_write_json
from gpuscale.detect.log import current_rank

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.step_profile
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gptneo_imdb as example  # noqa: E402

import gptneo_imdb_data as data  # noqa: E402

# GPT-neo-125M's layers and widths (its vocabulary aside: the offline tokenizer has 8,192 tokens); its 2,048 positions
# unless --block-size asks for more
GPT_NEO_125M = {"hidden_size": 768, "num_heads": 12, "num_layers": 12, "intermediate_size": 3072}
SIZES = ("125m", "tiny")
PROFILE = "step_profile.json"


def profile_window(text: str) -> tuple[int, int]:
    """--profile-steps START:COUNT, both positive."""
    start, _, count = text.partition(":")
    if not (start.isdigit() and count.isdigit() and int(start) >= 1 and int(count) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not START:COUNT with START and COUNT at least 1, e.g. 30:5")
    return int(start), int(count)


def pack(chunks: data.Chunks, block_size: int) -> data.Chunks:
    """The same tokens joined and cut into full chunks of `block_size` (HF's group_texts; the tail is dropped)."""
    usable = len(chunks.ids) - len(chunks.ids) % block_size
    return data.Chunks(chunks.ids[:usable], torch.arange(0, usable + 1, block_size, dtype=torch.int64))


def packed_data(args: argparse.Namespace, rt: gpuscale.Runtime) -> tuple[Any, data.Chunks, data.Chunks, data.Chunks]:
    """The example's data, packed before the validation split: (tokenizer, train, validation, test) of full blocks."""
    tokenizer, every, test = data.load_chunks(args, rt)
    return (tokenizer, *data.split(args, pack(every, args.block_size), pack(test, args.block_size)))


def build_model(args: argparse.Namespace, tokenizer: Any, rt: gpuscale.Runtime | None, size: str = "125m") -> torch.nn.Module:
    """The example's offline GPT-neo at GPT-neo-125M's shape (or, size "tiny", at the example's own)."""
    if size == "tiny":
        return example.build_model(args, tokenizer, rt)
    shape = {**GPT_NEO_125M, "max_position_embeddings": max(2048, args.block_size)}
    return example.build_model(args, tokenizer, rt, shape=shape)


def model_shape(model: torch.nn.Module) -> dict[str, Any] | None:
    """Layers, width, attention span and position-embedding size of a GPT-neo: what its FLOPs per token depend on
    besides the parameters (None for other architectures: bench/gpu.py then reports no MFU)."""
    config = model.config
    if getattr(config, "model_type", None) != "gpt_neo":
        return None
    wpe = getattr(getattr(model, "transformer", None), "wpe", None)
    return {"num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "attention_layers": list(config.attention_layers), "window_size": config.window_size,
            "position_embedding_parameters": getattr(wpe.weight, "ds_numel", wpe.weight.numel()) if wpe is not None else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptneo_bench.py", description=__doc__, allow_abbrev=False, add_help=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog="the example's options:")
    parser.add_argument("--model-size", choices=SIZES, default="125m",
                        help="shape of the offline model (default 125m: GPT-neo-125M's; tiny: the example's, for a CPU)")
    parser.add_argument("--profile-steps", type=profile_window, default=None, metavar="START:COUNT",
                        help="profile COUNT optimizer steps after the first START (bench/step_profile.py) into "
                             "OUT/step_profile.json, e.g. 30:5")
    ours, argv = parser.parse_known_args(argv)
    if {"-h", "--help"} & set(argv):
        parser.print_help()  # then the example's options, and exit
    args = example.parse_args(argv)
    if args.model != data.OFFLINE:
        gpuscale.print0(f"gptneo_bench: error: --model {args.model} has its own size; the benchmark trains the offline "
                        "model (leave --model out)")
        return 2
    built: list[torch.nn.Module] = []

    def make_model(args: argparse.Namespace, tokenizer: Any, rt: gpuscale.Runtime) -> torch.nn.Module:
        built.append(build_model(args, tokenizer, rt, ours.model_size))
        return built[-1]

    callbacks = []
    if ours.profile_steps is not None:
        from bench.step_profile import profile_callback

        start, count = ours.profile_steps
        callbacks.append(profile_callback(start, count, Path(args.out) / PROFILE))
    code = example.main(argv, make_data=packed_data, make_model=make_model, callbacks=callbacks)
    if code == 0 and current_rank()[0] == 0:  # rank 0 wrote the summary: add what the FLOPs count needs
        path = Path(args.out) / "summary.json"
        from bench.sdpa import sdpa_switches  # what SDPA's dispatcher obeyed in this run (bench sdpa, BENCHMARKS.md)

        atomic_write_json(path, {**json.loads(path.read_text()), "model_shape": model_shape(built[0]), "packed": True,
                                 "sdpa_switches": sdpa_switches()})
    return code


if __name__ == "__main__":
    raise SystemExit(main())
