"""Run the cells of a study, one after another, locally or as SLURM jobs; a rerun skips finished cells.

A cell is finished when its folder holds a complete summary.json of the cell's shape: the one the
script's gpuscale.Meter wrote, or the one merged from the ranks' probe records (`gpuscale.measure.probe`,
kept in ``<cell>/probe/``) after the cell, locally or after its SLURM job. A cell folder without
one (a run that failed or was interrupted) is emptied before the cell runs again: a run that
resumed from its own half-written checkpoints would time only the epochs after the resume.
Cells run one at a time, so no two runs compete for the same cores, GPUs or network.

`study.json` records the command and launcher; a rerun into the same directory with another command
is refused, so one table never mixes two experiments.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write_json, make_dir
from gpuscale.detect.launchtime import LAUNCH_TIME
from gpuscale.detect.topology import check_cpu_processes
from gpuscale.measure.probe import RECORDS as PROBE_RECORDS
from gpuscale.measure.probe import SUMMARY as SUMMARY_FILE
from gpuscale.measure.probe import collect, probe_enabled, probe_environ
from gpuscale.slurm import billing, jobs
from gpuscale.slurm.render import render_sbatch
from gpuscale.slurm.validate import validate_job
from gpuscale.study import missing, otherload
from gpuscale.study.matrix import SCALINGS, Cell, cpu_cores_for, local_argv
from gpuscale.study.missing import SELF_MEASURED, ScriptProblem, missing_summary, self_measured_problem, summary_problem, unusable_summary
from gpuscale.study.numbers import three_figures
from gpuscale.study.saved import RESULTS_FILE

STUDY_FILE = "study.json"
LOG_FILE = "output.log"


@dataclass
class Outcome:
    """What became of one cell."""

    cell: Cell
    status: str
    """'done' (ran now), 'skipped' (finished before), 'shared' (the same experiment as a cell that ran) or 'failed'."""
    seconds: float = 0.0
    summary: dict[str, Any] | None = None
    error: str | None = None


"""The figures of one device in a summary's utilisation that the table and report compute with."""


SAME_AS = "same-as"
"""A cell's file naming the cell whose run it shares: the same command on the same devices (`run_cells`' `shared`)."""
BILLING_FILE = "billing.json"
"""What one hour of a SLURM cell's job costs in the cluster's billing units (`gpuscale.slurm.billing.record_for`)."""


