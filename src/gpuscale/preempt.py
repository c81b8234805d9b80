"""Stopping on request: SLURM's warning before the time limit, preemption, a polite `kill`.

    stop = gpuscale.StopSignal()            # every rank, after init(): USR1 and TERM now ask to stop
    for x, y in loader:
        ...
        step += training.step()
        if stop.requested():                # collective: the same answer on every rank
            ckpt.save(step=step, model=..., optimizer=..., loader=loader)
            stop.exit()                     # ends the run with EXIT_STOPPED (75): "stopped, resume me"

Who sends the signals: gpuscale's batch scripts ask SLURM for USR1 some time before the time limit
(``--signal=B:USR1@N``, N from the profile) and pass it on to every task; a preempting SLURM sends
TERM; torchrun and `gpuscale run` pass USR1 and TERM on to their workers. The script finishes the
step it is in, writes a checkpoint and exits; the batch script then requeues the job, which resumes
from that checkpoint. With a fixed seed the resumed run ends bit for bit where an uninterrupted one
would (the checkpoint holds the loader's position and every rank's random state).

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

Until a `StopSignal` exists, the signals keep their default effect (the process ends; the job still
requeues and resumes from the last regular checkpoint). A second signal does not kill the process
either: it is already on its way to a checkpoint, and SLURM's SIGKILL after its grace period (or
torchrun's after 30 s) remains the last word.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

import torch
import torch.distributed as dist

from gpuscale.exits import EXIT_STOPPED, Stopped
from gpuscale.runtime import Runtime, current
from gpuscale.log import get_logger

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
        self._next_check = 1 if every == "auto" else every  # the call that checks next
        self._last_check = time.monotonic()
        self._calls_at_last_check = 0
        self._skip = 1  # calls between the last two checks
        self.signal_name: str | None = None
        """The first signal this rank received (e.g. 'SIGUSR1'), or None."""
        self._received = False
        self._agreed = False
        self._calls = 0
        self._group = None
        if self.rt.is_distributed and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # the flag travels on CPU: no device sync per step
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

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
        """End the run now with EXIT_STOPPED (75), after the checkpoint. gpuscale.init() tears down as usual."""
        if self.rt.is_main:
            get_logger("preempt").warning("stopped on request (%s) after writing a checkpoint; run again to resume",
                                          self.signal_name or "a signal on another rank")
        raise Stopped()

    def close(self) -> None:
        """Put the previous signal handlers back."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def __enter__(self) -> StopSignal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
