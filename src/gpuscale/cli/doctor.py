"""`gpuscale doctor`: check placement, software, environment and all-reduce bandwidth before training.

Run it the way the training runs, so that it sees the same ranks, GPUs and cores:

    gpuscale doctor                                        # this machine, one process
    gpuscale run --nproc-per-node 2 -m gpuscale doctor     # every rank of a local run
    srun --ntasks-per-node=8 python -m gpuscale doctor --profile lumi-g
    gpuscale slurm submit --doctor --profile lumi-g --nodes 2 -- train.py   # in the job, before train.py

Rank 0 prints a placement table (host, rank, local rank, GPUs seen, device, the GPU's NUMA node,
the cores the rank is bound to and their NUMA nodes), then one line per check (FAIL, warn, ok,
info, each failure or warning with its fix), the all-reduce bandwidth from 4 KiB to 256 MiB (algbw
and busbw, against the profile's link bandwidth), and the environment (secrets masked). The text
is meant to be pasted into a bug report; ``--json`` prints the same as one object.

Exit code: 0 when nothing failed (warnings allowed), 1 when a check failed (the same on every
rank, so srun and gpuscale run fail too), 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gpuscale.slurm.profiles import load_profile
from gpuscale.topology import parse_gpu_core_map
from gpuscale.doctor import check_port_free
from gpuscale.doctor.bandwidth import message_sizes, parse_size
from gpuscale.env import detect_env
from gpuscale.runtime import Runtime, init
from gpuscale.doctor import Finding, judge
from gpuscale.doctor.bandwidth import sweep, verdict
from gpuscale.doctor.facts import rank_facts
from gpuscale.doctor.report import as_json, exit_code, format_text
from gpuscale.cli.verbs import verb_parser

EPILOG = """examples:
  gpuscale doctor
  gpuscale run --nproc-per-node 2 -m gpuscale doctor
  gpuscale run --nproc-per-node 2 -m gpuscale doctor --json --max-size 16M
  srun --ntasks-per-node=8 --gpus-per-task=1 python -m gpuscale doctor --profile lumi-g
  gpuscale slurm submit --doctor --profile lumi-g --nodes 1 -- train.py
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "doctor", "preflight checks: placement, software, environment, all-reduce bandwidth", __doc__, EPILOG)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.add_argument("--profile", default=None,
                        help="cluster profile (name or TOML path): its GPU-to-cores map and expected link bandwidth")
    parser.add_argument("--gpu-cores", default=None, metavar="MAP",
                        help="the cores next to each GPU of a node, in GPU order: '49-55;57-63;...' (default: the profile's)")
    parser.add_argument("--expect-busbw", type=float, default=None, metavar="GBPS",
                        help="the all-reduce busbw to expect, in GB/s (default: the profile's link bandwidth)")
    parser.add_argument("--max-size", default="256M", help="largest all-reduce message (default 256M; from 4K)")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the all-reduce bandwidth sweep")
    parser.add_argument("--deepspeed", action="store_true", help="also check that DeepSpeed is importable")
    parser.add_argument("--bind", choices=("auto", "none"), default=None,
                        help="CPU binding to apply, as for training (default: auto, or GPUSCALE_BIND)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds the ranks may take to meet and for each collective (default 120)")
    parser.set_defaults(func=run)


