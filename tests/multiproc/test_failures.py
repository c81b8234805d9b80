"""A rank that dies ends the whole job quickly, with a non-zero exit and the culprit named first.

Every launcher (gpuscale run, bare torchrun, ranks started by hand), every way of dying (an
exception, SIGKILL), and a rank that hangs alive (only the collective timeout can end that one).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from gpuscale.runtime import refusal

from procs import SCRIPTS, clean_env, free_port, gpuscale_cmd, run, run_by_hand, torchrun_cmd

pytestmark = pytest.mark.multiproc
DIE = str(SCRIPTS / "die.py")
STORY_LINES = 15  # at most, stdout and stderr together, for a failure on 2 ranks
BOUND_S = 60  # far below the collective timeout of a default job (600 s); well under a minute
HOST = socket.gethostname()


def _failure_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[gpuscale] rank") and ("failed" in line or "stopped" in line)]


@pytest.mark.parametrize("mode", ["raise", "exit", "kill"])
def test_gpuscale_run_stops_everyone_when_a_rank_dies(mode):
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", DIE, mode), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < BOUND_S, f"took {elapsed:.0f} s to end"
    if mode == "raise":
        # the first failure report is the failing rank's: its rank, host and error; a ValueError (the script's way of
        # saying the input was wrong) in one line, with no traceback, not even Python's on the way out ...
        assert _failure_lines(result.stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"
        assert "Traceback" not in result.stderr and result.stderr.count("planted failure on rank 1") == 1
        # ... the victim says at most one line, after it: that a peer failed first (a second after it noticed, unless
        # the launcher stopped it meanwhile), with no traceback of its own
        assert all(line.startswith("[gpuscale] rank 0/2") and "a peer rank failed or ended first" in line
                   for line in _failure_lines(result.stderr)[1:])
        assert len(_failure_lines(result.stderr)) <= 2
        # ... and the launcher's last line names it as the first failure
        assert result.stderr.splitlines()[-1] == (f"gpuscale run: rank 1 on {HOST} failed first (exit code 1; its error is above); "
                                                  "the other ranks were stopped")
    else:
        last = result.stderr.splitlines()[-1]
        assert last.startswith(f"gpuscale run: rank 1 on {HOST} failed first ({'exit code 7' if mode == 'exit' else 'signal SIGKILL'})")
        assert result.returncode == (7 if mode == "exit" else 137)


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_bare_torchrun_stops_everyone_when_a_rank_dies(mode):
    start = time.monotonic()
    result = run(torchrun_cmd(2, DIE, mode), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0 and elapsed < BOUND_S, f"exit {result.returncode} after {elapsed:.0f} s"
    if mode == "raise":
        assert _failure_lines(result.stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"


@pytest.mark.parametrize("mode", ["exit", "kill", "raise"])
def test_ranks_started_by_hand_do_not_hang_when_a_peer_vanishes(mode):
    start = time.monotonic()
    results = run_by_hand([DIE, mode], world_size=2, timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert results[1].returncode == {"exit": 7, "kill": -9, "raise": 1}[mode]
    assert results[0].returncode != 0, "rank 0 claimed success although its peer died"
    assert elapsed < BOUND_S, f"rank 0 needed {elapsed:.0f} s to notice its peer died"
    if mode == "raise":
        assert _failure_lines(results[1].stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"
        assert "a peer rank failed or ended first" in _failure_lines(results[0].stderr)[0]


@pytest.mark.parametrize("world, refusing", [(2, (0,)), (2, (1,)), (2, (0, 1)), (3, (1,))],
                         ids=["rank0", "rank1", "both", "rank1-of-3"])
def test_a_rank_that_refuses_to_start_ends_its_peers_waiting_in_the_rendezvous(tmp_path, world, refusing):
    """Ranks started by hand (or by srun without --kill-on-bad-exit), one of which gpuscale.init() refuses before
    the rendezvous (its LOCAL_WORLD_SIZE of 4 cannot divide the world): nobody ends its peers, which waited in the
    rendezvous for the group's whole timeout. The refusing rank leaves its reason in the rendezvous store; every peer
    says it and ends with exit code 1, within seconds, whichever of them hosts the store (rank 0 stays until all have
    read it). Where all refuse, the rank 0 that hosts the store does not linger for peers that refused too. Each
    peer notes that it is a victim, not a cause, for the launcher's last line."""
    script = tmp_path / "join.py"
    script.write_text("import torch, gpuscale\nwith gpuscale.init() as rt:\n    torch.distributed.all_reduce(torch.ones(1))\n")
    port, notes = str(free_port()), tmp_path / "notes"
    notes.mkdir()
    procs = []
    for rank in range(world):
        extra = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"} if rank in refusing else {"LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, str(script)], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=clean_env(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                                    GPUSCALE_FAILURE_DIR=str(notes), **extra)))
    start = time.monotonic()
    try:
        outcomes = [proc.communicate(timeout=BOUND_S) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    elapsed = time.monotonic() - start
    reason = f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE=4"
    for rank in range(world):
        said = outcomes[rank][1]
        assert procs[rank].returncode == 1, said[-2000:]
        if rank in refusing:  # one line, no traceback, as any rank's wrong input
            assert f"[gpuscale] rank {rank}/{world} on {HOST} failed: {reason}" in said and "Traceback" not in said, said
        else:
            assert f"[gpuscale] rank {rank} on {HOST} stops: rank {refusing[0]} on {HOST} refused to start: {reason}" in said, said
            assert json.loads((notes / f"rank-{rank}.json").read_text())["symptom"] is True  # a victim
    assert elapsed < (BOUND_S if len(refusing) < world else refusal.LINGER_S - 5), f"the ranks needed {elapsed:.0f} s"


def test_a_rank_that_hangs_alive_is_ended_by_the_collective_timeout():
    """Rank 1 stops taking part without dying: rank 0's all-reduce gives up after --timeout, and the job ends."""
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--timeout", "10", DIE, "hang"), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert 10 <= elapsed < BOUND_S, f"ended after {elapsed:.0f} s"
    assert f"gpuscale run: rank 0 on {HOST} failed first" in result.stderr
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower()


def test_a_plain_script_whose_rank_hangs_alive_is_ended_by_the_timeout_gpuscale_run_was_given(tmp_path):
    """No gpuscale in the script: it starts its own gloo group, as the DDP tutorial does (torch's 30-minute default),
    and rank 1 sleeps at step 3. `--timeout 10` ends the job well within a minute, with rank 0's timed-out all-reduce
    named first. (A timeout the script passes itself is replaced too: tests/unit/test_collective_timeout.py.)"""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""\
        import time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        for step in range(6):
            if step == 3 and dist.get_rank() == 1:
                time.sleep(600)
            dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()
        """))
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--timeout", "10", str(script)), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stderr
    assert elapsed < BOUND_S, f"ended after {elapsed:.0f} s"
    assert f"gpuscale run: rank 0 on {HOST} failed first" in result.stderr, result.stderr
    assert "timed out" in result.stderr.lower(), result.stderr


def test_a_rank_that_runs_out_of_batches_first_is_named_not_its_waiting_peer(tmp_path):
    """Uneven inputs, the classic bug, in a plain DDP script: rank 1 trains 3 steps and exits 0, rank 0's fourth
    all-reduce loses its peer. The last line names rank 1 as the one that ended, not rank 0 as a failure."""
    script = tmp_path / "uneven.py"
    script.write_text(textwrap.dedent("""\
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        for step in range(3 if dist.get_rank() == 1 else 10):
            model(torch.randn(8, 4)).sum().backward()
        """))
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", str(script)), timeout=BOUND_S + 30)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"gpuscale run: rank 1 on {HOST} ended (exit code 0) while rank 0 still waited in a collective (its error is "
        "above): the ranks did not run the same collectives (uneven batches per rank, or one that returned early)")
    assert f"[gpuscale] rank 0/2 on {HOST} stopped: a peer rank failed or ended first (" in result.stderr


def _story(*script: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", *script), timeout=BOUND_S + 30)
    lines = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1, "\n".join(lines)
    assert len(lines) <= STORY_LINES, f"{len(lines)} lines:\n" + "\n".join(lines)
    # torchrun's FAILED block and its log lines on the workers' ends are gpuscale's last line now
    assert not [line for line in lines if "FAILED" in line or "closing signal" in line or "exitcode" in line], "\n".join(lines)
    return result, lines


def test_a_usage_error_in_the_ranks_is_told_once_in_one_line():
    """Every rank refuses a global batch that does not divide among them: one of them says so, the last line names it."""
    result, lines = _story(str(SCRIPTS / "bad_batch.py"), "--batch", "33")
    output = "\n".join(lines)
    assert output.count("global batch 33 does not divide among 2 ranks") == 1 and "Traceback" not in output
    [said] = [line for line in lines if "global batch 33" in line]
    rank = int(re.fullmatch(rf"\[gpuscale\] rank (\d)/2 on {re.escape(HOST)} failed: global batch 33 does not divide .*use a global batch "
                            "of 32 or 34.*", said).group(1))
    assert result.stderr.splitlines()[-1] == (f"gpuscale run: rank {rank} on {HOST} failed first (exit code 1; its error is above), "
                                              f"and rank {1 - rank} with the same error")


def test_a_plain_script_that_raises_on_one_rank_is_named_in_the_last_line():
    """No gpuscale in the script: rank 1's traceback (Python's), once; the last line names rank 1, not its victim."""
    result, lines = _story(str(SCRIPTS / "plain_raise.py"))
    assert "\n".join(lines).count("RuntimeError: boom") == 1
    assert result.stderr.splitlines()[-1] == (f"gpuscale run: rank 1 on {HOST} failed first (exit code 1; its error is above); "
                                              "the other ranks were stopped")


def test_a_plain_script_whose_ranks_all_fail_alike_at_start_up_prints_the_error_once(tmp_path):
    """No gpuscale in the script (a Lightning script with devices="auto" on a machine without the accelerator is
    the case seen): every rank raises the same error before training. One traceback, headed by its rank and
    host; one line for the other rank; the last line names both."""
    script = tmp_path / "refuses.py"
    script.write_text(  # both ranks reach the raise (a file barrier), before the agent stops the other one
        "import os, pathlib, time\nimport torch\nhere = pathlib.Path(__file__).parent\n"
        "(here / f\"up-{os.environ['RANK']}\").touch()\n"
        "while len(list(here.glob('up-*'))) < 2:\n    time.sleep(0.01)\n"
        "raise ValueError(\"devices='auto' found no accelerator; pass accelerator='cpu'\")\n")
    result, lines = _story(str(script))
    output = "\n".join(lines)
    assert output.count("ValueError: devices='auto' found no accelerator") == 1 and output.count("Traceback") == 1
    first = int(re.search(rf"^\[gpuscale\] rank (\d)/2 on {re.escape(HOST)} failed:$", output, re.M).group(1))
    assert f"[gpuscale] rank {1 - first}/2 on {HOST} failed with the error rank {first} printed: ValueError" in lines
    assert len(result.stderr.splitlines()) <= 8, result.stderr
    assert result.stderr.splitlines()[-1] == (f"gpuscale run: rank {first} on {HOST} failed first (exit code 1; its error is above), "
                                              f"and rank {1 - first} with the same error")


_PARSING_SCRIPT = (  # both ranks reach the parse (a file barrier), before the agent stops the slower one
    "import argparse, os, pathlib, time\nhere = pathlib.Path(__file__).parent\n"
    "(here / f\"up-{os.environ['RANK']}\").touch()\n"
    "while len(list(here.glob('up-*'))) < 2:\n    time.sleep(0.01)\n"
    "parser = argparse.ArgumentParser(description='trains a model')\n"
    "parser.add_argument('--epochs', type=int, required=True, help='passes over the data')\n"
    "print('epochs', parser.parse_args().epochs)\n")


def test_a_scripts_argparse_error_is_printed_by_one_rank_and_named_in_the_last_line(tmp_path):
    """No gpuscale in the script: each rank parses the same wrong argument; argparse's usage and error come once,
    unchanged, the job exits with argparse's code 2 and the last line names both ranks."""
    script = tmp_path / "parses.py"
    script.write_text(_PARSING_SCRIPT)
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", str(script), "--epochs", "x"), timeout=BOUND_S + 30)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert output.count("parses.py: error: argument --epochs: invalid int value: 'x'") == 1, output
    assert output.count("usage: parses.py [-h] --epochs EPOCHS") == 1, output
    first = re.fullmatch(rf"gpuscale run: rank (\d) on {re.escape(HOST)} failed first \(exit code 2; its error is above\), "
                         r"and rank (\d) with the same error", result.stderr.splitlines()[-1])
    assert first is not None and {first.group(1), first.group(2)} == {"0", "1"}, result.stderr
    assert len(output.splitlines()) == 3, output


