"""How a run ends on request: the exit code and the exception of a clean, requested stop, and the notes
a run leaves for the batch script that started it.

A leaf shared by the runtime (which must not report such a stop as a failure), by
`gpuscale.preempt.StopSignal` (which raises it after the checkpoint and writes the notes) and by the
batch scripts of `gpuscale.slurm` (which read them); it imports nothing of gpuscale.
"""

from __future__ import annotations

__all__ = ["EXIT_STOPPED", "Stopped", "STOP_MARKER", "stopped_marker"]

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


class Stopped(SystemExit):
    """Raised by `StopSignal.exit()`: a clean, requested stop (gpuscale.init() does not report it as a failure)."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)
