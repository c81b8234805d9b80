"""Run gpuscale's benchmarks: `python -m bench [NAME ...] [--repeat N] [--out bench/results]`.

Each benchmark runs its measurement several times (interleaving what it compares, round by round),
prints medians and spreads, and writes bench/results/NAME.json with the machine it ran on.
BENCHMARKS.md reports the latest figures and how to reproduce each.

    overhead     plain PyTorch DDP vs Accelerate vs gpuscale, step time on 2 CPU processes
    startup      launch to first step: gpuscale run vs bare torchrun
    scaling_cpu  weak-scaling efficiency of the dogs-vs-cats example, 1 -> 2 processes
    gloo_latency gloo's collectives and one DDP synchronisation, 2 processes, against a socket round trip
    host_overhead host ms per optimizer step of each training path (Trainer, Training, EpochLoop, probe) against a
                 bare loop on a tiny model, and every call in the step that would wait for the device
    cli_start    wall time of the verbs that neither train nor measure (--help, lint, slurm, profiles, report, predict)
    gpu          on a GPU: the examples at gpuscale's defaults vs the course's way; GPT-neo's MFU
                 (not in the default set; refuses to run without a GPU unless --allow-cpu)
    sdpa         which attention kernel SDPA picks and which ran in GPT-neo's layers, eager and compiled (--points;
                 not in the default set; a GPU's figures, a CPU's check)
    hf_sdpa      transformers' own SDPA compiled, with and without gpuscale's use_causal_sdpa: the masks, the kernels,
                 the step time (--points; not in the default set; a GPU's figures, a CPU's check)

Run it on a quiet machine: other work on the cores shows up as spread.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

BENCHMARKS = ("overhead", "startup", "scaling_cpu", "gloo_latency", "host_overhead", "cli_start", "gpu", "sdpa", "hf_sdpa")
DEFAULT = ("overhead", "startup", "scaling_cpu", "gloo_latency")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: {', '.join(DEFAULT)})")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per benchmark (default: each benchmark's own)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where the JSON goes (default bench/results)")
    parser.add_argument("--nproc", default=None, metavar="1,2,4,8",
                        help="scaling_cpu: process counts to try (default 1,2; each process needs a core of its own)")
    parser.add_argument("--batch-sizes", default=None, metavar="32,128",
                        help="scaling_cpu: per-process batch sizes to measure (default 32, the course's)")
    parser.add_argument("--cases", default=None, metavar="dogs_vs_cats,vit,gptneo", help="gpu: which examples (default all)")
    parser.add_argument("--compile", action="store_true", help="gpu: also measure the defaults with --compile")
    parser.add_argument("--compile-mode", default=None, metavar="MODE",
                        help="gpu: torch.compile's mode for the sweep (reduce-overhead: CUDA graphs)")
    parser.add_argument("--sweep", choices=("full", "quick"), default=None,
                        help="gpu: GPT-neo compiled at several (batch x block) points, each profiled (quick: 3 points)")
    parser.add_argument("--attention", default=None, choices=("auto", "sdpa", "flex", "eager"),
                        help="gpu: the GPT-neo example's --attention for the sweep (sdpa, flex, eager; default: the example's)")
    parser.add_argument("--points", default=None, metavar="16x512,64x512",
                        help="gpu: the sweep at these (per-device batch x tokens per block) points instead of --sweep's; "
                             "sdpa, hf_sdpa: the points to look at")
    parser.add_argument("--allow-cpu", action="store_true", help="gpu: run the pipeline on a CPU with small settings (a check, not a figure)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    for flag, value in (("--nproc", args.nproc), ("--batch-sizes", args.batch_sizes)):
        if value is not None and not all(part.isdigit() and int(part) > 0 for part in value.split(",")):
            parser.error(f"{flag} {value!r} is not a comma-separated list of positive numbers like 1,2,4")
    named = args.names or DEFAULT
    for flag, given, owners in (("--cases", args.cases is not None, ("gpu",)), ("--compile", args.compile, ("gpu",)),
                                ("--allow-cpu", args.allow_cpu, ("gpu",)), ("--sweep", args.sweep is not None, ("gpu",)),
                                ("--compile-mode", args.compile_mode is not None, ("gpu",)),
                                ("--points", args.points is not None, ("gpu", "sdpa", "hf_sdpa")),
                                ("--attention", args.attention is not None, ("gpu",)),
                                ("--batch-sizes", args.batch_sizes is not None, ("scaling_cpu",)),
                                ("--nproc", args.nproc is not None, ("scaling_cpu",))):
        if given and not set(owners) & set(named):
            which = " or ".join(owners) if len(owners) < 3 else f"{', '.join(owners[:-1])} or {owners[-1]}"
            parser.error(f"{flag} is an option of the {which} benchmark; name it: python -m bench {owners[0]} {flag} ...")
    if args.cases is not None:
        from bench.gpu import CASES
        bad = [c for c in args.cases.split(",") if c and c not in CASES]
        if bad:
            parser.error(f"--cases: unknown example(s) {', '.join(bad)}; choose from {', '.join(CASES)}")
    points = None
    if args.points is not None:
        pairs = [p.split("x") for p in args.points.split(",")]
        if not all(len(p) == 2 and all(n.isdigit() and int(n) > 0 for n in p) for p in pairs):
            parser.error(f"--points {args.points!r} is not a comma-separated list of BATCHxBLOCK points like 16x512,64x512")
        points = tuple((int(b), int(s)) for b, s in pairs)
    for flag, value in (("--compile-mode", args.compile_mode), ("--attention", args.attention)):
        if value is not None and "gpu" in named and not (args.sweep or points):
            parser.error(f"{flag} applies to GPT-neo's sweep: add --sweep quick, --sweep full or --points BxS,...")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    from bench.stats import write

    for name in named:
        module = importlib.import_module(f"bench.{name}")
        options = {"repeat": args.repeat} if args.repeat else {}
        if name == "scaling_cpu" and args.nproc:
            options["nproc"] = args.nproc
        if name in ("sdpa", "hf_sdpa") and points:
            options["points"] = points
        if name == "scaling_cpu" and args.batch_sizes:
            options["batch_sizes"] = args.batch_sizes
        if name == "gpu":
            options.update(compile=args.compile, allow_cpu=args.allow_cpu)
            if args.sweep or points:
                from bench.gpu import CPU_SWEEP, QUICK_SWEEP, SWEEP

                options["sweep_points"] = points or (CPU_SWEEP if args.allow_cpu else QUICK_SWEEP if args.sweep == "quick" else SWEEP)
                options["compile_mode"] = args.compile_mode
                options["attention"] = args.attention
            if args.cases is not None:
                options["cases"] = tuple(c for c in args.cases.split(",") if c)
            options["progress"] = lambda so_far: write("gpu", so_far, args.out)  # what a run killed at its budget leaves
        record = module.run(**options)
        path = write(name, record, args.out)
        print(f"== {name} ({path})\n{module.report(record)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