def test_a_scripts_help_is_printed_by_one_rank(tmp_path):
    script = tmp_path / "parses.py"
    script.write_text(_PARSING_SCRIPT)
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", str(script), "--help"), timeout=BOUND_S + 30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passes over the data") == 1 and result.stdout.count("usage: parses.py") == 1, result.stdout


def test_the_batch_scripts_node_agent_notes_the_first_failing_rank_and_leaves_torchruns_block_out(tmp_path):
    """`python -m gpuscale.agent`, a torchrun-mode batch script's task on each node: its exit code is the failing rank's own
    (torchrun's would be 1), it notes that rank, when and where for the batch script's last line, and prints no FAILED
    block; without the notes' folder it names the rank itself."""
    agent = [sys.executable, "-m", "gpuscale.agent", "--standalone", "--nnodes=1", "--nproc-per-node=2"]
    result = run([*agent, DIE, "exit"], timeout=BOUND_S + 30, GPUSCALE_EXIT_DIR=str(tmp_path), GPUSCALE_FAILURE_DIR=str(tmp_path),
                 SLURM_PROCID="4")
    assert result.returncode == 7, result.stderr  # os._exit(7) on rank 1
    when, code, rank, host = (tmp_path / "task-4").read_text().split()
    assert (code, rank, host) == ("7", "1", HOST) and abs(float(when) - time.time()) < BOUND_S
    assert not [line for line in result.stderr.splitlines() if "FAILED" in line or "exitcode" in line or "Traceback" in line], result.stderr

    killed = run([*agent, DIE, "kill"], timeout=BOUND_S + 30)
    assert killed.returncode == 137
    lines = killed.stderr.splitlines()
    assert f"[gpuscale] rank 1/2 on {HOST} was killed by SIGKILL (exit code 137)" in lines, killed.stderr
    assert lines[-1].startswith(f"gpuscale: rank 1 on {HOST} failed first (signal SIGKILL)"), killed.stderr


def test_an_error_file_cut_short_still_ends_in_the_failing_ranks_line(tmp_path):
    """torch's @record (or a rank stopped mid-write) can leave torchrun's error file empty, on which torch's launcher
    fails parsing it: `gpuscale run` still ends with its own last line naming the rank that raised, and a failure's
    exit code, not a usage error (exit 2) with torch's traceback. Every rank's error file is empty; rank 1 raises."""
    script = tmp_path / "cut_error_file.py"
    script.write_text(textwrap.dedent("""\
        import os, time
        open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()
        if os.environ["RANK"] == "1":
            raise RuntimeError("the cause")
        time.sleep(30)
    """))
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", str(script)), timeout=BOUND_S)
    assert time.monotonic() - start < BOUND_S
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("RuntimeError: the cause") == 1  # rank 1's own traceback, once
    assert "JSONDecodeError" not in result.stderr and "Failed to parse reply file" not in result.stderr
    assert result.stderr.splitlines()[-1] == (f"gpuscale run: rank 1 on {HOST} failed first (its error is above; its exit "
                                              "code is unknown: torchrun could not read a rank's error file)")
