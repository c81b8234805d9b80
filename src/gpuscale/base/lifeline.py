"""Workers that end with their launcher: no ghost training after torchrun is killed.

torchrun's agent (and `gpuscale run`, which is torchrun in-process) watches its workers, but the
workers do not watch it. Killed with SIGKILL (a terminal closed, an OOM killer, ``kill -9``), the
agent leaves its workers running: together they keep training, unsupervised, writing checkpoints
into the directory that the next, relaunched run also writes to. Under SLURM the job's cgroup
ends them; on a workstation nothing does.

`end_with_parent` asks Linux to send this process a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``). `gpuscale.init()` does it for workers started by torchrun, with
SIGTERM: a script with a `gpuscale.StopSignal` then finishes its step on every rank, writes a
checkpoint and exits (every worker has the agent as parent, so all get the signal); any other
script ends at once.

A Python handler of the signal (gpuscale's probe has one, to write its record) runs only when the
main thread comes back to the interpreter: a rank blocked in a collective whose peer is blocked too
would never get there, and would outlive its launcher until the group's timeout (minutes). So a
watchdog thread ends the process with SIGKILL when its parent has been gone `ORPHAN_GRACE_S`
seconds (``GPUSCALE_ORPHAN_GRACE_S``), as torchrun itself ends workers that a TERM did not. That bounds a
StopSignal's checkpoint after the launcher's death as torchrun's own stop does (and SLURM's KillWait, also 30 s by
default): a checkpoint that takes longer is cut short (and left incomplete, never taken for a whole one); raise the
grace for such a model.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import threading
import time

__all__ = ["ORPHAN_GRACE_S", "end_with_parent", "orphan_grace_s", "parent_death_signal", "watch_parent"]

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
ORPHAN_GRACE_S = 30.0
"""How long a worker whose launcher died may take to stop on its own before the watchdog kills it: torchrun's own
wait between the TERM and the KILL when it stops its workers. ``GPUSCALE_ORPHAN_GRACE_S`` sets another."""
_watching: list[int] = []  # the process whose watchdog thread runs (a forked child has none: threads stay behind)
_armed = [False]  # whether the watchdog may act: a parent-death signal is asked for now (end_with_parent(0): no longer)


def _prctl() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_signal() -> int:
    """The signal this process gets when its parent dies; 0 for none (or where it cannot be known)."""
    prctl = _prctl()
    value = ctypes.c_int(0)
    if prctl is None or prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:  # type: ignore[operator]
        return 0
    return value.value


def end_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send `signum` to this process when its parent process dies (0: no longer). Linux only.

    Returns True once set, False where it cannot be (not Linux, no libc). If the parent died just
    before the request, the signal is sent at once. (A parent that is init, as in a container whose
    first process is the launcher, never dies before the process does: the request is then moot.)
    """
    prctl = _prctl()
    parent = os.getppid()
    if prctl is None:
        return False
    if prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:  # type: ignore[operator]
        return False
    if signum and os.getppid() != parent:  # the parent died between the two calls: the kernel will not tell us
        os.kill(os.getpid(), signum)
    _armed[0] = bool(signum)
    if signum:
        watch_parent(parent)
    return True


def orphan_grace_s() -> float:
    """`ORPHAN_GRACE_S`, or ``GPUSCALE_ORPHAN_GRACE_S`` where it is set to a number of seconds."""
    try:
        return max(0.0, float(os.environ["GPUSCALE_ORPHAN_GRACE_S"]))
    except (KeyError, ValueError):
        return ORPHAN_GRACE_S


def watch_parent(parent: int) -> None:
    """Start (once per process) a daemon thread that kills this process with SIGKILL once `parent` has been gone
    `orphan_grace_s()` seconds; the parent-death signal came first and had that long to end it. It does nothing
    once the signal is no longer asked for (``end_with_parent(0)``, as `gpuscale.init()` leaves it)."""
    if os.getpid() in _watching:
        return
    _watching[:] = [os.getpid()]

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        grace = orphan_grace_s()
        if not math.isfinite(grace):  # GPUSCALE_ORPHAN_GRACE_S=inf: never
            return
        time.sleep(grace)
        if _armed[0]:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gpuscale-lifeline", daemon=True).start()
