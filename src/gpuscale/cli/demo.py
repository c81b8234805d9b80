"""`gpuscale demo`: a weak and a strong scaling study of the dogs-vs-cats example, on this machine, now.

It runs examples/dogs_vs_cats.py (transfer learning on a generated image set, 2 + 1 epochs) on
1 and 2 processes of this CPU, or on 1, 2, 4, ... up to all GPUs of this node, weak and strong,
each with the learning rate as given (variant ``none``) and scaled with the global batch by the linear
rule (variant ``linear``: Goyal et al.; a factor of 1 under strong scaling). It prints, for each run,
the throughput speed-up and efficiency against one device, the time-to-result speed-up, the
accuracy with the rule used, the prediction, and the measured split of the lost efficiency (data,
exposed communication, imbalance, per-device compute, the rest); report.html shows the same with
the waterfall of each run's losses. About a minute and a half on 2 CPU cores. Then read the report,
and run your own script the same way: ``gpuscale study --out DIR -- your_script.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuscale.cli import study as study_cmd
from gpuscale.cli.verbs import verb_parser
from gpuscale.study.spec import run_study

DEMO_ARGS = ["--epochs", "2", "--finetune-epochs", "1"]
LR_VARIANTS = ["--variant", "none=--lr-scaling none", "--variant", "linear=--lr-scaling linear"]


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "demo", __doc__,
                         "examples:\n  gpuscale demo\n  gpuscale demo --out runs/my-demo\n  gpuscale demo --repeat 3\n"
                         "  gpuscale run --nproc-per-node 2 \"$(gpuscale demo --examples)/vit.py\"\n")
    parser.add_argument("--out", default="runs/demo", help="study directory (default runs/demo; a rerun reuses finished runs)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="runs per cell, for a spread (default 1; a rerun with more adds runs to the finished ones)")
    parser.add_argument("--examples", action="store_true",
                        help="print the folder that holds the examples (dogs_vs_cats.py, vit.py, gptneo_imdb.py) and exit")
    parser.set_defaults(func=run)


def examples_folder() -> Path:
    """The examples: inside the installed package (a wheel carries them), else the checkout's examples/ (pip install -e .)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "examples", package.parents[1] / "examples"):
        if (candidate / "dogs_vs_cats.py").is_file():
            return candidate
    raise ValueError(f"no examples next to gpuscale ({package / 'examples'}) nor in its checkout; reinstall gpuscale "
                     "(pip install gpuscale), or from a checkout (git clone ...; pip install -e .)")


def example_script() -> Path:
    """The dogs-vs-cats example the demo studies."""
    return examples_folder() / "dogs_vs_cats.py"


def run(args: argparse.Namespace) -> int:
    if args.examples:
        print(examples_folder())
        return 0
    script = example_script()
    options = argparse.ArgumentParser()
    study_cmd.add_study_options(options)  # the study's own defaults: weak and strong, local, predicted
    import torch

    cpu_only = not torch.cuda.is_available() or torch.cuda.device_count() == 0
    repeat = ["--repeat", str(args.repeat)] if args.repeat is not None else []
    study_args = options.parse_args((["--nproc", "1,2"] if cpu_only else []) + LR_VARIANTS + repeat)  # CPU: 1 vs 2 processes
    result = run_study(study_cmd.spec_from_args(study_args, [str(script), *DEMO_ARGS], Path(args.out)))
    return 1 if result.failed else 0
