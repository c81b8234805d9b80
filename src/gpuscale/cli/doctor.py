"""`gpuscale doctor`: check placement, software, environment and all-reduce bandwidth before training.

Run it the way the training runs, so that it sees the same ranks, GPUs and cores:

    gpuscale doctor                                        # this machine, one process
    gpuscale run --nproc-per-node 2 -m gpuscale doctor     # every rank of a local run
    srun --ntasks-per-node=8 python -m gpuscale doctor --profile lumi-g
    gpuscale slurm submit --doctor --profile lumi-g --account project_465000 --container $SIF --nodes 2 -- train.py

Rank 0 prints a placement table (host, rank, local rank, GPUs seen, device, the GPU's NUMA node,
the cores the rank is bound to and their NUMA nodes), then one line per check (FAIL, warn, ok,
info, each failure or warning with its fix), the network each node really uses (one line per node:
on GPUs the transport NCCL/RCCL chose, read from its own log around a small all-reduce, with
--no-bandwidth too; on CPU the interface gloo binds), the all-reduce bandwidth from 4 KiB to 256 MiB
(algbw and busbw, against the profile's link bandwidth), and the environment (secrets masked). The
text is meant to be pasted into a bug report; ``--json`` prints the same as one object.

NCCL's log goes to a file, never to the terminal: doctor sets NCCL_DEBUG=INFO,
NCCL_DEBUG_SUBSYS=INIT,NET,ENV and NCCL_DEBUG_FILE (a private temporary folder, removed afterwards)
for its own run; a NCCL_DEBUG_FILE or NCCL_DEBUG_SUBSYS of yours is kept and read
(gpuscale.doctor.nccl_capture says exactly what is kept).

Exit code: 0 when nothing failed (warnings allowed), 1 when a check failed (the same on every
rank, so srun and gpuscale run fail too), 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from gpuscale.cli.verbs import verb_parser
from gpuscale.detect.env import detect_env
from gpuscale.detect.topology import parse_gpu_core_map
from gpuscale.doctor import Finding, check_port_free, judge
from gpuscale.doctor.bandwidth import message_sizes, parse_size, sweep, verdict
from gpuscale.doctor.facts import rank_facts
from gpuscale.doctor.gloonet import gloo_endpoint
from gpuscale.doctor.nccl_capture import NcclLogCapture
from gpuscale.doctor.ncclog import parse_process
from gpuscale.doctor.network import gloo_loopback, judge_network
from gpuscale.doctor.report import as_json, exit_code, format_text
from gpuscale.runtime.init import Runtime, init
from gpuscale.slurm.profiles import load_profile

PROBE_BYTES = 4 * 2**10
"""The all-reduce that makes NCCL set up its network (and log it), with or without the bandwidth sweep."""

EPILOG = """examples:
  gpuscale doctor
  gpuscale run --nproc-per-node 2 -m gpuscale doctor
  gpuscale run --nproc-per-node 2 -m gpuscale doctor --json --max-size 16M
  srun --ntasks-per-node=8 --gpus-per-task=1 python -m gpuscale doctor --profile lumi-g
  gpuscale slurm submit --doctor --profile lumi-g --account project_465000 --container $SIF -- train.py
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "doctor", __doc__, EPILOG)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.add_argument("--profile", default=None,
                        help="cluster profile (name or TOML path): its GPU-to-cores map and expected link bandwidth")
    parser.add_argument("--gpu-cores", default=None, metavar="MAP",
                        help="the cores next to each GPU of a node, in GPU order: '49-55;57-63;...' (default: the profile's)")
    parser.add_argument("--expect-busbw", type=float, default=None, metavar="GBPS",
                        help="the all-reduce busbw to expect, in GB/s (default: the profile's link bandwidth)")
    parser.add_argument("--max-size", default="256M", help="largest all-reduce message (default 256M; from 4K)")
    parser.add_argument("--no-bandwidth", action="store_true",
                        help="skip the all-reduce bandwidth sweep (the network check still runs one small all-reduce)")
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

    loopback = gloo_loopback(gloo_endpoint(environ), socket.gethostname(), env.rank, env.num_nodes)
    if loopback:  # gloo would fail or hang meeting the other nodes: say why instead
        print(f"gpuscale doctor: FAIL network: {loopback}", file=sys.stderr)
        return 1

    # The ranks meet over gloo even on GPUs: the faults checked here (two ranks on one GPU) make NCCL fail at
    # its set-up with an error about itself. NCCL gets its own group afterwards, with its log captured, for the network
    # check and the bandwidth sweep.
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
    """Gather every rank's facts, judge them on rank 0, read the network and measure the all-reduce if the placement
    allows; the exit code."""
    import torch.distributed as dist

    distributed = rt.is_distributed  # before a one-process run may start a one-rank NCCL group of its own
    mine = rank_facts(rt, environ)
    facts: list[Any] = [mine]
    if distributed:
        facts = [None] * rt.world_size
        dist.all_gather_object(facts, mine)
        rendezvous = Finding("ok", "rendezvous", f"all {rt.world_size} ranks met at {mine['master']}")
    findings: list[Finding] = []
    plan: list[Any] = [False, False, None]  # measure the all-reduce, capture NCCL's log, why not
    if rt.is_main:
        findings, plan = _judge_and_plan(args, rt, facts, gpu_cores, rendezvous)
    if distributed:
        dist.broadcast_object_list(plan, src=0)
    measure, capture, why_not = plan
    rows, backend, nccl = _communicate(args, rt, sizes, measure, capture, distributed)
    code = [0]
    if rt.is_main:
        if rows:
            findings += verdict(rows, expected, backend)
        try:
            network, net_findings = judge_network(facts, nccl, sweep=rows, expected_gbps=expected, note=why_not)
        except Exception as exc:  # a bug of ours must not leave the other ranks waiting in the broadcast below
            network, net_findings = [], [Finding("fail", "doctor", f"judging the network failed: {type(exc).__name__}: {exc}",
                                                 "report this as a gpuscale bug")]
        findings += net_findings
        code = [_report(args, facts, findings, rows, backend, network, nccl)]
    if distributed:  # every rank exits alike, so srun and gpuscale run report the verdict
        dist.broadcast_object_list(code, src=0)
    return int(code[0])


