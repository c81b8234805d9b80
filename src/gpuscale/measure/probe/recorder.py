"""In a rank: record what the script does with torch, without changing it; write the rank's record at exit.

Installed by the probe's ``sitecustomize`` right after the script imports torch (see
`gpuscale.measure.probe`). It hooks three things, each cheap enough to leave step time unchanged:

- **optimizer steps**: the global post-step hook of ``torch.optim`` (public), counting steps and
  noting the times of the first, the WARMUP_STEPS-th and the last step of every optimizer;
- **data loaders**: every ``DataLoader`` iterator's ``__next__`` (torch has no public hook for it:
  the method of ``torch.utils.data.dataloader._BaseDataLoaderIter`` is wrapped), timing the wait
  for each batch and counting its samples. One pass over a loader (an epoch, an evaluation) is a
  *pass*; a pass during which an optimizer stepped is a training pass, any other an evaluation;
- **the placement** the training runs with: its cores and thread count at the first batch or step
  (gpuscale's start-up hook placed the rank before the script ran; the script may have changed it);
- **the process group** (world size, backend), read once it exists, and the device the script uses
  (the GPU it made current, else the CPU), whose utilisation `gpuscale.measure.monitor` samples from the
  first batch or step on;
- **the model's inputs**: the largest DDP model's training forward passes (a forward pre-hook,
  `model_inputs`), whose batch dimension counts the samples of a script that feeds batches without
  a DataLoader;
- **DDP's own timers**: every ``DistributedDataParallel`` made is noted (its ``__init__`` is
  wrapped) and, after each optimizer step, the largest one's logging data is read
  (``_get_ddp_logging_data()``, a few microseconds). DDP times every iteration of a model on CPUs (the
  recorder asks it to: its timers read the host's clock), and on GPUs its first 10 and every 100th (there its
  timers wait for the device): forward and backward compute, and when its gradient all-reduce ended after the
  backward's last gradient was ready, which is the rank's **sync wait** (exposed communication, plus waiting
  for the slowest rank), with the optimizer step's wall time beside it. DDP's backward clock starts when the
  forward ends; the script's call of ``torch.autograd.backward`` (wrapped: its time is noted) splits what came
  before the backward (``host_s``: the loss, logging, a busy rank's extra work) from the backward itself. The merge turns these samples into
  the step's split as the sync probe's replays do for gpuscale's Training.

The record, ``GPUSCALE_PROBE_DIR/rank-<RANK>.json``, is written when the process ends, however
it ends: a normal end or ``sys.exit`` (atexit), an uncaught exception (noted by ``sys.excepthook``,
written at exit), a signal whose action was the default one (TERM, HUP, USR1, USR2: the record is
written, then the signal takes its default course, so the exit status is unchanged). A rank killed
outright (SIGKILL, the OOM killer) or stuck in native code when the signal came keeps the record a
background thread writes every FLUSH_S seconds, marked ``"ended": null``. No collective is made:
merging the ranks' records (`gpuscale.measure.probe.merge`) happens outside them.

A script that creates a `gpuscale.Meter` measures itself: its record says ``"meter": true`` and the
launcher leaves the summary to the Meter.

The hooks live beside this module: `loader_waits` (data loaders), `ddp_timers` (DDP's timers) and
`endings` (exceptions, signals); this module keeps the rank's state and writes its record.
"""

from __future__ import annotations

import atexit
import os
import resource
import signal
import socket
import sys
import threading
import time
import weakref
from collections import deque
from types import SimpleNamespace
from typing import Any

import torch

from gpuscale.base.files import atomic_write_json, make_dir
from gpuscale.detect.env import detect_env
from gpuscale.detect.launchtime import launch_time, process_start_time
from gpuscale.detect.topology import format_cpulist
from gpuscale.measure.monitor import Monitor, monitor_enabled
from gpuscale.measure.probe.ddp_timers import (
    DDP_DEFAULT_RATE,
    MAX_DDP_SAMPLES,
    ddp_sample,
    hook_backward,
    hook_ddp,
    keep_sample,
    split_at_backward_call,
    time_every_iteration,
)
from gpuscale.measure.probe.endings import SIGNALS, hook_exceptions, hook_signals
from gpuscale.measure.probe.loader_waits import MAX_PASSES, Pass, hook_loaders, next_pass
from gpuscale.measure.probe.model_inputs import ModelInputs
from gpuscale.runtime.pinning import PLACED

