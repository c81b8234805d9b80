"""What the prediction needs from a single-device run: its step (compute and data wait), batch and gradient bytes.

`Baseline.from_summary` reads it from a run's summary.json and refuses, in one line, one that cannot be a baseline
(a damaged file, a run of several devices, an older gpuscale's). `gpuscale.study.predict` projects it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Baseline", "check_step_time", "MIN_STEP_S", "MAX_STEP_S", "MAX_COUNT", "SHARDED_TRAFFIC"]

SHARDED_TRAFFIC = 1.5
"""FSDP and ZeRO-3 gather parameters and reduce-scatter gradients: about 1.5x DDP's bytes."""
MIN_STEP_S, MAX_STEP_S = 1e-9, 1e7
"""A step time outside these bounds (a nanosecond, about four months) is no measurement: a damaged file or a typo."""
MAX_COUNT = 2**40
"""Largest batch or number of micro-batches a summary may hold (a damaged file holds anything)."""


def check_step_time(seconds: Any) -> None:
    """ValueError unless `seconds` (``--step-time``) is a plausible step time (MIN_STEP_S to MAX_STEP_S)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not MIN_STEP_S <= seconds <= MAX_STEP_S:
        raise ValueError(f"--step-time {seconds!r} is not the seconds of one optimizer step: give a number from {MIN_STEP_S:g} "
                         f"to {MAX_STEP_S:g}, e.g. 0.0127 for 12.7 ms")


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """What the model needs from a single-device run's summary, and what the run was."""

    step_time_s: float
    """Seconds per optimizer step of one device at `per_device_batch` (training time without evaluation
    and checkpoints, over steps): the run's, or one target device's given instead (`with_step_time`)."""
    per_device_batch: int
    """Samples per device in one micro-batch."""
    grad_accum_steps: int
    gradient_bytes: int
    sharded: bool = False
    run: str | None = None
    """The run the figures come from (its directory as the user named it, or the study's cell)."""
    device: str | None = None
    """The run's device kind: "cpu" or "cuda" (NVIDIA and AMD GPUs alike); None where the summary does not say."""
    device_name: str | None = None
    """The run's device as torch names it ("NVIDIA H100 80GB HBM3", "AMD Instinct MI250X", "cpu")."""
    step_time_source: str = "given"
    """Where `step_time_s` comes from: "measured: RUN" (the run's own) or "--step-time" (the target's, given)."""
    measured_step_time_s: float | None = None
    """The run's own step time, kept when `step_time_s` is given instead."""
    data_wait_s: float = 0.0
    """Seconds of `step_time_s` the run waited for its loader (the summary's step_breakdown_s.data_wait): part of
    the step, but no compute that communication could hide behind. 0 for a step time given for a target."""

    @property
    def compute_time_s(self) -> float:
        """The step's compute at `per_device_batch`: its time less the data wait."""
        return self.step_time_s - self.data_wait_s

    @property
    def traffic_bytes(self) -> float:
        """Bytes one step synchronises: the gradients, 1.5x for FSDP and ZeRO-3 (parameters gathered too)."""
        return self.gradient_bytes * (SHARDED_TRAFFIC if self.sharded else 1.0)

    @property
    def step_time_given(self) -> bool:
        """True when the step time is the target's, given by the user, not the run's."""
        return self.step_time_source == "--step-time"

    @classmethod
    def from_summary(cls, summary: dict[str, Any], run: str | None = None) -> Baseline:
        """The baseline of the run `run` from its summary.json; ValueError, in one line, if it cannot be one."""
        if not isinstance(summary, dict):
            raise ValueError("the summary is not a JSON object; give the summary.json a gpuscale run wrote")
        if summary.get("world_size") != 1:
            raise ValueError(f"the prediction starts from a single-device run, but this summary is of {summary.get('world_size')} "
                             "devices; run the study with --nproc 1 in it (or predict from a 1-process summary.json)")
        missing = [k for k in ("step_time_s", "gradient_bytes", "per_device_batch", "global_batch") if not summary.get(k)]
        if missing:
            raise ValueError(f"the summary has no {missing[0]}: it was written by an older gpuscale, or the script built its "
                             "model without gpuscale.setup/wrap; run it again with this version")
        for key in ("step_time_s", "gradient_bytes", "per_device_batch", "global_batch", "grad_accum_steps"):
            value = summary.get(key, 1)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf):
                raise ValueError(f"the summary's {key} is {value!r}, not a positive number: the file is damaged; run it again")
        for key in ("per_device_batch", "global_batch", "grad_accum_steps"):
            value = summary.get(key) or 1
            if value > MAX_COUNT or value != int(value):
                raise ValueError(f"the summary's {key} is {value!r}, not a whole number from 1 to {MAX_COUNT}: "
                                 "the file is damaged; run it again")
        if summary["gradient_bytes"] > 2**60:
            raise ValueError(f"the summary's gradient_bytes is {summary['gradient_bytes']!r}, more than an exabyte: "
                             "the file is damaged; run it again")
        if not MIN_STEP_S <= summary["step_time_s"] <= MAX_STEP_S:
            raise ValueError(f"the summary's step_time_s is {summary['step_time_s']!r}, not a step time from {MIN_STEP_S:g} "
                             f"to {MAX_STEP_S:g} s: the file is damaged; run it again")
        for key in ("device", "device_name"):
            if summary.get(key) is not None and not isinstance(summary[key], str):
                raise ValueError(f"the summary's {key} is {summary[key]!r}, not text: the file is damaged; run it again")
        return cls(step_time_s=float(summary["step_time_s"]), per_device_batch=int(summary["per_device_batch"]),
                   grad_accum_steps=int(summary.get("grad_accum_steps") or 1), gradient_bytes=summary["gradient_bytes"],
                   sharded=_gathers_parameters(summary), run=run, device=summary.get("device"),
                   device_name=summary.get("device_name"), step_time_source=f"measured: {run}" if run else "measured",
                   measured_step_time_s=float(summary["step_time_s"]), data_wait_s=_data_wait(summary))

    def with_step_time(self, seconds: float) -> Baseline:
        """This baseline with the step time of one target device at the run's per-device batch instead of the run's."""
        check_step_time(seconds)
        return replace(self, step_time_s=float(seconds), step_time_source="--step-time", data_wait_s=0.0)

    def describe(self) -> dict[str, Any]:
        """What the prediction projects, as `Prediction.baseline` carries it."""
        return {"run": self.run, "device": self.device, "device_name": self.device_name,
                "per_device_batch": self.per_device_batch, "grad_accum_steps": self.grad_accum_steps,
                "step_time_s": self.step_time_s, "step_time_source": self.step_time_source,
                "measured_step_time_s": self.measured_step_time_s}


def _data_wait(summary: dict[str, Any]) -> float:
    """The run's data wait per step (step_breakdown_s.data_wait), within [0, half the step]: a summary without
    one waited for nothing the model can tell; one that waited longer than it computed is capped, so that the
    compute left to hide communication is never a sliver the timers' noise decides."""
    wait = (summary.get("step_breakdown_s") or {}).get("data_wait")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 < wait < math.inf:
        return 0.0
    return min(float(wait), 0.5 * float(summary["step_time_s"]))


def _gathers_parameters(summary: dict[str, Any]) -> bool:
    """Whether the run's strategy gathers sharded parameters every step (FSDP, ZeRO-3): its summary says so;
    summaries written before it did are judged by the strategy's name (fsdp only, as then)."""
    said = summary.get("gathers_parameters")
    return bool(said) if said is not None else summary.get("strategy") == "fsdp"
