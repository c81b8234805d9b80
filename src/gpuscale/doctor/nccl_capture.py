"""Capture NCCL's/RCCL's own initialisation log in the doctor's run, into a file rather than the terminal.

NCCL (and RCCL, which shares its logging) reads its logging variables once, when it first starts
in a process; the doctor sets them just before it makes its NCCL group, runs a small all-reduce,
then reads what NCCL wrote (``gpuscale.doctor.ncclog`` parses it). What the doctor does with a
setting of your own:

    NCCL_DEBUG         INFO for the doctor's process (it needs INFO to see the transport); a value of
                       yours of INFO or TRACE is kept, a lower one (WARN, VERSION) is raised for this run
    NCCL_DEBUG_SUBSYS  INIT,NET,ENV (the init, the network, the settings NCCL echoes); yours is kept,
                       and if it hides INIT or NET the report says the log did not name the transport
    NCCL_DEBUG_FILE    yours is kept: NCCL writes there, the doctor reads that file (%h and %p expanded
                       as NCCL does) and leaves it; otherwise NCCL writes nccl.<host>.<pid>.log into a
                       private temporary folder (mode 0700) that the doctor removes afterwards

Either way NCCL's log goes to a file, not to your terminal. The variables are restored when the
capture ends (NCCL keeps what it read). No torch here.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from types import TracebackType

__all__ = ["NcclLogCapture", "expand_debug_file", "DEBUG_SUBSYS"]

DEBUG_SUBSYS = "INIT,NET,ENV"
VERBOSE_LEVELS = ("INFO", "TRACE")


def expand_debug_file(pattern: str, host: str, pid: int) -> str:
    """NCCL_DEBUG_FILE's name for one process: %h is the host name up to its first dot, %p the process id."""
    return pattern.replace("%h", host.split(".")[0]).replace("%p", str(pid))


class NcclLogCapture:
    """A context: NCCL's logging pointed at a file for the doctor's run; `read()` returns what NCCL wrote.

        with NcclLogCapture() as capture:     # before the first NCCL communicator of the process
            ...                               # make the NCCL group, all-reduce once
            text = capture.read()             # before the context ends: it removes the file
    """

    def __init__(self, environ: MutableMapping[str, str] | None = None, host: str | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.host = host or socket.gethostname()
        self.saved: dict[str, str | None] = {}
        self.folder: Path | None = None
        self.notes: list[str] = []
        """What the capture changed or kept, in words, for the report."""

    def __enter__(self) -> NcclLogCapture:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _set(self, name: str, value: str) -> None:
        self.saved.setdefault(name, self.environ.get(name))
        self.environ[name] = value

    def start(self) -> None:
        """Set NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE as the module docstring says."""
        level = self.environ.get("NCCL_DEBUG", "")
        if level.upper() not in VERBOSE_LEVELS:
            self._set("NCCL_DEBUG", "INFO")
            if level:
                self.notes.append(f"NCCL_DEBUG={level} raised to INFO for the doctor's run")
        if not self.environ.get("NCCL_DEBUG_SUBSYS"):
            self._set("NCCL_DEBUG_SUBSYS", DEBUG_SUBSYS)
        else:
            self.notes.append(f"NCCL_DEBUG_SUBSYS={self.environ['NCCL_DEBUG_SUBSYS']} kept")
        if self.environ.get("NCCL_DEBUG_FILE"):
            self.notes.append(f"read from NCCL_DEBUG_FILE={self.environ['NCCL_DEBUG_FILE']}")
        else:
            self.folder = Path(tempfile.mkdtemp(prefix="gpuscale-nccl-"))
            self._set("NCCL_DEBUG_FILE", str(self.folder / "nccl.%h.%p.log"))

    def path(self, pid: int | None = None) -> Path:
        """The file NCCL writes for process `pid` (default: this one)."""
        return Path(expand_debug_file(self.environ["NCCL_DEBUG_FILE"], self.host, pid or os.getpid()))

    def read(self, pid: int | None = None) -> str:
        """What NCCL wrote for process `pid` so far ('' if nothing: NCCL had not started, or wrote elsewhere)."""
        candidates = [self.path(pid)]
        if self.folder is not None:
            candidates += sorted(self.folder.glob(f"*.{pid or os.getpid()}.log"))
        for candidate in candidates:
            try:
                return candidate.read_text(errors="replace")
            except OSError:
                continue
        return ""

    def close(self) -> None:
        """Restore the variables and remove the private folder (NCCL may keep its file open: unlinked, harmless)."""
        for name, value in self.saved.items():
            if value is None:
                self.environ.pop(name, None)
            else:
                self.environ[name] = value
        self.saved.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
