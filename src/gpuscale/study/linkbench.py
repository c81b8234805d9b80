"""Measure the interconnect as a training step feels it: what synchronising S bytes of gradients costs DDP.

    gpuscale run --nproc-per-node 2 -m gpuscale.study.linkbench link.json

For gradients of 8 KiB to 32 MiB (one parameter, so one DDP bucket) every rank runs a DDP step
(forward, backward) with and without gradient synchronisation, in alternating blocks, on its
device (gloo on CPU, NCCL/RCCL on GPUs). The cost of one bucket's all-reduce is the difference
of the medians. Rank 0 fits T(S) = a + c * S on relative errors, so that a = 2 (N - 1) alpha and
c = 2 (N - 1) / (N B) (see `gpuscale.study.predict`), and writes the fit and the raw times to
the JSON file. `gpuscale predict --measure` and `gpuscale study` without a profile start it
through `gpuscale.study.linkmeasure.measure_local`, which also holds the fit.

Why not time a bare `all_reduce`: on this project's 2-core machine, DDP's synchronisation of
0.8 MB cost 5.6 ms per step where a bare all-reduce of the same bytes took 3.5 ms (hooks,
bucket copies, gloo's threads sharing the rank's core, waiting for the other rank). The model
predicts steps, so it is calibrated on steps.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from gpuscale.base.files import atomic_write_json
from gpuscale.base.quickexit import skip_final_collection
from gpuscale.runtime.init import Runtime, init
from gpuscale.study.linkmeasure import fit

SIZES = tuple(2**k for k in range(13, 26, 2))  # 8 KiB .. 32 MiB
BLOCKS, STEPS_PER_BLOCK = 7, 5


def sync_cost(num_bytes: int, rt: Runtime) -> float:
    """Seconds DDP's gradient synchronisation adds to a step with `num_bytes` of gradients (median of blocks)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    class Weights(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(num_bytes // 4, device=rt.device))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.weight * x).sum()

    ddp = DistributedDataParallel(Weights())
    x = torch.ones((), device=rt.device)

    def block(sync: bool, steps: int) -> float:
        rt.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            if sync:
                ddp(x).backward()
            else:
                with ddp.no_sync():
                    ddp(x).backward()
            ddp.module.weight.grad = None
        if rt.device.type == "cuda":
            torch.cuda.synchronize(rt.device)
        return (time.perf_counter() - start) / steps

    block(True, 3)
    timed: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(BLOCKS):  # a fixed count: every rank must run the same number of synchronised steps
        for sync in (True, False):
            timed[sync].append(block(sync, STEPS_PER_BLOCK))
    # every rank measured; rank 0's medians stand for all (the synchronised blocks keep them in step)
    return max(statistics.median(timed[True]) - statistics.median(timed[False]), 1e-7)


def main(argv: list[str]) -> int:


    if len(argv) != 1:
        print("usage: gpuscale run --nproc-per-node N -m gpuscale.study.linkbench OUT.json", file=sys.stderr)
        return 2
    with init() as rt:
        if not rt.is_distributed:
            print("linkbench: needs at least 2 processes (gpuscale run --nproc-per-node 2 ...)", file=sys.stderr)
            return 2
        times = [sync_cost(size, rt) for size in SIZES]
        alpha, bandwidth = fit([float(s) for s in SIZES], times, rt.world_size)
        if rt.is_main:
            atomic_write_json(Path(argv[0]), {
                "world_size": rt.world_size, "backend": rt.backend, "device": rt.device.type,
                "latency_s": alpha, "bandwidth_bytes_per_s": bandwidth,
                "sizes_bytes": list(SIZES), "seconds": times,
            })
            print(f"DDP gradient all-reduce over {rt.world_size} ranks ({rt.backend}): latency {alpha * 1e6:.1f} us per "
                  f"ring step, bandwidth {bandwidth / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    skip_final_collection()  # gpuscale's own ranks: their exit skips the last garbage collection
    raise SystemExit(main(sys.argv[1:]))