def _expectations(args: argparse.Namespace, num_nodes: int) -> tuple[float | None, list[list[int] | None] | None]:
    """(expected busbw in GB/s, GPU index -> nearby cores) from the options or the profile."""
    expected, gpu_cores = args.expect_busbw, None
    if args.gpu_cores:
        try:
            gpu_cores = parse_gpu_core_map(args.gpu_cores)
        except ValueError:
            raise ValueError(f"--gpu-cores {args.gpu_cores!r} is not a ';'-separated list of core lists like 49-55;57-63") from None
    if args.profile:
        profile = load_profile(args.profile)
        if expected is None:
            expected = profile.inter_node_gbps if num_nodes > 1 else profile.intra_node_gbps
        if profile.gpu_cores and gpu_cores is None:
            gpu_cores = parse_gpu_core_map(";".join(profile.gpu_cores))
    if expected is not None and not 0 < expected < 1e6:
        raise ValueError(f"--expect-busbw {expected} must be a positive number of GB/s")
    return expected, gpu_cores


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist


    if not 0 < args.timeout < 1e6:
        raise ValueError(f"--timeout {args.timeout} must be a positive number of seconds")
    sizes = message_sizes(parse_size(args.max_size))
    environ = dict(os.environ)  # as the rank started, before init() fills in its defaults
    env = detect_env(environ)
    expected, gpu_cores = _expectations(args, env.num_nodes)
    rendezvous = None
    if env.launcher == "single":  # under a launcher the port is the launcher's own store, listening by design
        is_local = env.master_addr in (None, "", "127.0.0.1", "localhost", "::1") or env.master_addr == os.uname().nodename
        rendezvous = check_port_free(env.master_addr, env.master_port, is_local)

    # The ranks meet over gloo even on GPUs: the faults checked here (two ranks on one GPU) make NCCL fail at
    # its set-up with an error about itself. NCCL gets its own group afterwards, for the bandwidth sweep only.
    met = False
    try:
        with init(bind=args.bind, show_placement=False, timeout=args.timeout, backend="gloo") as rt:
            met = True
            return _examine(args, rt, environ, sizes, expected, gpu_cores, rendezvous)
    except (RuntimeError, dist.DistError) as exc:
        if met:
            raise
        print(f"gpuscale doctor: rank {env.rank} could not meet the other ranks at {env.master_addr}:{env.master_port} "
              f"within {args.timeout:g} s (it was told RANK={env.rank}, WORLD_SIZE={env.world_size}): ranks that disagree on "
              f"WORLD_SIZE or the rendezvous address, or a rank that never started ({str(exc).splitlines()[0][:200]})",
              file=sys.stderr)
        return 1


def _examine(args: argparse.Namespace, rt: Runtime, environ: dict[str, str], sizes: list[int], expected: float | None,
             gpu_cores: list[list[int] | None] | None, rendezvous: Any) -> int:
    """Gather every rank's facts, judge them on rank 0, measure the all-reduce if the placement allows; the exit code."""
    import torch.distributed as dist


    mine = rank_facts(rt, environ)
    facts: list[Any] = [mine]
    if rt.is_distributed:
        facts = [None] * rt.world_size
        dist.all_gather_object(facts, mine)
        rendezvous = Finding("ok", "rendezvous", f"all {rt.world_size} ranks met at {mine['master']}")
    findings: list[Finding] = []
    measure = [False]
    if rt.is_main:
        try:
            findings = judge(facts, gpu_cores=gpu_cores, want_deepspeed=args.deepspeed, rendezvous=rendezvous)
        except Exception as exc:  # a bug of ours must not leave the other ranks waiting in the broadcast below
            findings = [Finding("fail", "doctor", f"judging the facts failed: {type(exc).__name__}: {exc}", "report this as a gpuscale bug")]
        shared_gpu = any(f.level == "fail" and "share one GPU" in f.message for f in findings)
        measure = [rt.is_distributed and not args.no_bandwidth and not shared_gpu]
        if shared_gpu and not args.no_bandwidth:
            findings.append(Finding("info", "bandwidth", "not measured: ranks share a GPU (NCCL refuses that)"))
    if rt.is_distributed:
        dist.broadcast_object_list(measure, src=0)
    rows = None
    if measure[0]:
        group = dist.new_group(backend="nccl") if rt.device.type == "cuda" else None
        backend = "nccl" if group is not None else rt.backend
        rows = sweep(rt.device, sizes, group)
        if rt.is_main:
            findings += verdict(rows, expected, backend)
    else:
        backend = rt.backend
    code = [0]
    if rt.is_main:
        if not rt.is_distributed:
            findings.append(Finding("info", "bandwidth", "one process: no all-reduce to measure (run it under "
                                    "gpuscale run --nproc-per-node N -m gpuscale doctor)"))
        try:
            if args.json:
                print(json.dumps(as_json(facts, findings, rows, backend), indent=2))
            else:
                print(format_text(facts, findings, rows, backend))
            sys.stdout.flush()
            code = [exit_code(findings)]
        except OSError:  # stdout closed early (| head): still tell the other ranks
            code = [1]
    if rt.is_distributed:  # every rank exits alike, so srun and gpuscale run report the verdict
        dist.broadcast_object_list(code, src=0)
    return int(code[0])