def _judge_and_plan(args: argparse.Namespace, rt: Runtime, facts: list[Any], gpu_cores: Any,
                    rendezvous: Any) -> tuple[list[Finding], list[Any]]:
    """Rank 0: the placement, software and environment verdicts; whether to measure and to read NCCL's log."""
    try:
        findings = judge(facts, gpu_cores=gpu_cores, want_deepspeed=args.deepspeed, rendezvous=rendezvous)
    except Exception as exc:  # a bug of ours must not leave the other ranks waiting in the broadcast
        findings = [Finding("fail", "doctor", f"judging the facts failed: {type(exc).__name__}: {exc}", "report this as a gpuscale bug")]
    shared_gpu = any(f.level == "fail" and "share one GPU" in f.message for f in findings)
    gpus = [bool(f.get("gpu")) for f in facts]
    uniform = all(gpus) or not any(gpus)  # a CPU rank among GPU ranks could not join an NCCL group
    measure = rt.is_distributed and not args.no_bandwidth and not shared_gpu and uniform
    capture = all(gpus) and not shared_gpu  # one GPU process too: a one-rank NCCL group still loads the network plugin
    why_not = ("ranks share a GPU (NCCL refuses that)" if shared_gpu else "a rank runs on CPU among GPU ranks" if not uniform
               else None)
    if shared_gpu and not args.no_bandwidth:
        findings.append(Finding("info", "bandwidth", "not measured: ranks share a GPU (NCCL refuses that)"))
    if not rt.is_distributed:
        findings.append(Finding("info", "bandwidth", "one process: no all-reduce to measure (run it under "
                                "gpuscale run --nproc-per-node N -m gpuscale doctor)"))
    return findings, [measure, capture, why_not]


def _communicate(args: argparse.Namespace, rt: Runtime, sizes: list[int], measure: bool, capture: bool,
                 distributed: bool) -> tuple[list[dict[str, Any]] | None, str | None, dict[int, Any] | None]:
    """(the all-reduce table or None, the backend it ran on, rank -> its NCCL log read, or None on gloo)."""
    if capture:
        return _over_nccl(args, rt, sizes, measure, distributed)
    rows = sweep(rt.device, sizes, None) if measure else None
    return rows, rt.backend, None


def _over_nccl(args: argparse.Namespace, rt: Runtime, sizes: list[int], measure: bool,
               distributed: bool) -> tuple[list[dict[str, Any]] | None, str, dict[int, Any]]:
    """An NCCL group with NCCL's own log captured: a small all-reduce, the sweep if asked, every rank's log read."""
    with NcclLogCapture() as capture:
        group, error = _nccl_probe(rt, args.timeout, distributed)
        # over gloo: a rank whose NCCL failed must not strand the others in the sweep
        everyone = _gather(distributed, rt.world_size, error is None)
        rows = sweep(rt.device, sizes, group) if measure and all(everyone) else None
        mine = {"init": parse_process(capture.read(), os.getpid()).as_dict(), "error": error, "notes": capture.notes}
    return rows, "nccl", dict(enumerate(_gather(distributed, rt.world_size, mine)))


def _gather(distributed: bool, world_size: int, mine: Any) -> list[Any]:
    """Every rank's `mine`, in rank order, over the ranks' gloo group ([mine] for one process)."""
    import torch.distributed as dist

    if not distributed:
        return [mine]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def _nccl_probe(rt: Runtime, timeout: float, distributed: bool) -> tuple[Any, str | None]:
    """(an NCCL group over all ranks, None) after one small all-reduce on it; (None, NCCL's error) if it failed.

    One process gets a one-rank NCCL group (`Runtime.ensure_process_group`, destroyed when init's context ends).
    """
    import datetime

    import torch
    import torch.distributed as dist

    try:
        if distributed:
            group = dist.new_group(backend="nccl", timeout=datetime.timedelta(seconds=timeout))
        else:
            rt.ensure_process_group()
            group = None
        buf = torch.ones(PROBE_BYTES // 4, dtype=torch.float32, device=rt.device)
        dist.all_reduce(buf, group=group)
        torch.cuda.synchronize(rt.device)
    except (RuntimeError, dist.DistError) as exc:
        return None, _nccl_error(exc)
    return group, None


def _nccl_error(exc: BaseException) -> str:
    """NCCL's own reason from a torch error: the line after 'Last error:' if there is one, else the first line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("Last error"):
            return lines[i + 1][:300]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _report(args: argparse.Namespace, facts: list[Any], findings: list[Finding], rows: Any, backend: str | None,
            network: list[dict[str, Any]], nccl: dict[int, Any] | None) -> int:
    """Print the report (text or JSON) on rank 0; its exit code (1 if stdout closed early)."""
    try:
        if args.json:
            print(json.dumps(as_json(facts, findings, rows, backend, network=network, nccl=nccl), indent=2))
        else:
            print(format_text(facts, findings, rows, backend, network=network))
        sys.stdout.flush()
    except OSError:  # stdout closed early (| head): still tell the other ranks
        return 1
    return exit_code(findings)
