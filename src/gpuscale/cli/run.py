"""`gpuscale run`: start a training script on every GPU (or core) of this node, or of many nodes.

It is torchrun underneath (torch.distributed.run's elastic agent: rendezvous, worker
monitoring, restarts), with gpuscale's choices on top:

- ``--nproc-per-node auto`` (the default) is one process per GPU, or on a CPU-only machine one
  per core this process may use; ``gpu`` and ``cpu`` force either; a number is taken as is;
- every worker binds itself to its cores in `gpuscale.init()` (``--bind none`` to skip), and sizes
  its thread pool to them instead of torchrun's blanket OMP_NUM_THREADS=1;
- on one node a free rendezvous port is found; across nodes give ``--nnodes``, ``--node-rank``,
  ``--master-addr`` (and ``--master-port``, else derived from the SLURM job id or 29500);
- torchrun's own spellings of these options, with underscores, are taken too;
- when a worker fails, the others are stopped and the exit code is the failing worker's; its error is
  printed once (`gpuscale.runtime.failures`), and the last line names the rank that failed first.

A script that calls `gpuscale.init()` prints, on rank 0, where every rank runs.

Every worker loads gpuscale's probe first (`gpuscale.measure.probe`; ``GPUSCALE_PROBE=0`` turns it off):
for a script that does not measure itself with `gpuscale.Meter`, it counts optimizer steps,
samples and data waits, samples the device's utilisation, and at the end this command prints the
throughput and the split of the time (and writes summary.json and timeline.json with ``--summary DIR``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuscale.base.files import has_python_shebang, make_dir
from gpuscale.base.tempdirs import launcher_temp_dir
from gpuscale.cli.verbs import verb_parser
from gpuscale.detect.env import check_master_addr, check_one_launcher_per_node, port_from_job_id
from gpuscale.detect.launchtime import LAUNCH_TIME, launch_time, process_start_time
from gpuscale.detect.topology import allowed_cores, check_cpu_processes
from gpuscale.launch.agent import SIGNALS_OPTION, Outcome, launch
from gpuscale.measure.probe import RECORDS, collect, describe, measured_by_meter, probe_enabled, probe_environ, site_environ, summary_name
from gpuscale.runtime.init import OMP_FROM_LAUNCHER
from gpuscale.runtime.pinning import RANK_CORES, node_gpu_count, rank_cores_text
from gpuscale.runtime.placement import plan_for_workers
from gpuscale.slurm.render import TORCHRUN_SIGNALS

EPILOG = """examples:
  gpuscale run examples/dogs_vs_cats.py                       # one process per GPU, or per core
  gpuscale run --nproc-per-node 2 examples/dogs_vs_cats.py --out runs/dvc
  gpuscale run --nproc-per-node 2 -m gpuscale env             # where does each rank run?
  gpuscale run --nproc-per-node 2 --summary runs/ddp train.py # any script: runs/ddp/summary.json by the probe
  # two nodes, run on each (node-rank 0 and 1):
  gpuscale run --nnodes 2 --node-rank 0 --master-addr node0 --master-port 12345 train.py
