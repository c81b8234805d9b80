"""The batch script's stop handling, run by bash with stand-in srun/scontrol (srun runs task 0 only): SLURM's
warning (USR1 to the batch shell) reaches a script that stops at a checkpoint on it (a real gpuscale.StopSignal,
also under a real torchrun) and the job requeues itself within --max-requeues; a script without it is not
signalled, runs on and is not requeued; TERM (scancel, preemption) stops at a checkpoint but never requeues."""

from __future__ import annotations

import glob
import itertools
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import JobSpec, render_sbatch

# A script that stops at a checkpoint on USR1/TERM (gpuscale.StopSignal), or ends by itself after argv[1] seconds.
STOPPER = """
import os, sys, time
import gpuscale
with gpuscale.init(show_placement=False):
    stop = gpuscale.StopSignal()
    open(os.environ["STEP_READY"], "w").write(str(os.getpid()))
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        if stop.requested():
            time.sleep(0.3)  # "writing the checkpoint"; a second signal may arrive meanwhile
            open(os.environ["STEP_SEEN"], "w").write(stop.signal_name or "")
            stop.exit()
        time.sleep(0.05)
"""

# A plain script (no gpuscale): USR1 would end it at once; it says whether it ran to its end.
PLAIN = """
import os, sys, time
open(os.environ["STEP_READY"], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[1]))
open(os.environ["STEP_SEEN"], "w").write("ran to its end")
"""

# srun's stand-in: runs task 0 only, passes USR1 on to every process of it (as SLURM signals every process of a
# step) and notes the step's exit status.
SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
"$@" &
task=$!
trap 'for p in "$task" $(pgrep -P "$task"); do kill -USR1 "$p" 2>/dev/null; done' USR1
code=0; wait "$task" || code=$?
while kill -0 "$task" 2>/dev/null; do code=0; wait "$task" || code=$?; done
echo "$code" > "$STEP_STATUS"
exit "$code"
"""

_JOB_IDS = itertools.count(4242 + 1000 * (os.getpid() % 1000))


def _job_script(tmp_path, step=STOPPER, seconds=20.0, **job):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nif [ "$1" = requeue ]; then echo "$@" >> "$REQUEUES"; else echo node1; fi\n')
    (bin_dir / "srun").write_text(SRUN)
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "step.py"
    script.write_text(step)
    spec = {"mode": "srun", "gpus_per_node": 1, "python": sys.executable, **job}
    (tmp_path / "job.sh").write_text(render_sbatch(load_profile("local"), JobSpec(script=str(script), script_args=(str(seconds),), **spec)))
    job_id = str(next(_JOB_IDS))
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPUSCALE_")) and k not in ("RANK", "WORLD_SIZE")}
    env = {**keep, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": job_id,
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
           "REQUEUES": str(tmp_path / "requeues"), "STEP_READY": str(tmp_path / "ready"), "STEP_SEEN": str(tmp_path / "seen"),
           "STEP_STATUS": str(tmp_path / "status")}
    return tmp_path / "job.sh", env


def _start(script, env, tmp_path, restarts=0):
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env={**env, "SLURM_RESTART_COUNT": str(restarts)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"the step never started: {proc.communicate()}"
        time.sleep(0.05)
    time.sleep(0.2)
    return proc


def _requeues(tmp_path) -> list[str]:
    return (tmp_path / "requeues").read_text().split() if (tmp_path / "requeues").exists() else []


def test_the_warning_stops_a_script_at_its_checkpoint_and_requeues_the_job(tmp_path):
    script, env = _job_script(tmp_path)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert (tmp_path / "seen").read_text() == "SIGUSR1", "the step was not told to stop"
    assert proc.returncode == 75, err  # the step's own exit code, not the interrupted wait's
    assert _requeues(tmp_path) == ["requeue", env["SLURM_JOB_ID"]]
    assert "USR1 received; passed on to the step" in err and "restart 1 of at most 10" in err
    assert not glob.glob(f"/tmp/gpuscale-{env['SLURM_JOB_ID']}.*"), "the marker's folder was left behind"


def test_a_script_without_stop_signal_is_not_signalled_runs_on_and_is_not_requeued(tmp_path):
    script, env = _job_script(tmp_path, step=PLAIN, seconds=3)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "seen").read_text() == "ran to its end"
    assert _requeues(tmp_path) == []
    assert ("gpuscale: the script does not stop at a checkpoint on SLURM's warning (no gpuscale.StopSignal): "
            "it runs on to its time limit and is not requeued") in err.splitlines()


# A script with a SIGUSR1 handler of its own (Lightning's SLURM auto-requeue does this when its Trainer starts), no gpuscale.
OWN_HANDLER = """
import os, signal, sys, time
def on_usr1(signum, frame):
    open(os.environ["STEP_SEEN"], "w").write("its own handler ran")
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_usr1)
open(os.environ["STEP_READY"], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[1]))
open(os.environ["STEP_SEEN"], "w").write("ran to its end")
"""


def test_a_script_with_its_own_usr1_handler_gets_the_warning_and_gpuscale_does_not_requeue(tmp_path):
    """gpuscale's start-up hook notes the handler the script installs; the batch script passes SLURM's warning on to
    it (Lightning's handler checkpoints and requeues the job itself) and requeues nothing of its own."""
    script, env = _job_script(tmp_path, step=OWN_HANDLER, seconds=20)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert (tmp_path / "seen").read_text() == "its own handler ran", err
    assert proc.returncode == 0 and _requeues(tmp_path) == []
    assert "gpuscale: USR1 received; passed on to the step, whose script handles it with its own SIGUSR1 handler" in err
    assert "gpuscale did not requeue it (the script may have)" in err and "not stop at a checkpoint" not in err


def test_term_stops_the_script_at_its_checkpoint_but_a_cancelled_job_stays_cancelled(tmp_path):
    """scancel sends TERM: the step still stops at a checkpoint (told by USR1: srun would turn TERM into KILL)."""
    script, env = _job_script(tmp_path)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (tmp_path / "seen").read_text() == "SIGUSR1" and proc.returncode == 75, err
    assert _requeues(tmp_path) == []
    assert "TERM received, the step stopped at a checkpoint; not requeued" in err


@pytest.mark.parametrize("launcher", ["plain torchrun", "gpuscale agent"])
def test_under_torchrun_the_stop_reaches_the_batch_script(tmp_path, launcher):
    """A real torchrun (the one installed) reports its worker's 75 as 1; the note beside the marker tells the stop.
    gpuscale's agent, which the batch script runs in torchrun's place where the job's Python has gpuscale, ends the
    node's task with 75 itself (not 128 + USR1)."""
    script, env = _job_script(tmp_path, mode="torchrun")
    if launcher == "plain torchrun":  # a job Python without gpuscale's agent
        text = script.read_text()
        assert text.count('if [ -f "$agent" ]') == 1
        script.write_text(text.replace('if [ -f "$agent" ]', "if false"))
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=90)
    assert (tmp_path / "seen").read_text() == "SIGUSR1", err[-3000:]
    status = (tmp_path / "status").read_text().strip()
    if launcher == "plain torchrun":
        assert status not in ("", "0", "75"), "torchrun passed its worker's 75 on after all"
    else:
        assert status == "75", err[-3000:]
    assert proc.returncode == 75 and _requeues(tmp_path) == ["requeue", env["SLURM_JOB_ID"]], err[-3000:]


