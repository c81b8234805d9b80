"""Latency of gloo's collectives on this machine, 2 processes one core each, against a bare socket round trip.

What a small model's weak-scaling efficiency on CPUs is bound by: a DDP step synchronises at least one
bucket, whatever its size. `python -m bench gloo_latency` times, per call (median of rounds):

- a socket round trip between two processes on cores 0 and 1 (the floor the machine sets);
- gloo ``send``/``recv`` round trip, ``all_reduce`` of 1 to 1.3 M floats, ``all_gather`` of the same;
- a DDP step of the dogs-vs-cats model (frozen VGG-style features, a 187 KB head) with and without its
  gradient synchronisation (``no_sync``): what one synchronisation costs inside a step.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import ROOT, TORCHRUN, examples_on_path, launch

SIZES = (1, 16, 47_000, 1_300_000)  # floats: a scalar, a few, the dogs-vs-cats head (187 KB), 5.2 MB


def socket_round_trip(rounds: int = 2000) -> float:
    """Seconds per round trip of one byte between a process on core 0 and one on core 1 (blocking sockets)."""
    a, b = socket.socketpair()
    child = os.fork()
    if child == 0:  # pragma: no cover - the echoing child
        try:
            os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
            for _ in range(rounds):
                b.send(b.recv(8))
        finally:
            os._exit(0)
    os.sched_setaffinity(0, {0})
    started = time.perf_counter()
    for _ in range(rounds):
        a.send(b"x")
        a.recv(8)
    elapsed = (time.perf_counter() - started) / rounds
    os.waitpid(child, 0)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return elapsed


def worker(out: str) -> None:  # runs under torchrun: times the collectives and a DDP step
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank = int(os.environ["LOCAL_RANK"])
    os.sched_setaffinity(0, {rank})
    dist.init_process_group("gloo")

    def timed(fn, calls: int = 200) -> float:
        for _ in range(20):
            fn()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - started) / calls

    one = torch.zeros(1)

    def ping() -> None:
        if rank == 0:
            dist.send(one, 1)
            dist.recv(one, 1)
        else:
            dist.recv(one, 0)
            dist.send(one, 0)

    result: dict[str, Any] = {"send_recv_round_trip_s": timed(ping), "all_reduce_s": {}, "all_gather_s": {}}
    for n in SIZES:
        t, gathered = torch.ones(n), [torch.empty(n) for _ in range(2)]
        result["all_reduce_s"][n] = timed(lambda t=t: dist.all_reduce(t), 100)
        result["all_gather_s"][n] = timed(lambda t=t, g=gathered: dist.all_gather(g, t), 100)

    examples_on_path()
    from dogs_vs_cats import build_model

    torch.manual_seed(0)
    net = build_model("small", 32)
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 32, 32), (torch.rand(32) > 0.5).float()

    def step(sync: bool) -> None:
        if sync:
            F.binary_cross_entropy(model(x), y).backward()
        else:
            with model.no_sync():
                F.binary_cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    rounds: dict[str, list[float]] = {"sync": [], "no_sync": []}
    for _ in range(3):  # alternate, so a slow minute hits both
        for mode in rounds:
            rounds[mode].append(timed(lambda m=mode: step(m == "sync"), 100))
    result["ddp_step_s"] = {mode: statistics.median(v) for mode, v in rounds.items()}
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()
    os._exit(0)


def run(repeat: int = 3) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            out = Path(tmp) / f"{i}.json"
            launch([*TORCHRUN, str(Path(__file__)), str(out)], env={"PYTHONPATH": str(ROOT)})
            record = json.loads(out.read_text())
            record["socket_round_trip_s"] = socket_round_trip()
            rounds.append(record)

    def median(get) -> float:
        return statistics.median(get(r) for r in rounds)

    return {
        "repeat": repeat,
        "socket_round_trip_us": 1e6 * median(lambda r: r["socket_round_trip_s"]),
        "send_recv_round_trip_us": 1e6 * median(lambda r: r["send_recv_round_trip_s"]),
        "all_reduce_us": {n: 1e6 * median(lambda r, n=n: r["all_reduce_s"][str(n)]) for n in SIZES},
        "all_gather_us": {n: 1e6 * median(lambda r, n=n: r["all_gather_s"][str(n)]) for n in SIZES},
        "ddp_step_ms": {mode: 1e3 * median(lambda r, m=mode: r["ddp_step_s"][m]) for mode in ("sync", "no_sync")},
        "rounds": rounds,
    }


def report(record: dict[str, Any]) -> str:
    lines = [f"socket round trip        {record['socket_round_trip_us']:8.0f} us",
             f"gloo send/recv round trip {record['send_recv_round_trip_us']:7.0f} us"]
    for n in SIZES:
        lines.append(f"{n:>9} floats: all_reduce {record['all_reduce_us'][n]:7.0f} us, all_gather {record['all_gather_us'][n]:7.0f} us")
    step = record["ddp_step_ms"]
    lines.append(f"dogs-vs-cats DDP step: {step['sync']:.2f} ms, without synchronisation {step['no_sync']:.2f} ms "
                 f"(one synchronisation: {step['sync'] - step['no_sync']:.2f} ms)")
    return "\n".join(lines)


if __name__ == "__main__":
    worker(sys.argv[1])
