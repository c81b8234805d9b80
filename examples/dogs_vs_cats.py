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

Learning rate. A larger global batch means fewer, larger steps; at the learning rates tuned for
batch 32 the model then ends far less accurate (global batch 256: validation accuracy 0.66 against
0.95). ``--lr-scaling linear`` multiplies both phases' learning rates (--lr and --finetune-lr) by
global batch / base batch, ``sqrt`` by its square root (`gpuscale.scale_lr`); the base batch is
the global batch on one process, or ``--lr-base-batch``. ``--lr-warmup-steps N`` raises each
phase's rate from the given to the scaled one over its first N optimizer steps (default 0: at 8 x
the batch warm-up only cost accuracy here). One process can train with the global batch of 8 by
gradient accumulation, with the linear rule (0.938, tests/multiproc/test_lr_rules.py):

    python examples/dogs_vs_cats.py --scaling strong --batch-size 256 --max-device-batch 32 \
        --lr-base-batch 32 --lr-scaling linear

summary.json records the rule, factor and both phases' rates under ``lr`` and every epoch's phase,
accuracies, loss and learning rate under ``per_epoch``.

Strategies. ``--strategy ddp`` (the default) replicates the model; ``fsdp`` shards it; ``deepspeed``
runs ZeRO (``--zero-stage``, ``--offload``, ``--ds-config``); ``--precision bf16`` on GPUs that have it.
After unfreezing the last block the model is set up again, so its new parameters are synchronised
(DDP) or partitioned (DeepSpeed); the course's version forgot that step (docs/classic-bugs.md, bug 1).

Interrupted runs resume from OUT/checkpoints (written every epoch); --no-resume starts afresh.
Told to stop (SLURM's USR1 before the time limit, a TERM on preemption; gpuscale's batch scripts
pass them on), the run finishes its step, checkpoints there and exits with code 75; started again
(the batch script requeues itself), it continues from that very step.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import gpuscale
import gpuscale.lr

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PHASES = ("head", "fine-tune")  # the frozen extractor with its new head; then the last block unfrozen
CLASSES = ("cats", "dogs")
SYNTHETIC_VERSION = 2  # bump when the generator changes, so stale cached images are not reused
log = gpuscale.get_logger("dogs_vs_cats")


# --- data -------------------------------------------------------------------------------------


