"""A study claims only the experiment that happened: a real single-device script, unchanged, studied on 1 and 2
processes. It ignores the batch template (it reads no arguments: 64 per step, always) and its two ranks never
synchronise (no process group, no DDP). The truth is the script itself: its own batch_size, and no all-reduce."""

from __future__ import annotations

import json
import re

import pytest

from procs import ROOT, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

SCRIPT = ROOT / "tests" / "clients" / "quickstart_single.py"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims") / "study"
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "strong", "--global-batch", "32", "--no-predict",
                              "--out", str(out), "--", str(SCRIPT), "--batch-size", "{per_device_batch}"), timeout=600)
    assert_ok(result)
    return out, result, json.loads((out / "results.json").read_text())


def test_the_batch_each_rank_really_trained_is_shown_in_one_line(study):
    out, result, results = study
    rows = {row["name"]: row for row in results["rows"]}
    # the script's own batch_size = 64, not the 32 and 16 the template planned
    assert rows["strong-1x1"]["per_device_batch"] == 64 and rows["strong-1x2"]["per_device_batch"] == 64
    assert rows["strong-1x1"]["planned_per_device_batch"] == 32 and rows["strong-1x2"]["planned_per_device_batch"] == 16
    ignored = [n for n in results["notes"] if n.startswith("The script ignored the batch the study planned")]
    assert len(ignored) == 1 and "strong-1x1 (64, not 32)" in ignored[0] and "strong-1x2 (64, not 16)" in ignored[0]
    assert ignored[0] in " ".join(result.stdout.split())  # said where the user reads, not only in the JSON


def test_ranks_that_never_synchronised_show_no_speedup_and_say_why(study):
    out, result, results = study
    two = next(row for row in results["rows"] if row["name"] == "strong-1x2")
    assert two["synchronised"] is False
    assert two["speedup"] is None and two["efficiency"] is None and two["cost_ratio"] is None
    assert two["samples_per_s"] > 0  # its own throughput is still shown
    why = [n for n in results["notes"] if n.startswith("strong-1x2: its 2 ranks trained independent copies")]
    # the likely cause fits the script: it loaded no library that distributes, and never set up DDP itself
    assert len(why) == 1 and "never calls torch.distributed.init_process_group" in why[0] and "ACCELERATE" not in why[0]
    table = result.stdout[re.search(r"^run +scaling ", result.stdout, re.M).start():]
    line = next(line for line in table.splitlines() if line.startswith("strong-1x2 "))
    assert "—" in line and "%" not in line.split()[6:8]  # no speed-up, no efficiency
    assert not any("strong scaling" in s.lower() and "faster" in s for s in results["answer"])
    # each rank counted its own 2048 samples: two copies of the whole data set, not one shared between them
    summary = json.loads((out / "strong-1x2" / "summary.json").read_text())
    assert summary["samples"] == 2 * 2 * 2048
