"""How a run ends on request: the exit code and the exception of a clean, requested stop, and the notes
a run leaves for the batch script that started it (a stop at a checkpoint; a SIGUSR1 handler of the script's
own).

A leaf shared by the runtime (which must not report such a stop as a failure), by
`gpuscale.train.preempt.StopSignal` (which raises it after the checkpoint and writes the notes) and by the
batch scripts of `gpuscale.slurm` (which read them); it imports nothing of gpuscale.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

__all__ = ["EXIT_STOPPED", "Stopped", "STOP_MARKER", "stopped_marker", "own_usr1_marker", "watch_usr1_handlers"]

EXIT_STOPPED = 75
"""Exit code of a run that stopped on request after writing a checkpoint (sysexits' EX_TEMPFAIL: try again)."""

STOP_MARKER = "GPUSCALE_STOP_MARKER"
"""The environment variable by which a gpuscale batch script names a file in a folder of its own on its node.
A rank that stops at a checkpoint on a signal (a `StopSignal` exists) creates that file: only then does the batch
script pass SLURM's warning (USR1, whose default action ends a process) on to the ranks."""


def stopped_marker(marker: str) -> str:
    """The file beside `marker` that a rank writes when it stopped at a checkpoint: torchrun reports its workers'
    exit code 75 as a plain failure (1), so the batch script learns of the stop from this file."""
    return marker + ".stopped"


def own_usr1_marker(marker: str) -> str:
    """The file beside `marker` that a rank writes when its script installs a SIGUSR1 handler of its own (Lightning's
    SLURM auto-requeue, a research script's checkpoint-on-signal): the batch script then passes SLURM's warning on
    to the step, for that handler to act on (and to requeue the job itself, if it does)."""
    return marker + ".own-usr1"


def watch_usr1_handlers(environ: Mapping[str, str] = os.environ) -> None:
    """In a rank of a gpuscale batch script (GPUSCALE_STOP_MARKER set): from now on, a SIGUSR1 handler the script
    installs (`signal.signal(SIGUSR1, handler)`, as Lightning does when its Trainer starts) leaves the note
    `own_usr1_marker` names. Installed by gpuscale's start-up hook, before the script runs."""
    marker = environ.get(STOP_MARKER)
    if not marker or getattr(signal.signal, "_gpuscale_watched", False):
        return
    original = signal.signal

    def watched(signum: Any, handler: Any) -> Any:
        previous = original(signum, handler)
        own = not str(getattr(handler, "__module__", "") or "").startswith("gpuscale.")  # StopSignal's says so itself
        if signum == signal.SIGUSR1 and callable(handler) and own:
            try:
                with open(own_usr1_marker(marker), "w") as note:
                    note.write(f"{getattr(handler, '__qualname__', type(handler).__name__)}\n")
            except OSError:  # another node's rank: the batch script's folder is on the first node only
                pass
        return previous

    watched._gpuscale_watched = True  # type: ignore[attr-defined]
    signal.signal = watched  # type: ignore[assignment]


class Stopped(SystemExit):
    """Raised by `StopSignal.exit()`: a clean, requested stop (gpuscale.init() does not report it as a failure)."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)
