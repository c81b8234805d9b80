"""A rank that fails inside a SLURM job: the job ends quickly with that rank's own exit code, and its log tells one
story, in both launch modes, at 1 node x 2 GPUs and at 2 nodes x 1 GPU, for a raise, a SIGKILL, an exit 75 (which
requeues the job) and the time limit. srun alone would return its tasks' highest code (a victim's 143) and
torchrun a 1 for any failure, with its FAILED block and a traceback per node.

The sixteen jobs are submitted together at the start (the cluster runs two at a time, all 1 x 2 jobs first), and each case then waits
for its own. The story is the whole job log: at most 15 lines, the failing rank's own message first, at most one
line for each other node, and a last line naming the first failure and the job's exit code.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm
DIE = str(ROOT / "tests" / "multiproc" / "scripts" / "die.py")
STORY_LINES = 15
MODES = ("srun", "torchrun")
LAYOUTS = ("1x2", "2x1")
FAILURES = ("timeout", "raise", "kill", "requeue")  # the time limit first: those jobs take longest
# Grouped by layout: the two nodes run two 1 x 2 jobs at once, or two 2 x 1 jobs, but not one of each.
CASES = [(failure, mode, layout) for layout in LAYOUTS for failure in FAILURES for mode in MODES]
TORCHRUN_NOISE = ("FAILED", "Traceback", "exitcode", "closing signal", "SignalException", "Root Cause", "error_file")


def _scontrol(cluster, job: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "show", "job", "-o", job], env=cluster.env, capture_output=True, text=True, timeout=30).stdout
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Every case's job id and folder, all submitted before the first case waits."""
    submitted = {}
    for failure, mode, layout in CASES:
        folder = tmp_path_factory.mktemp(f"{failure}-{mode}-{layout}")
        nodes, gpus = layout.split("x")
        limit = ["--time", "1", "--set", "warn_before_end_s=10"] if failure == "timeout" else ["--time", "10"]
        result = cluster.gpuscale("slurm", "submit", "--profile", "local", *limit, "--mode", mode, "--nodes", nodes,
                                  "--gpus-per-node", gpus, "--output", str(folder / "job-%j.out"), "--", DIE,
                                  "run" if failure == "timeout" else failure, cwd=folder, timeout=120)
        assert result.returncode == 0, result.stderr
        submitted[(failure, mode, layout)] = (result.stdout.strip().split()[-1], folder)
    yield submitted
    subprocess.run(["scancel", *(job for job, _ in submitted.values())], env=cluster.env, timeout=60)


def _wait(cluster, job: str, folder: Path, failure: str, timeout: float = 900) -> dict[str, str]:
    """The job's fields once it ended (a requeue case: once it requeued itself; it is then cancelled)."""
    deadline = time.monotonic() + timeout
    while True:
        fields = _scontrol(cluster, job)
        if failure == "requeue" and fields.get("Restarts") == "1":
            subprocess.run(["scancel", job], env=cluster.env, timeout=30, check=True)  # its second run is not this test's
            return fields
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
            return fields
        assert time.monotonic() < deadline, f"job {job} did not end ({fields.get('JobState')})\n{_log(folder)}"
        time.sleep(1)


def _log(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.glob("job-*.out")))


def _hosts(lines: list[str]) -> dict[int, str]:
    """Rank -> host, from the placement table gpuscale.init() prints."""
    return {int(rank): host for host, rank in (re.match(r"^(\S+)\s+(\d+)\s+\d+\s+cpu\s", line).groups()
                                               for line in lines if re.match(r"^\S+\s+\d+\s+\d+\s+cpu\s", line))}


EXPECTED = {  # the failing rank's own message, the job's exit code, the last line's start
    "raise": ("[gpuscale] rank 1/2 on {host} failed: planted failure on rank 1", 1, "gpuscale: rank 1 on {host} failed first, with exit code 1 "),
    "kill": ("[gpuscale] rank 1/2 on {host} was killed by SIGKILL (exit code 137)", 137,
             "gpuscale: rank 1 on {host} failed first, with exit code 137 "),
    "requeue": ("[gpuscale] rank 1/2 on {host} exited with code 75 (EX_TEMPFAIL: it asks for the job to run again)", 75,
                "gpuscale: rank 1 on {host} ended first, with exit code 75 "),
}


@pytest.mark.parametrize("failure, mode, layout", CASES, ids=[f"{m}-{lay}-{f}" for f, m, lay in CASES])
def test_a_failure_ends_the_job_with_the_failing_ranks_code_and_one_short_story(cluster, jobs, failure, mode, layout):
    job, folder = jobs[(failure, mode, layout)]
    fields = _wait(cluster, job, folder, failure)
    text = _log(folder)
    lines = text.splitlines()
    where = f"{mode} {layout} {failure}, job {job}:\n{text}"
    assert len(lines) <= STORY_LINES, f"{len(lines)} lines; " + where
    assert not [line for line in lines if any(noise in line for noise in TORCHRUN_NOISE)], where
    hosts = _hosts(lines)
    assert sorted(hosts) == [0, 1], where
    told = [i for i, line in enumerate(lines) if line.startswith("[gpuscale] rank")]
    if failure == "timeout":
        assert fields["JobState"] == "TIMEOUT" and fields["Restarts"] == "0" and "requeueing" not in text, where
        assert _elapsed(fields["RunTime"]) >= 60, where  # the script ran on to its one-minute limit
        assert "gpuscale: the script does not stop at a checkpoint on SLURM's warning (no gpuscale.StopSignal): it runs on to its time " \
               "limit and is not requeued" in lines, where
        start = next(i for i, line in enumerate(lines) if "DUE TO TIME LIMIT" in line)
        assert lines[-1] == ("gpuscale: the ranks were stopped with TERM (by SLURM: the time limit, scancel or preemption, as its line "
                             "above says); the job ends with 143"), where
        assert not [i for i in told if i > start], where  # no rank claims to have failed
        return
    own, code, last = EXPECTED[failure]
    host = hosts[1]
    first = lines.index(own.format(host=host))  # the failing rank's own message, once ...
    assert first == told[0] and text.count(own.format(host=host)) == 1, where  # ... before any other rank's
    others = [lines[i] for i in told[1:]]  # each other node: one line at most (the other rank on the failing node may add one)
    assert len([line for line in others if f" on {host} " not in line]) <= (1 if layout == "2x1" else 0), where
    closing = [i for i, line in enumerate(lines) if line.startswith(last.format(host=host))]
    assert closing and closing[0] > first and lines[closing[0]].endswith(f"the job ends with {code}" if failure != "requeue" else
                                                                         "which asks for the job to run again; the job ends with 75"), where
    if failure == "requeue":  # (SLURM's own line on the requeue may follow)
        assert lines[closing[0] + 1] == (f"gpuscale: the step stopped at a checkpoint; requeueing job {job} (restart 1 of at most 10) "
                                         "to resume from it"), where
    else:
        assert closing[0] == len(lines) - 1, where
        assert fields["ExitCode"] == f"{code}:0", (fields["ExitCode"], where)
        assert fields["JobState"] == "FAILED", where
        assert _elapsed(fields["RunTime"]) < 60, where  # ended by the failure, long before its 10 minutes


def _elapsed(runtime: str) -> int:
    hours, minutes, seconds = (int(x) for x in runtime.split(":"))
    return hours * 3600 + minutes * 60 + seconds
