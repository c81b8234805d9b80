"""Run gpuscale's benchmarks: `python -m bench [NAME ...] [--repeat N] [--out bench/results]`.

Each benchmark runs its measurement several times (interleaving what it compares, round by round),
prints medians and spreads, and writes bench/results/NAME.json with the machine it ran on.
BENCHMARKS.md reports the latest figures and how to reproduce each.

    overhead     plain PyTorch DDP vs Accelerate vs gpuscale, step time on 2 CPU processes
    startup      launch to first step: gpuscale run vs bare torchrun
    scaling_cpu  weak-scaling efficiency of the dogs-vs-cats example, 1 -> 2 processes

Run it on a quiet machine: other work on the cores shows up as spread.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

BENCHMARKS = ("overhead", "startup", "scaling_cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per benchmark (default: each benchmark's own)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where the JSON goes (default bench/results)")
    parser.add_argument("--nproc", default=None, metavar="1,2,4,8",
                        help="scaling_cpu: process counts to try (default 1,2; each process needs a core of its own)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.nproc is not None and not all(part.isdigit() and int(part) > 0 for part in args.nproc.split(",")):
        parser.error(f"--nproc {args.nproc!r} is not a comma-separated list of process counts like 1,2,4")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    from bench.stats import write

    for name in args.names or BENCHMARKS:
        module = importlib.import_module(f"bench.{name}")
        options = {"repeat": args.repeat} if args.repeat else {}
        if name == "scaling_cpu" and args.nproc:
            options["nproc"] = args.nproc
        record = module.run(**options)
        path = write(name, record, args.out)
        print(f"== {name} ({path})\n{module.report(record)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
