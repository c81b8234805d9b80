"""Start-up: from the launch command to the end of the first training step, `gpuscale run` against bare torchrun.

The same script (bench/loops/gpuscale_ddp.py) under both launchers, 2 processes, interleaved round by
round; the script stamps the wall clock after its first optimizer step on rank 0, the harness just
before it starts the launcher. Target: gpuscale run at most 0.5 s slower.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import GPUSCALE_RUN, ROOT, TORCHRUN, launch, summary

LAUNCHERS = {"torchrun": TORCHRUN, "gpuscale run": GPUSCALE_RUN}


def run(repeat: int = 7) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    script = str(ROOT / "bench" / "loops" / "gpuscale_ddp.py")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(repeat):
            order = list(LAUNCHERS) if round_ % 2 == 0 else list(reversed(LAUNCHERS))
            for name in order:
                out = Path(tmp) / f"{round_}-{name.replace(' ', '_')}.json"
                started = launch([*LAUNCHERS[name], script, str(out), "3", "1"])
                seconds[name].append(json.loads(out.read_text())["first_step_at"] - started)
    extra = [g - t for g, t in zip(seconds["gpuscale run"], seconds["torchrun"], strict=False)]
    med = summary(extra)["median"]
    return {"repeat": repeat, "launch_to_first_step_s": {name: summary(v) for name, v in seconds.items()},
            "gpuscale_minus_torchrun_s": summary(extra), "targets": {"extra <= 0.5 s": med <= 0.5}, "raw_s": seconds}


def report(record: dict[str, Any]) -> str:
    lines = [f"{name:<13} {s['median']:.2f} s to the first step (min {s['min']:.2f}, max {s['max']:.2f})"
             for name, s in record["launch_to_first_step_s"].items()]
    extra = record["gpuscale_minus_torchrun_s"]
    lines.append(f"gpuscale run - torchrun: {extra['median']:+.2f} s (min {extra['min']:+.2f}, max {extra['max']:+.2f})")
    return "\n".join(lines)
