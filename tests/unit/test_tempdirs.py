"""gpuscale.base.tempdirs: a launcher's temporary folders carry its process id; those of launchers that are gone (a
SIGKILLed `gpuscale run` cannot remove its own) are removed when the next one starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from gpuscale.base.tempdirs import launcher_temp_dir, remove_orphaned


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_folders_of_gone_launchers_are_removed_and_the_others_kept(tmp_path):
    host = socket.gethostname()
    gone = tmp_path / f"gpuscale-failures-{_dead_pid()}@{host}@abc123"
    alive = tmp_path / f"gpuscale-failures-{os.getpid()}@{host}@def456"
    older = tmp_path / "gpuscale-failures-4vg3_8g4"  # named before the pid was in the name: not ours to judge
    other_kind = tmp_path / f"gpuscale-probe-{_dead_pid()}@{host}@x"
    other_host = tmp_path / f"gpuscale-failures-{_dead_pid()}@{host}-2@y"  # a shared TMPDIR: another node's pid
    for folder in (gone, alive, older, other_kind, other_host):
        folder.mkdir()
        (folder / "rank-0.json").write_text("{}")
    assert remove_orphaned("failures", tmp_path) == [gone]
    assert not gone.exists() and alive.exists() and older.exists() and other_kind.exists() and other_host.exists()


def test_a_launchers_folder_names_its_process(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale = tmp_path / f"gpuscale-probe-{_dead_pid()}@{socket.gethostname()}@zzz"
    stale.mkdir()
    with launcher_temp_dir("probe") as folder:
        assert os.path.basename(folder).startswith(f"gpuscale-probe-{os.getpid()}@{socket.gethostname()}@")
        assert not stale.exists()
