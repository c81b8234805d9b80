"""Dogs vs cats: transfer learning on 1 CPU, N processes or many GPUs, after the course's exercise.

A frozen convolutional feature extractor with a small head (Flatten -> Linear -> ReLU -> Linear ->
Sigmoid) is trained first; then the last convolutional block is unfrozen and fine-tuned with a
small learning rate. Every epoch prints train and validation accuracy over all ranks; the end
prints the total training time and the test accuracy before and after fine-tuning, and rank 0
writes OUT/summary.json.

The same file runs unchanged in every way the course launches it:

    python examples/dogs_vs_cats.py                                   # one process
    gpuscale run --nproc-per-node 2 examples/dogs_vs_cats.py          # N processes, bound to cores
    torchrun --nproc_per_node 2 examples/dogs_vs_cats.py
    # by hand, as the course's srun recipe does (one shell per rank):
    RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/dogs_vs_cats.py &
    RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/dogs_vs_cats.py

Data. By default (offline) a learnable two-class image set is generated once into --data (PNG files
in train/, validation/ and test/, each with cats/ and dogs/) and read back through the same
loading code as real photos; the backbone is a small VGG-style CNN whose weights are fixed by the
seed, since no pretrained weights can be downloaded. With the course's data:

    gpuscale run examples/dogs_vs_cats.py --data /scratch/dogs-vs-cats --backbone vgg16 \\
        --image-size 150 --scaling weak --batch-size 25 --epochs 10 --finetune-epochs 20 --lr 0.01 --momentum 0

(``--backbone vgg16`` needs torchvision and its ImageNet weights.) ``--swap-train-test`` trains on
the large test split instead, the course's "large data" variant (offline: a set whose test split
has the course's 22,000 images, generated once). Small against large data in one study:

    gpuscale study --nproc 1,2 --variant small= --variant large=--swap-train-test --out runs/data-size \\
        -- examples/dogs_vs_cats.py

Scaling. ``--scaling strong`` (the default) keeps the global batch at --batch-size whatever the
number of processes, so 1 and 2 processes train the same problem; ``--scaling weak`` keeps
--batch-size per process, as the course's script does. A global batch that does not divide among
the ranks is refused with the nearest valid values.

Learning rate. At the rates tuned for batch 32 a larger global batch ends far less accurate (256:
validation accuracy 0.60 against 0.95). ``--lr-scaling linear`` (or ``sqrt``) scales both phases' rates
(--lr, --finetune-lr) with global batch / base batch (`gpuscale.scale_lr`; base: the global batch on one
process, or ``--lr-base-batch``), ``--lr-warmup-steps N`` ramps them up. One process training 8 x the batch by
gradient accumulation with the linear rule reaches 0.932 (tests/multiproc/test_lr_rules.py):

    python examples/dogs_vs_cats.py --batch-size 256 --max-device-batch 32 --lr-base-batch 32 --lr-scaling linear

summary.json records the rule and both phases' rates under ``lr``, every epoch under ``per_epoch``.

Strategies. ``--strategy ddp`` (the default) replicates the model; ``fsdp`` shards it; ``deepspeed``
runs ZeRO (``--zero-stage``, ``--offload``, ``--ds-config``); ``--precision bf16`` on GPUs that have it.
After unfreezing the last block the model is set up again, so its new parameters are synchronised
(DDP) or partitioned (DeepSpeed); the course's version forgot that step (docs/classic-bugs.md, bug 1).

Interrupted runs resume from OUT/checkpoints (written every epoch); --no-resume starts afresh. Told to
stop (SLURM's USR1 before the time limit, a TERM on preemption), the run checkpoints the step it is in
and exits 75; started again (gpuscale's batch scripts requeue), it continues from that very step.
`gpuscale.EpochLoop` does all of that, so the loop in `train` is training only.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpuscale
import gpuscale.train.lr

from dogs_vs_cats_parts import ImageFolder, build_model, prepare_data  # beside this file: the data and the network

PHASES = ("head", "fine-tune")  # the frozen extractor with its new head; then the last block unfrozen
log = gpuscale.get_logger("dogs_vs_cats")


def evaluate(training: gpuscale.Training, loader: gpuscale.ShardedLoader, meter: gpuscale.Meter, device: torch.device) -> float:
    """Accuracy over the whole split: each rank scores its share once, the counts are summed.

    The shards are padded to equal batch counts and the padding masked out: under fsdp (and
    ZeRO-3) every forward pass is collective, so every rank must run as many as the others.
    """
    training.model.eval()
    correct = gpuscale.Average()
    with meter.phase("eval"), torch.no_grad():
        for (x, y), keep in loader.masked():
            x, y, keep = x.to(device, non_blocking=True), y.to(device, non_blocking=True), keep.to(device)
            with training.autocast():
                prob = training.model(x)
            correct.update((((prob.float() > 0.5).float() == y) & keep).sum(), keep.sum())
    training.model.train()
    return correct.compute()


def phase_lrs(args: argparse.Namespace, plan: gpuscale.BatchPlan) -> dict[str, gpuscale.ScaledLR]:
    """Each phase's learning rate (--lr, --finetune-lr) scaled for the global batch by the same rule (--lr-scaling)."""
    options = gpuscale.train.lr.lr_options(args)
    return {"head": gpuscale.scale_lr(args.lr, plan, **options), "fine-tune": gpuscale.scale_lr(args.finetune_lr, plan, **options)}


