"""The batch script's stop handling, run by bash with stand-in srun/scontrol: a USR1 or TERM to the batch
shell reaches the step as USR1 and the script waits for the step to end and exits with the step's
code; after USR1 (SLURM's warning before the time limit) it requeues itself within --max-requeues,
after TERM (scancel, preemption) it does not; without a signal nothing is requeued."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time

import pytest

from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import JobSpec, render_sbatch

# The "training step": records the signals it gets, ends with 75 after USR1 (like gpuscale.StopSignal.exit),
# or with 0 after a few seconds if nobody asks it to stop.
STEP = """
import os, signal, sys, time
got = []
def on(signum, frame):
    got.append(signal.Signals(signum).name)
signal.signal(signal.SIGUSR1, on)
open(os.environ["STEP_READY"], "w").write(str(os.getpid()))
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline and not got:
    time.sleep(0.05)
time.sleep(0.3)  # "writing the checkpoint"; a second signal may arrive meanwhile
open(os.environ["STEP_SEEN"], "w").write(",".join(got))
sys.exit(75 if got else 0)
"""


def _job_script(tmp_path, max_requeues=10):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nif [ "$1" = requeue ]; then echo "$@" >> "$REQUEUES"; else echo node1; fi\n')
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')  # runs task 0 only
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    step = tmp_path / "step.py"
    step.write_text(STEP)
    job = JobSpec(script=str(step), script_args=("20",), mode="srun", gpus_per_node=1, python="python3", max_requeues=max_requeues)
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(load_profile("local"), job))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "4242",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "REQUEUES": str(tmp_path / "requeues"),
           "STEP_READY": str(tmp_path / "ready"), "STEP_SEEN": str(tmp_path / "seen")}
    return script, env


def _start(script, env, tmp_path, restarts=0):
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env={**env, "SLURM_RESTART_COUNT": str(restarts)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the step never started"
        time.sleep(0.05)
    return proc


def test_the_warning_signal_stops_the_step_and_requeues_the_job(tmp_path):
    script, env = _job_script(tmp_path)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert (tmp_path / "seen").read_text().startswith("SIGUSR1"), "the step was not told to stop"
    assert proc.returncode == 75, err  # the step's own exit code, not the interrupted wait's
    assert (tmp_path / "requeues").read_text().split() == ["requeue", "4242"]
    assert "USR1 received" in err and "restart 1 of at most 10" in err


def test_term_stops_the_step_at_a_checkpoint_but_a_cancelled_job_stays_cancelled(tmp_path):
    """scancel sends TERM: the step still stops at a checkpoint, but the job is not requeued."""
    script, env = _job_script(tmp_path)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (tmp_path / "seen").read_text().startswith("SIGUSR1") and proc.returncode == 75
    assert not (tmp_path / "requeues").exists()
    assert "TERM received, step ended with 75; not requeued" in err


def test_no_signal_no_requeue(tmp_path):
    script, env = _job_script(tmp_path)
    env_short = {**env}
    script.write_text(script.read_text().replace(" 20 &", " 0.5 &"))  # the step ends by itself
    proc = _start(script, env_short, tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not (tmp_path / "requeues").exists()


def test_requeues_stop_after_max_requeues(tmp_path):
    script, env = _job_script(tmp_path, max_requeues=2)
    proc = _start(script, env, tmp_path, restarts=2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75
    assert not (tmp_path / "requeues").exists()
    assert "already requeued 2 times" in err


def test_max_requeues_zero_asks_slurm_not_to_requeue(tmp_path):
    text = render_sbatch(load_profile("local"), JobSpec(script="t.py", max_requeues=0))
    assert "#SBATCH --no-requeue" in text and "scontrol requeue" not in text
    text = render_sbatch(load_profile("local"), JobSpec(script="t.py"))
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@120" in text and "#SBATCH --open-mode=append" in text
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in text  # torchrun passes USR1 on


def test_a_time_limit_shorter_than_the_warning_is_refused():
    with pytest.raises(ValueError, match="not longer than the 120 s warning"):
        render_sbatch(load_profile("local"), JobSpec(script="t.py", time="2"))
    assert "--signal=B:USR1@30" in render_sbatch(load_profile("local", {"warn_before_end_s": 30}), JobSpec(script="t.py", time="1"))

