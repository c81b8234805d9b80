"""ViT image classification with DDP, FSDP or DeepSpeed ZeRO behind one switch, after the course's ViT workload.

A Vision Transformer (HF transformers' ViT: no torchvision needed) learns to classify images read
from one HDF5 file, split 80/20 into training and validation (seed 42). Every epoch prints the
training loss, the validation loss and accuracy over all ranks and the epoch's time; rank 0 writes
OUT/summary.json. Only --strategy changes between the three ways of spreading the model:

    gpuscale run --nproc-per-node 2 examples/vit.py --strategy ddp --out runs/vit-ddp
    gpuscale run --nproc-per-node 2 examples/vit.py --strategy fsdp --out runs/vit-fsdp
    gpuscale run --nproc-per-node 2 examples/vit.py --strategy deepspeed --out runs/vit-ds   # ZeRO-1 as the course
    gpuscale run --nproc-per-node 2 examples/vit.py --strategy deepspeed --zero-stage 3 --offload --out runs/vit-z3
    gpuscale run --nproc-per-node 2 examples/vit.py --strategy deepspeed --ds-config ds_config.json   # your config, checked

With the same seed, global batch and number of ranks the three strategies train the same model: their
final losses agree to float rounding in fp32 (tests/multiproc/test_example_vit.py checks it).

Data (examples/vit_data.py). The file holds ``images`` (N x H x W x 3, uint8) and ``labels`` (N, integers from 0); the
course's Tiny-ImageNet file (100,000 images of 64 x 64, 200 classes) has this layout. Offline (the
default) a learnable set of 2,000 images of 32 x 32 in 10 classes (coloured gratings, one
orientation, frequency and tint per class, in noise) is generated once into $GPUSCALE_DATA or
~/.cache/gpuscale. With the course's data and a pretrained ViT-B/16:

    gpuscale run examples/vit.py --data /scratch/tiny-imagenet.h5 --model google/vit-base-patch16-224 \\
        --image-size 224 --batch-size 32 --scaling weak --epochs 10 --lr 1e-3 --strategy deepspeed

(``--model NAME`` loads pretrained weights through transformers' from_pretrained, from the local HF
cache when the hub cannot be reached, and replaces the classifier head.)

Scaling. ``--scaling weak`` (the default, as the course) keeps --batch-size per process;
``--scaling strong`` keeps it global. The defaults of the course: Adam at 1e-3, gradient clipping
at 1.0 (the course's DeepSpeed config; here it applies to every strategy so they stay comparable),
ZeRO stage 1, fp32 on CPU and bf16 on GPUs that have it (--precision); a --ds-config that states its own ZeRO
stage or gradient_clipping overrides those two defaults (a --zero-stage or --clip-grad-norm typed against it is
refused). Weak scaling makes the global batch grow with the processes; ``--lr-scaling linear`` (or ``sqrt``) scales --lr with it,
``--lr-warmup-steps N`` warms it up from --lr over the first N steps (`gpuscale.scale_lr`), and
summary.json records the rule and factor under ``lr`` and each epoch's accuracy under ``per_epoch``.

Interrupted runs resume from OUT/checkpoints (every epoch; sharded for fsdp and deepspeed);
--no-resume starts afresh. Told to stop (SLURM's USR1 before the time limit, a TERM), the run
checkpoints the step it is in and exits with code 75; started again, it continues from that step
(`gpuscale.EpochLoop` does all three, so the loop below is training only).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import gpuscale
import gpuscale.train.lr
import gpuscale.train.step

from vit_data import offline_data_path, open_splits  # beside this file: the HDF5 images and the offline set

log = gpuscale.get_logger("vit")


# --- model ------------------------------------------------------------------------------------

def build_model(name: str, num_classes: int, image_size: int) -> torch.nn.Module:
    """A small ViT from scratch ('small'), or a pretrained one by its HF name with a new head."""
    from transformers import ViTConfig, ViTForImageClassification

    if name == "small":
        config = ViTConfig(image_size=image_size, patch_size=max(image_size // 8, 1), num_channels=3, hidden_size=96,
                           num_hidden_layers=4, num_attention_heads=4, intermediate_size=192, num_labels=num_classes,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return ViTForImageClassification(config)
    try:
        return ViTForImageClassification.from_pretrained(name, num_labels=num_classes, ignore_mismatched_sizes=True, image_size=image_size)
    except OSError as exc:
        raise ValueError(f"cannot load the pretrained model {name!r} ({exc}); it must be in the local HF cache "
                         "when the hub cannot be reached, or use --model small") from None


# --- training ---------------------------------------------------------------------------------

def evaluate(training: gpuscale.Training, loader: gpuscale.ShardedLoader, meter: gpuscale.Meter, device: torch.device) -> tuple[float, float]:
    """Validation loss and accuracy over the whole validation set (every sample once, over all ranks)."""
    loss_avg, acc_avg = gpuscale.Average(), gpuscale.Average()
    training.model.eval()
    with meter.phase("eval"), torch.no_grad():
        # Equal batch counts on every rank (padding masked out): FSDP's and ZeRO-3's forward passes are collective.
        for (x, y), keep in loader.masked():
            x, y, keep = x.to(device, non_blocking=True), y.to(device, non_blocking=True), keep.to(device)
            with training.autocast():
                logits = training.model(pixel_values=x).logits
            losses = F.cross_entropy(logits.float(), y, reduction="none")
            loss_avg.update((losses * keep).sum(), keep.sum())
            acc_avg.update(((logits.argmax(1) == y) & keep).sum(), keep.sum())
    training.model.train()
    return loss_avg.compute(), acc_avg.compute()


def per_epoch(history: dict[str, list[float]]) -> list[dict]:
    """One entry per epoch trained (1-based; a resumed run's earlier epochs included), for summary.json."""
    return [{"epoch": i + 1, "phase": "train", "val_accuracy": acc, "val_loss": val, "train_loss": loss}
            for i, (loss, val, acc) in enumerate(zip(history["train_loss"], history["val_loss"], history["val_accuracy"], strict=False))]


def clip_grad_norm(args: argparse.Namespace) -> float | None:
    """The clipping norm for `gpuscale.setup`: --clip-grad-norm (0: off), else the --ds-config's gradient_clipping
    under deepspeed (None: setup takes the config's), else the course's 1.0."""
    if args.clip_grad_norm is not None:
        # typed: under deepspeed even 0 goes to the config, which refuses a gradient_clipping that says otherwise
        return args.clip_grad_norm if args.strategy == "deepspeed" else args.clip_grad_norm or None
    return None if gpuscale.train.step.ds_config_setting(args, "gradient_clipping") is not None else 1.0


def train(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    with gpuscale.init() as rt:
        data_path = Path(args.data) if args.data else offline_data_path(rt)
        if not data_path.exists():
            raise ValueError(f"data file {data_path} does not exist; pass --data FILE.h5, or leave --data out for the offline set")
        train_set, val_set, num_classes, image_size = open_splits(data_path, args.image_size)
        plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling)
        eval_plan = gpuscale.plan_batch(args.eval_batch_size, rt.world_size, scaling="weak")
        train_loader = gpuscale.make_loader(train_set, plan, seed=args.seed, **gpuscale.loader_options(args))
        val_loader = gpuscale.make_loader(val_set, eval_plan, train=False, even=True, **gpuscale.loader_options(args))

        torch.manual_seed(args.seed)
        model = build_model(args.model, num_classes, image_size)
        num_params = sum(p.numel() for p in model.parameters())  # before setup: ZeRO-3 partitions them
        scaled = gpuscale.scale_lr(args.lr, plan, **gpuscale.train.lr.lr_options(args))
        training = gpuscale.setup(model, lambda params: torch.optim.Adam(params, lr=scaled.lr), plan=plan,
                                  clip_grad_norm=clip_grad_norm(args), **gpuscale.training_options(args))
        scheduler = scaled.scheduler(training.optimizer)  # the warm-up; step it once per optimizer step
        log.info("ViT with %.2fM parameters, %d classes, images %dx%d; %d training and %d validation images; "
                 "strategy %s, %s, global batch %d; %s", num_params / 1e6, num_classes, image_size, image_size, len(train_set),
                 len(val_set), training.strategy, training.precision.name, plan.global_batch, scaled.describe())

        # Resumes from OUT/checkpoints, saves one per epoch, and on a stop request (USR1, TERM) checkpoints the step it is in
        # and exits 75; the epoch's running loss survives the stop (`gpuscale.EpochLoop`).
        empty: dict[str, list[float]] = {"train_loss": [], "val_loss": [], "val_accuracy": [], "epoch_time_s": []}
        loop = gpuscale.EpochLoop(training, train_loader, epochs=args.epochs, checkpoints=out / "checkpoints",
                                  scheduler=scheduler, state={"history": empty}, resume=not args.no_resume)
        history, loss_avg = loop.state["history"], loop.average("loss")
        for epoch in loop:
            started = time.perf_counter()
            for x, y in loop.batches():
                x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
                with training.autocast():
                    loss = F.cross_entropy(training.model(pixel_values=x).logits.float(), y)
                training.backward(loss)
                loop.step()  # the optimizer and the warm-up scheduler, when a step is due
                loss_avg.update(loss.detach() * len(y), len(y))
            train_loss = loss_avg.compute()
            val_loss, val_acc = evaluate(training, val_loader, loop.meter, rt.device)
            epoch_time = time.perf_counter() - started
            for key, value in zip(history, (train_loss, val_loss, val_acc, epoch_time), strict=False):
                history[key].append(value)
            log.info("epoch %d/%d: train loss %.4f, validation loss %.4f, accuracy %.4f, %.1f s",
                     epoch + 1, args.epochs, train_loss, val_loss, val_acc, epoch_time)

        if not history["val_accuracy"]:
            raise ValueError(f"{loop.checkpointer.directory} holds a finished run of {loop.start_epoch} epochs; "
                             "use --no-resume or another --out")
        summary = loop.meter.write_summary(
            out,
            final_loss=history["train_loss"][-1],
            val_loss=history["val_loss"][-1],
            accuracy=history["val_accuracy"][-1],
            epoch_time_s=history["epoch_time_s"][-1],
            history=history,
            per_epoch=per_epoch(history),
            lr=scaled.as_dict(),
            precision=training.precision.name,
            zero_stage=training.ds_config["zero_optimization"]["stage"] if training.ds_config else None,
            example="vit",
            model=args.model,
        )
        log.info("training time %.1f s (evaluation and checkpoints included; %.0f train samples/s over the optimizer steps "
                 "alone); validation accuracy %.4f; summary in %s",
                 summary["train_time_s"], summary["samples_per_s"], summary["accuracy"], out / "summary.json")
        return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="HDF5 file with images and labels; default: generated offline set")
    parser.add_argument("--model", default="small", help="'small' (from scratch) or a pretrained HF ViT name")
    parser.add_argument("--image-size", type=int, default=None, help="resize images to this size (default: the file's)")
    parser.add_argument("--scaling", choices=("weak", "strong"), default="weak", help="weak: --batch-size per process (course); strong: global")
    parser.add_argument("--batch-size", type=int, default=32, help="per-process (weak) or global (strong) batch; course: 32 per rank")
    parser.add_argument("--eval-batch-size", type=int, default=100, help="per-process batch for validation")
    parser.add_argument("--epochs", type=int, default=5, help="epochs (course: 10)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (course: 1e-3)")
    parser.add_argument("--clip-grad-norm", type=float, default=None,
                        help="clip the gradients' norm (0: off; default: the --ds-config's gradient_clipping under deepspeed, "
                             "else 1.0, the course's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/vit", help="output folder for summary.json and checkpoints")
    parser.add_argument("--no-resume", action="store_true", help="ignore checkpoints in OUT/checkpoints and start afresh")
    gpuscale.add_arguments(parser, default_zero_stage=1)  # the course's ZeRO-1, unless --ds-config states a stage
    gpuscale.train.lr.add_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("batch_size", "eval_batch_size", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.image_size is not None and args.image_size < 8:
        parser.error("--image-size must be at least 8")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except ValueError as exc:  # bad input: one line, not a traceback (on several ranks gpuscale.init() said it)
        if not gpuscale.already_reported(exc):
            gpuscale.print0(f"vit: error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
