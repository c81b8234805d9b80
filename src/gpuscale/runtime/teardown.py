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
`end_at_exit` runs it, with a barrier of limited patience, from an exit handler in ranks of scripts that never call
``destroy_process_group()`` themselves (the Accelerate documentation's scripts, Lightning's), which
gpuscale's start-up hook installs in every rank it launches.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from gpuscale.detect.log import get_logger

__all__ = ["GIL_DRAIN_S", "all_ranks_at_exit", "end_process_group", "end_at_exit", "install_exit_teardown"]

GIL_DRAIN_S = 0.1
"""How long the main thread sleeps after destroying the group, so gloo's workers get the GIL first."""
EXIT_BARRIER_S = 5.0
"""At exit, how long a rank that ended normally waits for the others to reach their exit (see `end_at_exit`)."""

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


def end_at_exit(pid: int, failed: Callable[[], bool]) -> None:
    """The exit handler: end a gloo group the script left open.

    A rank that ends normally first meets the others at a barrier: collectives it started and never
    waited for (gloo runs them in order, before the barrier) are then done on every rank before any
    rank destroys its group; without it the same race aborted 3 of 5 runs. It goes to the barrier only
    once every rank has reached its exit handler, counted in the group's store, for at most
    EXIT_BARRIER_S (`all_ranks_at_exit`): a barrier is a message to peers, and a peer still inside a
    collective would never answer it (gloo's monitored barrier bounds only rank 0's wait; the others
    waited out the group's whole timeout, minutes, while torchrun waited for them to fail). A rank
    that raised an uncaught exception (`failed()`) waits for nobody, and says so in the store, which
    ends its peers' wait; one that ends with ``sys.exit(3)`` cannot be told from a finished one and
    waits at most EXIT_BARRIER_S. A peer that is gone, or still busy when the time is up, only ends
    the wait: ranks of a script may end at different times. A NCCL
    group is left to torch: destroying a communicator whose peers are gone can block, and NCCL has no
    gloo worker threads to race with.
    """
    if os.getpid() != pid or not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            if failed():
                _count_at_exit(FAILED_KEY)  # its peers need not wait for it
            end_process_group(None if failed() else _exit_barrier)
    except Exception as exc:  # at exit, nothing may turn a finished training into a failure
        print(f"gpuscale: ending the process group at exit failed ({type(exc).__name__}: {exc})", file=sys.stderr)


AT_EXIT_KEY, FAILED_KEY = "gpuscale/at-exit", "gpuscale/failed-at-exit"


def _count_at_exit(key: str, by: int = 1) -> int | None:
    """Add `by` to `key` in the default group's store (which answers while the ranks' collectives are stuck); the
    count after, or None where the store cannot be reached."""
    try:
        return int(dist.distributed_c10d._get_default_store().add(key, by))
    except Exception:  # no store (a group made without one), or its host gone
        return None


def all_ranks_at_exit(timeout_s: float) -> bool:
    """Whether every rank of the default group has come here within `timeout_s`, counted in the group's store; False
    at once once a rank that failed says so, and where the store cannot be reached.

    The count is kept in generations of the world size (this rank's is the one its own count falls in), so a count
    left by an earlier group on the same store cannot let ranks through early; a torchrun restart starts a store of
    its own anyway."""
    world = dist.get_world_size()
    arrived = _count_at_exit(AT_EXIT_KEY)
    if arrived is None:
        return False
    everyone = ((arrived - 1) // world + 1) * world
    deadline = time.monotonic() + timeout_s
    while arrived < everyone:
        failed = _count_at_exit(FAILED_KEY, 0)
        if failed is None or failed > 0 or time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
        arrived = _count_at_exit(AT_EXIT_KEY, 0)
        if arrived is None:
            return False
    return True


def _exit_barrier() -> None:
    if not all_ranks_at_exit(EXIT_BARRIER_S):  # a peer still busy or gone: see end_at_exit
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_BARRIER_S))
    except Exception:  # a peer gone in between
        pass


def install_exit_teardown() -> None:
    """Register `end_at_exit` for this process, and note an uncaught exception for it. Exit handlers run
    last-registered first, so this one, registered when torch is imported, runs after the script's own
    (Accelerate's, Lightning's)."""
    seen: list[BaseException] = []
    previous = sys.excepthook

    def note(kind: Any, value: Any, traceback: Any) -> None:
        seen.append(value)
        previous(kind, value, traceback)

    sys.excepthook = note
    atexit.register(end_at_exit, os.getpid(), lambda: bool(seen))
