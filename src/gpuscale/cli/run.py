"""`gpuscale run`: start a training script on every GPU (or core) of this node, or of many nodes.

It is torchrun underneath (torch.distributed.run's elastic agent: rendezvous, worker
monitoring, restarts), with gpuscale's choices on top:

- ``--nproc-per-node auto`` (the default) is one process per GPU, or on a CPU-only machine one
  per core this process may use; ``gpu`` and ``cpu`` force either; a number is taken as is;
- every worker binds itself to its cores in `gpuscale.init()` (``--bind none`` to skip), and sizes
  its thread pool to them instead of torchrun's blanket OMP_NUM_THREADS=1;
- on one node a free rendezvous port is found; across nodes give ``--nnodes``, ``--node-rank``,
  ``--master-addr`` (and ``--master-port``, else derived from the SLURM job id or 29500);
- when a worker fails, the others are stopped and the exit code is the failing worker's.

A script that calls `gpuscale.init()` prints, on rank 0, where every rank runs.

Every worker loads gpuscale's probe first (`gpuscale.probe`; ``GPUSCALE_PROBE=0`` turns it off):
for a script that does not measure itself with `gpuscale.Meter`, it counts optimizer steps,
samples and data waits, samples the device's utilisation, and at the end this command prints the
throughput and the split of the time (and writes summary.json and timeline.json with ``--summary DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuscale.files import make_dir
from gpuscale.probe import RECORDS, collect, describe, probe_enabled, probe_environ, summary_name
from gpuscale.env import check_master_addr, check_one_launcher_per_node, port_from_job_id
from gpuscale.exits import EXIT_STOPPED
from gpuscale.slurm.render import TORCHRUN_SIGNALS
from gpuscale.failures import FAILURE_DIR
from gpuscale.runtime import LAUNCH_TIME, OMP_FROM_LAUNCHER
from gpuscale.topology import allowed_cores
from gpuscale.cli.verbs import verb_parser

EPILOG = """examples:
  gpuscale run examples/dogs_vs_cats.py                       # one process per GPU, or per core
  gpuscale run --nproc-per-node 2 examples/dogs_vs_cats.py --out runs/dvc
  gpuscale run --nproc-per-node 2 -m gpuscale env             # where does each rank run?
  gpuscale run --nproc-per-node 2 --summary runs/ddp train.py # any script: runs/ddp/summary.json by the probe
  # two nodes, run on each (node-rank 0 and 1):
  gpuscale run --nnodes 2 --node-rank 0 --master-addr node0 --master-port 12345 train.py
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "run", "launch a script on all GPUs/cores of this node (or of many nodes)", __doc__, EPILOG)
    parser.add_argument("--nproc-per-node", default="auto", metavar="N|gpu|cpu|auto",
                        help="processes on this node (default auto: one per GPU, else one per usable core)")
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="index of this node, 0..nnodes-1 (default 0)")
    parser.add_argument("--master-addr", default=None, help="host of node 0 (needed with --nnodes > 1)")
    parser.add_argument("--master-port", type=int, default=None,
                        help="rendezvous port on node 0 (default: free port on one node; else from the SLURM job id, or 29500)")
    parser.add_argument("--bind", choices=("auto", "none"), default="auto",
                        help="bind each worker to the cores next to its GPU, or disjoint cores on CPU (default auto)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="how long a collective may wait for a stuck rank before the job fails (default: GPUSCALE_TIMEOUT or 600)")
    parser.add_argument("--max-restarts", type=int, default=0, help="restart all workers up to K times after a failure (default 0)")
    parser.add_argument("--summary", default=None, metavar="DIR",
                        help="write what the probe measured (a script without gpuscale.Meter) to DIR/summary.json and DIR/timeline.json "
                        "(DIR/summary-incomplete.json when a rank failed)")
    parser.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a Python module (python -m)")
    parser.add_argument("script", metavar="SCRIPT", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    parser.set_defaults(func=run)


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


def torchrun_argv(args: argparse.Namespace, nproc: int, environ: dict[str, str]) -> list[str]:
    """The torch.distributed.run command line for these options. Pure."""
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
    # torchrun passes these signals on to the workers (USR1 too: SLURM's warning before the time limit),
    # so a script using gpuscale.StopSignal checkpoints and exits; torchrun waits 30 s for it, then kills.
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(args.nnodes), "--max-restarts", str(args.max_restarts),
            "--signals-to-handle", TORCHRUN_SIGNALS]
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


def first_failure(failures: dict[int, Any], notes: dict[int, dict[str, Any]]) -> int:
    """The rank that failed first. Pure.

    torchrun orders failures by whole-second timestamps, and a rank whose collective lost its
    peer fails within the same second as the peer: on ties it would name rank 0, the victim. The
    ranks' own notes (precise time, and whether the error is only a lost peer) decide instead: a
    real failure before a symptom, then the earliest; a rank without a note (killed, os._exit)
    counts as a real failure at torchrun's time; one ended by SIGTERM, which is how the agent
    stops the survivors, comes last even with a note (it may have noted its own error first).
    """
    def key(rank: int) -> tuple[int, float, int]:
        note = notes.get(rank)
        if failures[rank].exitcode == -signal.SIGTERM:
            # how the agent stops the survivors once one rank failed (even one already on its way out)
            return 3, float(failures[rank].timestamp), rank
        if note is None:
            return 0, float(failures[rank].timestamp), rank
        return (2 if note.get("symptom") else 0), float(note.get("time", failures[rank].timestamp)), rank

    return min(failures, key=key)


def _read_notes(directory: Path) -> dict[int, dict[str, Any]]:
    notes = {}
    for path in directory.glob("rank-*.json"):
        try:
            note = json.loads(path.read_text())
            notes[int(note["rank"])] = note
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return notes


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(args: argparse.Namespace) -> int:
    check_one_launcher_per_node(os.environ)
    nproc = resolve_nproc(args.nproc_per_node, _gpu_count(), len(allowed_cores()))
    argv = torchrun_argv(args, nproc, dict(os.environ))
    if not args.module and not os.path.isfile(args.script):
        raise ValueError(f"script {args.script!r} does not exist; give the path of a Python file (or -m for a module)")

    # What every worker inherits: when it was launched (for the startup time), the binding choice,
    # and whether OMP_NUM_THREADS is ours to size (torchrun would force 1 thread per worker).
    os.environ[LAUNCH_TIME] = repr(time.time())
    os.environ["GPUSCALE_BIND"] = args.bind
    if args.timeout is not None:
        if not 0 < args.timeout < 1e7:
            raise ValueError(f"--timeout {args.timeout} must be a positive number of seconds")
        os.environ["GPUSCALE_TIMEOUT"] = repr(args.timeout)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ[OMP_FROM_LAUNCHER] = "1"
    if args.max_restarts > 0:
        # torchrun shares its rendezvous store with the workers and never clears it between restarts, so a restarted
        # rank can read a dead peer's address from the previous attempt: gloo's "Connection refused", then a hang
        # until the collective timeout, in about 1 restart of 4 here (pytorch/pytorch#135712, #167288). Without
        # sharing, each attempt's rank 0 serves a fresh store on a free port.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

    records = _arm_probe(args)
    code = 1
    try:
        code = _launch(argv, nproc)
        return code
    finally:
        if records is not None:
            _report_probe(args, records, nproc * args.nnodes, code)


def _arm_probe(args: argparse.Namespace) -> Any:
    """Load the probe in the workers; the folder its records go to (None: not ours to merge, or off).

    A study cell names the folder itself (and merges after the cell). Across nodes only --summary's
    folder, which every node must see, can hold all ranks' records; node 0 merges them.
    """
    if args.summary is not None:
        make_dir(args.summary)
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
        records = tempfile.TemporaryDirectory(prefix="gpuscale-probe-")
    path = Path(records if isinstance(records, Path) else records.name)
    make_dir(path)
    os.environ.update(probe_environ(path))
    return records


def _report_probe(args: argparse.Namespace, records: Any, world_size: int, code: int) -> None:
    """Merge the ranks' records, print what they measured, write it to --summary."""
    path = records if isinstance(records, Path) else Path(records.name)
    try:
        if args.node_rank != 0:
            return
        failure = f"gpuscale run ended with exit code {code}" if code else None
        summary = collect(path, args.summary, world_size=world_size, failure=failure)
        if summary is not None:
            where = f"; written to {Path(args.summary) / summary_name(summary)}" if args.summary else ""
            print(f"gpuscale run: {describe(summary)}{where}", file=sys.stderr, flush=True)
    finally:
        if not isinstance(records, Path):
            records.cleanup()


def _launch(argv: list[str], nproc: int) -> int:
    """torchrun with `argv`; the exit code, with one line on who failed first."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    notes_dir = tempfile.TemporaryDirectory(prefix="gpuscale-failures-")
    os.environ[FAILURE_DIR] = notes_dir.name
    try:
        torchrun.run(torchrun.parse_args(argv))
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        print(f"gpuscale run: got {name}; passed it on to the workers (a script using gpuscale.StopSignal "
              "wrote a checkpoint: run the same command again to resume)", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        if all(failure.exitcode == EXIT_STOPPED for failure in exc.failures.values()):
            print(f"gpuscale run: every rank stopped on request after writing a checkpoint (exit code {EXIT_STOPPED}); "
                  "run the same command again to resume", file=sys.stderr)
            return EXIT_STOPPED
        notes = _read_notes(Path(notes_dir.name))
        # the agent SIGTERMs the ranks still running once one has failed: they do not count as a verdict of their own
        codes = {failure.exitcode for failure in exc.failures.values() if failure.exitcode != -signal.SIGTERM}
        if len(exc.failures) == nproc and len(codes) == 1 and min(codes) > 0 and not notes:
            # every rank returned the same status and none reported an exception to gpuscale: most likely the script's own
            # verdict (gpuscale doctor's 1); anything a rank printed is above
            exited = sorted(rank for rank, failure in exc.failures.items() if failure.exitcode == min(codes))
            who = "every rank" if len(exited) == nproc else f"rank(s) {', '.join(map(str, exited))} (the others were then stopped)"
            print(f"gpuscale run: {who} exited with code {min(codes)}", file=sys.stderr)
            return min(codes)
        rank = first_failure(exc.failures, notes)
        failure = exc.failures[rank]
        code = failure.exitcode
        where = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        note = notes.get(rank, {})
        said = f": {note['message'].splitlines()[0]}" if note.get("message") else ""
        print(
            f"gpuscale run: rank {rank} on {socket.gethostname()} failed first ({where}){said}; the other ranks were stopped.\n"
            f"{exc.format_msg()}",
            file=sys.stderr,
        )
        return 128 - code if code < 0 else (code or 1)
    finally:
        notes_dir.cleanup()
    return 0
