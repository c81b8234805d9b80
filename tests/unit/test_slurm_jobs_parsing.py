"""Reading SLURM's answers (pure parts of gpuscale.slurm.jobs) and the missing-tool message."""

from __future__ import annotations

import pytest

from gpuscale.slurm import jobs


def test_scontrol_line_is_parsed_into_fields():
    # scontrol -o does not quote: values with spaces or quotes must survive
    line = ("JobId=42 JobName=train run UserId=root(0) JobState=FAILED Reason=NonZeroExitCode "
            "ExitCode=3:0 NodeList=n[1-2] Comment=it's odd StdOut=/tmp/out dir/job-42.out Restarts=1\n")
    fields = jobs._parse_scontrol(line)
    assert fields["JobId"] == "42" and fields["JobName"] == "train run" and fields["JobState"] == "FAILED"
    assert fields["Comment"] == "it's odd" and fields["UserId"] == "root(0)" and fields["NodeList"] == "n[1-2]"
    assert fields["StdOut"] == "/tmp/out dir/job-42.out" and fields["Restarts"] == "1"


@pytest.mark.parametrize("text, code", [("0:0", 0), ("3:0", 3), ("0:9", 137), ("0:15", 143), ("", None), ("x:y", None)])
def test_exit_codes_follow_the_shell_convention(text, code):
    assert jobs._exit_code(text) == code


def test_missing_slurm_tools_say_how_to_get_a_cluster(monkeypatch):
    monkeypatch.setattr(jobs.shutil, "which", lambda name: None)
    with pytest.raises(jobs.SlurmError, match="sbatch not found.*scripts/local-slurm/start.sh"):
        jobs.submit("#!/bin/bash\n")


def test_job_info_states():
    info = jobs.JobInfo(job_id="1", name="n", state="COMPLETED", exit_code=0, reason=None, nodes="n1", stdout_path=None)
    assert info.finished and info.succeeded
    assert not jobs.JobInfo(job_id="1", name="n", state="RUNNING", exit_code=None, reason=None, nodes=None, stdout_path=None).finished
    assert not jobs.JobInfo(job_id="1", name="n", state="COMPLETED", exit_code=2, reason=None, nodes=None, stdout_path=None).succeeded


def test_squeue_says_none_for_no_reason_and_a_job_line_leaves_it_out(monkeypatch):
    """squeue's %r is the literal "None" for a running job: no reason, not a reason named None."""
    monkeypatch.setattr(jobs, "_run", lambda cmd: "7|gpuscale|RUNNING|None|n1\n8|gpuscale|PENDING|Resources|\n")
    running, pending = jobs.list_jobs()
    assert (running.state, running.reason, running.nodes) == ("RUNNING", None, "n1")
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "Resources", None)