__all__ = ["RECORD_VERSION", "MAX_DDP_SAMPLES", "WARMUP_STEPS", "FLUSH_S", "MAX_PASSES", "SIGNALS", "ACTIVE", "Recorder",
           "ddp_sample", "install", "meter_created"]

RECORD_VERSION = 1
TRAINING_LIBRARIES = ("accelerate", "transformers", "lightning", "pytorch_lightning", "deepspeed")
"""Libraries a rank had loaded when it wrote its record: the merge names the likely cause of ranks that never synchronised."""
WARMUP_STEPS = 10
"""Optimizer steps before the steady step time is timed (as `gpuscale.Meter`'s default)."""
FLUSH_S = 10.0
"""How often a background thread rewrites the record while the rank runs."""

ACTIVE: Recorder | None = None
"""This process's recorder, once the probe is installed."""


class Recorder:
    """What one rank did: loader passes, optimizer steps, world, device, utilisation; written as its record."""

    def __init__(self, directory: str, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self.pid = os.getpid()
        self.loaded_at = time.time()
        self.launched_at = launch_time(os.environ, self.loaded_at) or process_start_time()
        self.passes: list[Pass] = []
        self.current: Pass | None = None  # the pass that gave the latest batch: the next step trains on it
        self.optimizers: dict[int, dict[str, Any]] = {}
        self.world: dict[str, Any] | None = None
        self.device: str | None = None
        self.device_name: str | None = None
        self.meter = False
        self.error: str | None = None
        self.signal: str | None = None
        self.monitor: Any = None
        self._lock = threading.RLock()  # reentrant: a signal's handler may interrupt at_exit's write in the same thread
        self._handling_signal = self._finished = False
        self._flusher: threading.Thread | None = None
        self.launcher = _launcher()
        self.ddp: weakref.ref[Any] | None = None  # the largest DistributedDataParallel module made
        self.ddp_parameters = 0
        self.ddp_samples: list[dict[str, Any]] = []
        self.ddp_stride = 1  # the kept sample's spacing after its first 10 iterations (ddp_timers.keep_sample)
        self.ddp_rate = DDP_DEFAULT_RATE  # one in how many iterations DDP times
        self.last_step_at: float | None = None  # the latest optimizer step of the main optimizer: a step's wall time
        self.backward_calls: deque[int] = deque(maxlen=8)  # when the script last called backward (time.time_ns)
        self.inputs = ModelInputs()  # the largest DDP model's training forwards: samples where no DataLoader counts them
        self.process_group: Any = None  # the DDP's group, held until exit (see ddp_created)
        self.placement: dict[str, Any] | None = None  # cores and threads as the training found them

    # --- hooks (the training thread) ---

    def batch(self, iterator: Any, fresh: bool, start: float, waited: float, batch: Any) -> None:
        """A batch came out of `iterator` after `waited` seconds."""
        state = iterator.__dict__.get("_gpuscale_pass")
        if state is None or state.ended or fresh:
            state = next_pass(self.passes, start)
            iterator.__dict__["_gpuscale_pass"] = state
            if len(self.passes) == 1:
                self._first_activity()
        state.add(waited, batch)
        self.current = state

    def loader_end(self, iterator: Any) -> None:
        """`iterator` raised StopIteration: its pass is over."""
        state = iterator.__dict__.get("_gpuscale_pass")
        if state is not None and not state.ended:
            state.ended = True
            state.last_at = time.time()

    def step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        """An optimizer finished a step (torch.optim's global post-step hook)."""
        now = time.time()
        entry = self.optimizers.get(id(optimizer))
        if _state_setup_step(optimizer):
            return  # not training: torch.distributed.checkpoint making the optimizer's state
        if entry is None:
            entry = self.optimizers[id(optimizer)] = {"name": type(optimizer).__name__, "steps": 0, "first_step_at": now,
                                                      "warm_at": None, "last_step_at": now,
                                                      "gradient_bytes": _gradient_bytes(optimizer)}
            if len(self.optimizers) == 1:
                self._first_activity()
        entry["steps"] += 1
        entry["last_step_at"] = now
        step_s = None  # the wall time of this optimizer step, from the main optimizer's step before
        if entry is self._main_optimizer():
            step_s = now - self.last_step_at if self.last_step_at is not None else None
            self.last_step_at = now
            self.inputs.stepped()
        if entry["steps"] == WARMUP_STEPS:
            entry["warm_at"] = now
        if self.current is not None:
            self.current.steps += 1
        if self.world is None:
            self._observe_world()
        if self.ddp is not None and not self.meter:  # a Meter's sync probe measures its own script
            self._sample_ddp(step_s)

    def ddp_created(self, module: Any) -> None:
        """A DistributedDataParallel module was made: follow the largest one's timers."""
        try:
            size = sum(p.numel() for p in module.parameters())
        except Exception:
            return
        if self.ddp is None or self.ddp() is None or size > self.ddp_parameters:
            self.ddp, self.ddp_parameters = weakref.ref(module), size
            self.ddp_samples, self.ddp_stride = [], 1
            self.ddp_rate = time_every_iteration(module)
            self.inputs.watch(module)
        # Keep the DDP's process group alive until this process's exit handlers (`at_exit`). A script that ends
        # with destroy_process_group() and returns frees its DDP model right away; if that frees the group too,
        # gloo's destructor joins its worker threads while the main thread holds the GIL, and a worker still
        # releasing its last collective needs the GIL: a deadlock seen in 1 of 8 runs under the probe
        # (docs/traps.md). Held to the exit handlers, the group is freed after the workers are idle.
        self.process_group = getattr(module, "process_group", None) or self.process_group

    def _main_optimizer(self) -> dict[str, Any] | None:
        """The optimizer that stepped most (a GAN's second optimizer does not split the steps' wall times)."""
        return max(self.optimizers.values(), key=lambda o: o["steps"], default=None)

    def _sample_ddp(self, step_s: float | None) -> None:
        module = self.ddp() if self.ddp is not None else None
        if module is None:
            return
        try:
            sample = ddp_sample(module._get_ddp_logging_data())
        except Exception:  # a private API: if it changes, exposed communication is just "not measured"
            self.ddp = None
            return
        if sample is not None:
            split_at_backward_call(sample, self.backward_calls)
            sample["step_s"] = step_s  # this optimizer step's wall time, from the one before (None for the first)
            self.ddp_stride = keep_sample(self.ddp_samples, sample, self.ddp_stride)

    def meter_created(self) -> None:
        """The script measures itself with gpuscale.Meter: leave the summary (and the device's sampling) to it."""
        self.meter = True
        if self.monitor is not None:
            self.monitor.stop(wait=False)

    def _first_activity(self) -> None:
        """The first batch or step: the script has set up its device and (usually) its process group."""
        self._observe_world()
        self._observe_device()
        self.placement = {"cores": format_cpulist(sorted(os.sched_getaffinity(0))), "threads": torch.get_num_threads(),
                          "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                          "placed_by": os.environ.get(PLACED, "").partition(":")[2] or None}
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_every, name="gpuscale-probe", daemon=True)
            self._flusher.start()

    def _observe_world(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.world = {"world_size": dist.get_world_size(), "rank": dist.get_rank(), "backend": str(dist.get_backend())}

    def _observe_device(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.device("cuda", torch.cuda.current_device())
            self.device_name = torch.cuda.get_device_name(device)
        else:
            device = torch.device("cpu")
        self.device = str(device)
        if self.meter or not monitor_enabled():
            return
        stand_in = SimpleNamespace(device=device, cores=tuple(sorted(os.sched_getaffinity(0))), rank=self.rank,
                                   host=socket.gethostname())
        self.monitor = Monitor(stand_in).start()

    # --- the record ---

    def record(self, ended: str | None) -> dict[str, Any]:
        """This rank's record now; `ended` is how the process ends ('exit', 'exception', 'signal') or None (running)."""
        series = None
        if self.monitor is not None:
            series = self.monitor.series(zero=0.0)  # absolute unix times: the merge picks the zero
        return {
            "version": RECORD_VERSION, "rank": self.rank, "pid": self.pid, "host": socket.gethostname(),
            "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")},
            "launched_at": self.launched_at, "loaded_at": self.loaded_at, "written_at": time.time(),
            "ended": ended, "error": self.error, "signal": self.signal,
            "launcher": self.launcher, "placement": self.placement, "world": self.world, "device": self.device,
            "device_name": self.device_name, "meter": self.meter,
            "optimizers": sorted(self.optimizers.values(), key=lambda o: -o["steps"]),
            "passes": [p.as_dict() for p in list(self.passes)],
            "warmup_steps": WARMUP_STEPS, "peak_memory_bytes": _peak_memory_bytes(),
            "series": series, "torch_version": torch.__version__, "argv": list(sys.argv),
            "ddp": {"parameters": self.ddp_parameters, "samples": list(self.ddp_samples), "rate": self.ddp_rate,
                    "stride": self.ddp_stride} if self.ddp_parameters else None,
            "inputs": self.inputs.as_dict(),
            "libraries": [name for name in TRAINING_LIBRARIES if name in sys.modules],
        }

    def write(self, ended: str | None) -> None:
        """Write the record (atomically); after the final write, periodic writes stop."""
        with self._lock:
            if self._finished:
                return
            if ended is not None:
                self._finished = True
                if self.monitor is not None:
                    self.monitor.stop(wait=False)
            try:
                make_dir(self.directory)
                atomic_write_json(os.path.join(self.directory, f"rank-{self.rank}.json"), self.record(ended))
            except Exception as exc:  # a full disk must not turn a good run into a failed one
                print(f"gpuscale probe: could not write rank {self.rank}'s record: {type(exc).__name__}: {exc}",
                      file=sys.stderr)

    def _flush_every(self) -> None:
        while not self._finished:
            time.sleep(FLUSH_S)
            if os.getpid() == self.pid:
                self.write(None)

    def at_exit(self) -> None:
        if os.getpid() == self.pid:
            self.write("exception" if self.error else "exit")
        if self.process_group is not None:
            time.sleep(0.05)  # without the GIL: gloo's workers finish with their last collective first
            self.process_group = None

    def on_signal(self, signum: int, frame: Any) -> None:
        """Write the record, then let the signal take its default course.

        Python runs a handler between two bytecodes of the main thread, also inside this very handler:
        a second signal during the first one's write must not wait for the lock the first one holds, which
        would never be released: workers of a SIGKILLed `gpuscale run` hung so in 2 of 8 runs (py-spy showed
        three nested handlers; 0 of 16 since). It returns at once; the first one ends the process when its
        record is written.
        """
        if self._handling_signal:
            return
        self._handling_signal = True
        try:
            name = signal.Signals(signum).name
            mine = signal.getsignal(signum) == self.on_signal
            if os.getpid() == self.pid:
                self.signal = name
                if mine:
                    self.write("signal")
                else:  # called on by a handler the script installed later: the process may go on
                    self.write(None)
            if mine:  # take the signal's default course, so the exit status is what it would have been
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
        finally:
            self._handling_signal = False


def _state_setup_step(optimizer: Any) -> bool:
    """Whether a step is one torch.distributed.checkpoint takes to make an optimizer's state (`_init_optim_state`: an
    fsdp resume; every save of a stateless SGD's): every learning rate 0 and every gradient zeros. The gradients (a
    DTensor's local shard) are looked at only where every learning rate is 0: a warm-up from 0 has real ones."""
    groups = getattr(optimizer, "param_groups", None) or []
    try:
        if not groups or not all(_zero_on_host(group.get("lr", 1.0)) for group in groups):
            return False
        grads = [p.grad for group in groups for p in group["params"] if getattr(p, "grad", None) is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        return bool(local) and not any(bool(torch.count_nonzero(g)) for g in local)
    except Exception:  # an optimizer of unusual make: count its step
        return False


def _zero_on_host(lr: Any) -> bool:  # known without a device sync: DCP sets a float or a host tensor
    return not (isinstance(lr, torch.Tensor) and lr.device.type != "cpu") and float(lr) == 0.0


def _gradient_bytes(optimizer: Any) -> int | None:
    """Bytes of the gradients this optimizer updates (what DDP all-reduces each step; a shard under ZeRO or FSDP)."""
    try:
        return sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"]
                   if p.requires_grad)
    except Exception:
        return None


def _launcher() -> str | None:
    """How this rank was started (torchrun, srun, ...), as gpuscale.detect.env tells it; None if it cannot."""
    try:
        return detect_env(os.environ).launcher
    except Exception:
        return None


def _peak_memory_bytes() -> int:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def install() -> Recorder | None:
    """Hook torch in this rank (once); called by the probe's sitecustomize after ``import torch``."""
    global ACTIVE
    if ACTIVE is not None:
        return ACTIVE
    directory = os.environ.get("GPUSCALE_PROBE_DIR")
    if not directory:
        return None
    recorder = Recorder(directory, int(os.environ.get("RANK", "0")))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(recorder.step)
    hook_loaders(recorder)
    hook_ddp(recorder)
    hook_backward(recorder.backward_calls)
    hook_exceptions(recorder)
    hook_signals(recorder)
    atexit.register(recorder.at_exit)
    ACTIVE = recorder
    return recorder


def meter_created() -> None:
    """Called by `gpuscale.Meter`: this rank measures itself."""
    if ACTIVE is not None:
        ACTIVE.meter_created()
