"""How long `gpuscale demo` takes on a fresh machine (no cached images): the README promises under two minutes on 2 cores.

    python bench/demo_time.py [--out bench/results/demo_time.json]

Runs the demo with an empty data cache and study directory, times it end to end, and writes the
time with the demo's own table (speed-up, efficiency) to JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/demo_time.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GPUSCALE_DATA": str(Path(tmp) / "data")}
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "gpuscale", "demo", "--out", str(Path(tmp) / "demo")],
                                env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
            return 1
        rows = json.loads((Path(tmp) / "demo" / "results.json").read_text())["rows"]
    record: dict[str, Any] = {
        "benchmark": "demo_time", "seconds": seconds, "cores": len(os.sched_getaffinity(0)), "machine": platform.machine(),
        "rows": [{k: r[k] for k in ("name", "samples_per_s", "speedup", "efficiency", "metric_value", "predicted_samples_per_s")}
                 for r in rows],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"gpuscale demo: {seconds:.1f} s on {record['cores']} cores")
    for r in record["rows"]:
        print(f"  {r['name']:<11} {r['samples_per_s']:8.1f} samples/s  speed-up {r['speedup']:.2f}x  efficiency {100 * r['efficiency']:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
