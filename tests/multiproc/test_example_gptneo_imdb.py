"""The GPT-neo-on-IMDB example (HF Trainer) on two CPU processes: it learns, it is really distributed,
DeepSpeed runs with the exact global batch, and an interrupted run resumes where it stopped.

All runs share one offline data cache (tokenizer and chunks are built by the first run). Short
runs evaluate on few chunks (--val-chunks, --test-chunks), and glibc keeps the large freed blocks
of a step for the next one (MALLOC_*_THRESHOLD_, about half the step time on a CPU), to keep the
file within a few minutes. The traced runs start tests/multiproc/scripts/gptneo_traced.py: the
example with a Trainer callback that records each rank's batches and weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuscale.measure.metrics import SUMMARY_KEYS

from procs import EXAMPLES, SCRIPTS, assert_ok, gpuscale_cmd, run, torchrun_cmd

pytestmark = pytest.mark.multiproc
EXAMPLE = str(EXAMPLES / "gptneo_imdb.py")
TRACED = str(SCRIPTS / "gptneo_traced.py")  # the example, and --trace DIR: per rank and step, batch and weight digests
# glibc: serve the logits (batch x block x vocabulary floats) from the heap and keep them for the next step instead of
# mapping and faulting in fresh pages each step (mallopt's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD, as environment)
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
SHORT = ["--val-chunks", "32", "--test-chunks", "32", "--num-samples", "2", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def env(example_data):
    """The session's offline cache (BPE tokenizer, tokenised reviews), and glibc's faster setting."""
    return {"GPUSCALE_DATA": example_data, **KEEP_FREED_MEMORY}


def _summary(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    assert not missing, f"summary.json lacks {missing}"
    return summary


def _trace(directory: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (directory / f"rank{rank}.jsonl").read_text().splitlines()]


def test_two_processes_learn_to_a_tenth_of_the_perplexity(tmp_path, env):
    """The offline default: validation perplexity falls to a tenth or less; results printed once."""
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", EXAMPLE, "--out", str(tmp_path)), timeout=900, **env)
    assert_ok(result)
    summary = _summary(tmp_path)
    assert summary["world_size"] == 2 and summary["launcher"] == "torchrun" and summary["backend"] == "gloo"
    assert summary["strategy"] == "ddp" and summary["scaling"] == "strong"
    assert summary["global_batch"] == 32 and summary["per_device_batch"] == 16 and summary["grad_accum_steps"] == 1
    assert summary["steps"] == summary["global_step"] == 240 and summary["samples"] == 240 * 32
    assert summary["perplexity"] <= summary["initial_perplexity"] / 10, (summary["initial_perplexity"], summary["perplexity"])
    assert summary["initial_perplexity"] > 7000  # a random model over 8,192 tokens starts near uniform
    assert summary["test_perplexity"] < summary["initial_perplexity"] / 5
    assert [h["step"] for h in summary["history"]] == [0, 120, 240]
    assert summary["final_loss"] is not None and summary["final_loss"] < 7.5
    split = summary["time_split_s"]
    assert all(v is None or v >= 0 for v in split.values()) and split["compute"] > 0 and split["eval"] > 0 and split["checkpoint"] > 0
    # the HF Trainer runs its own backward pass: no sync probe, and the summary says why
    assert summary["sync_probe"]["status"] == "not measured" and "Trainer" in summary["sync_probe"]["why"]
    assert split["exposed_comm"] is None and split["imbalance"] is None
    output = result.stdout + result.stderr
    assert output.count("test perplexity") == 1, "the results must be printed once, by rank 0"
    assert output.count("--- sample 1/4") == 1 and output.count("--- sample 4/4") == 1
    assert (tmp_path / "checkpoint-240" / "trainer_state.json").is_file()


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory, env):
    """A traced run stopped after 4 steps (checkpoints at 2 and 4), then continued to 6 under torchrun."""
    out, trace = tmp_path_factory.mktemp("resumed"), tmp_path_factory.mktemp("trace")
    common = [TRACED, "--out", str(out), "--save-steps", "2", "--eval-steps", "2", *SHORT]
    first = run(gpuscale_cmd("run", "--nproc-per-node", "2", *common, "--max-steps", "4", "--trace", str(trace / "first")),
                timeout=600, **env)
    assert_ok(first)
    first_summary = _summary(out)
    second = run(torchrun_cmd(2, *common, "--max-steps", "6", "--trace", str(trace / "second")), timeout=600, **env)
    assert_ok(second)
    return {"out": out, "trace": trace, "first": first_summary, "second": _summary(out), "second_log": second.stderr}


def test_ranks_train_on_different_batches_with_the_same_weights(interrupted_run):
    """The Trainer is really distributed: each step, the ranks' batches differ and their weights agree."""
    trace = interrupted_run["trace"] / "first"
    ranks = [_trace(trace, r) for r in (0, 1)]
    steps = [[e for e in r if e["event"] == "step"] for r in ranks]
    assert [e["step"] for e in steps[0]] == [e["step"] for e in steps[1]] == [1, 2, 3, 4]
    assert ranks[0][0]["event"] == "begin" and ranks[0][0]["weights"] == ranks[1][0]["weights"]
    seen: list[set[str]] = [set(), set()]
    for a, b in zip(*steps, strict=False):
        assert len(a["batches"]) == len(b["batches"]) == 1  # one micro-batch of 16 per rank and step
        assert a["batches"] != b["batches"], f"step {a['step']}: both ranks trained on the same batch"
        assert a["weights"] == b["weights"], f"step {a['step']}: the ranks' weights differ after the step"
        seen[0].update(a["batches"])
        seen[1].update(b["batches"])
    assert seen[0].isdisjoint(seen[1])
    weights = [e["weights"] for e in steps[0]]
    assert len(set(weights)) == len(weights), "the weights did not change at every step"


