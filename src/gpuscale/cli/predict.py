"""`gpuscale predict`: how fast a job will be on N devices and nodes, from one single-device run.

    gpuscale predict runs/one-gpu --profile lumi-g --nproc 1,2,4,8 --nodes 1,2,4
    gpuscale predict runs/one-cpu/summary.json --measure --nproc 1,2
    gpuscale predict runs/one-cpu --profile lumi-g --step-time 0.045 --nodes 1,2

The run's summary.json gives the step time, the per-device batch and the gradient bytes; the
interconnect comes from a cluster profile (``--profile``, its intra_node_* and inter_node_*
figures, ``--set`` to change them) or is measured here (``--measure``: an all-reduce sweep on 2
local processes). The ring all-reduce model (see `gpuscale.study.predict`) gives each shape's
step time, throughput and efficiency, weak and strong, and the smallest per-device batch at which
a step computes at least as long as it communicates: keep the batch at or above it. Each batch is
exact, as a study plans it (`gpuscale.plan_batch`): a strong-scaling shape among whose devices the
run's global batch does not divide is one a study refuses, so it gets no figures but its all-reduce,
and a line under the table gives the refusal (the global batches that divide, the device counts that do).

The step time is the run's device's, so the run must have been made on the kind of device the
target has: a CPU run onto a profile with GPUs (``gpu_vendor`` amd or nvidia), a GPU run onto a
profile without (``none``), an NVIDIA GPU's run onto AMD GPUs and the other way round are
refused in one line (exit code 2), and so is a GPU run under ``--measure`` on a machine without
GPUs (or a CPU run on one with them). ``--step-time SECONDS``, the seconds one optimizer step
takes on one target device at the run's per-device batch, lifts the refusal: the prediction then
uses it (the run still gives the gradient bytes and the batch) and says so. The table's first
line names what is projected: the run, its device, the step time and where it came from.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuscale.cli.slurm import profile_from_args
from gpuscale.cli.verbs import verb_parser
from gpuscale.slurm import billing
from gpuscale.study import linkmeasure, matrix, predict
from gpuscale.study.numbers import three_figures

EPILOG = """examples:
  gpuscale predict runs/dvc-1gpu --profile lumi-g --nproc 1,2,4,8 --nodes 1,2
  gpuscale predict runs/dvc-1cpu --measure --nproc 1,2
  gpuscale predict runs/dvc-1cpu --profile lumi-g --step-time 0.045   # one GCD's step, measured there
  gpuscale predict runs/dvc-1gpu --profile generic-nvidia --set inter_node_gbps=50 --nodes 1,2,4
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "predict", __doc__, EPILOG)
    parser.add_argument("run", metavar="RUN", help="summary.json of a single-device run, or its directory")
    parser.add_argument("--nproc", default="1,2,4,8", metavar="1,2,4,8", help="devices per node (default 1,2,4,8)")
    parser.add_argument("--nodes", default="1", metavar="1,2", help="node counts (default 1)")
    parser.add_argument("--scaling", default="weak,strong", metavar="weak,strong", help="scaling modes (default both)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="interconnect figures of this cluster profile")
    source.add_argument("--measure", action="store_true", help="measure the interconnect here (2 local processes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile value, e.g. inter_node_gbps=50")
    parser.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                        help="seconds per optimizer step of one target device at the run's per-device batch; used instead "
                        "of the run's (needed to project a run onto another kind of device)")
    parser.add_argument("--overlap", type=float, default=None,
                        help="share of compute time that hides communication (default 0 where the target has no GPUs, 0.5 on GPUs)")
    parser.set_defaults(func=run)


