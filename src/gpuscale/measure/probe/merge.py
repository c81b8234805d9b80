"""Merge the ranks' probe records into the summary.json a gpuscale script writes. Pure: records in, dicts out.

Each rank's record (`gpuscale.measure.probe.recorder`) holds its loader passes and optimizer steps with
their times. Per rank:

- **steps** are those of the optimizer that stepped most (a second optimizer, as in a GAN, does
  not double them);
- a **training pass** is a pass over a DataLoader during which an optimizer stepped; any other pass
  is an **evaluation** (validation loops, Lightning's sanity check);
- **training time** runs from the first request of the first training pass to the last optimizer
  step, less the evaluation passes that fall inside it (their whole span: the loop's forward
  passes too); the time after the last step (a final evaluation, saving) counts only in time to
  result;
- **samples** are the training passes' samples; **data wait** the time their batches were waited for.
  A rank that trained on no DataLoader's batches (nanoGPT's `get_batch`) counts the samples its DDP
  model received in training forward passes instead (``"samples_from": "model inputs"``); its
  training starts at the first such forward, and its data wait is not measured (it stays in compute).

Over the ranks, as `gpuscale.Meter` does it: samples add up, training time is the slowest rank's,
throughput is samples over it. Startup is launch to the first training batch; time to result
launch to the last rank's end.

**Exposed communication and imbalance** come from DDP's own timers where the script trains a
``DistributedDataParallel`` model (plain DDP, Accelerate, Lightning's and the Trainer's DDP): each
timed iteration (1-10, then every 100th) is a probe for `gpuscale.measure.stepsplit.split_step`, its sync
wait the time from the backward's last gradient to the end of the all-reduce on that rank. The
smallest sync wait over the ranks is exposed communication, the spread is imbalance (a persistent
part, the slow rank named, and jitter), as with the sync probe's replays; the compute is DDP's forward
and backward compute times the batches per step. A model on CPUs is timed on every iteration, so these
parts are the mean over all steps after DDP's first 10; on GPUs over DDP's sample (``sync_probe.probes``
of ``of_steps``), whose own wall time (``step_breakdown_s.sampled_step``) shows whether it stands for the run.

What the probe cannot see is None and named in ``probe.not_measured``: exposed communication and
imbalance without a DDP model (FSDP, DeepSpeed, a hand-written all-reduce), checkpoint time (it
stays in the training time if the script saves between steps), accuracy and loss.

A run is complete when every rank 0..world-1 left a record that ended normally and the launcher
saw no failure; otherwise ``"complete": false`` and ``probe.why`` says which rank did what.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Any, NamedTuple

from gpuscale._version import __version__
from gpuscale.base.timeline import device_stats, make_timeline
from gpuscale.measure.stepsplit import split_step, time_split

__all__ = ["rank_account", "merge_records", "synchronised", "NOT_MEASURED", "ddp_schedule", "DDP_WARMUP"]

NOT_MEASURED = {
    "exposed_comm": "exposed communication and imbalance: no DDP model timed its all-reduce (the probe reads DDP's own "
                    "timers; FSDP, DeepSpeed and hand-written collectives are not timed)",
    "checkpoint": "checkpoint time: saving between steps stays in the training time",
    "metrics": "accuracy and loss: the script's own numbers, which the probe does not read",
    "data_wait": "data wait: the batches came from no DataLoader (the script's own batching stays in compute)",
}


DDP_WARMUP = 10
"""DDP's first timed iterations, left out of the split where at least 10 timed ones come after them."""


def ddp_schedule(records: list[dict[str, Any]]) -> str:
    """Which iterations DDP timed, in words: every one (a model on CPUs), or its first 10 and one in its rate."""
    rates = {int((r.get("ddp") or {}).get("rate") or 100) for r in records if r.get("ddp")}
    rate = max(rates, default=100)
    if rate == 1:
        return ("DDP's timers on every iteration (the first 10 left out as warm-up where at least 10 came after them, "
                "else the first one)")
    return f"DDP's timed iterations: 1-10, then every {rate}th (the first 10 left out where enough came after them)"


