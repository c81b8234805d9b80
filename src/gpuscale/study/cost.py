"""What scaling costs: device-hours and energy per unit of work, against the baseline's. Pure.

For each run of a study (a row of results.json):

    device_hours_per_m_samples   devices x the time to train a million samples at the run's training throughput,
                                 in hours (evaluation, checkpoints and start-up not included)
    device_hours_per_epoch       devices x the run's time to result per epoch, in hours (all of it: what a job
                                 holding the devices is charged)
    cost_ratio                   device-hours per sample over the baseline's: 1 / efficiency. "1.61x faster for
                                 1.24x the device-hours per sample"
    billed_per_m_samples         on a cluster whose profile has a billing rule (`gpuscale.slurm.billing`): the units the
                                 run's job is billed per hour x hours to train a million samples ("billing" names the
                                 unit, rule and source)
    billed_per_epoch             ... x its time to result per epoch: SLURM bills the job's elapsed time, start-up included
    joules_per_sample            the devices' mean power while training (summed over ranks) / throughput, where
                                 power was sampled (NVML, amdsmi, rocm-smi; `energy_source` names it); None on CPUs

A device is what the study scales over: a GPU (a GCD on LUMI-G), or a process with its own cores on a CPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_cost"]


def _energy(row: dict[str, Any]) -> tuple[float | None, str | None]:
    devices = (row.get("utilisation") or {}).get("devices") or []
    powered = [d for d in devices if d.get("power_mean_w") is not None]
    if not powered or len(powered) != len(devices) or not row.get("samples_per_s"):
        return None, None
    watts = sum(float(d["power_mean_w"]) for d in powered)
    return watts / row["samples_per_s"], str(powered[0].get("source") or "") or None


def add_cost(row: dict[str, Any], base: dict[str, Any] | None) -> None:
    """Fill in `row`'s cost fields (in place); the ratio only against a baseline (`base`, None: no baseline)."""
    sps, world = row.get("samples_per_s"), row["world_size"]
    row["device_hours_per_m_samples"] = world * 1e6 / sps / 3600 if sps else None
    ttr, epochs = row.get("time_to_result_s"), row.get("epochs") or 1
    row["device_hours_per_epoch"] = world * ttr / max(epochs, 1) / 3600 if ttr else None
    mine, theirs = row["device_hours_per_m_samples"], base and base.get("device_hours_per_m_samples")
    row["cost_ratio"] = mine / theirs if mine and theirs and row.get("speedup") is not None else None
    row["joules_per_sample"], row["energy_source"] = _energy(row)
    rate = (row.get("billing") or {}).get("per_hour")
    row["billed_per_m_samples"] = rate * 1e6 / sps / 3600 if rate is not None and sps else None
    row["billed_per_epoch"] = rate * ttr / max(epochs, 1) / 3600 if rate is not None and ttr else None
