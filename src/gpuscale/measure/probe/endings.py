"""Learn how a rank ends, for its record: an uncaught exception, or a signal whose default action ends the process.

The recorder (`gpuscale.measure.probe.recorder`) writes the record in its own handlers (``at_exit``,
``on_signal``); this module only installs the hooks that call them or note the error.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Protocol

__all__ = ["SIGNALS", "hook_signals", "hook_exceptions"]

SIGNALS = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
"""Signals whose default action ends the process: the record is written first (when nobody else handles them)."""


class EndingListener(Protocol):
    """What the hooks tell: the uncaught exception's text (`error`), or a signal (`on_signal`)."""

    error: str | None

    def on_signal(self, signum: int, frame: Any) -> None: ...


def hook_signals(recorder: EndingListener) -> None:
    """Hand SIGNALS to ``recorder.on_signal`` where their action is still the default (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) == signal.SIG_DFL:
            signal.signal(number, recorder.on_signal)


def hook_exceptions(recorder: EndingListener) -> None:
    """Note an uncaught exception in ``recorder.error``, then let the previous ``sys.excepthook`` report it."""
    previous = sys.excepthook

    def excepthook(kind: Any, value: Any, traceback: Any) -> None:
        recorder.error = f"{kind.__name__}: {value}".splitlines()[0][:500] if str(value) else kind.__name__
        previous(kind, value, traceback)

    sys.excepthook = excepthook
