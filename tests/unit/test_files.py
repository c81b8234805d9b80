"""files.py: under the worst umask new directories and files are never world-writable, the umask helper restores; which
summary a run that trained nothing keeps."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpuscale.base.files import atomic_write, atomic_write_json, make_dir, tighten_umask
from gpuscale.cli import main


@pytest.fixture
def umask_000():
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_make_dir_creates_every_level_without_write_for_others(tmp_path, umask_000):
    target = make_dir(tmp_path / "a" / "b" / "c")
    assert target.is_dir()
    for level in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert _mode(level) == 0o775, oct(_mode(level))  # Path.mkdir(parents=True) would give 0777 here
    make_dir(target)  # exists: fine, untouched
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        make_dir(tmp_path / "file")


def test_make_dir_leaves_existing_directories_alone(tmp_path, umask_000):
    os.chmod(tmp_path, 0o700)
    make_dir(tmp_path / "new")
    assert _mode(tmp_path) == 0o700 and _mode(tmp_path / "new") == 0o775


def test_atomic_writes_are_0644_in_new_directories_whatever_the_umask(tmp_path, umask_000):
    path = atomic_write_json(tmp_path / "x" / "y" / "data.json", {"a": 1})
    assert _mode(path) == 0o644 and _mode(tmp_path / "x") == 0o775 and _mode(tmp_path / "x" / "y") == 0o775
    script = atomic_write(tmp_path / "job.sh", lambda f: f.write(b"#!/bin/sh\n"), mode=0o755)
    assert _mode(script) == 0o755


def test_tighten_umask_adds_not_by_others_and_returns_the_old_one(tmp_path):
    for start, tightened in ((0o000, 0o002), (0o022, 0o022), (0o077, 0o077), (0o020, 0o022)):
        before = os.umask(start)
        try:
            assert tighten_umask() == start
            assert os.umask(tightened) == tightened  # (reading the umask means setting it)
        finally:
            os.umask(before)


def test_cli_tightens_the_umask_while_a_verb_runs_and_restores_it(tmp_path, umask_000, capsys):
    out = tmp_path / "deep" / "job.sh"
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert main(["slurm", "script", "--profile", "local", "--gpus-per-node", "1", "-o", str(out), "--", str(script)]) == 0
    assert _mode(out) == 0o755 and _mode(tmp_path / "deep") == 0o775
    assert os.umask(0) == 0  # put back for the caller


def test_a_run_that_trained_nothing_finds_the_summary_of_the_run_that_trained(tmp_path):
    """A finished run started again took no step: the summary of a run that trained is found, whatever its experiment
    (its differences named key by key); a summary with no steps, or an unreadable one, is not."""
    from gpuscale.base.files import experiment_differences, trained_summary

    untrained = {"world_size": 2, "scaling": "strong", "global_batch": 32, "per_device_batch": 16, "grad_accum_steps": 1,
                 "steps": 0}
    path = tmp_path / "summary.json"
    assert trained_summary(path) is None  # none there
    path.write_text(json.dumps({**untrained, "steps": 64, "samples_per_s": 1564.0}))
    assert trained_summary(path)["samples_per_s"] == 1564.0 and experiment_differences(trained_summary(path), untrained) == []
    path.write_text(json.dumps({**untrained, "steps": 64, "world_size": 1, "per_device_batch": 32}))
    assert experiment_differences(trained_summary(path), untrained) == ["world_size 1, not 2", "per_device_batch 32, not 16"]
    # a probed run that took no step saw no batch: what it does not know differs in nothing
    assert experiment_differences(trained_summary(path), {**untrained, "per_device_batch": None}) == ["world_size 1, not 2"]
    path.write_text(json.dumps(untrained))
    assert trained_summary(path) is None  # it trained nothing either
    path.write_text("{not json")
    assert trained_summary(path) is None