def load_summary(path_text: str) -> tuple[dict[str, Any], str]:
    """(the summary, the run's name for messages: its directory as given) of a summary.json or its directory."""
    path = Path(path_text)
    if path.is_dir():
        name, path = path_text.rstrip("/") or path_text, path / "summary.json"
    else:
        name = str(path.parent) if path.name == "summary.json" and str(path.parent) != "." else path_text
    if not path.is_file():
        raise ValueError(f"{path} does not exist; give the summary.json of a single-device run (or its directory)")
    try:
        return json.loads(path.read_text()), name
    except ValueError:
        raise ValueError(f"{path} is not valid JSON") from None


def this_machine_vendor() -> str:
    """The GPUs of this machine as a profile's gpu_vendor names them: "nvidia", "amd", or "none"."""
    import torch

    if not torch.cuda.is_available():
        return "none"
    return "amd" if torch.version.hip else "nvidia"


def _num(value: float, digits: int = 4) -> str:
    return str(value) if isinstance(value, int) else f"{value:.{digits}g}"


def baseline_line(baseline: dict[str, Any]) -> str:
    """What the prediction projects, in one line: run, device, step time and batch, where the step time came from."""
    device, name = baseline.get("device"), baseline.get("device_name")
    if device == "cpu":
        what = "1 CPU process"
    elif device == "cuda":
        what = f"1 GPU ({name})" if name else "1 GPU"
    else:
        what = f"1 device of kind {device!r}" if device else "1 device of a kind the summary does not name"
    batch = f"{baseline['per_device_batch']} samples per device"
    if baseline.get("grad_accum_steps", 1) > 1:
        batch = f"{baseline['grad_accum_steps']} micro-batches of {batch}"
    step = predict.duration_words(baseline["step_time_s"])
    if baseline.get("step_time_source") == "--step-time":
        measured = baseline.get("measured_step_time_s")
        ran = f"; the run measured {predict.duration_words(measured)}" if measured else ""
        return (f"baseline: {baseline.get('run') or 'the run'}, {what} (its gradients and batch); "
                f"{step} per step on one target device at {batch} (given with --step-time{ran})")
    return f"baseline: {baseline.get('run') or 'the run'}, {what}, {step} per step at {batch} (measured)"


def _latency_words(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} µs" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms"


def _link_words(link: dict[str, Any]) -> str:
    """The interconnect's figures in words, with their units."""
    words = f"{link['intra_bandwidth'] / 1e9:.3g} GB/s and {_latency_words(link['intra_latency'])} per ring step within a node"
    if link.get("inter_bandwidth") and link.get("inter_latency"):
        words += f", {link['inter_bandwidth'] / 1e9:.3g} GB/s and {_latency_words(link['inter_latency'])} between nodes"
    return f"{link['source']}: {words} (bandwidth per direction)"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def _row(p: dict[str, Any], scaling: str, billed: bool) -> list[str]:
    """One predicted cell's line of the table: "—" for a figure the model has none of (a cell whose batch does not
    divide has only its all-reduce)."""
    def shown(key: str, form: Callable[[Any], str]) -> str:
        return "—" if p.get(key) is None else form(p[key])

    row = [p["name"], scaling, shown("per_device_batch", _num), shown("compute_s", _ms), _ms(p["comm_s"]),
           shown("exposed_comm_s", _ms), shown("samples_per_s", lambda v: f"{v:.1f}"), shown("efficiency", lambda v: f"{100 * v:.0f}")]
    return row + ([shown("billed_per_m_samples", three_figures)] if billed else [])


