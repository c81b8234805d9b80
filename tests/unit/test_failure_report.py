"""A failing rank's report (gpuscale.runtime.failures.report_failure) is said once: not again by Python on the way out,
not again by a second rank of the node that failed the same way.

The first tests run a real interpreter that reports an exception as gpuscale.init() does and lets it
go on uncaught, and read what that process printed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from gpuscale.detect.env import DistEnv
from gpuscale.launch.verdicts import read_notes
from gpuscale.runtime.failures import FAILURE_DIR, report_failure

HOST = socket.gethostname()
BATCH = "global batch 33 does not divide among 2 ranks; use a global batch of 32 or 34"
GLOO = "[pair.cc:553] Connection closed by peer [127.0.0.1]:1770. This is typically caused by a remote worker crashing."


def rank_env(rank: int, world_size: int = 2) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size, node_rank=0, num_nodes=1,
                   master_addr="127.0.0.1", master_port=29500, launcher="torchrun")


def raise_reported(raised: str, tmp_path) -> subprocess.CompletedProcess[str]:
    """A process that raises `raised` in rank 1, reports it as gpuscale.init() does, and lets it go on, uncaught.

    An excepthook installed first stands for the probe's (which notes the exception in the rank's record):
    it must still see the exception, whatever is printed.
    """
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gpuscale.detect.env import DistEnv
        from gpuscale.runtime.failures import report_failure

        previous = sys.excepthook
        def probe_hook(kind, value, tb):
            Path({str(tmp_path / "seen")!r}).write_text(kind.__name__)
            previous(kind, value, tb)
        sys.excepthook = probe_hook

        env = DistEnv(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, num_nodes=1,
                      master_addr="127.0.0.1", master_port=29500, launcher="torchrun")
        try:
            raise {raised}
        except BaseException as exc:
            report_failure(env, exc)
            raise
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_usage_error_is_one_line_and_no_traceback(tmp_path):
    result = raise_reported(f"ValueError({BATCH!r})", tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"[gpuscale] rank 1/2 on {HOST} failed: {BATCH}"]
    assert (tmp_path / "seen").read_text() == "ValueError"  # the probe's hook still saw it


def test_an_error_is_printed_once_with_its_traceback(tmp_path):
    result = raise_reported("RuntimeError('boom')", tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"[gpuscale] rank 1/2 on {HOST} failed:\nTraceback (most recent call last):\n")
    assert result.stderr.count("Traceback") == 1 and result.stderr.count("RuntimeError: boom") == 1
    assert (tmp_path / "seen").read_text() == "RuntimeError"


def test_a_rank_that_lost_its_peer_says_one_line(tmp_path):
    result = raise_reported(f"RuntimeError({GLOO!r})", tmp_path=tmp_path)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"[gpuscale] rank 1/2 on {HOST} stopped: a peer rank failed or ended first (")


def test_one_process_leaves_a_usage_error_to_python():
    """With one process nobody else says it: Python's traceback, as without gpuscale."""
    code = textwrap.dedent(f"""
        from gpuscale.detect.env import DistEnv
        from gpuscale.runtime.failures import report_failure
        env = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
                      master_addr="127.0.0.1", master_port=29500, launcher="single")
        try:
            raise ValueError({BATCH!r})
        except ValueError as exc:
            report_failure(env, exc)
            raise
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.count("Traceback") == 1 and result.stderr.rstrip().endswith(f"ValueError: {BATCH}")


def test_the_same_error_on_two_ranks_is_printed_by_the_first_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAILURE_DIR, str(tmp_path))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # report_failure installs its hook: put the original back after
    for rank in (1, 0):
        report_failure(rank_env(rank), ValueError(BATCH))
    assert capsys.readouterr().err.splitlines() == [f"[gpuscale] rank 1/2 on {HOST} failed: {BATCH}"]
    notes = read_notes(tmp_path)
    assert notes[1]["repeat_of"] is None and notes[0]["repeat_of"] == 1
    assert [json.loads((tmp_path / f"rank-{r}.json").read_text())["message"] for r in (0, 1)] == [BATCH, BATCH]
    # a different error, a peer's symptom, and the same error after a restart (--max-restarts) are each said
    report_failure(rank_env(0), ValueError("something else"))
    report_failure(rank_env(0), RuntimeError(GLOO))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    report_failure(rank_env(0), ValueError(BATCH))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"[gpuscale] rank 0/2 on {HOST} failed: something else"
    assert "a peer rank failed or ended first" in err[1] and err[2] == f"[gpuscale] rank 0/2 on {HOST} failed: {BATCH}" and len(err) == 3
    assert sorted(p.name for p in tmp_path.iterdir() if ".rank-" in p.name) == []  # no claim left half-made


@pytest.mark.parametrize("directory", [None, "under a file"])
def test_without_a_shared_folder_every_rank_says_it(tmp_path, monkeypatch, capsys, directory):
    if directory is None:
        monkeypatch.delenv(FAILURE_DIR, raising=False)
    else:  # a folder nobody can make: the claim fails, and so does the note
        (tmp_path / "afile").write_text("")
        monkeypatch.setenv(FAILURE_DIR, str(tmp_path / "afile" / "failures"))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    for rank in (1, 0):
        report_failure(rank_env(rank), ValueError(BATCH))
    assert len(capsys.readouterr().err.splitlines()) == 2


def test_only_a_collective_that_lost_its_peer_is_cut_to_one_line(monkeypatch, capsys):
    """The start-up hook's excepthook, installed in every rank of any script: gloo's lost peer in a job of two
    ranks is one line; a download's "Connection reset by peer", or any error of a single process, keeps its traceback."""
    import sys

    from gpuscale.runtime.failures import one_line_for_a_lost_peer

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: (seen.append(value), print("TRACEBACK", file=sys.stderr)))
    one_line_for_a_lost_peer()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    gloo = RuntimeError("[/src/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6034")
    download = ConnectionResetError(104, "Connection reset by peer")
    for exc, one_line in ((gloo, True), (download, False)):
        sys.excepthook(type(exc), exc, None)
        err = capsys.readouterr().err
        assert ("TRACEBACK" not in err and "rank 0/2" in err and "Connection closed by peer" in err) if one_line \
            else err == f"[gpuscale] rank 0/2 on {socket.gethostname()} failed:\nTRACEBACK\n", err  # headed by its rank
    monkeypatch.setenv("WORLD_SIZE", "1")
    sys.excepthook(type(gloo), gloo, None)
    assert capsys.readouterr().err == "TRACEBACK\n"
    assert seen == [gloo, download, gloo]  # the hooks below still see every exception


