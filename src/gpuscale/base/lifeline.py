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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["end_with_parent", "parent_death_signal"]

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2


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
    return True
