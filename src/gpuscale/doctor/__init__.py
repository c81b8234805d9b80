"""`gpuscale doctor`: preflight checks of where ranks run, what they run with, and how fast they talk.

Run it where the training will run, the way the training will be launched:

    gpuscale doctor                                        # this machine, one process
    gpuscale run --nproc-per-node 2 -m gpuscale doctor     # every rank of a local run
    srun ... python -m gpuscale doctor                     # every task of a SLURM step
    gpuscale slurm submit --doctor ... -- train.py         # inside the job, before the training

Every rank joins (`gpuscale.init()`, so with exactly the binding and device the training gets),
describes itself (`facts`), and rank 0 judges the whole world (`checks`): ranks that disagree on
the world size, two ranks on one GPU, ranks sharing cores, a rank bound far from its GPU, a GPU no
rank uses; torch, NCCL/RCCL (and DeepSpeed) versions; the network interface across nodes,
MIOpen's cache on AMD, tokenizers and threads; the rendezvous port. Then the network each node
really uses (`network`): on GPUs NCCL's/RCCL's own init log, captured around a small all-reduce
(`nccl_capture`) and parsed (`ncclog`: IB, OFI with its plugin and provider, or the socket
fallback); on CPU the address gloo binds, by torch's rule (`gloonet`). Then all ranks all-reduce
messages of 4 KiB to 256 MiB and rank 0 reports algbw and busbw (`bandwidth`) against the
profile's link bandwidth. The exit code is 1 on every rank when anything failed, 0 otherwise.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscale.doctor.checks import Finding, check_environment, check_placement, check_software

__all__ = ["Finding", "judge", "check_port_free"]


def check_port_free(addr: str | None, port: int, is_local: bool) -> Finding:
    """Before any launch: can a rendezvous store listen on `port` here? (Only meaningful on rank 0's host.)"""
    if addr and not is_local:
        try:
            socket.getaddrinfo(addr, port)
        except OSError as exc:
            return Finding("fail", "rendezvous", f"MASTER_ADDR={addr} does not resolve here ({exc.strerror or exc})",
                           "set MASTER_ADDR to rank 0's host name as every node knows it")
        return Finding("info", "rendezvous", f"rendezvous {addr}:{port} is another host: its port is checked there")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: a port in TIME_WAIT is usable
        try:
            s.bind(("", port))
        except OSError:
            return Finding("fail", "rendezvous", f"port {port} is already in use on this host (another job or a leftover "
                           "process): the rendezvous store cannot listen there",
                           "pick another port (gpuscale run --master-port, MASTER_PORT), or let gpuscale derive it from "
                           f"the SLURM job id; find the holder with: ss -ltnp 'sport = :{port}'")
    return Finding("ok", "rendezvous", f"port {port} is free for the rendezvous store")


def judge(facts: Sequence[Mapping[str, Any]], *, gpu_cores: Sequence[Sequence[int] | None] | None = None,
          want_deepspeed: bool = False, rendezvous: Finding | None = None) -> list[Finding]:
    """All of rank 0's verdicts on the gathered facts, in report order. Pure."""
    found = check_placement(facts, gpu_cores)
    found += check_software(facts, want_deepspeed)
    found += check_environment(facts)
    if rendezvous is not None:
        found.append(rendezvous)
    return found
