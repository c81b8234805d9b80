"""Ending a process group without gloo's abort at exit, for gpuscale's scripts and every other rank.

The abort ("terminate called without an active exception", SIGABRT, after a correct training;
docs/traps.md) comes from a gloo worker thread that holds the last reference to a finished
collective, whose destructor needs the GIL to release Python objects (autograd's context, a
tensor). If the main thread is already in interpreter shutdown, Python ends the waiting thread
inside a C++ destructor and std::terminate aborts the process. The cure, measured on 2-process
runs (torch 2.13 + gloo, the race forced wider): collect garbage, wait for every rank, destroy the
group, then sleep briefly so the GIL goes to those threads before shutdown starts. Nothing
11/40 aborted, destroy alone 6/20, barrier + destroy 5/40, this sequence 0/60.

`end_process_group` is that sequence; `gpuscale.init()` runs it when its block ends.
`end_at_exit` runs it, without the barrier, from an exit handler in ranks of scripts that never call
``destroy_process_group()`` themselves (the Accelerate documentation's scripts, Lightning's), which
gpuscale's start-up hook installs in every rank it launches.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
from collections.abc import Callable

import torch.distributed as dist

from gpuscale.log import get_logger

__all__ = ["GIL_DRAIN_S", "end_process_group", "end_at_exit", "install_exit_teardown"]

GIL_DRAIN_S = 0.1
"""How long the main thread sleeps after destroying the group, so gloo's workers get the GIL first."""

log = get_logger("runtime")


def end_process_group(barrier: Callable[[], None] | None) -> None:
    """Collect garbage, wait at `barrier` (None: a rank that failed waits for nobody), destroy, drain.

    A barrier that fails (a peer died at the very end) is reported as a warning; the group is destroyed anyway.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    if barrier is not None:
        try:
            # Nobody leaves before everybody is done: a rank that exits early closes its sockets
            # under the others' last collective.
            barrier()
        except Exception as exc:
            log.warning("final barrier failed (%s); a peer probably exited early", exc)
    dist.destroy_process_group()
    time.sleep(GIL_DRAIN_S)


def end_at_exit(pid: int) -> None:
    """The exit handler: end a gloo group the script left open, without a barrier.

    No barrier: at exit a rank cannot tell a finished training from a failed one (``sys.exit(1)`` runs
    the same handlers), and a barrier with a peer that failed would hold the failure story for as
    long as it waits. A NCCL group is left to torch: destroying a communicator whose peers are gone
    can block, and NCCL has no gloo worker threads to race with.
    """
    if os.getpid() != pid or not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            end_process_group(None)
    except Exception as exc:  # at exit, nothing may turn a finished training into a failure
        print(f"gpuscale: ending the process group at exit failed ({type(exc).__name__}: {exc})", file=sys.stderr)


def install_exit_teardown() -> None:
    """Register `end_at_exit` for this process. Exit handlers run last-registered first, so this one,
    registered when torch is imported, runs after the script's own (Accelerate's, Lightning's)."""
    atexit.register(end_at_exit, os.getpid())
