"""How a run ends on request: the exit code and the exception of a clean, requested stop.

A leaf shared by the runtime (which must not report such a stop as a failure) and by
`gpuscale.preempt.StopSignal` (which raises it after the checkpoint); it imports nothing of gpuscale.
"""

from __future__ import annotations

__all__ = ["EXIT_STOPPED", "Stopped"]

EXIT_STOPPED = 75
"""Exit code of a run that stopped on request after writing a checkpoint (sysexits' EX_TEMPFAIL: try again)."""


class Stopped(SystemExit):
    """Raised by `StopSignal.exit()`: a clean, requested stop (gpuscale.init() does not report it as a failure)."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)
