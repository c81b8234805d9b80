"""Measure: metrics over all ranks, throughput, the split of time, and `summary.json`.

A loss or accuracy computed on rank 0's shard describes 1/N of the data (docs/classic-bugs.md, bug 3).
`Average` sums value and count on every rank and all-reduces both, so `compute()` is the value
over the whole dataset, identical on every rank:

    acc = gpuscale.Average()
    for x, y in val_loader:                 # make_loader(..., train=False): each sample once
        acc.update((model(x).argmax(1) == y).sum(), len(y))
    accuracy = acc.compute()                # collective: every rank calls it

`Meter` times a run: startup (launch to the first batch), waiting for data, computing, evaluation
and checkpoints, counts samples and steps, and writes the summary that `gpuscale study` and
`report` read. Its methods that end in a reduction are collective: call them on every rank.

A Meter also samples each rank's device while it lives (`gpuscale.measure.monitor`: GPU utilisation,
memory and power, or CPU use of the rank's cores): `write_summary` stops the sampling, writes every
rank's series to ``timeline.json`` and adds their means and peaks to the summary under
``"utilisation"``. ``GPUSCALE_MONITOR=0`` or ``Meter(plan, monitor=False)`` turns it off.
"""

from __future__ import annotations

import resource
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuscale._version import __version__
from gpuscale.base import wrapped
from gpuscale.base.batches import batch_len as _batch_len
from gpuscale.base.files import write_or_keep
from gpuscale.detect.log import get_logger
from gpuscale.measure.monitor import Monitor, device_stats, make_timeline, monitor_enabled
from gpuscale.measure.probe.recorder import meter_created
from gpuscale.measure.stepsplit import PHASES, split_step, time_split
from gpuscale.measure.syncprobe import FIRST_PROBE_STEP, PROBE_STEPS, probe_enabled
from gpuscale.measure.syncprobe import RECORD as PROBES
from gpuscale.runtime.data import BatchPlan
from gpuscale.runtime.init import Runtime, current

__all__ = ["Average", "Meter", "all_reduce_sum", "all_reduce_max", "SUMMARY_KEYS", "PHASES"]

log = get_logger("meter")

SUMMARY_KEYS = (
    "world_size", "num_nodes", "launcher", "backend", "device", "strategy", "scaling", "global_batch",
    "per_device_batch", "steps", "epochs", "train_time_s", "samples_per_s", "final_loss",
    "peak_memory_bytes", "time_split_s",
)


def _runtime(rt: Runtime | None) -> Runtime:
    return rt or current()


def _numbers(values: Sequence[float] | torch.Tensor) -> list[float]:
    """`values` as floats: a list of numbers or of one-element tensors, or a 1-D tensor; TypeError naming the fix
    for anything else (a tensor of more dimensions, a string)."""
    if isinstance(values, torch.Tensor) and values.dim() > 1:
        raise TypeError(f"expected numbers (a list of floats or a 1-D tensor), got a tensor of shape {tuple(values.shape)}; "
                        "flatten it first (t.flatten())")
    if isinstance(values, torch.Tensor):  # one copy to the host (a device tensor read element by element waits each time)
        return values.detach().to("cpu", torch.float64).reshape(-1).tolist()  # float64 items: Python floats
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"expected numbers (a list of floats or a 1-D tensor): {exc}") from None