def test_no_signal_no_requeue(tmp_path):
    script, env = _job_script(tmp_path, seconds=0.5)
    proc = _start(script, env, tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _requeues(tmp_path) == [] and "gpuscale:" not in err


def test_requeues_stop_after_max_requeues(tmp_path):
    script, env = _job_script(tmp_path, max_requeues=2)
    proc = _start(script, env, tmp_path, restarts=2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75
    assert _requeues(tmp_path) == []
    assert "already requeued 2 times" in err


def test_max_requeues_zero_stops_at_a_checkpoint_without_requeue(tmp_path):
    script, env = _job_script(tmp_path, max_requeues=0)
    proc = _start(script, env, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75 and _requeues(tmp_path) == []
    assert "not requeued (--max-requeues 0)" in err


def test_max_requeues_zero_asks_slurm_not_to_requeue():
    text = render_sbatch(load_profile("local"), JobSpec(script="t.py", max_requeues=0))
    assert "#SBATCH --no-requeue" in text and "scontrol requeue" not in text
    text = render_sbatch(load_profile("local"), JobSpec(script="t.py"))
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@120" in text and "#SBATCH --open-mode=append" in text


def test_a_time_limit_shorter_than_the_warning_is_refused():
    with pytest.raises(ValueError, match="not longer than the 120 s warning"):
        render_sbatch(load_profile("local"), JobSpec(script="t.py", time="2"))
    assert "--signal=B:USR1@30" in render_sbatch(load_profile("local", {"warn_before_end_s": 30}), JobSpec(script="t.py", time="1"))


def test_the_hook_notes_the_scripts_own_usr1_handler_not_gpuscales(tmp_path, monkeypatch):
    from gpuscale.base.exits import own_usr1_marker, watch_usr1_handlers
    from gpuscale.train.preempt import StopSignal

    marker = str(tmp_path / "stops-at-checkpoint")
    monkeypatch.setattr(signal, "signal", signal.signal)  # restored after the test: the watch replaces it
    before = signal.getsignal(signal.SIGUSR1)
    try:
        watch_usr1_handlers({"GPUSCALE_STOP_MARKER": marker})
        signal.signal(signal.SIGUSR1, StopSignal._handle.__get__(object()))  # gpuscale's own: StopSignal says so itself
        signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # another signal
        assert not os.path.exists(own_usr1_marker(marker))
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # the script's own (Lightning's, say)
        assert os.path.exists(own_usr1_marker(marker))
    finally:
        signal.signal(signal.SIGUSR1, before)