def _overlap(start: float, end: float, low: float, high: float) -> float:
    return max(0.0, min(end, high) - max(start, low))


def rank_account(record: dict[str, Any]) -> dict[str, Any]:
    """One rank's training, from its record: steps, samples, training window, evaluation, data wait."""
    optimizers = sorted(record.get("optimizers") or [], key=lambda o: -o["steps"])
    main = optimizers[0] if optimizers else None
    passes = record.get("passes") or []
    training = [p for p in passes if p["steps"] > 0]
    evaluation = [p for p in passes if p["steps"] == 0]
    inputs = record.get("inputs") if not training else None  # no DataLoader: the model's training forwards count
    account: dict[str, Any] = {
        "rank": record["rank"], "host": record.get("host"), "steps": main["steps"] if main else 0,
        "gradient_bytes": main.get("gradient_bytes") if main else None,
        "batches": sum(p["batches"] for p in training), "epochs": len(training),
        "samples": None if not training or any(p["samples"] is None for p in training) else sum(p["samples"] for p in training),
        "samples_from": "data loader" if training else None,
        "unknown_batch": next((p["unknown_batch"] for p in training if p.get("unknown_batch")), None),
        "data_wait_s": sum(p["wait_s"] for p in training), "start": None, "end": None,
        "train_s": None, "eval_s": 0.0, "steady_step_s": None, "batch_size": None, "probes": [],
    }
    if inputs:
        account.update(batches=inputs["calls"], samples=inputs["samples"], unknown_batch=inputs["unknown_batch"],
                       samples_from="model inputs")
    sizes: Counter[int] = Counter()
    for p in [*training, *([inputs] if inputs else [])]:
        sizes.update({int(k): v for k, v in (p.get("batch_sizes") or {}).items()})
    if sizes:
        account["batch_size"] = sizes.most_common(1)[0][0]
    if main is None:
        return account
    micro_batches = max(1, round(account["batches"] / main["steps"])) if main["steps"] else 1
    account["probes"] = [{"step": d["iteration"], "forward_s": d["forward_s"], "backward_s": d["backward_s"],
                          "synced_backward_s": d["backward_s"] + d["sync_wait_s"], "micro_batches": micro_batches,
                          "step_s": d.get("step_s"), "host_s": d.get("host_s")}
                         for d in (record.get("ddp") or {}).get("samples") or []]
    start = min(p["first_at"] for p in training) if training else (inputs or {}).get("first_at") or main["first_step_at"]
    end = main["last_step_at"]
    eval_s = sum(_overlap(p["first_at"], p["last_at"], start, end) for p in evaluation)
    account.update(start=start, end=end, eval_s=eval_s, train_s=max(end - start - eval_s, 0.0))
    warmup = record.get("warmup_steps") or 0
    if main.get("warm_at") is not None and main["steps"] > warmup:
        steady_eval = sum(_overlap(p["first_at"], p["last_at"], main["warm_at"], end) for p in evaluation)
        account["steady_step_s"] = max(end - main["warm_at"] - steady_eval, 0.0) / (main["steps"] - warmup)
    return account


def _problems(records: dict[int, dict[str, Any]], world_size: int, failure: str | None) -> list[str]:
    problems = [failure] if failure else []
    for rank in range(world_size):
        record = records.get(rank)
        if record is None:
            problems.append(f"rank {rank} left no record")
        elif record.get("ended") == "exception":
            problems.append(f"rank {rank} raised {record.get('error')}")
        elif record.get("ended") == "signal":
            problems.append(f"rank {rank} was ended by {record.get('signal')}")
        elif record.get("ended") is None:
            problems.append(f"rank {rank} ended without writing its last record (killed, or stuck when signalled); "
                            "its counts stop at its last periodic record")
    return problems


