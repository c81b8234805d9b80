"""kill -9 in the middle of a checkpoint write: the previous checkpoint stays loadable, no half file is ever taken."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gpuscale.train.checkpoint import Checkpointer

from procs import ROOT, SCRIPTS, clean_env

pytestmark = pytest.mark.multiproc


def test_sigkill_while_writing_leaves_the_previous_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "save_forever.py"), str(out)], env=clean_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # wait until the big checkpoint's temporary file exists and is growing: the write is under way
        while not (out / "saved-1").exists() or not any(p.name.endswith(".tmp") and p.stat().st_size > 1 << 20
                                                         for p in out.glob(".step-000000002.pt.*")):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the big checkpoint never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    visible = sorted(p.name for p in out.iterdir() if p.name.startswith("step-"))
    assert visible == ["step-000000001.pt", "step-000000001.pt.sha256"], visible  # the half-written one never got its name
    state = Checkpointer(out, rt=SimpleNamespace()).peek()  # reading needs no process group
    assert state.step == 1 and state.path.name == "step-000000001.pt"