def read_billing(run_dir: Path) -> dict[str, Any] | None:
    """The billing record a SLURM cell's job left (unit, units per hour, rule, source), or None."""
    try:
        record = json.loads((run_dir / BILLING_FILE).read_text())
    except (OSError, ValueError):
        return None
    rate = record.get("per_hour") if isinstance(record, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < math.inf or not isinstance(record.get("unit"), str):
        return None
    return record


def read_summary(cell_dir: Path, cell: Cell) -> dict[str, Any] | None:
    """The cell's summary if it is complete, of this cell's shape and scaling, and not damaged; else None (run it again).
    A cell that shares another's run (SAME_AS) has that run's summary, under its own scaling, with "same_as" naming it."""
    try:
        other = (cell_dir / SAME_AS).read_text().strip()
    except OSError:
        return _summary_of(cell_dir, cell.world_size, cell.scaling)
    if not other or "/" in other or other in (".", "..") or (cell_dir.parent / other / SAME_AS).exists():
        return None  # one step only: a cell shares a run that ran
    summary = _summary_of(cell_dir.parent / other, cell.world_size, None)
    return None if summary is None else {**summary, "scaling": cell.scaling, "same_as": other}


def _summary_of(cell_dir: Path, world_size: int, scaling: str | None) -> dict[str, Any] | None:
    """The summary in `cell_dir` if it is complete, undamaged, of `world_size` ranks and of `scaling` (None: any)."""
    try:
        summary = json.loads((cell_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if summary_problem(summary) or summary.get("world_size") != world_size or scaling not in (None, summary.get("scaling")):
        return None
    if summary.get("complete") is False:  # merged by the probe from a run that failed or lost a rank
        return None
    return summary


def read_study(out: Path) -> dict[str, Any]:
    """study.json of the study in `out`, checked: ValueError in one line if it is not one gpuscale wrote."""
    path = out / STUDY_FILE
    try:
        study = json.loads(path.read_text())
    except UnicodeDecodeError:
        study = None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); restore it, or give another --out") from None
    problem = _study_problem(study)
    if problem:
        raise ValueError(f"{path} is not a study that gpuscale wrote ({problem}); restore it, or give another --out")
    return study


def _study_problem(study: Any) -> str | None:
    if not isinstance(study, dict):
        return "not a JSON object"
    command = study.get("command", [])
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        return "its command is not a list of strings"
    if not isinstance(study.get("launcher"), (str, type(None))):
        return "its launcher is not a string"
    cells = study.get("cells", [])
    if not isinstance(cells, list):
        return "its cells are not a list"
    for index, entry in enumerate(cells):
        try:
            cell_from_entry(entry)
        except (TypeError, KeyError, ValueError) as exc:
            return f"cell {index}: {exc}"
    return None


def cell_from_entry(entry: Any) -> Cell:
    """A Cell from its study.json entry; TypeError, KeyError or ValueError saying what is wrong with it."""
    if not isinstance(entry, dict):
        raise TypeError("not a JSON object")
    scaling, nodes, nproc = entry["scaling"], entry["nodes"], entry["nproc_per_node"]
    variant, variant_args, repeat = entry.get("variant", ""), entry.get("variant_args", []), entry.get("repeat", 1)
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r} is not one of {', '.join(SCALINGS)}")
    for key, value in (("nodes", nodes), ("nproc_per_node", nproc), ("repeat", repeat)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} {value!r} is not a positive whole number")
    if not isinstance(variant, str) or not re.fullmatch(r"[A-Za-z0-9_.]*", variant):
        raise ValueError(f"variant {variant!r} is not a name of letters, digits, _ and .")
    if not isinstance(variant_args, list) or not all(isinstance(a, str) for a in variant_args):
        raise ValueError("variant_args is not a list of strings")
    return Cell(scaling, nodes, nproc, variant, tuple(variant_args), repeat)


def record_study(out: Path, command: list[str], launcher: str, cells: list[Cell], batch: dict[str, Any] | None = None,
                 target_efficiency: float | None = None) -> None:
    """Write (or check) study.json: a study directory holds one command's runs only (and one batch); the target the
    study was last run with (`gpuscale report`'s default) where given; when it was first started (`study_created`)."""
    path = out / STUDY_FILE
    known: list[dict[str, Any]] = []
    batch = {k: v for k, v in (batch or {}).items() if v is not None}
    previous: dict[str, Any] = {}
    if path.exists():
        previous = read_study(out)
        if previous.get("command") != command or previous.get("launcher") != launcher:
            raise ValueError(
                f"{out} holds a study of `{' '.join(previous.get('command', []))}` ({previous.get('launcher')}); "
                "give another --out, or delete that directory to start over"
            )
        if (previous.get("batch") or {}) != batch:
            raise ValueError(f"{out} holds a study with batch options {previous.get('batch') or 'none'}, not {batch or 'none'}; "
                             "give another --out, or delete that directory to start over")
        known = previous.get("cells", [])
    names = {c["name"] for c in known}
    for cell in cells:
        if cell.name not in names:
            known.append({"name": cell.name, "scaling": cell.scaling, "nodes": cell.nodes, "nproc_per_node": cell.nproc_per_node,
                          "variant": cell.variant, "variant_args": list(cell.variant_args), "repeat": cell.repeat})
    out.mkdir(parents=True, exist_ok=True)
    if target_efficiency is None:
        target_efficiency = previous.get("target_efficiency")
    created = study_created(previous) or _first_results_date(out) or datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_json(path, {"version": 1, "command": command, "launcher": launcher, "cells": known, "created": created,
                             **({"batch": batch} if batch else {}),
                             **({"target_efficiency": target_efficiency} if target_efficiency is not None else {})})


def study_created(study: dict[str, Any]) -> str | None:
    """When the study was started: study.json's "created" (kept by every rerun and report), None where a study.json
    written before gpuscale kept it has none, or one that is not text."""
    created = study.get("created")
    return created if isinstance(created, str) else None


def _first_results_date(out: Path) -> str | None:
    """The date results.json carries where study.json (written before it kept one) has none: the last analysis's
    (gpuscale rewrote it at every report then), the nearest to the study's start there is; None where it has none or
    cannot be read (a damaged one is `gpuscale report`'s to refuse)."""
    try:
        saved = json.loads((out / RESULTS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return study_created(saved) if isinstance(saved, dict) else None


def tail(path: Path, lines: int = 12) -> str:
    """The last lines of a run's output, indented; torchrun's failure banner is cut off (gpuscale run's
    one-line summary of it stays), so what the script itself printed last is what is shown."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    end = next((i + 1 for i, line in enumerate(text) if line.startswith("gpuscale run: rank ")), len(text))
    return "\n".join("    " + line for line in text[:end][-lines:])


def _collect_probe(cell: Cell, cell_dir: Path, error: str | None, step_samples: int | None = None) -> dict[str, Any] | None:
    """Merge the cell's probe records into its summary.json (unless the script's gpuscale.Meter wrote one);
    `step_samples`: the study's batch per optimizer step, for a script whose samples nothing else counts."""
    if (cell_dir / SUMMARY_FILE).exists():
        return None
    try:
        return collect(cell_dir / PROBE_RECORDS, cell_dir, world_size=cell.world_size, scaling=cell.scaling,
                       failure="the run failed" if error else None, step_samples=step_samples)
    except (ValueError, KeyError, TypeError) as exc:  # a damaged record: say so, keep the study going
        return {"complete": False, "probe": {"why": f"its probe records do not merge ({type(exc).__name__}: {exc})"}}


class LocalRunner:
    """Runs each cell with `gpuscale run` on this node.

    On a CPU-only node every process gets the same number of cores in every cell (see
    `matrix.cpu_cores_for`); with GPUs each process has its GPU and `gpuscale run` binds the cores.
    """

    launcher = "local"

    def __init__(self, argv_for: Callable[[Cell], list[str]], max_nproc: int, num_gpus: int, cores: list[int],
                 timeout_s: float | None = None) -> None:
        if num_gpus and max_nproc > num_gpus:
            raise ValueError(f"--nproc asks for {max_nproc} processes but this node has {num_gpus} GPUs; "
                             f"use at most {num_gpus}, or --launcher slurm for more nodes")
        if not num_gpus:  # a cell of processes sharing cores measures nothing
            check_cpu_processes(max_nproc, len(cores), "--nproc")
        self.argv_for = argv_for  # the script's argv in a cell
        self.max_nproc = max_nproc
        self.num_gpus = num_gpus
        self.cores = cores
        self.timeout_s = timeout_s

    def run(self, cell: Cell, cell_dir: Path) -> str | None:
        """Run one cell; None on success, else why it failed."""
        argv = local_argv(cell, self.argv_for(cell))
        cores = None if self.num_gpus else cpu_cores_for(cell, self.max_nproc, self.cores)
        otherload.record(cell_dir, self.cores)  # none of the study's processes runs now: what is busy is other work
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[LAUNCH_TIME] = repr(time.time())  # the cell's time to result counts from here, gpuscale's own start-up included
        if probe_enabled(env):
            make_dir(cell_dir / PROBE_RECORDS)
            env.update(probe_environ((cell_dir / PROBE_RECORDS).resolve(), env))
        log_path = cell_dir / LOG_FILE
        with log_path.open("w") as log:
            log.write(f"$ {' '.join(argv)}\n" + (f"# cores {cores}\n" if cores else ""))
            log.flush()
            try:
                with otherload.during(cell_dir, cores or self.cores):  # the run's processes: this one's children
                    code = subprocess.run(
                        argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=self.timeout_s,
                        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
                    ).returncode
            except subprocess.TimeoutExpired:
                return f"did not finish within {self.timeout_s:.0f} s (see {log_path})"
        if code != 0:
            return f"exit code {code}; last lines of {log_path}:\n{tail(log_path)}"
        return None


class SlurmRunner:
    """Runs each cell as a SLURM job (rendered from a cluster profile) and waits for it to end.

    Jobs are submitted one at a time: a study measures speed, and two of its own jobs sharing a
    node or a switch would measure each other.
    """

    launcher = "slurm"

    def __init__(self, job_for: Callable[[Cell, str], tuple[Any, Any]],
                 on_state: Callable[[str], None] | None = None, timeout_s: float | None = None) -> None:
        self.job_for = job_for  # (cell, output path) -> (profile, JobSpec)
        self.on_state = on_state
        self.timeout_s = timeout_s

    def run(self, cell: Cell, cell_dir: Path) -> str | None:
        log_path = cell_dir / LOG_FILE
        make_dir(cell_dir / PROBE_RECORDS)
        profile, job = self.job_for(cell, str(log_path))
        script = render_sbatch(profile, job)
        cost = billing.record_for(profile, billing.allocation_of_plan(profile, validate_job(profile, job), job.nodes))
        if cost is not None:
            atomic_write_json(cell_dir / BILLING_FILE, cost)
        job_id = jobs.submit(script, chdir=os.getcwd())

        def changed(info: Any) -> None:
            if self.on_state:
                self.on_state(f"job {job_id} {info.state}" + (f" on {info.nodes}" if info.nodes else ""))

        info = jobs.wait(job_id, poll_s=1.0, timeout_s=self.timeout_s, on_change=changed)
        if not info.succeeded:
            return f"job {job_id} ended {info.state} (exit code {info.exit_code}); last lines of {log_path}:\n{tail(log_path)}"
        return None


def _after_run(cell: Cell, cell_dir: Path, error: str | None, step_samples: int | None,
               uses_gpuscale: bool) -> tuple[dict[str, Any] | None, str | None, ScriptProblem | None]:
    """(the cell's summary, why it failed, what the script does wrong in every cell) once its run ended with `error`:
    the probe's records merged, the summary read, and where there is none, why in words that name the fix."""
    merged = _collect_probe(cell, cell_dir, error, step_samples)
    summary = read_summary(cell_dir, cell) if error is None else None
    problem = self_measured_problem(cell_dir, cell) if error is None and summary is None else None
    if problem is not None:
        error = problem.message
    elif error is None and summary is None and merged is None and (cell_dir / SUMMARY_FILE).exists():
        error = unusable_summary(cell_dir, cell)
    elif error is None and summary is None:
        error = missing_summary(cell_dir) if merged is None else f"the probe's summary is incomplete: {merged['probe']['why']}" \
            + (f"; {SELF_MEASURED}" if uses_gpuscale else "")
    elif error and merged and merged["probe"].get("why"):
        error += f"\n    the probe: {merged['probe']['why']}"
    return summary, error, problem or missing.usage_problem(error, cell)


def _exit_words(seconds: float, summary: dict[str, Any]) -> str:
    """How the launcher's whole time splits at the run's time to result (the table's, which ends at the last rank's
    record): ", its result at 5.5 s, then 2.0 s to exit"; "" where the summary has no time to result."""
    result = summary.get("time_to_result_s")
    if not isinstance(result, (int, float)) or not 0 < result <= seconds:
        return ""
    return f", its result at {result:.1f} s, then {seconds - result:.1f} s to exit"


def run_cells(out: Path, cells: list[Cell], runner: Any, progress: Callable[[str], None] = print,
              unit: str = "process", step_samples: Callable[[Cell], int | None] = lambda cell: None,
              uses_gpuscale: bool = True, shared: Mapping[str, str] | None = None) -> list[Outcome]:
    """Run every unfinished cell; report each start and end through `progress`. `step_samples(cell)`: the study's
    batch per optimizer step where the script's arguments carry it (the probe's last way to count samples);
    `uses_gpuscale`: the script imports gpuscale, so a summary it should have written is its own to write;
    `shared`: cell name -> an earlier cell that runs the very same experiment (the same command on the same
    devices: weak and strong scaling's baselines often are), whose run it takes instead of running again."""
    outcomes: list[Outcome] = []
    stopped: tuple[str, ScriptProblem] | None = None  # the cell that showed what the script does wrong in every cell
    for index, cell in enumerate(cells, 1):
        cell_dir = out / cell.name
        head = f"[{index}/{len(cells)}] {cell.name} ({cell.describe(unit)})"
        same = (shared or {}).get(cell.name)
        if same and read_summary(out / same, next(c for c in cells if c.name == same)) is not None:
            if cell_dir.exists():
                shutil.rmtree(cell_dir)
            make_dir(cell_dir)
            (cell_dir / SAME_AS).write_text(same + "\n")
            summary = read_summary(cell_dir, cell)
            progress(f"{head}: the same experiment as {same} (the same command on the same devices): its run is used")
            outcomes.append(Outcome(cell, "shared", summary=summary))
            continue
        summary = read_summary(cell_dir, cell)
        if summary is not None:
            progress(f"{head}: finished before, skipped ({three_figures(summary['samples_per_s'])} samples/s)")
            outcomes.append(Outcome(cell, "skipped", summary=summary))
            continue
        if stopped is not None and stopped[1].stops(cell):
            progress(f"{head}: not run: it would fail as {stopped[0]} did")
            outcomes.append(Outcome(cell, "failed", error=f"not run: {stopped[0]} showed that {stopped[1].message}"))
            continue
        if cell_dir.exists():
            shutil.rmtree(cell_dir)  # an unfinished run: start it afresh, not from its checkpoints
        cell_dir.mkdir(parents=True)
        progress(f"{head}: running ...")
        start = time.perf_counter()
        error = runner.run(cell, cell_dir)
        seconds = time.perf_counter() - start
        summary, error, problem = _after_run(cell, cell_dir, error, step_samples(cell), uses_gpuscale)
        if error or summary is None:
            progress(f"{head}: FAILED after {seconds:.1f} s: {error}")
            outcomes.append(Outcome(cell, "failed", seconds, error=error))
            if problem is not None and stopped is None:  # the script, not this run: its other cells would fail the same way
                stopped = (cell.name, problem)
                progress("the study runs no more cells that would fail the same way"
                         + (f" (the {problem.spares} scaling cells still run)" if problem.spares else ""))
        else:
            after = _exit_words(seconds, summary) if getattr(runner, "launcher", None) == "local" else ""  # a job's includes its queue
            progress(f"{head}: done in {seconds:.1f} s{after} ({three_figures(summary['samples_per_s'])} samples/s)")
            outcomes.append(Outcome(cell, "done", seconds, summary=summary))
        sys.stdout.flush()
    return outcomes