def _device(records: list[dict[str, Any]]) -> str | None:
    devices = {str(r.get("device") or "").split(":")[0] for r in records if r.get("device")}
    return devices.pop() if len(devices) == 1 else None


def _utilisation(records: list[dict[str, Any]], zero: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The summary's "utilisation" and the timeline.json document, t counted from `zero` (the training's start)."""
    series = []
    for record in records:
        s = record.get("series")
        if s:
            series.append({**s, "t": [round(t - zero, 3) for t in s["t"]]})
    if not series:
        return None, None
    stats = [device_stats(s) for s in series]
    sources = sorted({s["source"] for s in stats if s["source"]})
    interval = 0.5
    starts = [r["series"]["t"][0] for r in records if r.get("series") and r["series"]["t"]]
    utilisation = {"source": ",".join(sources) or None, "interval_s": interval, "devices": sorted(stats, key=lambda s: s["rank"])}
    return utilisation, make_timeline(series, interval, min(starts) if starts else None)


class _Totals(NamedTuple):
    """The ranks' training added up as `gpuscale.Meter` does: the first rank's steps, all ranks' samples, the slowest rank's time."""

    lead: dict[str, Any] | None  # the first rank's account
    steps: int
    samples: int | None  # None when some rank's samples could not be counted
    train_s: float | None  # the slowest rank's training time, evaluation left out
    window_s: float | None  # the longest span from a rank's first training batch to its last step
    starts: list[float]  # the ranks' training starts

    @property
    def step_time(self) -> float | None:
        return self.train_s / self.steps if self.train_s and self.steps else None

    @property
    def throughput(self) -> float | None:
        return self.samples / self.train_s if self.samples and self.train_s else None


def _totals(accounts: list[dict[str, Any]]) -> _Totals:
    lead = accounts[0] if accounts else None
    samples_known = bool(accounts) and all(a["samples"] is not None for a in accounts)
    trained = [a for a in accounts if a["train_s"] is not None]
    return _Totals(lead=lead, steps=lead["steps"] if lead else 0,
                   samples=sum(a["samples"] for a in accounts) if samples_known else None,
                   train_s=max((a["train_s"] for a in trained), default=None),
                   window_s=max((a["end"] - a["start"] for a in trained), default=None),
                   starts=[a["start"] for a in trained])


def _world_size_seen(records: list[dict[str, Any]]) -> int:
    """The largest world size the records name (their process group's, else their WORLD_SIZE), else 1."""
    return max([(r.get("world") or {}).get("world_size") or int((r.get("env") or {}).get("WORLD_SIZE") or 1) for r in records] or [1])


def _counting_problems(accounts: list[dict[str, Any]], totals: _Totals) -> list[str]:
    """Why the steps or samples of the run cannot be counted (none when they can)."""
    if totals.steps == 0:
        return ["no optimizer step was taken (the probe counts torch.optim steps)"]
    if totals.samples is None:
        kind = next((a["unknown_batch"] for a in accounts if a["unknown_batch"]), None)
        return [f"the probe cannot count the samples of a batch of type {kind}" if kind
                else "no training batch came from a torch DataLoader and no DistributedDataParallel model trained on "
                     "one, so the probe cannot count samples (a study of the script can: give `gpuscale study` the "
                     "batch with --global-batch or --per-device-batch, the script's batch option as {per_device_batch})"]
    return []


def _clock(records: list[dict[str, Any]], starts: list[float]) -> tuple[float, float, float | None]:
    """The run's zero (the first training start, else the launch), its startup and its time to result."""
    launched = min((float(t) for r in records if (t := r.get("launched_at") or r.get("loaded_at")) is not None), default=None)
    zero = min(starts) if starts else launched or 0.0
    startup = max(0.0, zero - launched) if launched is not None else 0.0
    ended = max((r.get("written_at") or 0.0 for r in records), default=None)
    return zero, startup, ended - launched if ended and launched else None


def _step_split(totals: _Totals, accounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The step's split (data wait, compute, exposed communication, imbalance) from the ranks' DDP timers: the mean
    over their timed iterations after DDP's first 10 (every iteration on CPUs), as the run lost it on average."""
    split = split_step(totals.step_time, totals.steps, [{"rank": a["rank"], "data_wait_s": a["data_wait_s"], "probes": a["probes"]}
                                                        for a in accounts], NOT_MEASURED["exposed_comm"],
                       average="mean", warmup=DDP_WARMUP, slowed_backward=True)
    if split["status"] != "measured" and any(a["probes"] for a in accounts):
        split["why"] = "the ranks' DDP timers have no timed iteration in common"
    return split


def _setup(records: list[dict[str, Any]], world: int, scaling: str | None, totals: _Totals) -> dict[str, Any]:
    """The summary's part on what ran where: world, hosts, launcher, backend, device, batch sizes."""
    lead, steps = totals.lead, totals.steps
    batch = lead["batch_size"] if lead else None
    accumulation = max(1, round(lead["batches"] / steps)) if lead and steps else 1
    world_info = next((r["world"] for r in records if r.get("world")), None) or {}
    return {
        "world_size": world,
        "num_nodes": len({r.get("host") for r in records}) or None,
        "hosts": sorted({str(r.get("host")) for r in records}),
        "launcher": next((r.get("launcher") for r in records if r.get("launcher")), None),
        "backend": world_info.get("backend"),
        "device": _device(records),
        "device_name": next((r.get("device_name") for r in records if r.get("device_name")), None),
        "strategy": None,
        "scaling": scaling,
        "global_batch": batch * accumulation * world if batch else None,
        "per_device_batch": batch,
        "grad_accum_steps": accumulation,
    }


def _results(records: list[dict[str, Any]], accounts: list[dict[str, Any]], totals: _Totals,
             time_to_result: float | None) -> dict[str, Any]:
    """The summary's part on what the training did: steps, samples, times, throughput, memory."""
    lead = totals.lead
    return {
        "steps": totals.steps,
        "epochs": lead["epochs"] if lead else 0,
        "samples": totals.samples,
        "samples_from": _samples_from(accounts) if totals.samples is not None else None,
        "train_time_s": totals.window_s,
        "time_to_result_s": time_to_result,
        "samples_per_s": totals.throughput,
        "step_time_s": totals.step_time,
        "steady_step_time_s": max((a["steady_step_s"] for a in accounts if a["steady_step_s"] is not None), default=None),
        "warmup_steps": records[0].get("warmup_steps") if records else None,
        "gradient_bytes": lead["gradient_bytes"] if lead else None,
        "final_loss": None,
        "peak_memory_bytes": max((int(r.get("peak_memory_bytes") or 0) for r in records), default=None),
    }


def _samples_from(accounts: list[dict[str, Any]]) -> str:
    """What counted the samples: "data loader" (its batches), "model inputs" (the DDP model's training forwards), "study batch"."""
    return " and ".join(sorted({a["samples_from"] for a in accounts if a["samples_from"]}))


def _time_split(startup: float, totals: _Totals, split: dict[str, Any], accounts: list[dict[str, Any]], schedule: str,
                time_to_result: float | None) -> dict[str, Any]:
    """The summary's part on where the time went: the run's phases (adding up to its time to result), the step's split,
    DDP's timers as sync probes."""
    eval_s = sum(a["eval_s"] for a in accounts) / max(len(accounts), 1)
    phases = time_split(startup, totals.train_s or 0.0, totals.steps, split, eval_s, None, 0.0, time_to_result)  # type: ignore[arg-type]
    return {
        "time_split_s": phases,
        "step_breakdown_s": split["per_step_s"],
        "sync_probe": {"status": split["status"], "why": split["why"], "probes": split["probes"],
                       "of_steps": split["of_steps"], "slow_rank": split["slow_rank"],
                       "schedule": schedule, "reference_rank": split["reference_rank"], "source": "ddp_timers"},
        "ranks": split["ranks"],
    }


def _probe_part(problems: list[str], split: dict[str, Any], accounts: list[dict[str, Any]],
                by_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The summary's "probe": whether the run is complete and why not, what was not measured, each rank's account."""
    no_loader = any(a["samples_from"] in ("model inputs", "study batch") for a in accounts)
    alone = len(accounts) == 1  # one rank: no communication, no imbalance to miss
    not_measured = [text for key, text in NOT_MEASURED.items()
                    if (key != "exposed_comm" or (split["status"] != "measured" and not alone)) and (key != "data_wait" or no_loader)]
    return {"complete": not problems, "why": "; ".join(problems) or None, "not_measured": not_measured,
            "synchronised": synchronised(list(by_rank.values())),
            "libraries": sorted({name for r in by_rank.values() for name in r.get("libraries") or []}),
            "ranks": [{k: a[k] for k in ("rank", "host", "steps", "samples", "train_s", "eval_s", "data_wait_s")}
                      | {k: by_rank[a["rank"]].get(k) for k in ("ended", "error", "signal")} for a in accounts]}


def synchronised(records: list[dict[str, Any]]) -> bool | None:
    """Whether the ranks trained one model together: True where every rank made a DDP model; False where no rank
    made one and none joined a process group of more than one rank that can communicate (independent copies, as a
    Trainer or Accelerate script on CPUs not told to distribute trains: Accelerate 1.15 there joins a group of the
    launcher's world with no backend, "undefined", and trains alone); None where the records cannot tell (one
    rank, FSDP, DeepSpeed, a script's own all-reduces, records without the world)."""
    if len(records) < 2 or any("world" not in r for r in records):
        return None
    if all((r.get("ddp") or {}).get("parameters") for r in records):
        return True
    if any(r.get("ddp") for r in records) or any(_communicating_world(r) for r in records):
        return None
    return False


def _communicating_world(record: dict[str, Any]) -> bool:
    """Whether a rank joined a process group of more than one rank with a backend to communicate through."""
    world = record.get("world") or {}
    return int(world.get("world_size") or 1) > 1 and world.get("backend") != "undefined"


def merge_records(records: list[dict[str, Any]], *, world_size: int | None = None, scaling: str | None = None,
                  failure: str | None = None, step_samples: int | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The summary (Meter's format, ``"measured_by": "probe"``) and the timeline of one run from its ranks' records.

    world_size: how many ranks the launcher started (else what the records say); scaling: the study
    cell's ('weak'/'strong'), None outside a study; failure: the launcher's word on a failed run;
    step_samples: the study's batch per optimizer step over all ranks (its --global-batch or
    --per-device-batch, carried into the script's arguments), used only where the ranks counted no samples.
    """
    by_rank = {r["rank"]: r for r in records}
    world = world_size or _world_size_seen(records)
    accounts = [rank_account(by_rank[rank]) for rank in sorted(by_rank)]
    totals = _totals(accounts)
    if totals.samples is None and step_samples and totals.steps and not any(a["unknown_batch"] for a in accounts):
        totals = totals._replace(samples=totals.steps * step_samples)
        for account in accounts:
            account["samples_from"] = "study batch"
    problems = _problems(by_rank, world, failure) + _counting_problems(accounts, totals)
    zero, startup, time_to_result = _clock(records, totals.starts)
    split = _step_split(totals, accounts)
    utilisation, timeline = _utilisation(records, zero)
    summary: dict[str, Any] = {
        "measured_by": "probe",
        "complete": not problems,
        **_setup(records, world, scaling, totals),
        **_results(records, accounts, totals, time_to_result),
        **_time_split(startup, totals, split, accounts, ddp_schedule(records), time_to_result),
        "probe": _probe_part(problems, split, accounts, by_rank),
        "placements": None,
        "torch_version": next((r.get("torch_version") for r in records), None),
        "gpuscale_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "utilisation": utilisation,
    }
    if summary["samples_from"] == "study batch":
        summary["global_batch"] = step_samples
    return summary, timeline
