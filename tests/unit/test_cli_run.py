"""Unit tests for `gpuscale run`: nproc resolution, the torchrun command line, and error handling.

Nothing is launched: the CLI tests only feed input that fails before torchrun would start. The
command lines are parsed by the installed torch's own torchrun parser.
"""

from __future__ import annotations

import argparse
import os
import re

import pytest

import gpuscale.cli
from gpuscale.cli.run import SIGNALS_OPTION, handles_signals_option, resolve_nproc, torchrun_argv
from gpuscale.slurm.render import TORCHRUN_SIGNALS

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
# the command line is one the installed torchrun takes, and one an older torchrun takes


def torchrun_parser(without: str | None = None):
    """The installed torch's own torchrun parser; `without` one of its options, as a torchrun from before it came."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    if without is not None:
        action = next(action for action in parser._actions if without in action.option_strings)
        parser._remove_action(action)
        for spelling in action.option_strings:
            del parser._option_string_actions[spelling]
    return parser


@pytest.mark.parametrize("kw", [
    dict(),
    dict(nnodes=2, node_rank=1, master_addr="node0", master_port=12345, max_restarts=2),
    dict(module=True, script="gpuscale", script_args=["env", "--json"]),
    dict(script_args=["--nproc-per-node", "3", "--", "x"]),  # the script's own options stay its own
])
def test_torchrun_argv_parses_with_the_installed_torchrun(kw):
    args = ns(**kw)
    parsed = torchrun_parser().parse_args(torchrun_argv(args, 4, {}))
    assert parsed.nproc_per_node == "4" and parsed.nnodes == str(args.nnodes) and parsed.max_restarts == args.max_restarts
    assert parsed.training_script == args.script and parsed.training_script_args == args.script_args
    assert parsed.module == args.module and parsed.standalone == (args.nnodes == 1)
    if args.nnodes > 1:
        assert (parsed.node_rank, parsed.master_addr, parsed.master_port) == (1, "node0", 12345)
    assert parsed.signals_to_handle == TORCHRUN_SIGNALS  # torch 2.13 here: USR1 is passed on by torchrun itself


def test_the_signals_option_goes_to_the_torchrun_that_takes_it():
    import torch
    from torch.torch_version import TorchVersion

    assert handles_signals_option() == (TorchVersion(torch.__version__) >= "2.10")  # torchrun has it since 2.10
    assert SIGNALS_OPTION in torchrun_argv(ns(), 2, {}) or not handles_signals_option()


def test_an_older_torchrun_gets_no_signals_option():
    old = torchrun_parser(without=SIGNALS_OPTION)
    with pytest.raises(SystemExit):  # what torch 2.9's torchrun says: "unrecognized arguments: --signals-to-handle"
        old.parse_args([SIGNALS_OPTION, TORCHRUN_SIGNALS, "train.py"])
    assert not handles_signals_option(old)
    argv = torchrun_argv(ns(script_args=["--epochs", "3"]), 2, {}, parser=old)
    assert SIGNALS_OPTION not in argv
    parsed = old.parse_args(argv)
    assert parsed.training_script == "train.py" and parsed.training_script_args == ["--epochs", "3"]


# --------------------------------------------------------------------------------------------------
# torchrun's spellings


def parse(*argv):
    return gpuscale.cli.build_parser().parse_args(["run", *argv])


def test_torchruns_spellings_are_taken():
    args = parse("--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr", "node0", "--master_port", "12345",
                 "--max_restarts", "3", "train.py", "--nproc_per_node", "9")
    assert (args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr, args.master_port, args.max_restarts) == (
        "2", 2, 1, "node0", 12345, 3)
    assert args.script == "train.py" and args.script_args == ["--nproc_per_node", "9"]  # the script's own options stay its own
    parsed = torchrun_parser().parse_args(torchrun_argv(args, 2, {}))
    assert (parsed.nproc_per_node, parsed.node_rank, parsed.master_addr, parsed.master_port, parsed.max_restarts) == ("2", 1, "node0", 12345, 3)


def test_without_torchruns_spellings_the_defaults_stand():
    args = parse("train.py")
    assert (args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr, args.master_port, args.max_restarts) == (
        "auto", 1, 0, None, None, 0)
    assert parse("--nproc", "3", "train.py").nproc_per_node == "3"  # gpuscale study's spelling, once an abbreviation


def test_help_names_each_option_once(capsys):
    with pytest.raises(SystemExit):
        gpuscale.cli.main(["run", "--help"])
    out = capsys.readouterr().out
    options = re.findall(r"(?<![\w-])--[a-z][\w-]*", out)
    assert "--nproc-per-node" in options and "--master-port" in options
    assert not [option for option in options if "_" in option] and "--nproc" not in options


@pytest.mark.parametrize("value,nodes", [("2", 2), ("3:3", 3)])
def test_nnodes_as_torchrun_writes_it(value, nodes):
    assert parse("--nnodes", value, "train.py").nnodes == nodes


def test_nnodes_elastic_range_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--nnodes", "1:4", "train.py")
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "1:4" in err and "elastic range" in err and "--nnodes 4" in err


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


def test_cli_a_folder_or_a_data_file_is_no_script(clean_environ, capsys, tmp_path):
    """A folder, or a summary.json given where the script goes, is refused before any rank runs it as Python; a file
    with another suffix whose first line says python is a script."""
    assert gpuscale.cli.main(["run", "--nproc-per-node", "1", str(tmp_path)]) == 2
    assert_one_line_error(capsys, "is a folder; give the path of a Python file in it")
    (tmp_path / "summary.json").write_text("{}")
    assert gpuscale.cli.main(["run", "--nproc-per-node", "1", str(tmp_path / "summary.json")]) == 2
    assert_one_line_error(capsys, "is not a Python file (a .json file, no python #! line)")
    from gpuscale.cli.run import check_script_path

    (tmp_path / "train.job").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    check_script_path(str(tmp_path / "train.job"))
    (tmp_path / "train").write_text("print('hi')\n")
    check_script_path(str(tmp_path / "train"))
    (tmp_path / "app.pyz").write_bytes(b"PK")  # a zip app: python runs it
    check_script_path(str(tmp_path / "app.pyz"))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("")  # a folder python runs
    check_script_path(str(tmp_path / "pkg"))


def test_cli_a_module_no_rank_could_import_is_refused(clean_environ, capsys, tmp_path):
    """-m of a module that exists neither in this folder nor on the path: one line before any rank starts (each rank
    would print its own ModuleNotFoundError); one in this folder is found as the ranks would find it."""
    clean_environ.chdir(tmp_path)
    assert gpuscale.cli.main(["run", "--nproc-per-node", "1", "-m", "nonexistent_mod.train"]) == 2
    assert_one_line_error(capsys, "no module named 'nonexistent_mod' here or on the path")
    from gpuscale.cli.run import check_module_name

    (tmp_path / "mytrain_here.py").write_text("raise SystemExit('imported: the check must only look it up')")
    check_module_name("mytrain_here")
    check_module_name("gpuscale.study.linkbench")
    for bad, said in (("gpuscale.study.no_such_module", "no module named 'gpuscale.study.no_such_module'"),
                      ("mytrain_here.py", "a module's name has no .py; give -m mytrain_here"),
                      ("mytrain_here.sub", "mytrain_here is a module, not a package")):
        with pytest.raises(ValueError, match=re.escape(said)):
            check_module_name(bad)


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


@pytest.mark.parametrize("argv", [["run"], ["run", "--nproc-per-node", "2"]])
def test_cli_without_script_says_how_to_call(clean_environ, capsys, argv):
    assert gpuscale.cli.main(argv) == 2
    assert_one_line_error(capsys, "SCRIPT is required", "gpuscale run [options] [-m] SCRIPT [ARGS ...]", "train.py")


def test_cli_summary_under_a_file(clean_environ, capsys, script, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    before = dict(os.environ)
    for summary in (blocker / "runs" / "x", blocker):
        assert gpuscale.cli.main(["run", "--nproc-per-node", "2", "--summary", str(summary), script]) == 2
        assert_one_line_error(capsys, f"--summary {summary}:", f"{blocker} is a file, not a folder")
    assert dict(os.environ) == before  # refused before anything was set up for the workers
    assert blocker.read_text() == ""


@pytest.mark.parametrize("summary,words", [
    ("/sys/gpuscale-summary", ["cannot make this folder"]),  # sysfs: no new folders, not even for root
    ("/sys", ["cannot write in this folder"]),
])
def test_cli_summary_where_nobody_may_write(clean_environ, capsys, script, summary, words):
    assert gpuscale.cli.main(["run", "--nproc-per-node", "2", "--summary", summary, script]) == 2
    assert_one_line_error(capsys, f"--summary {summary}:", "give a folder you can write", *words)


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

    from gpuscale.launch.verdicts import first_failure
    from gpuscale.runtime.failures import is_peer_symptom

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


def test_the_launchers_last_line_names_the_rank_whose_error_is_on_screen():
    from types import SimpleNamespace

    from gpuscale.launch.verdicts import verdict

    # every rank refused the same input: rank 1 printed it, the agent stopped it on its way out, rank 0 noted a repeat
    failures = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-15)}
    notes = {0: {"time": 100.2, "symptom": False, "repeat_of": 1}, 1: {"time": 100.1, "symptom": False, "repeat_of": None}}
    assert verdict(failures, notes, 2, "h") == (1, "gpuscale run: rank 1 on h failed first (exit code 1; its error is above), "
                                                   "and rank 0 with the same error")
    # a script without gpuscale: the probe saw rank 1 raise and rank 0 lose its peer, whichever torchrun saw first
    from gpuscale.launch.verdicts import note_from_record

    records = [{"rank": 0, "ended": "exception", "written_at": 100.05,
                "error": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1770"},
               {"rank": 1, "ended": "exception", "written_at": 100.1, "error": "RuntimeError: boom"}]
    notes = {record["rank"]: note_from_record(record) for record in records}
    both = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=1)}
    assert verdict(both, notes, 2, "h") == (1, "gpuscale run: rank 1 on h failed first (exit code 1; its error is above); "
                                               "the other ranks were stopped")
    assert note_from_record({"rank": 0, "ended": "exit", "error": None}) is None  # sys.exit(1): the script's own verdict
    # the agent's SIGTERM came while rank 1 was on its way out after raising: its record still has the error
    stopped = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-15)}
    notes[1] = note_from_record({**records[1], "ended": "signal", "signal": "SIGTERM"})
    assert verdict(stopped, notes, 2, "h") == (1, "gpuscale run: rank 1 on h failed first (exit code 1; its error is above); "
                                                  "the other ranks were stopped")
    # a rank killed without a word
    killed = {0: SimpleNamespace(timestamp=100, exitcode=-15), 1: SimpleNamespace(timestamp=100, exitcode=-9)}
    assert verdict(killed, {}, 2, "h") == (137, "gpuscale run: rank 1 on h failed first (signal SIGKILL); the other ranks were stopped")


def test_a_rank_stopped_on_its_way_out_after_raising_is_still_the_cause():
    """The agent SIGTERMs every rank still running once one exited: here the one that raised was still tearing down,
    and the victim that only lost its peer exited first."""
    from types import SimpleNamespace

    from gpuscale.launch.verdicts import first_failure, verdict

    failures = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-15)}
    notes = {0: {"time": 100.2, "symptom": True}, 1: {"time": 100.1, "symptom": False}}
    assert first_failure(failures, notes) == 1
    assert verdict(failures, notes, 2, "h") == (1, "gpuscale run: rank 1 on h failed first (exit code 1; its error is above); "
                                                   "the other ranks were stopped")
    # without its note it is just a survivor the agent stopped
    assert first_failure(failures, {0: notes[0]}) == 0


def test_a_collective_that_timed_out_names_the_ranks_it_waited_for():
    """Rank 0 waited out gloo's timeout in an all_reduce that rank 1, alive but stuck elsewhere, never joined: rank 0
    failed first, and the line says which rank it waited for. A real error of rank 0 keeps the plain line."""
    from types import SimpleNamespace

    from gpuscale.launch.verdicts import verdict

    failures = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-15),
                2: SimpleNamespace(timestamp=100, exitcode=-15)}
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation"
    notes = {0: {"time": 100.0, "symptom": False, "message": gloo}}
    assert verdict(failures, notes, 3, "h") == (1, "gpuscale run: rank 0 on h failed first (exit code 1; its error is above); "
                                                   "it timed out waiting in a collective, while ranks 1, 2 still ran (stuck "
                                                   "elsewhere, or slower than the timeout) and were stopped")
    for other in ("CUDA out of memory", "<urlopen error timed out>", "[Errno 110] Connection timed out", "Read timed out."):
        notes[0]["message"] = other  # its own error, a download's timeout among them: rank 0 was the one waited for
        assert verdict(failures, notes, 3, "h")[1].endswith("; the other ranks were stopped"), other


def test_a_rank_that_ended_cleanly_while_its_peer_waited_is_named_not_the_peer():
    """The classic uneven-inputs bug: rank 1 ran out of batches and exited 0, rank 0's next all-reduce lost its peer.
    torchrun names only rank 0; the line names rank 1 as the one that ended, on the node's ranks 2-3 as on 0-1."""
    from types import SimpleNamespace

    from gpuscale.launch.verdicts import verdict

    lost = {"time": 100.2, "symptom": True, "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:1770"}
    assert verdict({0: SimpleNamespace(timestamp=100, exitcode=1)}, {0: lost}, 2, "h") == (
        1, "gpuscale run: rank 1 on h ended (exit code 0) while rank 0 still waited in a collective (its error is above): "
           "the ranks did not run the same collectives (uneven batches per rank, or one that returned early)")
    line = verdict({3: SimpleNamespace(timestamp=100, exitcode=1)}, {3: lost}, 2, "h")[1]  # the second node of 2 x 2
    assert line.startswith("gpuscale run: rank 2 on h ended (exit code 0) while rank 3 still waited")
    # 3 ranks: rank 2 ended, rank 0 lost it, and the agent stopped rank 1 before it noted anything
    waited = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-15)}
    assert verdict(waited, {0: lost}, 3, "h")[1].startswith("gpuscale run: rank 2 on h ended (exit code 0) while ranks 0, 1 still")
    assert verdict(waited, {}, 3, "h")[1].startswith("gpuscale run: rank 0 on h failed first")  # no rank lost a peer
    # a rank that failed of its own error is the cause, whoever exited 0
    own = {"time": 100.2, "symptom": False, "message": "RuntimeError: boom"}
    assert verdict({0: SimpleNamespace(timestamp=100, exitcode=1)}, {0: own}, 2, "h")[1] == (
        "gpuscale run: rank 0 on h failed first (exit code 1; its error is above)")