"""


USAGE = "gpuscale run [options] [-m] SCRIPT [ARGS ...]"
NO_SCRIPT = (f"SCRIPT is required: {USAGE}, e.g. gpuscale run --nproc-per-node 2 train.py --epochs 3 "
             "(see 'gpuscale run --help')")
TORCHRUN_SPELLINGS = {
    "--nproc-per-node": ("--nproc_per_node", "--nproc"),  # --nproc: gpuscale study's, no longer a unique abbreviation
    "--node-rank": ("--node_rank",),
    "--master-addr": ("--master_addr",),
    "--master-port": ("--master_port",),
    "--max-restarts": ("--max_restarts",),
}
"""torchrun's spellings of gpuscale run's options, accepted too (and left out of --help)."""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "run", __doc__, EPILOG)
    parser.usage = USAGE
    _option(parser, "--nproc-per-node", default="auto", metavar="N|gpu|cpu|auto",
            help="processes on this node (default auto: one per GPU, else one per usable core)")
    parser.add_argument("--nnodes", type=node_count, default=1, help="number of nodes (default 1)")
    _option(parser, "--node-rank", type=int, default=0, help="index of this node, 0..nnodes-1 (default 0)")
    _option(parser, "--master-addr", default=None, help="host of node 0 (needed with --nnodes > 1)")
    _option(parser, "--master-port", type=int, default=None,
            help="rendezvous port on node 0 (default: free port on one node; else from the SLURM job id, or 29500)")
    parser.add_argument("--bind", choices=("auto", "none"), default="auto",
                        help="bind each worker to the cores next to its GPU, or disjoint cores on CPU (default auto)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="how long a collective may wait for a stuck rank before the job fails (default: GPUSCALE_TIMEOUT or 600); "
                             "given, it replaces torch's default in a process group the script starts itself")
    _option(parser, "--max-restarts", type=int, default=0, help="restart all workers up to K times after a failure (default 0)")
    parser.add_argument("--summary", default=None, metavar="DIR",
                        help="write what the probe measured (a script without gpuscale.Meter) to DIR/summary.json and DIR/timeline.json "
                        "(DIR/summary-incomplete.json when a rank failed)")
    parser.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a Python module (python -m)")
    # optional to argparse, so that its absence is one line saying how to call (run() checks it)
    parser.add_argument("script", nargs="?", metavar="SCRIPT", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    parser.set_defaults(func=run)


def _option(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """`parser.add_argument(name, ...)`, and its TORCHRUN_SPELLINGS as hidden options filling the same value."""
    action = parser.add_argument(name, **kwargs)
    for spelling in TORCHRUN_SPELLINGS.get(name, ()):
        parser.add_argument(spelling, dest=action.dest, type=action.type, metavar=action.metavar,  # type: ignore[arg-type]
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def node_count(text: str) -> int:
    """--nnodes: a number; torchrun's elastic MIN:MAX only when both are the same."""
    low, _, high = text.partition(":")
    try:
        count, most = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of nodes; give one, e.g. --nnodes 2") from None
    if most != count:
        raise argparse.ArgumentTypeError(f"{text} is torchrun's elastic range, which gpuscale run does not take; "
                                         f"give the number of nodes, e.g. --nnodes {most}")
    return count


def resolve_nproc(value: str, num_gpus: int, num_cores: int) -> int:
    """Processes per node for 'auto', 'gpu', 'cpu' or a number. Pure."""
    if value == "auto":
        return num_gpus if num_gpus > 0 else num_cores
    if value == "gpu":
        if num_gpus == 0:
            raise ValueError("--nproc-per-node gpu, but torch sees no GPU here; use a number, 'cpu' or 'auto'")
        return num_gpus
    if value == "cpu":
        return num_cores
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--nproc-per-node {value!r} is not a number, 'gpu', 'cpu' or 'auto'") from None
    if count < 1:
        raise ValueError(f"--nproc-per-node {count} must be at least 1")
    return count


def torchrun_argv(args: argparse.Namespace, nproc: int, environ: dict[str, str],
                  parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The torch.distributed.run command line for these options, for torchrun's `parser` (default: the installed one's)."""
    if args.nnodes < 1:
        raise ValueError(f"--nnodes {args.nnodes} must be at least 1")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} must be in 0..{args.nnodes - 1} for --nnodes {args.nnodes}")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts {args.max_restarts} must not be negative")
    if args.master_addr is not None:
        check_master_addr(args.master_addr, "--master-addr")  # a wildcard names no node: refuse it before torchrun binds
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise ValueError(f"--master-port {args.master_port} is not a TCP port; choose one in 1024-65535")
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(args.nnodes), "--max-restarts", str(args.max_restarts)]
    if handles_signals_option(parser):
        # torchrun passes these signals on to the workers (USR1 too: SLURM's warning before the time limit),
        # so a script using gpuscale.StopSignal checkpoints and exits; torchrun waits 30 s for it, then kills.
        # Before torch 2.10 torchrun has no such option: gpuscale.launch.agent.launch passes USR1 on itself.
        argv += [SIGNALS_OPTION, TORCHRUN_SIGNALS]
    if args.nnodes == 1 and args.master_addr is None and args.master_port is None:
        argv.append("--standalone")  # a c10d store on a free port: no collision with other jobs
    else:
        if args.nnodes > 1 and not args.master_addr:
            raise ValueError(f"--nnodes {args.nnodes} needs --master-addr: the host of node 0, reachable from every node")
        port = args.master_port or (port_from_job_id(environ["SLURM_JOB_ID"]) if environ.get("SLURM_JOB_ID") else 29500)
        argv += ["--node-rank", str(args.node_rank), "--master-addr", args.master_addr or "127.0.0.1", "--master-port", str(port)]
    if args.module:
        argv.append("--module")
    return [*argv, "--", args.script, *args.script_args]  # "--": a script named like an option is still the script


def handles_signals_option(parser: argparse.ArgumentParser | None = None) -> bool:
    """Whether torchrun's `parser` (default: the installed torch's) takes --signals-to-handle (torch 2.10 and later)."""
    if parser is None:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
    _, unknown = parser.parse_known_args([f"{SIGNALS_OPTION}=SIGTERM", "train.py"])
    return not unknown


def check_module_name(module: str) -> None:
    """Refuse, before any rank starts, a -m module no rank could import (each rank runs `python -m MODULE` from this
    folder: the folder, then the path). Its packages are looked up, not imported: no code of the user's runs here."""
    if module.endswith(".py"):
        raise ValueError(f"-m {module}: a module's name has no .py; give -m {module[:-3]} (or the script's path without -m)")
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ValueError(f"-m {module!r} is not a module name; give a dotted name such as mypkg.train (or a script's path without -m)")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd()]) or importlib.util.find_spec(parts[0])
    for depth in range(1, len(parts) + 1):
        if spec is None:
            raise ValueError(f"-m {module}: no module named {'.'.join(parts[:depth])!r} here or on the path; run from the "
                             "folder that holds it, or give a script's path without -m")
        if depth == len(parts):
            return
        if spec.submodule_search_locations is None:
            raise ValueError(f"-m {module}: {'.'.join(parts[:depth])} is a module, not a package; give -m {'.'.join(parts[:depth])}")
        spec = importlib.machinery.PathFinder.find_spec(parts[depth], list(spec.submodule_search_locations))


