"""`gpuscale study`: run a training script on 1, 2, ..., N devices, weak and strong, and report the scaling.

    gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py --epochs 2
    gpuscale study --launcher slurm --profile lumi-g --nproc 1,2,4,8 --nodes 1,2 --account project_465000 \\
        --out runs/lumi -- examples/vit.py

Each cell (a scaling and a shape, e.g. weak-1x2: weak scaling, 1 node x 2 processes) runs the
script with ``--scaling weak|strong --out DIR/<cell>`` appended; the script writes its
summary.json there (gpuscale.Meter). Cells run one after another; a rerun skips finished cells,
so an interrupted study continues where it stopped, and a longer --nproc list adds cells.

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
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from gpuscale.cli.slurm import add_cluster_options, cluster_job, profile_from_args
from gpuscale.files import atomic_write_json
from gpuscale.study import analysis, matrix, predict, runner
from gpuscale.study.linkbench import MeasureError

EPILOG = """examples:
  gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py --epochs 2
  gpuscale study --nproc 1,2 --variant small= --variant large=--swap-train-test --out runs/data-size \
      -- examples/dogs_vs_cats.py                    # the course's 2,000 vs 22,000 training images
  gpuscale study --launcher slurm --profile local --nproc 1,2 --nodes 1,2 --out runs/slurm -- examples/dogs_vs_cats.py
  gpuscale report runs/study
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "study", help="run a script on 1..N devices, weak and strong; table, report and prediction",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_study_options(parser)
    parser.add_argument("--out", required=True, help="study directory (created; a rerun skips finished cells)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]", help="the training script and its arguments")
    parser.set_defaults(func=run)


def add_study_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", default=None, metavar="1,2,4",
                        help="processes per node to try (default: 1, 2, 4, ... up to the node's GPUs, or its cores without GPUs)")
    parser.add_argument("--nodes", default="1", metavar="1,2", help="node counts to try (default 1; more need --launcher slurm)")
    parser.add_argument("--scaling", default="weak,strong", metavar="weak,strong", help="scaling modes (default both)")
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
    slurm = parser.add_argument_group("SLURM (with --launcher slurm)")
    add_cluster_options(slurm, profile_required=False)


def _node_devices() -> tuple[int, list[int]]:
    import torch

    from gpuscale.topology import allowed_cores

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus, allowed_cores()


def _command(raw: list[str]) -> list[str]:
    command = raw[1:] if raw and raw[0] == "--" else list(raw)
    if not command:
        raise ValueError("no training script given; put it after --, e.g. `-- examples/dogs_vs_cats.py --epochs 2`")
    if not os.path.isfile(command[0]):
        raise ValueError(f"script {command[0]!r} does not exist; give the path of a Python file")
    _check_script_args(command[1:])
    return command


def _check_script_args(args: list[str] | tuple[str, ...]) -> None:
    if any(a in ("--out", "--scaling") or a.startswith(("--out=", "--scaling=")) for a in args):
        raise ValueError("leave --out and --scaling out of the script's arguments: the study sets them for each cell")


def _link(args: argparse.Namespace, out: Path, num_gpus: int, cores: list[int], max_nproc: int) -> predict.Link:
    """The interconnect figures: the profile's on SLURM, else measured here once (cached in the study)."""
    from gpuscale.study import linkbench

    if args.launcher == "slurm":
        return predict.Link.from_profile(profile_from_args(args))
    path = out / "link.json"
    if path.is_file():
        return predict.Link.from_measurement(json.loads(path.read_text()))
    nproc = 2 if not num_gpus else min(2, num_gpus)
    # on CPU the benchmark's processes get the cores a 2-process cell gets
    bound = None if num_gpus else matrix.cpu_cores_for(matrix.Cell("weak", 1, nproc), max_nproc, cores)
    return predict.Link.from_measurement(linkbench.measure_local(path, nproc, bound))


def execute(args: argparse.Namespace, command: list[str], out: Path, progress: Any = print) -> dict[str, Any]:
    """Run the study that `args` describe; write results and report; return the results."""
    from gpuscale.study.report import format_table, write_report

    predict.check_overlap(args.overlap)
    if args.cell_timeout is not None and not 0 < args.cell_timeout < math.inf:
        raise ValueError(f"--cell-timeout {args.cell_timeout} must be a positive number of seconds")
    num_gpus, cores = _node_devices()
    if args.launcher == "slurm":
        if not args.profile:
            raise ValueError("--launcher slurm needs --profile (see `gpuscale profiles`)")
        device_count = profile_from_args(args).gpus_per_node  # the cluster's nodes, not this login node
    else:
        device_count = num_gpus or len(cores)
    nproc = matrix.parse_counts(args.nproc, "--nproc") if args.nproc else matrix.default_nproc(device_count)
    nodes = matrix.parse_counts(args.nodes, "--nodes")
    variants = [matrix.parse_variant(v) for v in args.variant]
    cells = matrix.cells(nproc, nodes, matrix.parse_scalings(args.scaling), variants or None, args.repeat)
    for _, extra in variants:
        _check_script_args(extra)
    unit = "GPU" if (num_gpus or args.launcher == "slurm") else "process"
    if args.launcher == "slurm":

        def job_for(cell: matrix.Cell, argv: list[str], output: str) -> tuple[Any, Any]:
            return cluster_job(args, argv, nodes=cell.nodes, gpus_per_node=cell.nproc_per_node, output=output)

        for cell in cells:  # every cell's job is checked before the first one runs
            job_for(cell, matrix.script_argv(cell, command, str(out / cell.name)), str(out / cell.name / runner.LOG_FILE))
        run_one: Any = runner.SlurmRunner(command, job_for, on_state=lambda s: progress(f"    {s}"), timeout_s=args.cell_timeout)
    else:
        if max(nodes) > 1:
            raise ValueError(f"--nodes {args.nodes} needs --launcher slurm: the local launcher runs on this node only")
        run_one = runner.LocalRunner(command, max(nproc), num_gpus, cores, timeout_s=args.cell_timeout)

    runner.record_study(out, command, args.launcher, cells)
    outcomes = runner.run_cells(out, cells, run_one, progress, unit)
    medians = analysis.median_runs([(o.cell, o.summary) for o in outcomes if o.summary is not None])
    summaries = {cell.base_name: summary for cell, summary, _ in medians}
    shapes = [c for c in cells if c.repeat == 1]
    prediction = None
    if not args.no_predict and any(c.world_size == 1 and c.name in summaries for c in shapes) and len(shapes) > 1:
        overlap = args.overlap if args.overlap is not None else (0.5 if unit == "GPU" else 0.0)
        try:
            link = _link(args, out, num_gpus, cores, max(nproc))
            prediction = predict.predict_study(shapes, summaries, link, overlap)
        except (ValueError, MeasureError) as exc:
            progress(f"no prediction: {exc}")
    results = analysis.analyse(out, prediction)
    atomic_write_json(out / "results.json", results)
    if results["rows"]:
        progress("")
        progress(format_table(results))
        paths = write_report(results, out)
        progress(f"\nreport: {paths['report.html']}  (and report.md, {out / 'plots'})")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        progress(f"{len(failed)} of {len(cells)} runs failed: {', '.join(o.cell.name for o in failed)}; "
                 "fix the cause and run the same command again: finished runs are kept")
    results["failed"] = [o.cell.name for o in failed]
    return results


def run(args: argparse.Namespace) -> int:
    command = _command(args.command)
    results = execute(args, command, Path(args.out))
    sys.stdout.flush()
    return 1 if results["failed"] else 0
