"""`gpuscale study`: run a training script on 1, 2, ..., N devices, weak and strong, and report the scaling.

    gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py --epochs 2
    gpuscale study --launcher slurm --profile lumi-g --nproc 1,2,4,8 --nodes 1,2 --account project_465000 \\
        --container $SIF --out runs/lumi -- examples/vit.py

Any script can be studied as it is. Each cell (a scaling and a shape, e.g. weak-1x2: weak scaling,
1 node x 2 processes) fills the templates in the script's arguments ({out}, {scaling},
{world_size}, {nproc_per_node}, {nodes}, {per_device_batch}, {global_batch}, {grad_accum_steps});
with --global-batch N or --per-device-batch N every cell's batch is exact:

    gpuscale study --nproc 1,2 --global-batch 64 --out runs/ddp -- train.py --batch-size {per_device_batch}

gpuscale's probe, loaded in every rank, measures a script that does not use gpuscale.Meter
(optimizer steps, samples, data waits, utilisation); a gpuscale script without templates gets
``--scaling weak|strong --out DIR/<cell>`` appended and writes its own, richer summary.json.
Cells run one after another; a rerun skips finished cells, so an interrupted study continues
where it stopped, and a longer --nproc list adds cells. From Python: `gpuscale.study.run_study`.

Weak scaling keeps each device's batch (the work grows with the devices), strong scaling keeps
the global batch (the work is fixed). For both, speed-up and efficiency are training throughput
(samples/s of optimizer steps, data waits included) against the smallest run of the same scaling
and against ideal (its throughput per device x devices): the same quantity the prediction
models. Time to result (the whole run) has its own column and speed-up; accuracy and the
learning-rate rule stand beside them, so you see what each did to the model. Below the table,
each run's lost efficiency is split into measured parts (data, exposed communication, imbalance,
per-device compute, the rest), with the prediction's part beside it. The table is printed and
DIR/results.json, report.md, report.html and plots/ are written (`gpuscale report DIR` writes them
again).

On a CPU-only machine every process gets the same number of cores in every cell (the cores
divided by the largest process count), the CPU counterpart of "one GPU per process".
The prediction of the ring all-reduce model (`gpuscale predict`) stands beside the measurement:
with a profile's interconnect figures on SLURM, with figures measured here otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuscale.cli.slurm import add_cluster_options, cluster_options
from gpuscale.cli.verbs import verb_parser
from gpuscale.study import matrix
from gpuscale.study.spec import StudyResult, StudySpec, run_study

EPILOG = """examples:
  gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py --epochs 2
  gpuscale study --nproc 1,2 --global-batch 64 --out runs/ddp -- train.py --batch-size {per_device_batch}
  gpuscale study --nproc 1,2 --variant small= --variant large=--swap-train-test --out runs/data-size \
      -- examples/dogs_vs_cats.py                    # the course's 2,000 vs 22,000 training images
  gpuscale study --launcher slurm --profile local --nproc 1,2 --nodes 1,2 --out runs/slurm -- examples/dogs_vs_cats.py
  gpuscale report runs/study
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "study", __doc__, EPILOG)
    add_study_options(parser)
    parser.add_argument("--out", required=True, help="study directory (created; a rerun skips finished cells)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]", help="the training script and its arguments")
    parser.set_defaults(func=run)


def add_study_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", default=None, metavar="1,2,4",
                        help="processes per node to try (default: 1, 2, 4, ... up to the node's GPUs, or its cores without GPUs)")
    parser.add_argument("--nodes", default="1", metavar="1,2", help="node counts to try (default 1; more need --launcher slurm)")
    parser.add_argument("--scaling", default="weak,strong", metavar="weak,strong", help="scaling modes (default both)")
    parser.add_argument("--global-batch", type=int, default=None, metavar="N",
                        help="strong scaling keeps this global batch, weak scaling the baseline's share of it; fills {per_device_batch}, "
                        "{global_batch}, {grad_accum_steps} in the script's arguments")
    parser.add_argument("--per-device-batch", type=int, default=None, metavar="N",
                        help="weak scaling keeps this per-device batch, strong scaling the baseline's global batch")
    parser.add_argument("--max-device-batch", type=int, default=None, metavar="M",
                        help="the most samples a device holds per pass: a larger share becomes equal gradient-accumulation passes")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                        help="a variant of the command: ARGS added to the script's (repeatable), e.g. "
                        "--variant small= --variant large=--swap-train-test; each variant gets its own baseline")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="run every cell K times, in rounds, and show the median run (default 1; 3 on noisy or shared machines)")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local", help="run cells here or as SLURM jobs (default local)")
    parser.add_argument("--overlap", type=float, default=None,
                        help="share of compute time that hides communication, for the prediction (default 0 on CPU, 0.5 on GPUs)")
    parser.add_argument("--no-predict", action="store_true", help="skip the prediction (and measuring the interconnect)")
    parser.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS", help="give up on a cell after this long")
    parser.add_argument("--target-efficiency", type=float, default=0.75, metavar="F",
                        help="recommend the largest run whose efficiency stays at or above F (default 0.75)")
    slurm = parser.add_argument_group("SLURM (with --launcher slurm)")
    add_cluster_options(slurm, profile_required=False)


def spec_from_args(args: argparse.Namespace, command: list[str], out: Path) -> StudySpec:
    """The StudySpec that parsed `gpuscale study` options describe (ValueError for a bad one)."""
    raw = command[1:] if command and command[0] == "--" else list(command)
    return StudySpec(
        command=tuple(raw), out=out,
        nproc=tuple(matrix.parse_counts(args.nproc, "--nproc")) if args.nproc else None,
        nodes=tuple(matrix.parse_counts(args.nodes, "--nodes")),
        scalings=tuple(matrix.parse_scalings(args.scaling)),
        variants=tuple(matrix.parse_variant(v) for v in args.variant),
        repeat=args.repeat, global_batch=args.global_batch, per_device_batch=args.per_device_batch,
        max_device_batch=args.max_device_batch, launcher=args.launcher,
        cluster=cluster_options(args) if args.profile else None,
        overlap=args.overlap, predict=not args.no_predict, cell_timeout_s=args.cell_timeout,
        target_efficiency=args.target_efficiency,
    )


def run(args: argparse.Namespace) -> int:
    result: StudyResult = run_study(spec_from_args(args, args.command, Path(args.out)))
    sys.stdout.flush()
    return 1 if result.failed else 0