def setup_phase(model: nn.Module, phase: str, plan: gpuscale.BatchPlan, args: argparse.Namespace,
                scaled: gpuscale.ScaledLR) -> tuple[gpuscale.Training, torch.optim.lr_scheduler.LambdaLR]:
    """The model spread over the ranks with its phase's optimizer (SGD for the head, RMSprop to fine-tune)
    at the phase's scaled learning rate, and the scheduler that warms that learning rate up.

    Called again after unfreezing the last block: DDP then synchronises the new parameters, DeepSpeed
    partitions them; FSDP keeps its shards. The new optimizer starts with no momentum or running
    averages, so its warm-up starts afresh too.
    """
    if phase == "head":
        def optimizer(params):
            return torch.optim.SGD(params, lr=scaled.lr, momentum=args.momentum)
    else:
        def optimizer(params):
            return torch.optim.RMSprop(params, lr=scaled.lr)
    training = gpuscale.setup(model, optimizer, plan=plan, **gpuscale.training_options(args))
    return training, scaled.scheduler(training.optimizer)


def per_epoch(history: dict, head_epochs: int) -> list[dict]:
    """One entry per epoch trained (1-based), with its phase: where a run lost accuracy, and in which phase.

    "lr" is the learning rate of the epoch's last optimizer step (the warm-up shows in the first epochs of each phase).
    """
    return [
        {"epoch": i + 1, "phase": PHASES[i >= head_epochs], "val_accuracy": val, "train_loss": loss, "train_accuracy": acc,
         "lr": lr}
        for i, (val, loss, acc, lr) in enumerate(zip(history["val_accuracy"], history["train_loss"], history["train_accuracy"],
                                                     history["lr"], strict=False))
    ]


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    with gpuscale.init() as rt:
        root = prepare_data(args, rt)
        train_split, test_split = ("test", "train") if args.swap_train_test else ("train", "test")
        train_set = ImageFolder(root / train_split, args.image_size)
        val_set = ImageFolder(root / "validation", args.image_size)
        test_set = ImageFolder(root / test_split, args.image_size)

        plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling, max_per_device=args.max_device_batch)
        lrs = phase_lrs(args, plan)
        loading = gpuscale.loader_options(args)
        train_loader = gpuscale.make_loader(train_set, plan, seed=args.seed, **loading)
        eval_plan = gpuscale.plan_batch(args.eval_batch_size, rt.world_size, scaling="weak")
        val_loader = gpuscale.make_loader(val_set, eval_plan, train=False, even=True, **loading)
        test_loader = gpuscale.make_loader(test_set, eval_plan, train=False, even=True, **loading)
        log.info(
            "%d train / %d validation / %d test images; %s scaling: global batch %d = %d ranks x %d x %d accumulation",
            len(train_set), len(val_set), len(test_set), plan.scaling, plan.global_batch, rt.world_size, plan.per_device_batch,
            plan.grad_accum_steps,
        )
        for name, scaled in lrs.items():
            log.info("%s: %s", name, scaled.describe())

        net = build_model(args.backbone, args.image_size)
        out = Path(args.out)
        ckpt = gpuscale.Checkpointer(out / "checkpoints", keep=2)
        if args.no_resume and rt.is_main:
            shutil.rmtree(ckpt.directory, ignore_errors=True)
        rt.barrier()
        # The checkpoint's phase decides what to build before resuming into it: fine-tuning trains the last block too.
        saved = ckpt.peek()
        inside = bool(saved and saved.extra.get("partial_epoch"))  # it stopped in the middle of epoch saved.epoch
        fine_tuning = saved is not None and (saved.epoch > args.epochs or (saved.epoch == args.epochs and inside))
        if fine_tuning:
            net.unfreeze_last_block()
        phase = PHASES[fine_tuning]
        training, scheduler = setup_phase(net, phase, plan, args, lrs[phase])
        # Resumes, checkpoints every epoch, and on a stop request (USR1, TERM) checkpoints the step it is in and exits 75.
        history: dict[str, list[float]] = {"train_accuracy": [], "val_accuracy": [], "train_loss": [], "lr": []}
        loop = gpuscale.EpochLoop(training, train_loader, epochs=args.epochs + args.finetune_epochs, checkpoints=ckpt,
                                  scheduler=scheduler, state={"history": history, "test_accuracy_before_finetune": None})
        history, loss_avg, acc_avg = loop.state["history"], loop.average("loss"), loop.average("accuracy")
        for epoch in loop:
            if epoch == args.epochs and not loop.resumed_inside_epoch:  # phase 2: measure, unfreeze, set up again
                before = evaluate(loop.training, test_loader, loop.meter, rt.device)
                loop.state["test_accuracy_before_finetune"] = before
                log.info("test accuracy before fine-tuning: %.4f; unfreezing the last block", before)
                net.unfreeze_last_block()
                loop.training, loop.scheduler = setup_phase(loop.training.model, "fine-tune", plan, args, lrs["fine-tune"])
            training, scheduler = loop.training, loop.scheduler
            epoch_lr = scheduler.get_last_lr()[0]
            for x, y in loop.batches():
                x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
                with training.autocast():
                    prob = training.model(x)
                prob = prob.float()  # binary cross-entropy is not autocast-safe: compute it in fp32
                loss = F.binary_cross_entropy(prob, y)
                training.backward(loss)
                rate = scheduler.get_last_lr()[0]
                if loop.step():  # the optimizer, then the warm-up (it counts optimizer steps, not micro-batches)
                    epoch_lr = rate  # the rate this step used
                loss_avg.update(loss.detach() * len(y), len(y))
                acc_avg.update(((prob.detach() > 0.5).float() == y).sum(), len(y))
            train_loss, train_acc = loss_avg.compute(), acc_avg.compute()
            val_acc = evaluate(training, val_loader, loop.meter, rt.device)
            for key, value in (("train_loss", train_loss), ("train_accuracy", train_acc), ("val_accuracy", val_acc), ("lr", epoch_lr)):
                history[key].append(value)
            log.info("epoch %d/%d: loss %.4f, train accuracy %.4f, validation accuracy %.4f",
                     epoch + 1, loop.epochs, train_loss, train_acc, val_acc)

        meter, test_before = loop.meter, loop.state["test_accuracy_before_finetune"]
        test_after = evaluate(loop.training, test_loader, meter, rt.device)
        if test_before is None:  # no fine-tuning phase was run
            test_before = test_after
        summary = meter.write_summary(
            out,
            final_loss=history["train_loss"][-1] if history["train_loss"] else None,
            accuracy=history["val_accuracy"][-1] if history["val_accuracy"] else None,
            test_accuracy_before_finetune=test_before,
            test_accuracy=test_after,
            history=history,
            per_epoch=per_epoch(history, args.epochs),
            lr={**lrs["head"].as_dict(), "phases": {name: {"base_lr": s.base_lr, "lr": s.lr} for name, s in lrs.items()}},
            example="dogs_vs_cats",
            backbone=args.backbone,
        )
        log.info("total training time %.1f s (evaluation and checkpoints included; %.0f train samples/s over the optimizer "
                 "steps alone); test accuracy %.4f before fine-tuning, %.4f after",
                 summary["train_time_s"], summary["samples_per_s"], test_before, test_after)
        return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder with train/, validation/, test/ (each cats/ and dogs/); default: generated offline set")
    parser.add_argument("--backbone", choices=("small", "vgg16"), default="small", help="feature extractor (default small; vgg16 needs torchvision)")
    parser.add_argument("--image-size", type=int, default=32, help="images are resized to this square size (course: 150)")
    parser.add_argument("--scaling", choices=("weak", "strong"), default="strong", help="strong: --batch-size is global; weak: per process")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (strong) or per-process batch (weak); course: 25, weak")
    parser.add_argument("--max-device-batch", type=int, default=None,
                        help="most images one process holds per pass; a larger share of the global batch is split into "
                             "gradient-accumulation steps (one process can then train with the global batch of many)")
    parser.add_argument("--eval-batch-size", type=int, default=100, help="per-process batch for validation and test")
    parser.add_argument("--epochs", type=int, default=6, help="epochs with the frozen feature extractor (course: 10)")
    parser.add_argument("--finetune-epochs", type=int, default=2, help="epochs with the last block unfrozen (course: 20)")
    parser.add_argument("--lr", type=float, default=0.003, help="SGD learning rate of the first phase (course: 0.01)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum of the first phase (course: 0)")
    parser.add_argument("--finetune-lr", type=float, default=1e-5, help="RMSprop learning rate of fine-tuning")
    parser.add_argument("--swap-train-test", action="store_true", help="train on the (large) test split: the course's large-data variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/dogs_vs_cats", help="output folder for summary.json and checkpoints")
    parser.add_argument("--no-resume", action="store_true", help="ignore checkpoints in OUT/checkpoints and start afresh")
    gpuscale.add_arguments(parser)
    gpuscale.train.lr.add_arguments(parser, default_warmup_steps=0)
    args = parser.parse_args(argv)
    for name in ("image_size", "batch_size", "eval_batch_size", "max_device_batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.epochs < 0 or args.finetune_epochs < 0 or args.epochs + args.finetune_epochs == 0:
        parser.error("--epochs and --finetune-epochs must not be negative, and not both 0")
    if args.fused == "on" and args.finetune_epochs > 0:
        parser.error("--fused on: fine-tuning uses RMSprop, which has no fused kernel; use --fused auto (SGD is fused on "
                     "GPUs) or --finetune-epochs 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        train(args)
    except ValueError as exc:  # bad input: one line, not a traceback (on several ranks gpuscale.init() said it)
        if not gpuscale.already_reported(exc):
            gpuscale.print0(f"dogs_vs_cats: error: {exc}")
        return 2
    gpuscale.print0(f"done in {time.perf_counter() - start:.1f} s in all (set-up, data, training, evaluation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