class ImageFolder(Dataset):
    """root/<class>/<image>: images as float tensors (3, size, size) in [-1, 1], labels 0/1 by class name."""

    def __init__(self, root: Path, size: int) -> None:
        from PIL import Image  # imported here so `--help` works without Pillow

        self._image = Image
        self.size = size
        self.items = [
            (path, label)
            for label, name in enumerate(CLASSES)
            for path in sorted((root / name).iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ] if all((root / name).is_dir() for name in CLASSES) else []
        if not self.items:
            raise ValueError(f"no images in {root}/{{{','.join(CLASSES)}}}; expected files ending in {', '.join(IMAGE_SUFFIXES)}")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.items[index]
        with self._image.open(path) as img:
            img = img.convert("RGB").resize((self.size, self.size))
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        pixels = data.view(self.size, self.size, 3).permute(2, 0, 1).float().div_(127.5).sub_(1.0)
        return pixels, torch.tensor(float(label))


def _synthetic_image(label: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """A noisy striped image: cats' stripes run near horizontal and lean blue, dogs' near vertical and lean red.

    Colours, stripe width, phase, angle (within +-15 degrees) and a bright blob vary at random, so
    neither cue alone decides every image: telling the classes apart takes learning, and a small
    network gets well above 90%.
    """
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij")
    u = torch.rand(6, generator=gen)
    angle = math.radians(-15 + 30 * u[0].item() + (90 if label else 0))
    period = size * (0.15 + 0.15 * u[1].item())
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * (xs * math.sin(angle) + ys * math.cos(angle)) / period + 6.28 * u[2].item())
    tint = torch.tensor([0.2, 0.0, -0.2] if label else [-0.2, 0.0, 0.2]).view(3, 1, 1)
    dark, light = torch.rand(3, 1, 1, generator=gen) * 0.5, 0.5 + torch.rand(3, 1, 1, generator=gen) * 0.5
    image = dark + (light - dark) * stripes + tint
    cy, cx, radius = size * u[3].item(), size * u[4].item(), size * (0.1 + 0.2 * u[5].item())
    image = image + 0.5 * (((ys - cy) ** 2 + (xs - cx) ** 2) < radius**2).float()
    return (image + 0.15 * torch.randn(3, size, size, generator=gen)).clamp(0, 1)


def generate_synthetic(root: Path, size: int = 64, counts: dict[str, int] | None = None, seed: int = 0) -> None:
    """Write the offline image set once: into a temporary folder, renamed into place when complete."""
    from PIL import Image

    counts = counts or {"train": 2000, "validation": 1000, "test": 1000}
    tmp = root.with_name(root.name + f".tmp-{os.getpid()}")
    gen = torch.Generator().manual_seed(seed)
    for split, count in counts.items():
        for label, name in enumerate(CLASSES):
            (tmp / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count // 2):
                pixels = (_synthetic_image(label, size, gen) * 255).round().to(torch.uint8)
                Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy()).save(
                    tmp / split / name / f"{name[:-1]}.{i}.png", compress_level=1)  # lossless either way; 2x faster
    os.replace(tmp, root)


def prepare_data(args: argparse.Namespace, rt: gpuscale.Runtime) -> Path:
    """The data folder; the offline set is generated by rank 0 while the others wait (once, not N times)."""
    if args.data is not None:
        root = Path(args.data)
        if not all((root / split).is_dir() for split in ("train", "validation", "test")):
            raise ValueError(f"--data {root} needs train/, validation/ and test/ folders, each with cats/ and dogs/")
        return root
    # The course's split sizes are 2,000 train / 1,000 validation / 22,000 test; the offline set keeps
    # its test split small (1,000) unless the large-data variant, which trains on it, asks for all 22,000.
    large = args.swap_train_test
    name = f"dogs-vs-cats-synthetic-v{SYNTHETIC_VERSION}-{args.image_size}px" + ("-test22000" if large else "")
    root = Path(os.environ.get("GPUSCALE_DATA", Path.home() / ".cache" / "gpuscale")) / name
    if rt.is_main and not root.is_dir():
        log.info("generating the offline image set in %s", root)
        counts = {"train": 2000, "validation": 1000, "test": 22000 if large else 1000}
        generate_synthetic(root, size=args.image_size, counts=counts, seed=1234)
    rt.barrier()
    return root


# --- model ------------------------------------------------------------------------------------


def small_vgg(num_blocks: int = 3, width: int = 8) -> nn.Sequential:
    """A VGG-style feature extractor: blocks of two 3x3 convolutions, ReLU and 2x2 max-pooling.

    He-initialised (fixed by the seed) so that features keep their scale through the blocks; such
    random convolutional features separate the offline image set well enough for a trained head.
    """
    layers: list[nn.Module] = []
    channels = 3
    for block in range(num_blocks):
        out = width * 2**block
        convs = [nn.Conv2d(channels, out, 3, padding=1), nn.Conv2d(out, out, 3, padding=1)]
        for conv in convs:
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
        layers.append(nn.Sequential(convs[0], nn.ReLU(inplace=True), convs[1], nn.ReLU(inplace=True), nn.MaxPool2d(2)))
        channels = out
    return nn.Sequential(*layers)


class TransferNet(nn.Module):
    """Frozen feature extractor + the course's head: Flatten -> Linear(F, 64) -> ReLU -> Linear(64, 1) -> Sigmoid."""

    def __init__(self, features: nn.Module, feature_dim: int, last_block: nn.Module) -> None:
        super().__init__()
        self.features = features
        self.last_block = last_block  # the block unfrozen for fine-tuning (a sub-module of features)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(feature_dim, 64), nn.ReLU(inplace=True), nn.Linear(64, 1), nn.Sigmoid())
        for p in self.features.parameters():
            p.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).squeeze(1)

    def unfreeze_last_block(self) -> None:
        for p in self.last_block.parameters():
            p.requires_grad = True


def build_model(backbone: str, image_size: int) -> TransferNet:
    if backbone == "vgg16":
        try:
            from torchvision.models import VGG16_Weights, vgg16
        except ImportError:
            raise ValueError("--backbone vgg16 needs torchvision (pip install torchvision); use --backbone small offline") from None
        features = vgg16(weights=VGG16_Weights.IMAGENET1K_V1).features
        last_block = features[24:]  # conv5_1 .. pool5, the block the course unfreezes
    else:
        features = small_vgg()
        last_block = features[-1]
    with torch.no_grad():
        feature_dim = features(torch.zeros(1, 3, image_size, image_size)).numel()
    return TransferNet(features, feature_dim, last_block)