def check_script_path(script: str) -> None:
    """Refuse, before any rank starts, a script that is missing, a folder, or a file of another kind (a summary.json,
    a shell script: every rank would fail on it as Python). What `python PATH` runs passes: a file with no suffix, a
    zip app, a compiled script, a folder with a __main__.py, and any file whose first line says python."""
    path = Path(script)
    if path.is_dir():
        if (path / "__main__.py").is_file():
            return  # `python FOLDER` runs its __main__.py
        raise ValueError(f"script {script!r} is a folder; give the path of a Python file in it (or -m for a module)")
    if not path.is_file():
        raise ValueError(f"script {script!r} does not exist; give the path of a Python file (or -m for a module)")
    if path.suffix not in ("", ".py", ".pyw", ".pyc", ".pyz", ".zip") and not has_python_shebang(path):  # zip apps, compiled
        raise ValueError(f"script {script!r} is not a Python file (a {path.suffix} file, no python #! line); give the "
                         "training script (or -m for a module)")


def run(args: argparse.Namespace) -> int:
    """Launch SCRIPT on this node's processes through torchrun; the exit code of the job, then its last line."""
    if args.script is None:
        raise ValueError(NO_SCRIPT)
    check_one_launcher_per_node(os.environ)
    gpus, cores = node_gpu_count(os.environ), len(allowed_cores())
    nproc = resolve_nproc(args.nproc_per_node, gpus, cores)
    if (args.nproc_per_node == "cpu" or gpus < nproc) and args.bind != "none":
        check_cpu_processes(nproc, cores, "--nproc-per-node",
                            " (or --bind none to share them anyway, one thread each, as torchrun does)")
    argv = torchrun_argv(args, nproc, dict(os.environ))
    if args.module:
        check_module_name(args.script)
    else:
        check_script_path(args.script)
    if args.timeout is not None and not 0 < args.timeout < 1e7:
        raise ValueError(f"--timeout {args.timeout} must be a positive number of seconds")
    if args.summary is not None:
        summary_dir(args.summary)

    # What every worker inherits: when it was launched (for the startup time: this command's own start, or a study
    # cell's or a batch script's launch before it), the binding choice, and whether OMP_NUM_THREADS is ours to size
    # (torchrun would force 1 thread per worker).
    os.environ[LAUNCH_TIME] = repr(launch_time(os.environ, time.time()) or process_start_time())
    os.environ["GPUSCALE_BIND"] = args.bind
    if args.timeout is not None:
        os.environ["GPUSCALE_TIMEOUT"] = repr(args.timeout)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ[OMP_FROM_LAUNCHER] = "1"
    _plan_workers(args, nproc)
    if args.max_restarts > 0:
        # torchrun shares its rendezvous store with the workers and never clears it between restarts, so a restarted
        # rank can read a dead peer's address from the previous attempt: gloo's "Connection refused", then a hang
        # until the collective timeout, in about 1 restart of 4 here (pytorch/pytorch#135712, #167288). Without
        # sharing, each attempt's rank 0 serves a fresh store on a free port.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

    records = _arm_probe(args)
    outcome = Outcome(1)
    try:
        outcome = launch(argv, nproc, _records_path(records))
    finally:
        if records is not None:
            _report_probe(args, records, nproc * args.nnodes, outcome.code)
    if outcome.line:  # after what the probe measured: the story ends with who failed
        print(outcome.unseen + outcome.line, file=sys.stderr, flush=True)
    return outcome.code


