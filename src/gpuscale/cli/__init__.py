"""The `gpuscale` command. One module per verb, each with `add_parser(subparsers)` and `run(args) -> int`.

Mistakes in what the user typed end in one line on stderr and exit code 2, never a traceback.
Whatever the user's umask, nothing a verb writes (or the processes it starts write) is
world-writable: `main` tightens the umask first (`gpuscale.files.tighten_umask`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpuscale._version import __version__
from gpuscale.cli import consolidate as consolidate_cmd
from gpuscale.cli import demo as demo_cmd
from gpuscale.cli import doctor as doctor_cmd
from gpuscale.cli import env as env_cmd
from gpuscale.cli import lint as lint_cmd
from gpuscale.cli import predict as predict_cmd
from gpuscale.cli import profiles as profiles_cmd
from gpuscale.cli import report as report_cmd
from gpuscale.cli import run as run_cmd
from gpuscale.cli import slurm as slurm_cmd
from gpuscale.cli import study as study_cmd
from gpuscale.files import tighten_umask
from gpuscale.slurm.jobs import SlurmError
from gpuscale.study.linkbench import MeasureError

VERBS = (demo_cmd, run_cmd, env_cmd, doctor_cmd, study_cmd, report_cmd, predict_cmd, slurm_cmd, profiles_cmd, consolidate_cmd, lint_cmd)

EPILOG = """examples:
  gpuscale demo                                              # weak and strong scaling of an example, here
  gpuscale study --nproc 1,2 --out runs/study -- examples/dogs_vs_cats.py --epochs 2
  gpuscale report runs/study
  gpuscale predict runs/study/weak-1x1 --profile lumi-g --nproc 1,2,4,8 --nodes 1,2
  gpuscale run --nproc-per-node 2 examples/dogs_vs_cats.py --out runs/dvc
  gpuscale run --nproc-per-node 2 -m gpuscale env
  gpuscale env --json
  gpuscale run --nproc-per-node 2 -m gpuscale doctor           # placement, versions, all-reduce bandwidth
  gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --mode srun -- train.py
  gpuscale profiles lumi-g
  gpuscale consolidate runs/mine/checkpoints/step-000001000 model.pt
  gpuscale lint train.py                                     # multi-GPU mistakes in a training script
"""


def one_line(message: str) -> str:
    """An error message on one line, even where it quotes a value or path with a line break as it was typed."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that names the fix."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpuscale",
        description="Run one PyTorch training script unchanged from 1 CPU to all GPUs of many nodes, "
        "placed correctly, and measure how much faster it got.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuscale {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        verb.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    old_umask = tighten_umask()
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, SlurmError, MeasureError) as exc:  # bad input, an unreadable path, SLURM said no
        print(f"gpuscale {args.verb}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    finally:
        os.umask(old_umask)  # main() is also called in-process (tests, scripts)


if __name__ == "__main__":
    sys.exit(main())
