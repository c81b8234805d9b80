"""Unit tests for `gpuscale run`: nproc resolution, the torchrun command line, and error handling.

Nothing is launched: the CLI tests only feed input that fails before torchrun would start.
"""

from __future__ import annotations

import argparse
import os

import pytest

import gpuscale.cli
from gpuscale.cli.run import resolve_nproc, torchrun_argv

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
               "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_environ(monkeypatch):
    """os.environ without launcher or SLURM variables, restored afterwards."""
    for name in list(os.environ):
        if name.startswith("SLURM_") or name in LAUNCH_VARS:
            monkeypatch.delenv(name)
    return monkeypatch


def ns(**kw):
    defaults = dict(nnodes=1, node_rank=0, master_addr=None, master_port=None, max_restarts=0,
                    module=False, script="train.py", script_args=[])
    defaults.update(kw)
    return argparse.Namespace(**defaults)


def option(argv, name):
    return argv[argv.index(name) + 1]


# --------------------------------------------------------------------------------------------------
# resolve_nproc


@pytest.mark.parametrize("value,gpus,cores,expected", [
    ("auto", 8, 56, 8),
    ("auto", 0, 56, 56),
    ("auto", 0, 2, 2),
    ("gpu", 4, 64, 4),
    ("cpu", 4, 64, 64),
    ("cpu", 0, 2, 2),
    ("3", 8, 56, 3),
    ("16", 0, 2, 16),
])
def test_resolve_nproc(value, gpus, cores, expected):
    assert resolve_nproc(value, gpus, cores) == expected


def test_resolve_nproc_gpu_without_gpu_fails():
    with pytest.raises(ValueError) as info:
        resolve_nproc("gpu", 0, 8)
    msg = str(info.value)
    assert "no GPU" in msg and "'cpu'" in msg and "'auto'" in msg


@pytest.mark.parametrize("value", ["0", "-2"])
def test_resolve_nproc_not_positive_fails(value):
    with pytest.raises(ValueError, match="at least 1"):
        resolve_nproc(value, 8, 8)


@pytest.mark.parametrize("value", ["zero", "two", "1.5", "", "GPU"])
def test_resolve_nproc_not_a_number_fails(value):
    with pytest.raises(ValueError) as info:
        resolve_nproc(value, 8, 8)
    msg = str(info.value)
    assert repr(value) in msg and "'gpu'" in msg and "'cpu'" in msg and "'auto'" in msg


# --------------------------------------------------------------------------------------------------
# torchrun_argv


def test_one_node_is_standalone():
    argv = torchrun_argv(ns(), 4, {})
    assert "--standalone" in argv
    assert option(argv, "--nproc-per-node") == "4"
    assert option(argv, "--nnodes") == "1"
    assert option(argv, "--max-restarts") == "0"
    assert "--master-addr" not in argv and "--master-port" not in argv and "--node-rank" not in argv
    assert argv[-1] == "train.py"


def test_one_node_ignores_slurm_job_id_when_standalone():
    argv = torchrun_argv(ns(), 2, {"SLURM_JOB_ID": "4567890"})
    assert "--standalone" in argv and "--master-port" not in argv


def test_script_and_its_arguments_come_last_in_order():
    argv = torchrun_argv(ns(script="train.py", script_args=["--out", "runs/x", "--epochs", "3"]), 2, {})
    assert argv[-5:] == ["train.py", "--out", "runs/x", "--epochs", "3"]


def test_module_mode():
    argv = torchrun_argv(ns(module=True, script="gpuscale", script_args=["env"]), 2, {})
    assert argv[-4:] == ["--module", "--", "gpuscale", "env"]


def test_max_restarts_is_passed():
    assert option(torchrun_argv(ns(max_restarts=3), 2, {}), "--max-restarts") == "3"


def test_two_nodes_static_rendezvous_with_port_from_slurm_job():
    for node_rank in (0, 1):
        argv = torchrun_argv(ns(nnodes=2, node_rank=node_rank, master_addr="nid005001"), 8, {"SLURM_JOB_ID": "4567890"})
        assert "--standalone" not in argv
        assert option(argv, "--nnodes") == "2"
        assert option(argv, "--node-rank") == str(node_rank)
        assert option(argv, "--master-addr") == "nid005001"
        assert option(argv, "--master-port") == "17890"
        assert option(argv, "--nproc-per-node") == "8"


def test_two_nodes_explicit_port_wins_over_job_id():
    argv = torchrun_argv(ns(nnodes=2, node_rank=1, master_addr="node0", master_port=12345), 4, {"SLURM_JOB_ID": "4567890"})
    assert option(argv, "--master-port") == "12345"


def test_two_nodes_without_slurm_default_port():
    argv = torchrun_argv(ns(nnodes=2, master_addr="node0"), 4, {})
    assert option(argv, "--master-port") == "29500"


def test_one_node_with_explicit_port_is_not_standalone():
    argv = torchrun_argv(ns(master_port=23456), 2, {})
    assert "--standalone" not in argv
    assert option(argv, "--master-port") == "23456"
    assert option(argv, "--master-addr") == "127.0.0.1"


def test_two_nodes_without_master_addr_fails():
    with pytest.raises(ValueError) as info:
        torchrun_argv(ns(nnodes=2), 4, {})
    msg = str(info.value)
    assert "--nnodes 2" in msg and "--master-addr" in msg


