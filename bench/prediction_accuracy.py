"""Prediction against measurement: the ring all-reduce model on CPU processes over gloo.

    python bench/prediction_accuracy.py [--hidden 256,640,1024] [--repeat 3] [--out bench/results/prediction_accuracy.json]

For each MLP width (gradients grow with its square) runs `gpuscale study --nproc 1,2 --scaling
weak,strong --repeat K` on tests/multiproc/scripts/mlp_scaling.py and records, per cell, the
measured median throughput, the predicted one and the error, with the measured link figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "multiproc" / "scripts" / "mlp_scaling.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", default="256,640,1024")
    parser.add_argument("--repeat", default="3")
    parser.add_argument("--steps", default="150")
    parser.add_argument("--out", default="bench/results/prediction_accuracy.json")
    args = parser.parse_args()
    records = []
    for hidden in args.hidden.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "study"
            # --overlap 0 (the CPU default) given, so that the study does not calibrate the model on the runs it checks
            cmd = [sys.executable, "-m", "gpuscale", "study", "--nproc", "1,2", "--scaling", "weak,strong", "--repeat", args.repeat,
                   "--overlap", "0", "--out", str(out), "--", str(SCRIPT), "--steps", args.steps, "--hidden", hidden, "--batch-size", "128"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
                return 1
            results = json.loads((out / "results.json").read_text())
            link = json.loads((out / "link.json").read_text())
        for row in results["rows"]:
            cell = next(c for c in results["prediction"]["cells"] if c["name"] == row["name"])
            records.append({
                "hidden": int(hidden), "cell": row["name"], "gradient_mib": row["gradient_bytes"] / 2**20,
                "measured_samples_per_s": row["samples_per_s"], "runs": row["samples_per_s_runs"],
                "predicted_samples_per_s": row["predicted_samples_per_s"],
                "error": row["predicted_samples_per_s"] / row["samples_per_s"] - 1,
                "comm_share_predicted": cell["exposed_comm_s"] / cell["step_time_s"],
                "link_latency_us": link["latency_s"] * 1e6, "link_gbps": link["bandwidth_bytes_per_s"] / 1e9,
            })
            r = records[-1]
            print(f"hidden {hidden:>5} {r['cell']:<11} measured {r['measured_samples_per_s']:8.0f}  predicted "
                  f"{r['predicted_samples_per_s']:8.0f}  error {100 * r['error']:+5.1f}%  comm {100 * r['comm_share_predicted']:.0f}% of step")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "prediction_accuracy", "records": records}, indent=2) + "\n")
    worst = max(abs(r["error"]) for r in records)
    print(f"worst error {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