def test_a_lost_peers_long_message_is_cut_at_a_word_not_mid_word():
    from gpuscale.runtime.failures import _lost_peer_line

    long = RuntimeError("[/src/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6034; the remote "
                        "process may have exited before reporting an error to this rank, so look at the other ranks' output for the "
                        "error that ended it")
    line = _lost_peer_line("[gpuscale] rank 0/2 on n1", long)
    inside = line.split("first (", 1)[1].rsplit("); its report", 1)[0]
    assert inside.endswith("...") and len(inside) <= 160 and long.args[0].split("] ", 1)[1].startswith(inside[:-3])
    assert inside[:-3].split()[-1] in long.args[0].split()  # the last word shown is a whole word


def test_torchruns_error_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """torchrun's launcher parses a failed rank's error file and fails on an empty one: a rank stopped while writing
    it (its peer failed first, and the launcher sends TERM) must leave no file rather than a cut one."""
    import json as json_module

    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    try:
        raise RuntimeError("planted")
    except RuntimeError as exc:
        report_failure(rank_env(1), exc)
    assert json.loads(target.read_text())["message"]["message"] == "RuntimeError: planted"  # torch's own format, whole
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]

    target.unlink()

    def stopped_mid_write(data, fp, **kwargs):  # the launcher's TERM, as the Python exception a TERM handler raises
        fp.write('{"message": {')
        raise KeyboardInterrupt

    monkeypatch.setattr(json_module, "dump", stopped_mid_write)
    try:
        raise RuntimeError("planted again")
    except RuntimeError as exc:
        with pytest.raises(KeyboardInterrupt):
            report_failure(rank_env(1), exc)
    assert not target.exists()  # nothing for the launcher to choke on; the rank's own note and report still count
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == str(target)  # put back
    capsys.readouterr()


def test_an_unreadable_error_file_names_this_nodes_first_failure(tmp_path):
    """A batch script's nodes share the failure folder: where torchrun could not read an error file, the agent names
    the earliest failure among its own node's ranks, not another node's earlier one (whose host it would misname)."""
    from gpuscale.launch.agent import _unreadable_error_file

    here = socket.gethostname()
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "time": 100.0, "host": "another-node", "symptom": False,
                                                      "message": "boom", "repeat_of": None}))
    (tmp_path / "rank-3.json").write_text(json.dumps({"rank": 3, "time": 101.0, "host": here, "symptom": False,
                                                      "message": "boom", "repeat_of": None}))
    outcome = _unreadable_error_file(str(tmp_path), None)
    assert outcome.code == 1 and outcome.rank == 3
    assert outcome.line.startswith(f"gpuscale run: rank 3 on {here} failed first (its error is above")


def test_a_node_agent_whose_ranks_stopped_at_a_checkpoint_ends_with_75_under_its_batch_scripts_marker(tmp_path, monkeypatch):
    """A batch script names the stop marker (its own folder); the ranks stopped at a checkpoint on the USR1 SLURM
    handed on. The node's task ends with 75, which asks for the job to run again, not 138, a death by USR1."""
    import signal

    from gpuscale.base.exits import STOP_MARKER, stopped_marker
    from gpuscale.launch.agent import _ended_by_signal

    marker = tmp_path / "stops-at-checkpoint"
    monkeypatch.setenv(STOP_MARKER, str(marker))
    assert _ended_by_signal(signal.SIGUSR1).code == 128 + signal.SIGUSR1  # no rank stopped at a checkpoint
    open(stopped_marker(str(marker)), "w").close()
    stopped = _ended_by_signal(signal.SIGUSR1)
    assert stopped.code == 75 and "stopped at a checkpoint" in stopped.line


def test_an_unreadable_error_file_names_a_cause_before_a_victim_and_the_rank_whose_error_is_on_screen(tmp_path):
    """The same order as when torchrun reads its error files (`first_failure`): a rank that only lost its peer comes
    after the rank that failed, even if it noted earlier; a rank that failed with the error another printed stands for
    that rank."""
    from gpuscale.launch.agent import _unreadable_error_file

    here = socket.gethostname()

    def note(rank, time, symptom=False, repeat_of=None):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "time": time, "host": here, "symptom": symptom,
                                                                "message": "boom", "repeat_of": repeat_of}))

    note(0, 99.0, symptom=True)
    note(2, 100.0)
    assert _unreadable_error_file(str(tmp_path), None).rank == 2
    note(1, 99.5, repeat_of=2)  # failed first, with the error rank 2 printed
    assert _unreadable_error_file(str(tmp_path), None).rank == 2
    note(3, 98.0)
    assert _unreadable_error_file(str(tmp_path), None).rank == 3