def _reduce(values: Sequence[float] | torch.Tensor, op: dist.ReduceOp.RedOpType, rt: Runtime | None = None) -> list[float]:
    numbers = _numbers(values)
    rt = _runtime(rt)
    if not rt.is_distributed:
        return numbers
    tensor = torch.tensor(numbers, dtype=torch.float64, device=rt.device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def all_reduce_sum(values: Sequence[float] | torch.Tensor, rt: Runtime | None = None) -> list[float]:
    """Element-wise sum over all ranks (collective): floats, whether given floats, one-element tensors or a 1-D tensor."""
    return _reduce(values, dist.ReduceOp.SUM, rt)


def all_reduce_max(values: Sequence[float] | torch.Tensor, rt: Runtime | None = None) -> list[float]:
    """Element-wise maximum over all ranks (collective), as `all_reduce_sum` takes and gives its values."""
    return _reduce(values, dist.ReduceOp.MAX, rt)


class Average:
    """A mean over all ranks' samples: update with (sum of values, count), compute collectively.

    Tensors given to `update` are summed on their own device and read only by `compute` (or `total` and
    `count`): updating every step never waits for the GPU.
    """

    def __init__(self) -> None:
        self._numbers = [0.0, 0.0]  # sums of what came as Python numbers: (values, count)
        self._tensors: list[torch.Tensor | None] = [None, None]  # sums of what came as tensors, where they live

    def update(self, value_sum: Any, count: Any = 1) -> None:
        """Add `value_sum` (a number or tensor, summed) over `count` samples of this rank."""
        for i, value in enumerate((value_sum, count)):
            if isinstance(value, torch.Tensor):
                value = value.detach().sum().to(torch.float64)
                held = self._tensors[i]
                self._tensors[i] = value if held is None else held.add_(value.to(held.device))
            else:
                self._numbers[i] += float(value)

    def _read(self, i: int) -> float:
        held = self._tensors[i]
        return self._numbers[i] + (float(held) if held is not None else 0.0)

    @property
    def total(self) -> float:
        """This rank's sum of values so far (reads a device tensor: a synchronisation)."""
        return self._read(0)

    @property
    def count(self) -> float:
        """This rank's count of samples so far."""
        return self._read(1)

    def compute(self, rt: Runtime | None = None) -> float:
        """The mean over every rank's samples; collective. NaN if no rank saw a sample."""
        total, count = all_reduce_sum([self.total, self.count], rt)
        return total / count if count else float("nan")

    def reset(self) -> None:
        self._numbers = [0.0, 0.0]
        self._tensors = [None, None]


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


class Meter:
    """Times and counts a training run; writes summary.json on rank 0.

        meter = gpuscale.Meter(plan)
        for epoch in range(epochs):
            for x, y in meter.iter(train_loader):    # data wait, samples and steps
                ...
            with meter.phase("eval"):
                ...
        meter.write_summary(out_dir, final_loss=loss, accuracy=acc)   # collective

    Compute time is the training wall time minus the time spent waiting for data, evaluating
    and checkpointing. On a GPU the meter synchronises the device at phase boundaries, so
    queued kernels are charged to the phase that issued them.

    monitor: sample this rank's device from now until `write_summary` (see `gpuscale.measure.monitor`;
    GPUSCALE_MONITOR=0 turns it off too). The sampling thread is a daemon and also stops when
    the Meter is garbage-collected or the process exits. Pass the same value on every rank.

    warmup_steps: ``steady_step_time_s`` in the summary is the time per optimizer step after the
    first `warmup_steps` (compilation, cuDNN's algorithm search, allocator growth and the loader
    workers' start all fall into those), evaluation and checkpoints excluded; None when the run
    took no more steps than that. ``step_time_s`` keeps every step.
    """

    def __init__(self, plan: BatchPlan, rt: Runtime | None = None, monitor: bool = True, warmup_steps: int = 10) -> None:
        self.rt = _runtime(rt)
        meter_created()  # under gpuscale's probe: this script measures itself
        self.plan = plan
        self.seconds = {"data_wait": 0.0, "eval": 0.0, "checkpoint": 0.0}
        self.batches, self.samples = 0, 0
        self.epochs: float = 0  # whole passes with a batch; the HF Trainer's callback sets its fractional count
        self.created = time.time()
        self.train_started: float | None = None  # wall clock of the first batch request
        self.warmup_steps = warmup_steps
        self._steady: tuple[float, int, dict[str, float]] | None = None  # (wall clock, steps, phase seconds) after warm-up
        self._probes_from, self._probe_seconds_from = PROBES.mark()  # this run's sync probes (gpuscale.measure.syncprobe)
        self.monitor: Monitor | None = None
        if monitor and monitor_enabled():
            self.monitor = Monitor(self.rt).start()
            # Stops the thread when this Meter goes away (or at exit) without write_summary.
            weakref.finalize(self, self.monitor.stop, False)

    def _sync(self) -> None:
        if self.rt.device.type == "cuda":
            torch.cuda.synchronize(self.rt.device)

    def iter(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate `loader`, charging the time blocked on the next batch to data wait."""
        if self.train_started is None:
            self.train_started = time.time()
        iterator = iter(loader)
        before = self.batches
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            self.seconds["data_wait"] += time.perf_counter() - start
            self.mark_warmup()
            self.batches += 1
            self.samples += _batch_len(batch)
            yield batch
        self._sync()
        if self.batches > before:  # a pass resumed after its last batch trained nothing: no epoch of this run
            self.epochs += 1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to 'eval' or 'checkpoint'."""
        if name not in self.seconds or name == "data_wait":
            raise ValueError(f"phase {name!r} is not one of 'eval', 'checkpoint'")
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start

    def mark_warmup(self) -> None:
        """Note the time once `warmup_steps` optimizer steps are done (called as batches are counted)."""
        if self._steady is None and self.steps >= self.warmup_steps:
            self._sync()
            self._steady = (time.time(), self.steps, {**self.seconds, "probe": self._probe_seconds()})

    def _probe_seconds(self) -> float:
        """Seconds this run's sync probes spent replaying (charged to the 'probe' phase, not to training)."""
        return PROBES.seconds - self._probe_seconds_from

    @property
    def steps(self) -> int:
        """Optimizer steps so far (batches / gradient-accumulation steps)."""
        return self.batches // self.plan.grad_accum_steps

    def summary(self, **metrics: Any) -> dict[str, Any]:
        """The run's summary (collective). `metrics` (final_loss, accuracy, ...) are added as given.

        Throughput (``samples_per_s``) is samples over training time: the wall time from the first
        batch request on, without evaluation, checkpoints and the sync probe's replays, so data
        waits count. ``time_to_result_s`` is the whole run: startup, training, evaluation,
        checkpoints and probes. ``step_breakdown_s`` splits one optimizer step (`gpuscale.measure.stepsplit`).
        """
        self._sync()
        now = time.time()
        started = self.train_started if self.train_started is not None else now
        wall = now - started
        startup = started - self.rt.started_at
        probe_s = self._probe_seconds()
        samples, eval_s, ckpt_s, probe_s = all_reduce_sum(
            [float(self.samples), self.seconds["eval"], self.seconds["checkpoint"], probe_s], self.rt
        )
        world = self.rt.world_size
        eval_s, ckpt_s, probe_s = eval_s / world, ckpt_s / world, probe_s / world
        wall, startup, peak, steady = all_reduce_max(
            [wall, startup, float(_peak_memory_bytes(self.rt.device)), self._steady_step_time(now)], self.rt)
        train_only = max(wall - eval_s - ckpt_s - probe_s, 1e-9)
        step_time = train_only / self.steps if self.steps else None
        split = split_step(step_time, self.steps, self._rank_reports(), self._unmeasured())
        facts = wrapped.latest()
        summary: dict[str, Any] = {
            **self._where(),
            "strategy": facts.strategy if facts else None,
            "scaling": self.plan.scaling,
            "global_batch": self.plan.global_batch,
            "per_device_batch": self.plan.per_device_batch,
            "grad_accum_steps": self.plan.grad_accum_steps,
            "steps": self.steps,
            "epochs": self.epochs,
            "samples": int(samples),
            "train_time_s": wall,
            "time_to_result_s": startup + wall,
            "samples_per_s": samples / train_only,
            "step_time_s": step_time,
            "steady_step_time_s": steady if steady >= 0 else None,
            "warmup_steps": self.warmup_steps,
            "gradient_bytes": facts.gradient_bytes if facts else None,
            "gathers_parameters": facts.gathers_parameters if facts else None,
            "final_loss": None,
            "peak_memory_bytes": int(peak),
            "time_split_s": time_split(startup, train_only, self.steps, split, eval_s, ckpt_s, probe_s, startup + wall),
            "step_breakdown_s": split["per_step_s"],
            "sync_probe": {"status": split["status"], "why": split["why"], "probes": split["probes"],
                           "of_steps": split["of_steps"], "schedule": PROBE_STEPS, "reference_rank": split["reference_rank"],
                           "slow_rank": split["slow_rank"], "source": "sync_probe"},
            "ranks": split["ranks"],
            "placements": self.rt.placements,
            "torch_version": torch.__version__,
            "gpuscale_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "utilisation": self._utilisation(),
        }
        summary.update(metrics)
        return summary

    def _steady_step_time(self, now: float) -> float:
        """Seconds per step since the warm-up ended, without evaluation, checkpoints and probes; -1 if unknown."""
        if self._steady is None or self.steps <= self._steady[1]:
            return -1.0
        at, steps_then, seconds_then = self._steady
        excluded = sum(now_s - seconds_then[k] for k, now_s in
                       (("eval", self.seconds["eval"]), ("checkpoint", self.seconds["checkpoint"]), ("probe", self._probe_seconds())))
        return max((now - at) - excluded, 0.0) / (self.steps - steps_then)

    def _where(self) -> dict[str, Any]:
        """Where the run ran: ranks, nodes, hosts, launcher, backend, device."""
        env = self.rt.env
        return {
            "world_size": self.rt.world_size,
            "num_nodes": env.num_nodes,
            "hosts": sorted({p["host"] for p in self.rt.placements}),
            "launcher": env.launcher,
            "backend": self.rt.backend,
            "device": self.rt.device.type,
            "device_name": self.rt.placements[0]["device_name"] if self.rt.placements else None,
        }

    def _unmeasured(self) -> str | None:
        """Why the sync probe may have measured nothing (used only when no rank has a probe)."""
        if not probe_enabled():
            return "the sync probe is off (GPUSCALE_SYNC_PROBE=0)"
        if PROBES.unsupported:
            return PROBES.unsupported
        if PROBES.steps == 0 and self.steps > 0:
            return "the script does not step through gpuscale.setup's Training (backward, step), where the sync probe runs"
        if PROBES.steps > FIRST_PROBE_STEP:
            return "no probed step captured a forward pass: call the model inside `with training.autocast():`"
        return None

    def _rank_reports(self) -> list[dict[str, Any]]:
        """Every rank's data wait and sync probes (collective: small objects, gathered on every rank)."""
        mine = {"rank": self.rt.rank, "data_wait_s": self.seconds["data_wait"],
                "probes": PROBES.as_rows(self._probes_from)}
        if not self.rt.is_distributed:
            return [mine]
        gathered: list[Any] = [None] * self.rt.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    def _series(self) -> dict[str, Any] | None:
        zero = self.train_started if self.train_started is not None else self.created
        return self.monitor.series(zero) if self.monitor is not None else None

    def _utilisation(self) -> dict[str, Any] | None:
        """Every rank's means and peaks so far (collective: small objects, gathered on every rank)."""
        series = self._series()
        stats = [device_stats(series)] if series is not None else []
        if self.rt.is_distributed:
            gathered: list[Any] = [None] * self.rt.world_size
            dist.all_gather_object(gathered, stats)
            stats = [s for rank in gathered for s in rank]
        if not stats:
            return None
        sources = sorted({s["source"] for s in stats if s["source"]})
        return {"source": ",".join(sources) or None, "interval_s": self.monitor.interval_s if self.monitor else None,
                "devices": sorted(stats, key=lambda s: s["rank"])}

    def _timeline(self) -> dict[str, Any] | None:
        """Every rank's series, on rank 0 only (collective: the series can be long, so not on every rank)."""
        mine = (self.monitor.started, self._series()) if self.monitor is not None else None
        gathered: list[Any] | None = [mine]
        if self.rt.is_distributed:
            gathered = [None] * self.rt.world_size if self.rt.is_main else None  # None on the other ranks, as torch asks
            dist.gather_object(mine, gathered, dst=0)
        if not self.rt.is_main or gathered is None or not any(gathered):
            return None
        starts = [g[0] for g in gathered if g is not None and g[0] is not None]
        return make_timeline([g[1] for g in gathered if g is not None], self.monitor.interval_s if self.monitor else None,
                             min(starts) if starts else None)

    def write_summary(self, out_dir: str | Path, **metrics: Any) -> dict[str, Any]:
        """Stop the monitor, compute the summary (collective), and write on rank 0 ``out_dir/summary.json``
        and ``out_dir/timeline.json`` (removed, when the monitor is off, so that it never describes
        another run than the summary), saying where in one line (INFO). A run that took no optimizer step (a finished
        run started again) never writes over the summary of a run that trained: it returns that one where it is of the
        same experiment, else its own, unwritten, with a warning (`gpuscale.base.files.write_or_keep`). Call
        `summary` for numbers mid-run: it keeps the monitor going."""
        if self.monitor is not None:
            self.monitor.stop()
        summary, timeline = self.summary(**metrics), self._timeline()
        if not self.rt.is_main:
            return summary
        outcome = write_or_keep(out_dir, summary, timeline)
        (log.warning if outcome.warn else log.info)("%s", outcome.line)
        return outcome.summary