def test_resume_continues_from_the_last_checkpoint(interrupted_run):
    first, second = interrupted_run["first"], interrupted_run["second"]
    assert first["global_step"] == 4 and first["steps"] == 4
    assert second["global_step"] == 6 and second["steps"] == 2, "the resumed run must run only the missing steps"
    assert second["launcher"] == "torchrun" and second["world_size"] == 2
    assert "resuming from" in interrupted_run["second_log"] and "checkpoint-4" in interrupted_run["second_log"]
    before = _trace(interrupted_run["trace"] / "first", 0)
    after = _trace(interrupted_run["trace"] / "second", 0)
    assert after[0]["event"] == "begin" and after[0]["step"] == 4
    assert after[0]["weights"] == before[-1]["weights"], "the resumed run did not start from the checkpoint's weights"
    assert [e["step"] for e in after if e["event"] == "step"] == [5, 6]
    old = {b for e in before if e["event"] == "step" for b in e["batches"]}
    assert not old & {b for e in after if e["event"] == "step" for b in e["batches"]}, "resumed with batches already seen"
    assert [h["step"] for h in second["history"]] == [4, 6]


def test_deepspeed_two_processes_keep_the_global_batch(tmp_path, env):
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", EXAMPLE, "--out", str(tmp_path), "--strategy", "deepspeed",
                              "--max-steps", "3", "--eval-steps", "3", "--save-steps", "3", *SHORT),
                 timeout=600, **env)
    assert_ok(result)
    summary = _summary(tmp_path)
    assert summary["strategy"] == "deepspeed" and summary["world_size"] == 2
    assert summary["global_batch"] == 32 and summary["per_device_batch"] == 16 and summary["steps"] == 3
    assert summary["perplexity"] < summary["initial_perplexity"]
    assert (tmp_path / "checkpoint-3" / "global_step3").is_dir()  # DeepSpeed's own sharded checkpoint


def test_one_process(tmp_path, env):
    result = run([sys.executable, EXAMPLE, "--out", str(tmp_path), "--max-steps", "2", "--eval-steps", "2", *SHORT],
                 timeout=600, **env)
    assert_ok(result)
    summary = _summary(tmp_path)
    assert summary["world_size"] == 1 and summary["launcher"] == "single"
    assert summary["global_batch"] == 32 and summary["per_device_batch"] == 32 and summary["steps"] == 2


@pytest.mark.parametrize("extra, message", [
    (["--global-batch", "25"], "global batch 25 does not divide among 2 ranks"),
    # refused by argparse as each rank parses its command line, before any work: the Trainer's strategies only
    (["--strategy", "fsdp"], "argument --strategy: invalid choice: 'fsdp' (choose from 'ddp', 'deepspeed')"),
])
def test_bad_input_is_one_line(tmp_path, env, extra, message):
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", EXAMPLE, "--out", str(tmp_path), *extra),
                 timeout=300, **env)
    assert result.returncode == 2
    # once: argparse writes to stderr, the example's own errors to stdout, each by one rank
    assert (result.stdout + result.stderr).count(message) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
