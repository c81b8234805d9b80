"""gpuscale.base.lifeline: the kernel's parent-death signal, set by init() under torchrun and put back after.

What it is for (a SIGKILLed launcher leaves no workers behind) is tested with real launchers in
tests/multiproc/test_launcher_killed.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import gpuscale
from gpuscale.base.lifeline import end_with_parent, parent_death_signal


@pytest.fixture(autouse=True)
def _no_parent_death_signal():
    before = parent_death_signal()
    end_with_parent(0)
    yield
    end_with_parent(before)


def test_the_signal_is_set_read_back_and_cleared():
    assert parent_death_signal() == 0
    assert end_with_parent(signal.SIGTERM)
    assert parent_death_signal() == signal.SIGTERM
    assert end_with_parent(0)
    assert parent_death_signal() == 0


def test_init_under_torchrun_ends_with_the_launcher_and_puts_the_setting_back(single_process, monkeypatch):
    for name, value in (("TORCHELASTIC_RUN_ID", "test"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("LOCAL_WORLD_SIZE", "1"), ("GROUP_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    with gpuscale.init(show_placement=False) as rt:
        assert rt.env.launcher == "torchrun"
        assert parent_death_signal() == signal.SIGTERM
    assert parent_death_signal() == 0


def test_init_elsewhere_leaves_the_setting_alone(single_process):
    with gpuscale.init(show_placement=False) as rt:
        assert rt.env.launcher == "single"
        assert parent_death_signal() == 0


def _orphan(tmp_path, body: str, **env: str) -> tuple[int, float]:
    """Start a parent process whose child runs `body` (then sleeps), SIGKILL the parent once the child has started;
    (the child's pid, the time of the kill). The caller ends the child."""
    child_pid, child = tmp_path / "child.pid", tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import os, signal, time
        from gpuscale.base.lifeline import end_with_parent
        {body}
        open({str(child_pid)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """))
    program = f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(child)!r}]); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", program], env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 60
        while not (child_pid.exists() and child_pid.read_text()):
            assert time.monotonic() < deadline and parent.poll() is None, "the child never started"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()
    return int(child_pid.read_text()), time.monotonic()


def _ends_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _runs(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


def test_a_child_that_asked_ends_when_its_parent_is_killed(tmp_path):
    pid, _ = _orphan(tmp_path, "assert end_with_parent()")
    assert _ends_within(pid, 10), "the child outlived its parent"


def test_a_child_whose_handler_does_not_end_it_is_killed_after_the_grace(tmp_path):
    """A TERM handler that does not end the process stands for one that cannot run (the main thread blocked in a
    collective): the watchdog kills it once the parent has been gone the grace (1 s here), not before."""
    pid, killed_at = _orphan(tmp_path, "assert end_with_parent(); signal.signal(signal.SIGTERM, lambda *_: None)",
                             GPUSCALE_ORPHAN_GRACE_S="1")
    assert _ends_within(pid, 15), "the orphan outlived its grace"
    assert time.monotonic() - killed_at >= 1.0


def test_a_child_that_withdrew_the_request_is_left_alone(tmp_path):
    pid, _ = _orphan(tmp_path, "end_with_parent(); end_with_parent(0); signal.signal(signal.SIGTERM, lambda *_: None)",
                     GPUSCALE_ORPHAN_GRACE_S="0.2")
    assert not _ends_within(pid, 3), "a child that withdrew its request was ended"  # _ends_within killed it


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
