"""A scaling study as a library call: `StudySpec` -> `run_study` -> `StudyResult`.

    from gpuscale.study import StudySpec, run_study

    spec = StudySpec(command=("train.py", "--batch-size", "{per_device_batch}"), out="runs/study",
                     nproc=(1, 2), global_batch=64)
    result = run_study(spec)
    print(result.table)                 # the table `gpuscale study` prints; result.results is results.json

`gpuscale study` is a thin parser over this. A spec is frozen and checked when it is made (a bad
value raises ValueError with the fix); running it runs every unfinished cell (`runner`), merges
what the probe measured in cells of scripts without gpuscale.Meter, analyses (`analysis.analyse`),
predicts (`predict`), and writes results.json, report.md, report.html and plots/ (`report.write_report`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write_json
from gpuscale.detect.topology import allowed_cores
from gpuscale.runtime.pinning import node_gpu_count
from gpuscale.slurm.cluster import ClusterOptions, cluster_job, load_cluster_profile
from gpuscale.study import analysis, calibrate, linkmeasure, matrix, predict, runner
from gpuscale.study.answer import TARGET_EFFICIENCY, check_target
from gpuscale.study.command import StudyCommand, baseline_world_size, check_batch_reaches_script, check_no_cell_options
from gpuscale.study.linkmeasure import MeasureError
from gpuscale.study.report import format_table, write_report

__all__ = ["StudySpec", "StudyResult", "run_study", "LAUNCHERS"]

LAUNCHERS = ("local", "slurm")


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """What to study: a script, the cells (devices x scalings x variants x repeats), the batch, where to run."""

    command: tuple[str, ...]
    """The script and its arguments; templates such as {per_device_batch} are filled per cell (`command`)."""
    out: Path
    """The study directory (created; a rerun skips finished cells)."""
    nproc: tuple[int, ...] | None = None
    """Processes per node to try; None: 1, 2, 4, ... up to the node's GPUs (or cores; the profile's GPUs on SLURM)."""
    nodes: tuple[int, ...] = (1,)
    """Node counts to try (more than 1 needs launcher 'slurm')."""
    scalings: tuple[str, ...] = ("weak", "strong")
    variants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Named variants of the command: (name, arguments added), each with its own baseline."""
    repeat: int = 1
    """Runs of every cell, in rounds; the table shows the median."""
    global_batch: int | None = None
    per_device_batch: int | None = None
    max_device_batch: int | None = None
    launcher: str = "local"
    """'local' (this node, `gpuscale run`) or 'slurm' (a job per cell, from `cluster`)."""
    cluster: ClusterOptions | None = None
    """The cluster side of the SLURM jobs (profile, account, time, ...); needed with launcher 'slurm'."""
    overlap: float | None = None
    """Share of compute that hides communication, for the prediction (default 0 on CPU, 0.5 on GPUs)."""
    predict: bool = True
    """Predict each cell with the ring all-reduce model beside the measurement."""
    cell_timeout_s: float | None = None
    """Give up on a cell after this long."""
    target_efficiency: float = TARGET_EFFICIENCY
    """The efficiency a run must keep to be recommended (the answer above the table)."""
    script_source: str | None = field(default=None, repr=False)
    """The script's source (default: read from command[0]); decides whether gpuscale's options are appended."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "out", Path(self.out))
        if not self.command:
            raise ValueError("no training script given; put it after --, e.g. `-- examples/dogs_vs_cats.py --epochs 2`")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.launcher == "slurm" and self.cluster is None:
            raise ValueError("--launcher slurm needs --profile (see `gpuscale profiles`)")
        if self.launcher == "local" and max(self.nodes) > 1:
            raise ValueError(f"--nodes {','.join(map(str, self.nodes))} needs --launcher slurm: the local launcher runs on this node only")
        predict.check_overlap(self.overlap)
        check_target(self.target_efficiency)
        if self.cell_timeout_s is not None and not 0 < self.cell_timeout_s < math.inf:
            raise ValueError(f"--cell-timeout {self.cell_timeout_s} must be a positive number of seconds")
        if self.script_source is None:
            try:
                source = Path(self.command[0]).read_text(errors="replace")
            except FileNotFoundError:
                raise ValueError(f"script {self.command[0]!r} does not exist; give the path of a Python file") from None
            except IsADirectoryError:
                raise ValueError(f"script {self.command[0]!r} is a folder; give the path of a Python file in it") from None
            object.__setattr__(self, "script_source", source)
        study_command = self.study_command  # checks templates and batch options
        given = [f"{flag} {value}" for flag, value in (("--global-batch", self.global_batch), ("--per-device-batch", self.per_device_batch),
                                                       ("--max-device-batch", self.max_device_batch)) if value is not None]
        if given:
            check_batch_reaches_script(self.command, self.variants, given[0])
        for _, extra in self.variants:
            if study_command.appends_cell_options:
                check_no_cell_options(extra)
            StudyCommand(argv=(self.command[0], *extra), appends_cell_options=False, global_batch=self.global_batch,
                         per_device_batch=self.per_device_batch, max_device_batch=self.max_device_batch)

    @property
    def study_command(self) -> StudyCommand:
        return StudyCommand.for_script(self.command, self.script_source or "", global_batch=self.global_batch,
                                       per_device_batch=self.per_device_batch, max_device_batch=self.max_device_batch)


@dataclass
class StudyResult:
    """What a study gave: the analysed results (results.json's content), each cell's outcome, the report's files."""

    results: dict[str, Any]
    outcomes: list[runner.Outcome]
    report: dict[str, Path] = field(default_factory=dict)
    table: str = ""
    """The table as `gpuscale study` prints it ('' when no cell finished)."""

    @property
    def failed(self) -> list[str]:
        """Names of the cells that failed (run the same study again after fixing the cause: finished cells are kept)."""
        return [o.cell.name for o in self.outcomes if o.status == "failed"]


def _node_devices() -> tuple[int, list[int]]:
    """This node's GPUs as torch counts them (torch not imported where `no_gpu_here`), and the cores this process may
    use."""
    return node_gpu_count(os.environ), allowed_cores()


def _prediction(spec: StudySpec, shapes: list[matrix.Cell], summaries: dict[str, dict[str, Any]], nproc: int,
                devices: tuple[int, list[int]], unit: str) -> dict[str, Any] | None:
    """The study's prediction from its single-device runs and the link (the profile's, or measured here), with the
    overlap given (--overlap), else calibrated on its measured runs (`_calibrated`)."""
    num_gpus, cores = devices
    overlap = spec.overlap if spec.overlap is not None else (0.5 if unit == "GPU" else 0.0)
    link = _link(spec, num_gpus, cores, nproc)
    per_node = load_cluster_profile(spec.cluster).gpus_per_node if spec.launcher == "slurm" and spec.cluster else NEXT_NODE_DEVICES
    largest = max(per_node, max(c.nproc_per_node for c in shapes))
    prediction = predict.predict_study(shapes, summaries, link, overlap, largest)
    if prediction is None or spec.overlap is not None:
        return prediction
    return _calibrated(prediction, spec, lambda o, lk: predict.predict_study(shapes, summaries, lk, o, largest), link, unit)


def _calibrated(prediction: dict[str, Any], spec: StudySpec, predict_with: Callable[[float, predict.Link], dict[str, Any] | None],
                link: predict.Link, unit: str) -> dict[str, Any]:
    """The prediction made again with the overlap its measured runs show (`gpuscale.study.calibrate`), a link measured
    here first scaled to fit them where its all-reduce outlasts them (`calibrate.link_fit`; a profile's figures are
    kept as given); as it was, with its default's source, where no run measured its exposed communication."""
    rows = analysis.analyse(spec.out, prediction, spec.target_efficiency)["rows"]
    found = calibrate.calibration(prediction, rows)
    if found is None:
        default = "GPUs: NCCL runs beside the backward" if unit == "GPU" else "CPUs: gloo's threads share the cores the backward uses"
        return {**prediction, "overlap_source": f"the default for {default}; no run measured its exposed communication"}
    factor = calibrate.link_fit(prediction, rows) if link.measured else None  # a profile's figures are the user's word
    if factor is not None:
        link = link.scaled(factor, f"its all-reduce times x {factor:.2f} to fit the study's measured runs, which "
                                   "could not hold them as measured (measured in a busy minute?)")
        prediction = predict_with(prediction["overlap"], link) or prediction
        found = calibrate.calibration(prediction, rows) or found
    overlap, source = found
    return {**(predict_with(overlap, link) or prediction), "overlap_source": source}


def _link(spec: StudySpec, num_gpus: int, cores: list[int], max_nproc: int) -> predict.Link:
    """The interconnect figures: the profile's on SLURM, else measured here once (cached in the study)."""
    if spec.cluster is not None and spec.launcher == "slurm":
        return predict.Link.from_profile(load_cluster_profile(spec.cluster))
    path = spec.out / "link.json"
    if path.is_file():
        return predict.Link.from_measurement(json.loads(path.read_text()))
    nproc = 2 if not num_gpus else min(2, num_gpus)
    # on CPU the benchmark's processes get the cores a 2-process cell gets
    bound = None if num_gpus else matrix.cpu_cores_for(matrix.Cell("weak", 1, nproc), max_nproc, cores)
    return predict.Link.from_measurement(linkmeasure.measure_local(path, nproc, bound))


def plan_cells(spec: StudySpec, device_count: int) -> list[matrix.Cell]:
    """The study's cells, their batches checked (ValueError before anything runs)."""
    nproc = list(spec.nproc) if spec.nproc else matrix.default_nproc(device_count)
    for counts, option in ((nproc, "--nproc"), (list(spec.nodes), "--nodes")):
        matrix.parse_counts(",".join(map(str, counts)), option)
    cells = matrix.cells(sorted(set(nproc)), sorted(set(spec.nodes)), matrix.parse_scalings(",".join(spec.scalings)),
                         [(n, tuple(a)) for n, a in spec.variants] or None, spec.repeat)
    spec.study_command.check_cells(cells)
    return cells


NEXT_NODE_DEVICES = 8
"""A local study predicts its next scales up to a node of this many devices (GPUs, or processes with their own
cores), as a researcher would ask for next; a SLURM study up to its profile's GPUs per node, then 2 and 4 nodes."""


def shared_runs(cells: list[matrix.Cell], command: Any, argv_for: Callable[[matrix.Cell], list[str]], out: Path) -> dict[str, str]:
    """Cells that would run the very same experiment as an earlier one, run once and used by both: the same command line
    (its own folder aside) on the same devices, as weak and strong scaling's baselines are when their batches coincide.

    A gpuscale script gets ``--scaling weak|strong`` appended, which decides only how its batch follows the world size
    (`gpuscale.plan_batch`): on one device the two give the same batches, so its one-device cells of the two scalings
    share a run too; on more devices they differ, and each runs."""
    first: dict[tuple[Any, ...], str] = {}
    shared = {}
    for cell in cells:
        if command.appends_cell_options and cell.world_size != 1:
            continue
        folder = str(out / cell.name)
        argv = [arg.replace(folder, "{out}") for arg in argv_for(cell)]
        if command.appends_cell_options:
            argv = [("{scaling}" if arg == cell.scaling and before == "--scaling" else arg)
                    for before, arg in zip(["", *argv[:-1]], argv, strict=True)]
        key = (cell.nodes, cell.nproc_per_node, cell.repeat, tuple(argv))
        if key in first:
            shared[cell.name] = first[key]
        else:
            first[key] = cell.name
    return shared


def run_study(spec: StudySpec, progress: Callable[[str], None] = print) -> StudyResult:
    """Run the study `spec` describes; write results.json and the report; return them (see `StudyResult`)."""
    num_gpus, cores = _node_devices()
    if spec.launcher == "slurm":
        assert spec.cluster is not None
        device_count = load_cluster_profile(spec.cluster).gpus_per_node  # the cluster's nodes, not this login node
    else:
        device_count = num_gpus or len(cores)
    cells = plan_cells(spec, device_count)
    command = spec.study_command
    out = spec.out

    def argv_for(cell: matrix.Cell) -> list[str]:
        return command.argv_for(cell, str(out / cell.name), baseline_world_size(cells, cell))

    unit = "GPU" if (num_gpus or spec.launcher == "slurm") else "process"
    if spec.launcher == "slurm":
        cluster = spec.cluster
        assert cluster is not None

        def job_for(cell: matrix.Cell, output: str) -> tuple[Any, Any]:
            return cluster_job(cluster, argv_for(cell), nodes=cell.nodes, gpus_per_node=cell.nproc_per_node, output=output,
                               probe_dir=str((out / cell.name / runner.PROBE_RECORDS).resolve()))

        for cell in cells:  # every cell's job is checked before the first one runs
            job_for(cell, str(out / cell.name / runner.LOG_FILE))
        run_one: Any = runner.SlurmRunner(job_for, on_state=lambda s: progress(f"    {s}"), timeout_s=spec.cell_timeout_s)
    else:
        nproc = [c.nproc_per_node for c in cells]
        run_one = runner.LocalRunner(argv_for, max(nproc), num_gpus, cores, timeout_s=spec.cell_timeout_s)

    runner.record_study(out, list(spec.command), spec.launcher, cells, command.as_record(), spec.target_efficiency)
    outcomes = runner.run_cells(out, cells, run_one, progress, unit,
                                step_samples=lambda cell: command.step_samples(cell, baseline_world_size(cells, cell)),
                                uses_gpuscale=command.appends_cell_options, shared=shared_runs(cells, command, argv_for, out))
    medians = analysis.median_runs([(o.cell, o.summary) for o in outcomes if o.summary is not None])
    summaries = {cell.base_name: summary for cell, summary, _ in medians}
    shapes = [c for c in cells if c.repeat == 1]
    prediction = None
    if spec.predict and any(c.world_size == 1 and c.name in summaries for c in shapes) and len(shapes) > 1:
        try:
            prediction = _prediction(spec, shapes, summaries, max(c.nproc_per_node for c in cells), (num_gpus, cores), unit)
        except (ValueError, MeasureError) as exc:
            progress(f"no prediction: {exc}")
    results = analysis.analyse(out, prediction, spec.target_efficiency)
    results["study_target_efficiency"] = spec.target_efficiency  # `gpuscale report`'s default; its --target-efficiency is a what-if
    atomic_write_json(out / analysis.RESULTS_FILE, results)
    result = StudyResult(results=results, outcomes=outcomes)
    if results["rows"]:
        result.table = format_table(results)
        progress("")
        progress(result.table)
        result.report = write_report(results, out)
        progress(f"\nreport: {result.report['report.html']}  (and report.md, {out / 'plots'})")
    if result.failed:
        not_run = [o.cell.name for o in outcomes if o.status == "failed" and (o.error or "").startswith("not run:")]
        failed = [name for name in result.failed if name not in not_run]
        progress(f"{len(failed)} of {len(cells)} runs failed: {', '.join(failed)}"
                 + (f"; {len(not_run)} not run: {', '.join(not_run)}" if not_run else "")
                 + "; fix the cause and run the same command again: finished runs are kept")
    return result
