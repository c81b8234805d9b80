"""`gpuscale predict`: how fast a job will be on N devices and nodes, from one single-device run.

    gpuscale predict runs/one-gpu --profile lumi-g --nproc 1,2,4,8 --nodes 1,2,4
    gpuscale predict runs/one-cpu/summary.json --measure --nproc 1,2

The run's summary.json gives the step time, the per-device batch and the gradient bytes; the
interconnect comes from a cluster profile (``--profile``, its intra_node_* and inter_node_*
figures, ``--set`` to change them) or is measured here (``--measure``: an all-reduce sweep on 2
local processes). The ring all-reduce model (see `gpuscale.study.predict`) gives each shape's
step time, throughput and efficiency, weak and strong, and the per-device batch below which a
step spends more time communicating than computing: keep the batch above it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from gpuscale.cli.slurm import profile_from_args
from gpuscale.study import matrix, predict

EPILOG = """examples:
  gpuscale predict runs/dvc-1gpu --profile lumi-g --nproc 1,2,4,8 --nodes 1,2
  gpuscale predict runs/dvc-1cpu --measure --nproc 1,2
  gpuscale predict runs/dvc-1gpu --profile generic-nvidia --set inter_node_gbps=50 --nodes 1,2,4
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("predict", help="predict throughput and efficiency on N devices from a 1-device run",
                                   description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", metavar="RUN", help="summary.json of a single-device run, or its directory")
    parser.add_argument("--nproc", default="1,2,4,8", metavar="1,2,4,8", help="devices per node (default 1,2,4,8)")
    parser.add_argument("--nodes", default="1", metavar="1,2", help="node counts (default 1)")
    parser.add_argument("--scaling", default="weak,strong", metavar="weak,strong", help="scaling modes (default both)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="interconnect figures of this cluster profile")
    source.add_argument("--measure", action="store_true", help="measure the interconnect here (2 local processes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile value, e.g. inter_node_gbps=50")
    parser.add_argument("--overlap", type=float, default=None,
                        help="share of compute time that hides communication (default 0 for a CPU run, 0.5 for a GPU run)")
    parser.set_defaults(func=run)


def load_summary(path_text: str) -> dict[str, Any]:
    path = Path(path_text)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; give the summary.json of a single-device run (or its directory)")
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"{path} is not valid JSON") from None


def format_prediction(prediction: dict[str, Any], cells: list[matrix.Cell]) -> str:
    """The predicted table and the batch sweet spot, as text."""
    scaling_of = {c.name: c.scaling for c in cells}
    lines = [f"interconnect: {prediction['link']['source']}; overlap {prediction['overlap']:.2f}; "
             f"gradients {prediction['gradient_bytes'] / 2**20:.1f} MiB per step", ""]
    head = f"{'run':<12} {'scaling':<7} {'batch/dev':>9} {'compute':>10} {'all-reduce':>11} {'exposed':>10} {'samples/s':>10} {'efficiency':>10}"
    lines += [head, "-" * len(head)]
    for p in prediction["cells"]:
        lines.append(f"{p['name']:<12} {scaling_of.get(p['name'], ''):<7} {p['per_device_batch']:>9.4g} {1e3 * p['compute_s']:>8.1f}ms "
                     f"{1e3 * p['comm_s']:>9.1f}ms {1e3 * p['exposed_comm_s']:>8.1f}ms {p['samples_per_s']:>10.1f} {100 * p['efficiency']:>9.0f}%")
    if prediction["comm_dominates_below_batch"]:
        lines.append("")
        for shape, batch in prediction["comm_dominates_below_batch"].items():
            lines.append(f"{shape}: below {batch:.3g} samples per device, a step communicates longer than it computes")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    predict.check_overlap(args.overlap)  # before --measure spends seconds on a benchmark
    summary = load_summary(args.run)
    base = predict.Baseline.from_summary(summary)
    cells = matrix.cells(matrix.parse_counts(args.nproc, "--nproc"), matrix.parse_counts(args.nodes, "--nodes"),
                         matrix.parse_scalings(args.scaling))
    if args.measure:
        from gpuscale.study.linkbench import measure_local

        with tempfile.TemporaryDirectory() as tmp:
            link = predict.Link.from_measurement(measure_local(Path(tmp) / "link.json"))
    else:
        link = predict.Link.from_profile(profile_from_args(args))
    overlap = args.overlap if args.overlap is not None else (0.5 if summary.get("device") == "cuda" else 0.0)
    prediction = predict.predict(cells, base, link, overlap, summary["global_batch"]).to_dict()
    print(format_prediction(prediction, cells))
    return 0