def _plan_workers(args: argparse.Namespace, nproc: int) -> None:
    """Plan the workers' cores once, with torch's view of the GPUs, and hand the plan to them (GPUSCALE_RANK_CORES):
    gpuscale's start-up hook binds each worker by it before its script runs, whatever the script."""
    os.environ.pop(RANK_CORES, None)
    plan = plan_for_workers(nproc, args.nnodes, args.node_rank, args.bind, use_gpus=args.nproc_per_node != "cpu")
    if plan.source in ("gpu-local", "even-split"):
        os.environ[RANK_CORES] = rank_cores_text(plan)


def summary_dir(path: str) -> Path:
    """--summary's folder, made now (before any worker starts); one line naming the fix if it cannot be written."""
    try:
        folder = make_dir(path)
    except (FileExistsError, NotADirectoryError) as exc:
        raise ValueError(f"--summary {path}: {exc.filename} is a file, not a folder; give a folder path") from None
    except OSError as exc:
        raise ValueError(f"--summary {path}: cannot make this folder ({exc.strerror}: {exc.filename}); "
                         "give a folder you can write, e.g. --summary runs/mine") from None
    try:
        with tempfile.TemporaryFile(dir=folder):  # the truth of "may I write here" (root's os.access says yes to /sys)
            pass
    except OSError as exc:
        raise ValueError(f"--summary {path}: cannot write in this folder ({exc.strerror}); "
                         "give a folder you can write, e.g. --summary runs/mine") from None
    return folder


def _arm_probe(args: argparse.Namespace) -> Any:
    """Load gpuscale's start-up hook in the workers, and the probe with it; the folder its records go to (None: not
    ours to merge, or off). The hook places each rank and ends its process group cleanly even with the probe off.

    A study cell names the folder itself (and merges after the cell). Across nodes only --summary's
    folder, which every node must see, can hold all ranks' records; node 0 merges them.
    """
    os.environ.update(site_environ())  # the start-up hook: placement and a clean exit for every script
    if not probe_enabled():
        return None
    if os.environ.get("GPUSCALE_PROBE_DIR") and args.summary is None:
        os.environ.update(probe_environ(os.environ["GPUSCALE_PROBE_DIR"]))
        return None
    if args.summary is not None:
        records: Any = Path(args.summary) / RECORDS
        for stale in records.glob("rank-*.json"):
            stale.unlink()
    elif args.nnodes > 1:
        return None
    else:
        records = launcher_temp_dir("probe")
    path = _folder(records)
    make_dir(path)
    os.environ.update(probe_environ(path))
    return records


def _records_path(records: Any) -> Path | None:
    """The folder of `_arm_probe`'s records (None when it armed none)."""
    if records is None:
        return None
    return _folder(records)


def _folder(records: Path | tempfile.TemporaryDirectory[str]) -> Path:
    """The folder of records that `_arm_probe` armed: --summary's, or a temporary one."""
    return records if isinstance(records, Path) else Path(records.name)


def _report_probe(args: argparse.Namespace, records: Any, world_size: int, code: int) -> None:
    """Merge the ranks' records, print what they measured, write it to --summary.

    After a failure the lines say what was measured before it, not again which rank raised what
    (that is the failure's own story, told last; the file keeps it); without --summary, nothing
    when no optimizer step was measured (gpuscale's own verbs under it, a script that only evaluates).
    """
    path = _folder(records)
    try:
        if args.node_rank != 0:
            return
        failure = f"gpuscale run ended with exit code {code}" if code else None
        summary = collect(path, args.summary, world_size=world_size, failure=failure)
        if summary is None and args.summary is not None and measured_by_meter(path):
            print(f"gpuscale run: nothing written to {args.summary}: the script measures itself with gpuscale.Meter, "
                  "whose summary is in the Meter's out_dir", file=sys.stderr, flush=True)
        if summary is not None and summary.get("kept"):  # no step taken, and a trained run's summary stays
            print(f"gpuscale run: {summary['kept']}", file=sys.stderr, flush=True)
            return
        if summary is None or (not summary["steps"] and args.summary is None):
            return  # no training to tell of (`-m gpuscale doctor`, an evaluation), and no file asked for
        text = describe({**summary, "complete": True}) if code else describe(summary)
        if code:
            text += f"\n  incomplete: the run ended with exit code {code} (how: below)"
        where = f"; written to {Path(args.summary) / summary_name(summary)}" if args.summary else ""
        print(f"gpuscale run: {text}{where}", file=sys.stderr, flush=True)
    finally:
        if not isinstance(records, Path):
            records.cleanup()