# --- training ---------------------------------------------------------------------------------


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
    options = gpuscale.lr.lr_options(args)
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
                                                     history["lr"]))
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

        stop = gpuscale.StopSignal()  # USR1/TERM: finish the step, checkpoint, exit (75) to be resumed
        net = build_model(args.backbone, args.image_size)
        out = Path(args.out)
        ckpt = gpuscale.Checkpointer(out / "checkpoints", keep=2)
        if args.no_resume and rt.is_main:
            shutil.rmtree(ckpt.directory, ignore_errors=True)
        rt.barrier()
        saved = None if args.no_resume else ckpt.peek()
        start_epoch = saved.epoch if saved else 0
        partial = saved.extra.get("partial_epoch") if saved else None  # stopped inside epoch start_epoch
        total_epochs = args.epochs + args.finetune_epochs
        fine_tuning = start_epoch > args.epochs or (start_epoch == args.epochs and partial is not None)
        if fine_tuning:
            net.unfreeze_last_block()
        phase = PHASES[fine_tuning]
        training, scheduler = setup_phase(net, phase, plan, args, lrs[phase])
        history: dict = {"train_accuracy": [], "val_accuracy": [], "train_loss": [], "lr": []}
        step, test_before = 0, None
        if saved:
            ckpt.resume(model=training.model, optimizer=training.optimizer, scheduler=scheduler, loader=train_loader,
                        path=saved.path)
            step, history, test_before = saved.step, saved.extra["history"], saved.extra["test_accuracy_before_finetune"]
            if start_epoch >= total_epochs:
                log.warning("%s holds a finished run; evaluating it again (use --no-resume or another --out to train anew)", saved.path)

        meter = gpuscale.Meter(plan)
        loss_avg, acc_avg = gpuscale.Average(), gpuscale.Average()
        for epoch in range(start_epoch, total_epochs):
            inside = partial is not None and epoch == start_epoch  # resuming in the middle of this epoch
            if epoch == args.epochs and not inside:  # phase 2: measure, unfreeze the last block, re-wrap so it syncs
                test_before = evaluate(training, test_loader, meter, rt.device)
                log.info("test accuracy before fine-tuning: %.4f; unfreezing the last block", test_before)
                net.unfreeze_last_block()
                # With gradient accumulation an epoch may end inside an optimizer step: those micro-batches'
                # gradients belong to the head's training and must not leak into fine-tuning's first step (a run
                # resumed at this point starts without them too)
                for param in training.module.parameters():  # not the wrapper's zero_grad: DeepSpeed's has no set_to_none
                    param.grad = None
                training, scheduler = setup_phase(training.model, "fine-tune", plan, args, lrs["fine-tune"])
            loss_avg.reset()
            acc_avg.reset()
            if inside and rt.is_main:  # the epoch's sums so far, over all ranks, saved when it stopped
                loss_avg.update(partial[0], partial[1])
                acc_avg.update(partial[2], partial[3])
            epoch_lr = scheduler.get_last_lr()[0]
            bar = gpuscale.progress(meter.iter(train_loader), desc=f"epoch {epoch + 1}/{total_epochs}", total=len(train_loader))
            for x, y in bar:
                x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
                with training.autocast():
                    prob = training.model(x)
                prob = prob.float()  # binary cross-entropy is not autocast-safe: compute it in fp32
                loss = F.binary_cross_entropy(prob, y)
                training.backward(loss)
                stepped = training.step()
                if stepped:
                    epoch_lr = scheduler.get_last_lr()[0]  # the rate this step used
                    scheduler.step()  # the warm-up counts optimizer steps, not micro-batches
                step += stepped
                loss_avg.update(loss.detach() * len(y), len(y))
                acc_avg.update(((prob.detach() > 0.5).float() == y).sum(), len(y))
                if stepped and stop.requested():  # collective; only after a full optimizer step
                    sums = gpuscale.all_reduce_sum([loss_avg.total, loss_avg.count, acc_avg.total, acc_avg.count])
                    with meter.phase("checkpoint"):
                        ckpt.save(step=step, epoch=epoch, model=training.model, optimizer=training.optimizer, scheduler=scheduler,
                                  loader=train_loader,
                                  extra={"history": history, "test_accuracy_before_finetune": test_before, "partial_epoch": sums})
                    stop.exit()
            train_loss, train_acc = loss_avg.compute(), acc_avg.compute()
            val_acc = evaluate(training, val_loader, meter, rt.device)
            history["train_loss"].append(train_loss)
            history["train_accuracy"].append(train_acc)
            history["val_accuracy"].append(val_acc)
            history["lr"].append(epoch_lr)
            log.info("epoch %d/%d: loss %.4f, train accuracy %.4f, validation accuracy %.4f",
                     epoch + 1, total_epochs, train_loss, train_acc, val_acc)
            with meter.phase("checkpoint"):
                ckpt.save(step=step, epoch=epoch + 1, model=training.model, optimizer=training.optimizer, scheduler=scheduler,
                          loader=train_loader, extra={"history": history, "test_accuracy_before_finetune": test_before})

        test_after = evaluate(training, test_loader, meter, rt.device)
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
        log.info("total training time %.1f s (%.0f samples/s); test accuracy %.4f before fine-tuning, %.4f after",
                 summary["train_time_s"], summary["samples_per_s"], test_before, test_after)
        log.info("summary written to %s", out / "summary.json")
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
    gpuscale.lr.add_arguments(parser, default_warmup_steps=0)
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
    except ValueError as exc:  # bad input: one line, not a traceback
        gpuscale.print0(f"dogs_vs_cats: error: {exc}")
        return 2
    gpuscale.print0(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
