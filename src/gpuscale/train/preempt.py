"""Stopping on request: SLURM's warning before the time limit, preemption, a polite `kill`.

    stop = gpuscale.StopSignal()            # every rank, after init(): USR1 and TERM now ask to stop
    for x, y in loader:
        ...
        step += training.step()
        if stop.requested():                # collective: the same answer on every rank
            ckpt.save(step=step, model=..., optimizer=..., loader=loader)
            stop.exit()                     # ends the run with EXIT_STOPPED (75): "stopped, resume me"

Who sends the signals: gpuscale's batch scripts ask SLURM for USR1 some time before the time limit
(``--signal=B:USR1@N``, N from the profile); a preempting SLURM and scancel send TERM; torchrun and
`gpuscale run` pass USR1 and TERM on to their workers. USR1's default action ends a process, so a
batch script passes the warning on to its ranks only when they stop at a checkpoint on it: creating
a StopSignal says so, by creating the file the batch script names in GPUSCALE_STOP_MARKER (see
`gpuscale.base.exits`). The script finishes the step it is in, writes a checkpoint and exits with 75, and
leaves a note beside that file (torchrun turns its workers' 75 into a 1); the batch script then
requeues the job, which resumes from that checkpoint. With a fixed seed the resumed run ends bit for
bit where an uninterrupted one would (the checkpoint holds the loader's position and every rank's
random state).

Why a collective: the signal reaches the ranks at slightly different moments, possibly in
different steps, while a checkpoint must be written by all ranks after the same step. So
`requested()` combines every rank's flag with an all-reduce (max): once any rank has been told,
all of them answer True after the same step. It runs on a CPU (gloo) group, so on GPUs it costs no
device synchronisation. Its latency is still that of a gloo round: 0.6 to 2.5 ms per call on our
2-core VM, a tenth of a small model's step. So by default (``every="auto"``) the ranks check about
every ``interval_s`` (0.5 s): each check's all-reduce also carries the slowest rank's time since the
last one, from which every rank derives the same number of calls to skip until the next (starting
at 1, at most doubling from one check to the next, at most 10,000). A stop then comes at most about
half a second later than it would with a check every step, against SLURM's warning of minutes.
``every=K`` checks every K-th call instead; one process checks its own flag at every call, which
costs nothing.

Until a `StopSignal` exists (and after `close()`), the signals keep their default effect, and a
gpuscale batch script does not pass SLURM's warning on: the script runs on to its time limit and is
not requeued. A second signal does not kill the process either, nor one after `exit()`: it is
already on its way to a checkpoint or out, and SLURM's SIGKILL after its grace period (or torchrun's,
a while after it passed a signal on) remains the last word.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from types import FrameType

import torch
import torch.distributed as dist

from gpuscale.base.exits import EXIT_STOPPED, STOP_MARKER, Stopped, stopped_marker
from gpuscale.detect.log import get_logger
from gpuscale.runtime.init import Runtime, current

__all__ = ["StopSignal", "Stopped", "EXIT_STOPPED", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopSignal:
    """Turns USR1 and TERM into a request to stop after the current step (see the module docstring).

    Create it on every rank at the same point (with NCCL it makes a small gloo group: collective).
    Use it as a context manager to put the previous handlers back at the end, or let the process end.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, *, every: int | str = "auto", interval_s: float = 0.5,
                 rt: Runtime | None = None) -> None:
        if every != "auto" and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"every={every!r} must be 'auto' or at least 1 (check for a stop request every K-th call)")
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r} must be a positive number of seconds between checks")
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("StopSignal() must be created in the main thread: Python delivers signals only there")
        self.rt = rt or current()
        self.every = every
        self.interval_s = interval_s
        self._next_check: int = 1 if isinstance(every, str) else every  # the call that checks next ("auto": the first)
        self._last_check = time.monotonic()
        self._calls_at_last_check = 0
        self._skip = 1  # calls between the last two checks
        self.signal_name: str | None = None
        """The first signal this rank received (e.g. 'SIGUSR1'), or None."""
        self._received = False
        self._agreed = False
        self._exiting = False
        self._calls = 0
        self._group = None
        if self.rt.is_distributed and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # the flag travels on CPU: no device sync per step
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}
        # Only now that the handlers are in place: the batch script passes SLURM's warning on from here on.
        marker = os.environ.get(STOP_MARKER)
        _note_for_batch_script(marker, "a rank stops at a checkpoint on USR1 and TERM\n")
        if marker:  # a stop of an earlier attempt (torchrun restarted the group) is not this one's; every rank gets
            with contextlib.suppress(OSError):  # here before any stops, since the stop is agreed by all
                os.remove(stopped_marker(marker))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self._received:
            self._received = True
            self.signal_name = signal.Signals(signum).name
            # os.write, not logging: a signal handler may interrupt logging while it holds its lock.
            os.write(2, f"[gpuscale] rank {self.rt.rank} got {self.signal_name}: stopping after this step to write "
                        "a checkpoint\n".encode())

    @property
    def received(self) -> bool:
        """True once this rank got a stop signal (local: other ranks may not know yet)."""
        return self._received

    def requested(self) -> bool:
        """True on every rank once any rank got a stop signal. Collective: call it on all ranks, equally often."""
        if self._agreed:
            return True
        self._calls += 1
        if not self.rt.is_distributed:
            self._agreed = self._received
            return self._agreed
        if self._calls < self._next_check:
            return False
        now = time.monotonic()
        shared = torch.tensor([1.0 if self._received else 0.0, now - self._last_check], dtype=torch.float64)
        dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=self._group)
        self._agreed = bool(shared[0].item())
        self._next_check = self._calls + self._calls_to_skip(float(shared[1].item()))
        self._last_check, self._calls_at_last_check = now, self._calls
        return self._agreed

    def _calls_to_skip(self, slowest_s: float) -> int:
        """Calls until the next check. The same on every rank: it depends only on all-reduced values.

        The first check's time runs from the constructor, not over whole calls: it says nothing of
        a step's length, so the second check comes at the next call. From then on the time between
        checks gives the time per call; the gap may at most double from one check to the next, so a
        few fast first calls (before the loader or the model has warmed up, say) cannot set it far too long.
        """
        if self.every != "auto":
            return int(self.every)
        if self._calls_at_last_check == 0:
            return 1
        per_call = slowest_s / max(1, self._calls - self._calls_at_last_check)
        fits = int(self.interval_s / per_call) if per_call > 0 else 10_000
        self._skip = max(1, min(10_000, 2 * self._skip, fits))
        return self._skip

    def exit(self) -> None:
        """End the run now with EXIT_STOPPED (75), after the checkpoint. gpuscale.init() tears down as usual.

        From here to the end of the process the stop signals are ignored (close() leaves them so): the rank is on its
        way out after a checkpoint, and a late signal (torchrun TERMs the workers still running once one has exited;
        a second warning or a scancel) must not turn that clean stop into a death by signal, in the teardown or at
        interpreter exit, where Python puts back the default action of the signals it handled.
        """
        if self.rt.is_main:
            get_logger("preempt").warning("stopped on request (%s) after writing a checkpoint; run again to resume",
                                          self.signal_name or "a signal on another rank")
        marker = os.environ.get(STOP_MARKER)
        _note_for_batch_script(marker and stopped_marker(marker), "stopped at a checkpoint\n")
        if threading.current_thread() is threading.main_thread():
            for sig in self._previous:
                signal.signal(sig, signal.SIG_IGN)
            self._exiting = True
        raise Stopped()

    def close(self) -> None:
        """Put the previous signal handlers back (after exit(): keep ignoring them); from now on the batch script keeps
        SLURM's warning to itself."""
        if not self._exiting:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
        self._previous = {}
        marker = os.environ.get(STOP_MARKER)
        if marker:
            try:
                os.remove(marker)
            except OSError:
                pass  # another rank on this node removed it first, or the batch script's folder is on another node

    def __enter__(self) -> StopSignal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _note_for_batch_script(path: str | None, text: str) -> None:
    """Write `text` to a file the batch script reads, if it named one. The batch script's folder exists only on its
    own node (the job's first): ranks elsewhere find no folder and leave no note, which is fine, because every rank
    of a job stops together and the ranks on that node write for all of them."""
    if not path:
        return
    try:
        with open(path, "w") as note:
            note.write(text)
    except OSError:
        pass
