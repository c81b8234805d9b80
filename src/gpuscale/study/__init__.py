"""Scaling studies: run a script on 1, 2, ..., N devices, weak and strong, and say how much faster it got.

    gpuscale study --nproc 1,2 --scaling weak,strong --out runs/study -- examples/dogs_vs_cats.py
    gpuscale report runs/study

A study directory holds:

    study.json              what was asked: the command, the launcher, the cells (written first)
    <cell>/summary.json     each run's summary (gpuscale.Meter), e.g. weak-1x2/ = weak scaling, 1 node x 2 processes
                            (weak-1x2.r2/ is its second run with --repeat; large-weak-1x2/ a --variant's)
    <cell>/timeline.json    each run's utilisation timeline (gpuscale.monitor)
    <cell>/output.log       what the run printed
    results.json            the analysed table (`analysis.analyse`), re-derived by `gpuscale report`
    report.md, report.html, plots/*.png

Modules: `matrix` (the cells and their commands, pure), `runner` (runs cells locally or as SLURM
jobs, resumable), `analysis` (speed-up, efficiency, flags; pure), `predict` (the ring all-reduce
cost model), `report` and `plots` (Markdown, HTML, PNG).

results.json, the contract between analysis and report (version 1):

    {"version": 1, "command": [...], "launcher": "local"|"slurm", "device": "cpu"|"cuda",
     "device_name": str|None, "created": iso time,
     "rows": [ {                      # one per finished cell, sorted by scaling then world size
        "name": "weak-1x2", "variant": ""|"large", "scaling": "weak"|"strong", "nodes": 1, "nproc_per_node": 2, "world_size": 2,
        "run": "weak-1x2.r2",            # the folder of the run shown: the median of --repeat runs
        "repeats": 3, "samples_per_s_runs": [118.0, 123.4, 125.1],
        "global_batch": 64, "per_device_batch": 32, "epochs": 2, "steps": 125, "samples": 4000,
        "samples_per_s": 123.4, "train_time_s": 10.2, "step_time_s": 0.08,
        "time_split_s": {"startup": .., "data_wait": .., "compute": .., "eval": .., "checkpoint": ..},
        "speedup": 1.9, "efficiency": 0.95,  # vs the smallest run of the same scaling
        "metric": "accuracy"|"perplexity"|None, "metric_value": 0.93|None, "final_loss": 0.2|None,
        "predicted_samples_per_s": float|None, "predicted_efficiency": float|None,
        "utilisation": the summary's "utilisation" or None,
        "timeline": "weak-1x2/timeline.json"|None,   # relative to the study directory
        "flags": ["rank 1 (cpu) used 12% of its cores while rank 0 used 95%: ...", ...] } ],
     "baseline": {"weak": "weak-1x1", "strong": "strong-1x1"},
     "prediction": {...} | None}    # predict.Prediction as a dict, when the study made one

Speed-up is throughput (samples/s) over the baseline's for weak scaling (each device keeps its
batch, so the work grows with the devices), and the baseline's time over this run's time for the
same number of epochs for strong scaling (the global batch stays, so the work is fixed).
Efficiency is speed-up / (world size / baseline world size).
"""
