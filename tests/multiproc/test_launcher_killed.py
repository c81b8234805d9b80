"""A launcher killed with SIGKILL leaves no workers training on (gpuscale.base.lifeline).

torchrun's agent watches its workers, not the other way round: without gpuscale the workers of
a SIGKILLed `gpuscale run` or torchrun keep training together, unsupervised, writing into the
checkpoint directory the relaunched run will use.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from procs import ROOT, SCRIPTS, clean_env, gpuscale_cmd, torchrun_cmd

pytestmark = pytest.mark.multiproc
OUTLIVE = str(SCRIPTS / "outlive.py")


def _alive(pid: int) -> bool:
    """A process that runs (an orphan that ended may linger as a zombie until its reaper waits for it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(what: str, condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _kill_launcher_while_training(cmd: list[str], out: Path, **env: str) -> list[int]:
    """Start `cmd`, SIGKILL it once both ranks train, and return the workers' pids."""
    launcher = subprocess.Popen(cmd, env=clean_env(**env), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pid_files = [out / f"pid-{rank}" for rank in range(2)]
    workers: list[int] = []
    try:
        _wait_for("both ranks to train", lambda: all(p.exists() and p.read_text() for p in pid_files) or launcher.poll() is not None, 120)
        assert launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
        workers = [int(p.read_text()) for p in pid_files]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _wait_for("the workers to end with their launcher", lambda: not any(_alive(pid) for pid in workers), 30)
    finally:
        for pid in workers:  # never leave them behind, whatever the test found
            if _alive(pid):
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return workers


@pytest.mark.parametrize("launcher", ["gpuscale run", "torchrun"])
def test_workers_end_when_their_launcher_is_killed(tmp_path, launcher):
    args = [OUTLIVE, str(tmp_path), "plain"]
    cmd = gpuscale_cmd("run", "--nproc-per-node", "2", *args) if launcher == "gpuscale run" else torchrun_cmd(2, *args)
    _kill_launcher_while_training(cmd, tmp_path)


def test_workers_of_a_killed_launcher_stop_together_at_a_checkpoint(tmp_path):
    """With a StopSignal the launcher's death is a stop request: every rank stops after the same step."""
    _kill_launcher_while_training(gpuscale_cmd("run", "--nproc-per-node", "2", OUTLIVE, str(tmp_path), "stop"), tmp_path)
    stopped = [(tmp_path / f"stopped-{rank}").read_text() for rank in range(2)]
    assert stopped[0] == stopped[1]


def test_workers_blocked_in_a_collective_end_after_the_grace(tmp_path):
    """Both ranks wait in gloo for each other, so the probe's TERM handler can never run: the lifeline's watchdog
    kills them once their launcher has been gone the grace (2 s here; torchrun's 30 s by default)."""
    started = time.monotonic()
    _kill_launcher_while_training(gpuscale_cmd("run", "--nproc-per-node", "2", OUTLIVE, str(tmp_path), "blocked"), tmp_path,
                                  GPUSCALE_ORPHAN_GRACE_S="2")
    assert time.monotonic() - started < 120