def format_prediction(prediction: dict[str, Any], cells: list[matrix.Cell]) -> str:
    """The baseline, the interconnect, the predicted table (units in its headers) and the batch sweet spot, as text."""
    scaling_of = {c.name: c.scaling for c in cells}
    lines = [baseline_line(prediction["baseline"]),
             f"interconnect: {_link_words(prediction['link'])}",
             (f"overlap: communication hides behind {100 * prediction['overlap']:.0f}% of the compute time"
              + (f" ({prediction['overlap_source']})" if prediction.get("overlap_source") else "")
              + f"; gradients: {prediction['gradient_bytes'] / 2**20:.1f} MiB per step"), ""]
    head = ["run", "scaling", "batch/device (samples)", "compute (ms)", "all-reduce (ms)", "exposed (ms)",
            "throughput (samples/s)", "efficiency (%)"]
    billed = prediction.get("billing")
    if billed:
        head.append(f"{billed['unit']}/1M samples")
    rows = [_row(p, scaling_of.get(p["name"], ""), bool(billed)) for p in prediction["cells"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def line(values: list[str]) -> str:
        return " ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    table = [line(head), "-" * len(line(head)), *(line(r) for r in rows)]
    lines += table
    refused = [p for p in prediction["cells"] if p.get("refused")]
    if refused:  # in the words the study refuses them in: the run's global batch cannot be shared exactly
        lines += ["", *(f"{p['name']}: not predicted: {p['refused']}" for p in refused)]
    if prediction["comm_dominates_below_batch"]:
        lines.append("")
        for shape, batch in prediction["comm_dominates_below_batch"].items():
            if batch > 1:
                lines.append(f"{shape}: below {batch} samples per device, a step communicates longer than it computes")
            else:
                lines.append(f"{shape}: at any batch, a step computes at least as long as it communicates")
    if billed:
        lines += ["", f"billing: what gpuscale's batch script for each shape asks for, by {billed['rules']} (from "
                      f"{billed['source'] or 'the profile'}); at the predicted throughput, start-up not included"]
    return "\n".join(lines)


def add_billing(prediction: dict[str, Any], profile: Any) -> None:
    """Price each predicted cell in the profile's billing units per million samples (in place), where it has a rule:
    the job gpuscale's batch script would ask for that shape (`billing.default_allocation`)."""
    rules = []
    for cell in prediction["cells"]:
        alloc = billing.default_allocation(profile, cell["nodes"], cell["world_size"] // cell["nodes"])
        rate = billing.units_per_hour(profile, alloc)
        if rate is None:
            return
        cell["billed_per_m_samples"] = None if cell["samples_per_s"] is None else rate * 1e6 / cell["samples_per_s"] / 3600
        rules.append(billing.rule_words(profile, alloc.partition))
    prediction["billing"] = {"unit": profile.billing_unit, "source": profile.billing_source,
                             "rules": "; ".join(dict.fromkeys(r for r in rules if r))}


def run(args: argparse.Namespace) -> int:
    predict.check_overlap(args.overlap)  # before --measure spends seconds on a benchmark
    if args.step_time is not None:
        predict.check_step_time(args.step_time)
    summary, name = load_summary(args.run)
    base = predict.Baseline.from_summary(summary, run=name)
    if args.step_time is not None:
        base = base.with_step_time(args.step_time)
    cells = matrix.cells(matrix.parse_counts(args.nproc, "--nproc"), matrix.parse_counts(args.nodes, "--nodes"),
                         matrix.parse_scalings(args.scaling))
    if args.measure:
        vendor = this_machine_vendor()
        predict.check_target(base, vendor, "this machine (--measure)", "here")
        with tempfile.TemporaryDirectory() as tmp:
            link = predict.Link.from_measurement(linkmeasure.measure_local(Path(tmp) / "link.json"))
    else:
        profile = profile_from_args(args)
        vendor = profile.gpu_vendor
        predict.check_target(base, vendor, f"profile {profile.name}", f"on {profile.name}")
        link = predict.Link.from_profile(profile)
    overlap = args.overlap if args.overlap is not None else (0.0 if vendor == "none" else 0.5)
    prediction = predict.predict(cells, base, link, overlap, summary["global_batch"]).to_dict()
    prediction["overlap_source"] = ("as given (--overlap)" if args.overlap is not None else
                                    f"the default {'without GPUs' if vendor == 'none' else 'on GPUs'}, assumed: one run "
                                    "cannot show it; a study calibrates it from its measured runs, so its prediction may differ")
    if not args.measure:
        add_billing(prediction, profile)
    print(format_prediction(prediction, cells))
    return 0
