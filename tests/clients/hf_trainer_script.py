"""A Hugging Face ``Trainer`` training script (test client).

Written the way the Transformers documentation writes it: a model built from
its config, a ``Dataset`` that yields ``input_ids`` / ``labels`` dicts,
``TrainingArguments`` and ``Trainer(...).train()``.  It knows nothing of
whoever launches or measures it.

The model is a tiny GPT-Neo causal LM created from a ``GPTNeoConfig`` (random
weights: nothing is downloaded).  The data are synthetic and deterministic
(fixed seed): token sequences that count upwards with a per-sequence stride,
modulo the vocabulary, so there is something to learn.

Run it:

    python tests/clients/hf_trainer_script.py --epochs 1
    torchrun --standalone --nproc-per-node 2 tests/clients/hf_trainer_script.py --batch-size 16 --epochs 2 --samples 2048

``--out`` is the Trainer's output_dir (default: a temporary directory that is
removed at the end; with saving off nothing is written there).  At the end
every rank prints one line:

    CLIENT rank=<global rank> world_size=<world size> steps=<trainer.state.global_step> samples=<training samples> train_s=<seconds>

where samples counts the batch lengths that went through ``training_step`` on
that rank (evaluation batches never do), and train_s is the rank's own
training time as a ``TrainerCallback`` times it with ``time.perf_counter``:
from the beginning of the first epoch to the end of the last optimizer step,
less the ``eval_runtime`` of any evaluation that ended in between (this script
evaluates never, but a copy of it given an eval_strategy would).
"""

import argparse
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    GPTNeoConfig,
    GPTNeoForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

VOCAB = 256
SEQ_LEN = 32
SEED = 0


def parse_args():
    parser = argparse.ArgumentParser(description="HF Trainer test client")
    parser.add_argument("--batch-size", type=int, default=16, help="per-device train batch size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training set size")
    parser.add_argument("--out", default=None, help="Trainer output_dir (default: a temporary directory)")
    return parser.parse_args()


class CountingSequences(Dataset):
    """Sequences start, start+stride, start+2*stride, ... (mod VOCAB)."""

    def __init__(self, n, seed=SEED):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        stride = torch.randint(1, 8, (n, 1), generator=gen)
        self.tokens = (start + stride * torch.arange(SEQ_LEN)) % VOCAB

    def __len__(self):
        return self.tokens.shape[0]

    def __getitem__(self, idx):
        ids = self.tokens[idx]
        # The model shifts labels itself for the causal LM loss.
        return {"input_ids": ids, "labels": ids.clone()}


def make_model():
    config = GPTNeoConfig(
        vocab_size=VOCAB,
        max_position_embeddings=SEQ_LEN,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=16,
        intermediate_size=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPTNeoForCausalLM(config)


class CountingTrainer(Trainer):
    """A Trainer that counts the training samples passing through it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_samples = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.train_samples += inputs["input_ids"].shape[0]
        return super().training_step(model, inputs, num_items_in_batch)


class TrainingTime(TrainerCallback):
    """Times the training: first epoch's beginning .. last step's end, less the evaluations in between."""

    def __init__(self):
        self.start = self.end = None
        self.evaluations = []  # (when it ended, its eval_runtime) of every evaluation

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.start is None:
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.end = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append((time.perf_counter(), (metrics or {}).get("eval_runtime", 0.0)))

    @property
    def seconds(self):
        inside = sum(runtime for at, runtime in self.evaluations if self.start < at < self.end)
        return self.end - self.start - inside


def train(args, output_dir):
    training_args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=SEED,
        # As the transformers docs write it: nothing about the device or the
        # backend. On a machine without a GPU the Trainer (on Accelerate) joins
        # the launcher's ranks only when told to use the CPU; gpuscale's
        # launchers set ACCELERATE_USE_CPU there, as `accelerate launch --cpu`.
        # Every parameter gets a gradient; say so, or DDP walks the graph for
        # unused ones each step and warns about it.
        ddp_find_unused_parameters=False,
    )
    timer = TrainingTime()
    trainer = CountingTrainer(
        model=make_model(),
        args=training_args,
        train_dataset=CountingSequences(args.samples),
        data_collator=default_data_collator,
        callbacks=[timer],
    )
    trainer.train()

    # One write call, so lines from concurrent ranks never interleave.
    sys.stdout.write(
        f"CLIENT rank={training_args.process_index} world_size={training_args.world_size} "
        f"steps={trainer.state.global_step} samples={trainer.train_samples} train_s={timer.seconds:.4f}\n"
    )
    sys.stdout.flush()
    # Finish the trackers and destroy the process group, once, at the end.
    trainer.end()


def main():
    args = parse_args()
    if args.out is not None:
        train(args, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="hf_trainer_client_") as tmp:
            train(args, tmp)


if __name__ == "__main__":
    main()
