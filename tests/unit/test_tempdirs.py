"""gpuscale.base.tempdirs: a launcher's temporary folders carry its process id; those of launchers that are gone (a
SIGKILLed `gpuscale run` cannot remove its own) are removed when the next one starts."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuscale.base.tempdirs import launcher_temp_dir, remove_orphaned


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_folders_of_gone_launchers_are_removed_and_the_others_kept(tmp_path):
    gone = tmp_path / f"gpuscale-failures-{_dead_pid()}-abc123"
    alive = tmp_path / f"gpuscale-failures-{os.getpid()}-def456"
    older = tmp_path / "gpuscale-failures-4vg3_8g4"  # named before the pid was in the name: not ours to judge
    other_kind = tmp_path / f"gpuscale-probe-{_dead_pid()}-x"
    for folder in (gone, alive, older, other_kind):
        folder.mkdir()
        (folder / "rank-0.json").write_text("{}")
    assert remove_orphaned("failures", tmp_path) == [gone]
    assert not gone.exists() and alive.exists() and older.exists() and other_kind.exists()


def test_a_launchers_folder_names_its_process(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale = tmp_path / f"gpuscale-probe-{_dead_pid()}-zzz"
    stale.mkdir()
    with launcher_temp_dir("probe") as folder:
        assert os.path.basename(folder).startswith(f"gpuscale-probe-{os.getpid()}-")
        assert not stale.exists()
