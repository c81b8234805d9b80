"""Scaling studies: run a script on 1, 2, ..., N devices, weak and strong, and say how much faster it got.

    gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py
    gpuscale report runs/study

From Python (a notebook), the same study:

    from gpuscale.study import StudySpec, run_study
    result = run_study(StudySpec(command=("train.py", "--batch-size", "{per_device_batch}"),
                                 out="runs/ddp", nproc=(1, 2), global_batch=64))
    print(result.table)              # result.results is results.json; analyse(out) and write_report(results, out) redo the report

A study directory holds:

    study.json              what was asked: the command, the launcher, the cells, when it was started (written first)
    <cell>/summary.json     each run's summary (gpuscale.Meter), e.g. weak-1x2/ = weak scaling, 1 node x 2 processes
                            (weak-1x2.r2/ is its second run with --repeat; large-weak-1x2/ a --variant's)
    <cell>/timeline.json    each run's utilisation timeline (gpuscale.measure.monitor)
    <cell>/output.log       what the run printed
    results.json            the analysed table (`analysis.analyse`), re-derived by `gpuscale report`
    report.md, report.html, plots/*.png

Modules: `spec` (StudySpec, run_study), `matrix` (the cells, pure), `command` (the script's
arguments in each cell: templates, exact batches; pure), `runner` (runs cells locally or as SLURM
jobs, resumable), `experiments` (is each run the experiment planned; pure), `analysis` (speed-up,
efficiency, flags; pure), `predict` (the ring all-reduce
cost model), `report` and `plots` (Markdown, HTML, PNG).

results.json, the contract between analysis and report (version 2):

    {"version": 2, "command": [...], "launcher": "local"|"slurm", "device": "cpu"|"cuda",
     "device_name": str|None, "created": iso time,   # when the study was started (study.json's); kept by every report
     "report_written": iso time,      # when these results were derived: the study's end, or the last `gpuscale report`
     "rows": [ {                      # one per finished cell, sorted by scaling then world size
        "name": "weak-1x2", "variant": ""|"large", "scaling": "weak"|"strong", "nodes": 1, "nproc_per_node": 2, "world_size": 2,
        "run": "weak-1x2.r2",            # the folder of the run shown: the median of --repeat runs
        "repeats": 3, "samples_per_s_runs": [118.0, 123.4, 125.1],
        "device": "cpu", "strategy": "ddp", "global_batch": 64, "per_device_batch": 32, "grad_accum_steps": 1,
        "epochs": 2, "steps": 125, "samples": 4000,
        "samples_per_s": 123.4,          # training throughput: the basis of speed-up and efficiency
        "ideal_samples_per_s": 130.0,    # the baseline's samples/s per device x devices
        "speedup": 1.9, "efficiency": 0.95,     # throughput / the baseline's, / ideal (both scalings)
        "efficiency_runs": [0.91, 0.95, 0.96],  # each repeated run's throughput / ideal (the baseline's median)
        "train_time_s": 10.2,            # the training loop's whole span, evaluation and checkpoints inside included
        "time_to_result_s": 14.0, "time_speedup": 1.6,   # the whole run, same epochs
        "step_time_s": 0.08, "time_split_s": {"startup": .., "data_wait": .., "compute": .., "exposed_comm": ..|None,
                                              "imbalance": ..|None, "eval": .., "checkpoint": .., "probe": ..,
                                              "after_training": ..},  # the phases add up to time_to_result_s
        "step_breakdown_s": {"step", "data_wait", "compute", "exposed_comm", "imbalance", "other"},  # per step
        "sync_probe": {"status": "measured"|"not measured", "why": str|None, "probes": 11, ...},
        "loss_breakdown": {"data": .03, "exposed_comm": .12, "imbalance": .01, "compute": .06, "rest": .02},
                                         # fractions of ideal throughput; they sum to 1 - efficiency
        "noise": 0.05,                   # the comparison's: the spread of the run's or its baseline's repeats, >= 3%
        "part_noise": {"data": .05, "exposed_comm": .03, ...},   # each part's: the noise (within-run parts: 3%), or
                                         # how far the part ranged over the repeats, the larger
        "step_breakdown_s_runs": [{...}|None, ...],   # each repeated run's step_breakdown_s, in samples_per_s_runs' order
        "metric": "accuracy"|"perplexity"|None, "metric_value": 0.93|None, "final_loss": 0.2|None,
        "lr": {"rule": "linear", "factor": 2.0, ...}|None, "per_epoch": [{"epoch": 1, "phase": .., "val_accuracy": ..}]|None,
        "predicted_samples_per_s": float|None, "predicted_efficiency": float|None,
        "predicted_breakdown": {"exposed_comm": .15, "compute": 0.0, "data": None, ...}|None,
        "utilisation": the summary's "utilisation" or None,
        "other_load": 0.02|None,         # how busy the cores were just before the run (0..1; local runs)
        "other_load_during": {"others": 0.31, "steal": {"0": 0.30, ...}, "seconds": 12.0}|None,   # what else took the
                                         # cores' time while it ran (its own processes' CPU time left out); steal per core
        "timeline": "weak-1x2/timeline.json"|None,   # relative to the study directory
        "samples_from": "data loader"|"model inputs"|"study batch"|None,   # what counted the probe's samples
        "planned_per_device_batch": 32|None,   # what the batch template planned (None: no template)
        "synchronised": True|False|None,       # the probe's view: one model (DDP), independent copies, or cannot tell
        "flags": ["waited for data 31% of its training time ...", ...] } ],
     "baseline": {"weak": "weak-1x1", "strong": "strong-1x1"},
     "missing_baseline": {"weak": "weak-1x1"},   # a planned baseline that did not finish: no speed-ups for that scaling
     "notes": ["The script ignored the batch the study planned: ...", ...],   # `experiments.check_experiments`'s findings
     "prediction": {...} | None}    # predict.Prediction as a dict, when the study made one; `analyse` keeps it

One basis for both scalings: speed-up is training throughput (samples/s of optimizer steps, data
waits included) over the baseline's (the smallest run of the same scaling), efficiency is
throughput over ideal (the baseline's throughput per device x devices), the same quantity the
prediction models. Weak scaling keeps each device's batch, strong scaling the global batch; time
to result (the whole run) is a second, separately labelled column. `analysis` has the breakdown
of lost efficiency, `gpuscale.measure.stepsplit` and `gpuscale.measure.syncprobe` how its parts are measured.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Where each public name lives, imported on first use (PEP 562): `gpuscale report` and `predict` import
# one module of this package without the rest (plots import matplotlib, runs import torch).
_HOMES = {"analyse": "gpuscale.study.analysis", "write_report": "gpuscale.study.report",
          "StudyResult": "gpuscale.study.spec", "StudySpec": "gpuscale.study.spec", "run_study": "gpuscale.study.spec",
          "ClusterOptions": "gpuscale.slurm.cluster"}

if TYPE_CHECKING:
    from gpuscale.slurm.cluster import ClusterOptions
    from gpuscale.study.analysis import analyse
    from gpuscale.study.report import write_report
    from gpuscale.study.spec import StudyResult, StudySpec, run_study


def __getattr__(name: str) -> Any:
    """`gpuscale.study.StudySpec`, ...: the public name, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gpuscale.study' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = ["StudySpec", "StudyResult", "run_study", "analyse", "write_report", "ClusterOptions"]
