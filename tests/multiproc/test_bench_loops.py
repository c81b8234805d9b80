"""The overhead benchmark compares like with like: plain DDP and gpuscale train the same model on the same
batches in the same order (identical losses), and the Accelerate loop trains too."""

from __future__ import annotations

import json

from procs import ROOT, run

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def test_plain_and_gpuscale_loops_take_identical_steps(tmp_path):
    import sys

    records = {}
    for loop in ("plain_ddp", "gpuscale_ddp", "accelerate_ddp"):
        out = tmp_path / f"{loop}.json"
        result = run([sys.executable, *TORCHRUN, str(ROOT / "bench" / "loops" / f"{loop}.py"), str(out), "41", "5"], timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        records[loop] = json.loads(out.read_text())
    assert records["plain_ddp"]["losses"] == records["gpuscale_ddp"]["losses"] and len(records["plain_ddp"]["losses"]) == 2
    assert all(r["world_size"] == 2 and r["threads"] == 1 and r["step_s"] > 0 for r in records.values())
    assert len(records["accelerate_ddp"]["losses"]) == 2
