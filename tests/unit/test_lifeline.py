"""gpuscale.base.lifeline: the kernel's parent-death signal, set by init() under torchrun and put back after.

What it is for (a SIGKILLed launcher leaves no workers behind) is tested with real launchers in
tests/multiproc/test_launcher_killed.py.
"""

from __future__ import annotations

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


def test_a_child_that_asked_ends_when_its_parent_is_killed(tmp_path):
    """A parent process starts a child that calls end_with_parent, then the parent is SIGKILLed."""
    child_pid, child = tmp_path / "child.pid", tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import os, time
        from gpuscale.base.lifeline import end_with_parent
        assert end_with_parent()
        open({str(child_pid)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """))
    program = f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(child)!r}]); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", program])
    try:
        deadline = time.monotonic() + 60
        while not (child_pid.exists() and child_pid.read_text()):
            assert time.monotonic() < deadline and parent.poll() is None, "the child never started"
            time.sleep(0.05)
        pid = int(child_pid.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _runs(pid):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