@pytest.mark.parametrize("kw,words", [
    (dict(nnodes=0), ["--nnodes 0", "at least 1"]),
    (dict(nnodes=2, node_rank=2, master_addr="h"), ["--node-rank 2", "0..1"]),
    (dict(nnodes=2, node_rank=-1, master_addr="h"), ["--node-rank -1"]),
    (dict(max_restarts=-1), ["--max-restarts -1", "negative"]),
    (dict(master_port=0), ["--master-port 0", "1024-65535"]),
    (dict(master_port=70000), ["--master-port 70000"]),
])
def test_torchrun_argv_bad_values(kw, words):
    with pytest.raises(ValueError) as info:
        torchrun_argv(ns(**kw), 2, {})
    for word in words:
        assert word in str(info.value)


# --------------------------------------------------------------------------------------------------
# gpuscale.cli.main: bad input ends in one line on stderr and exit code 2


def assert_one_line_error(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuscale run: error:"), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], err


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('must not run')\n")
    return str(path)


def test_cli_bad_nproc_per_node(clean_environ, capsys, script):
    assert gpuscale.cli.main(["run", "--nproc-per-node", "zero", script]) == 2
    assert_one_line_error(capsys, "'zero'")


def test_cli_nproc_per_node_zero(clean_environ, capsys, script):
    assert gpuscale.cli.main(["run", "--nproc-per-node", "0", script]) == 2
    assert_one_line_error(capsys, "at least 1")


def test_cli_missing_script(clean_environ, capsys, tmp_path):
    missing = str(tmp_path / "nope.py")
    assert gpuscale.cli.main(["run", "--nproc-per-node", "2", missing]) == 2
    assert_one_line_error(capsys, "nope.py", "does not exist")


def test_cli_missing_script_checked_before_nproc(clean_environ, capsys, tmp_path):
    clean_environ.chdir(tmp_path)
    assert gpuscale.cli.main(["run", "--nproc-per-node", "zero", "x.py"]) == 2
    assert_one_line_error(capsys)


def test_cli_two_nodes_without_master_addr(clean_environ, capsys, script):
    assert gpuscale.cli.main(["run", "--nproc-per-node", "2", "--nnodes", "2", script]) == 2
    assert_one_line_error(capsys, "--master-addr")


def test_cli_node_rank_out_of_range(clean_environ, capsys, script):
    argv = ["run", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "5", "--master-addr", "h", script]
    assert gpuscale.cli.main(argv) == 2
    assert_one_line_error(capsys, "--node-rank 5")


def test_cli_launcher_started_several_times_per_node(clean_environ, capsys, script):
    clean_environ.setenv("SLURM_STEP_ID", "0")
    clean_environ.setenv("SLURM_STEP_TASKS_PER_NODE", "8")
    assert gpuscale.cli.main(["run", "--nproc-per-node", "2", script]) == 2
    assert_one_line_error(capsys, "8 times", "--ntasks-per-node=1")


def test_cli_bad_input_leaves_environment_alone(clean_environ, capsys, script):
    before = dict(os.environ)
    gpuscale.cli.main(["run", "--nproc-per-node", "zero", script])
    assert dict(os.environ) == before


def test_cli_without_verb_prints_help_and_returns_2(capsys):
    assert gpuscale.cli.main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_cli_argparse_type_error_exits_2(clean_environ, capsys, script):
    # argparse's own errors (usage line + error line) exit with status 2 too.
    with pytest.raises(SystemExit) as info:
        gpuscale.cli.main(["run", "--nnodes", "two", script])
    assert info.value.code == 2
    assert "'two'" in capsys.readouterr().err


def test_the_first_failure_is_the_cause_not_the_peer_that_lost_it():
    from types import SimpleNamespace

    from gpuscale.cli.run import first_failure
    from gpuscale.failures import is_peer_symptom

    failures = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=1)}
    # torchrun's whole seconds tie; rank 0 only lost its peer, rank 1 raised
    notes = {0: {"rank": 0, "time": 100.2, "symptom": True}, 1: {"rank": 1, "time": 100.3, "symptom": False}}
    assert first_failure(failures, notes) == 1
    # a rank that vanished (os._exit, a kill) leaves no note: it is the cause, not the symptom
    assert first_failure(failures, {0: notes[0]}) == 1
    # two real failures: the earlier one
    assert first_failure(failures, {0: {"time": 100.1, "symptom": False}, 1: {"time": 100.05, "symptom": False}}) == 1
    # no notes at all (not launched by gpuscale run): torchrun's order, ties to the lower rank
    assert first_failure({0: SimpleNamespace(timestamp=101, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=1)}, {}) == 1
    # the agent stopped rank 0 with SIGTERM after rank 1 failed: rank 1 is named, and its exit code used
    stopped = {0: SimpleNamespace(timestamp=100, exitcode=-15), 1: SimpleNamespace(timestamp=100, exitcode=2)}
    assert first_failure(stopped, {1: {"time": 100.4, "symptom": False}}) == 1
    assert first_failure(stopped, {0: {"time": 100.1, "symptom": False}, 1: {"time": 100.4, "symptom": False}}) == 1
    gloo = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1770. This is typically caused by a remote worker crashing.")
    assert is_peer_symptom(gloo) and not is_peer_symptom(ValueError("planted failure on rank 1"))
