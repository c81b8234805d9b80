"""Epochs that survive a stop: resume, checkpoints and stop requests in one loop, so a script's own loop is training only.

    loop = gpuscale.EpochLoop(training, train_loader, epochs=args.epochs, checkpoints=out / "checkpoints",
                              scheduler=scheduler, state={"history": []})
    loss = loop.average("loss")
    for epoch in loop:                       # from where the last run stopped
        for x, y in loop.batches():          # this rank's batches, timed by loop.meter, with a progress bar
            with training.autocast():
                batch_loss = F.cross_entropy(training.model(x), y)
            training.backward(batch_loss)
            loop.step()                      # the optimizer (and the scheduler) step when due
            loss.update(batch_loss.detach() * len(y), len(y))
        loop.state["history"].append(loss.compute())
    summary = loop.meter.write_summary(out, final_loss=loop.state["history"][-1])

What the loop does for the script:

- **resume**: the newest readable checkpoint (if any, and unless ``resume=False``) restores the
  model, optimizer, scheduler, the loader's position, every rank's random state, the step count,
  the epoch, the script's `state` dict and, when the run stopped inside an epoch, the running sums
  of that epoch's averages, so its means come out as if it had never stopped;
- **end of epoch**: a checkpoint of the finished epoch, written when the ``for epoch`` loop moves on,
  so what the body appended to `state` (history, metrics) is in it;
- **stop requests** (`gpuscale.StopSignal`: SLURM's warning before the time limit, scancel,
  preemption): after the optimizer step in progress, a checkpoint with the epoch's running sums,
  then exit 75 to be resumed (requeued by gpuscale's batch scripts). Asked only after optimizer
  steps, on every rank together (the request is a collective), never inside gradient accumulation.

`loop.training` and `loop.scheduler` may be replaced between epochs (a fine-tuning phase builds a
new `Training` after unfreezing); `loop.resumed_inside_epoch` says whether the current epoch
started in the middle (a phase change at its start must then not run again). Everything a
checkpoint holds must be plain data (numbers, strings, lists, dicts): checkpoints are read with
``weights_only=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuscale.detect.log import get_logger, progress
from gpuscale.measure.metrics import Average, Meter, all_reduce_sum
from gpuscale.runtime.data import ShardedLoader
from gpuscale.runtime.init import Runtime, current
from gpuscale.train.checkpoint import Checkpointer
from gpuscale.train.preempt import StopSignal
from gpuscale.train.step import Training

__all__ = ["EpochLoop"]

log = get_logger("epochs")


class EpochLoop:
    """A resumable loop over epochs and their batches; see the module docstring."""

    def __init__(self, training: Training, loader: ShardedLoader, *, epochs: int, checkpoints: str | Path | Checkpointer,
                 scheduler: Any = None, state: dict[str, Any] | None = None, meter: Meter | None = None,
                 stop: StopSignal | None = None, resume: bool = True, keep: int = 2, rt: Runtime | None = None) -> None:
        if epochs < 0:
            raise ValueError(f"epochs={epochs} must be 0 or more")
        self.rt = rt or current()
        self.training = training
        """The `Training` whose model and optimizer are stepped and checkpointed (replaceable between epochs)."""
        self.loader = loader
        self.scheduler = scheduler
        """The learning-rate scheduler, stepped once per optimizer step (replaceable between epochs)."""
        self.epochs = epochs
        self.checkpointer = checkpoints if isinstance(checkpoints, Checkpointer) else Checkpointer(checkpoints, keep=keep)
        self.state: dict[str, Any] = state if state is not None else {}
        """The script's own record (history, metrics): saved with every checkpoint, restored on resume."""
        self.meter = meter or Meter(training.plan)
        """Times the run (data waits, steps); write the summary with it."""
        self.stop = stop or StopSignal()
        self.steps = 0
        """Optimizer steps taken, this run and the runs it resumes."""
        self.start_epoch = 0
        """The epoch this run started in (0 for a fresh run)."""
        self.resumed_inside_epoch = False
        """True while the current epoch is one a stopped run left in the middle."""
        self._averages: dict[str, Average] = {}
        self._partial: dict[str, list[float]] = {}
        self._stepped = False
        self._warned_inside_step = False
        self._epoch: int | None = None
        if resume:
            self._resume()

    def _resume(self) -> None:
        restored = self.checkpointer.resume(model=self.training.model, optimizer=self.training.optimizer,
                                            scheduler=self.scheduler, loader=self.loader)
        if restored is None:
            return
        self.steps, self.start_epoch = restored.step, restored.epoch or 0
        self.state = restored.extra.get("state", self.state)
        self._partial = restored.extra.get("partial_epoch") or {}
        if self.start_epoch >= self.epochs and not self._partial:
            log.warning("%s holds a finished run of %d epoch(s); nothing is trained (to train anew: another checkpoint "
                        "folder, EpochLoop(resume=False), or the examples' --no-resume)", restored.path,
                        self.start_epoch)

    def average(self, name: str) -> Average:
        """A per-epoch `gpuscale.Average` (reset at every epoch's start) whose running sums a stop saves."""
        if name not in self._averages:
            self._averages[name] = Average()
        return self._averages[name]

    def __iter__(self) -> Iterator[int]:
        for epoch in range(self.start_epoch, self.epochs):
            self._epoch = epoch
            # a stop mid-epoch: the running sums it saved, or (a loop without averages saves none) the loader's position
            inside = bool(self._partial) or getattr(self.loader, "batches_done", 0) > 0
            self.resumed_inside_epoch = inside and epoch == self.start_epoch
            self._start_averages()
            yield epoch
            self.resumed_inside_epoch = False
            self._warn_inside_a_step(epoch)
            self._save(epoch + 1)
        self._epoch = None

    def _warn_inside_a_step(self, epoch: int) -> None:
        """Say so, once, where an epoch ends inside gradient accumulation (a loader that keeps incomplete batches,
        drop_last=False, or a pass left before its end): its last micro-batches' gradients join the next epoch's first
        step, and the checkpoint written now does not hold them, so a run resumed from it steps without them."""
        pending = self.training.pending_micro_batches
        if pending and not self._warned_inside_step and self.rt.is_main:
            self._warned_inside_step = True
            why = ("the pass was left before its end" if self.loader.loader.drop_last else
                   "make_loader's default drop_last=True ends every epoch on a whole step")
            log.warning("epoch %d ended inside an optimizer step (%d of its %d micro-batches): their gradients carry into "
                        "the next epoch, and its checkpoint does not hold them (%s)", epoch + 1, pending,
                        self.training.plan.grad_accum_steps, why)

    def _start_averages(self) -> None:
        for name, average in self._averages.items():
            average.reset()
            if self.resumed_inside_epoch and self.rt.is_main and name in self._partial:
                average.update(*self._partial[name])  # the epoch's sums over all ranks when it stopped
        if not self.resumed_inside_epoch:
            self._partial = {}

    def batches(self, desc: str | None = None) -> Iterator[Any]:
        """This epoch's batches (timed by `meter`, with a progress bar); stops at a checkpoint when asked to."""
        if self._epoch is None:
            raise RuntimeError("call loop.batches() inside `for epoch in loop:`")
        label = desc or f"epoch {self._epoch + 1}/{self.epochs}"
        done = getattr(self.loader, "batches_done", 0)  # a resumed epoch's batches so far (0 at any other pass's start)
        for batch in progress(self.meter.iter(self.loader), desc=label, total=len(self.loader), initial=done):
            self._stepped = False
            yield batch
            if self._stepped and self.stop.requested():  # collective: every rank has just stepped
                self._save(self._epoch, partial=self._running_sums())
                self.stop.exit()

    def step(self) -> bool:
        """Step the optimizer if this micro-batch completes a step (then the scheduler too); True if it stepped."""
        stepped = self.training.step()
        if stepped:
            if self.scheduler is not None:
                self.scheduler.step()
            self.steps += 1
            self._stepped = True
        return stepped

    def _running_sums(self) -> dict[str, list[float]]:
        """Every average's sums so far over all ranks (collective, the same order on every rank)."""
        names = sorted(self._averages)
        sums = all_reduce_sum([v for name in names for v in (self._averages[name].total, self._averages[name].count)], self.rt)
        return {name: [sums[2 * i], sums[2 * i + 1]] for i, name in enumerate(names)}

    def _save(self, epoch: int, partial: dict[str, list[float]] | None = None) -> Path:
        extra: dict[str, Any] = {"state": self.state}
        if partial:
            extra["partial_epoch"] = partial
        with self.meter.phase("checkpoint"):
            return self.checkpointer.save(step=self.steps, epoch=epoch, model=self.training.model,
                                          optimizer=self.training.optimizer, scheduler=self.scheduler,
                                          loader=self.loader, extra=extra)
