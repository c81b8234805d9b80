"""The batch script's exit code and last line, from the notes its tasks leave: run in bash with planted notes.

The lines are the rendered ones (`slurm.stopping`); the step is a stand-in that leaves the notes a real job's
tasks would (a rank that failed, a victim that lost its peer, a task srun or SLURM stopped with TERM, a node's
agent) and exits as srun would, with the highest code. What the job must end with is known from the plant.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuscale.slurm.stopping import requeue_block, stop_handling, task_exit_note


def _run(tmp_path: Path, notes: dict[str, str], srun_code: int, symptoms: tuple[int, ...] = (), stopped: bool = False,
         max_requeues: int = 0, cut: bool = False, repeats: dict[int, int] | None = None) -> tuple[int, list[str]]:
    """Run the stop handling around a step that writes `notes` (task -> line; `cut`: without the line's end, as a task
    killed while writing it leaves it) and exits `srun_code`."""
    plant = []
    for task, line in notes.items():
        plant.append(f'printf %s {shlex.quote(line if cut else line + chr(10))} > "$GPUSCALE_EXIT_DIR/task-{task}"')
    for rank in symptoms:
        note = json.dumps({"rank": rank, "time": 1.0, "symptom": True, "message": "Connection closed by peer"}, indent=1)
        plant.append(f'echo {shlex.quote(note)} > "$GPUSCALE_FAILURE_DIR/rank-{rank}.json"')
    for rank, printed in (repeats or {}).items():  # as gpuscale.runtime.failures.note_failure writes it
        note = json.dumps({"rank": rank, "time": 1.0, "symptom": False, "message": "bad --data", "repeat_of": printed},
                          indent=2, sort_keys=True)
        plant.append(f'echo {shlex.quote(note)} > "$GPUSCALE_FAILURE_DIR/rank-{rank}.json"')
    if stopped:
        plant.append('touch "$GPUSCALE_STOP_MARKER.stopped"')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {shlex.quote(str(tmp_path / 'scontrol.calls'))}\n")
    (bin_dir / "scontrol").chmod(0o755)
    script = "\n".join(["set -euo pipefail", *stop_handling(), f"( {'; '.join(plant) or ':'}; exit {srun_code} ) &",
                        *requeue_block(max_requeues)])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert not list(tmp_path.glob(".gpuscale-77*")), "the notes' folder outlived the batch script"
    return result.returncode, [line for line in result.stderr.splitlines() if line.startswith("gpuscale:")]


def test_the_rank_that_failed_on_its_own_is_named_not_the_victim_srun_ended(tmp_path):
    code, lines = _run(tmp_path, {"0": "100.5 143 0 n1", "1": "100.2 1 1 n2"}, srun_code=143)
    assert code == 1
    assert lines == ["gpuscale: rank 1 on n2 failed first, with exit code 1 (srun: 143); the job ends with 1"]


def test_a_victim_that_noted_its_lost_peer_comes_after_the_cause_even_when_it_ended_first(tmp_path):
    code, lines = _run(tmp_path, {"0": "100.1 1 0 n1", "1": "100.9 137 1 n2"}, srun_code=137, symptoms=(0,))
    assert code == 137
    assert lines == ["gpuscale: rank 1 on n2 failed first, with exit code 137 (srun: 137); the job ends with 137"]


def test_a_node_whose_torchrun_was_stopped_before_its_ranks_failed_is_named_by_its_host(tmp_path):
    code, lines = _run(tmp_path, {"0": "100.1 143 - n1", "1": "100.4 7 1 n2"}, srun_code=143)
    assert code == 7 and lines == ["gpuscale: rank 1 on n2 failed first, with exit code 7 (srun: 143); the job ends with 7"]


def test_every_task_stopped_with_term_is_slurms_doing_not_a_ranks_failure(tmp_path):
    code, lines = _run(tmp_path, {"0": "100.1 143 0 n1", "1": "100.2 143 - n2"}, srun_code=143)
    assert code == 143
    assert lines == ["gpuscale: the ranks were stopped with TERM (by SLURM: the time limit, scancel or preemption, as its line above "
                     "says); the job ends with 143"]


def test_a_garbled_note_is_left_out_not_taken_for_a_rank_that_ended_with_0(tmp_path):
    """CI's timed-out job: a task's note lost its time (" 143 0 n1" read as time 143, code 0, rank n1), and the job
    ended with 0. A note that does not read "<time> <code> <rank> <host>" is left out."""
    for garbled, cut in [(" 143 0 n1", False), ("100.1 143 0", False), ("100.1 0 n1", False), ("143 0 n1 x", False),
                         ("", True), ("100.1 1", True)]:
        code, lines = _run(tmp_path, {"0": garbled, "1": "100.2 143 1 n2"}, srun_code=143, cut=cut)
        assert code == 143, garbled
        assert lines == ["gpuscale: the ranks were stopped with TERM (by SLURM: the time limit, scancel or preemption, as its line above "
                         "says); the job ends with 143"], garbled
    code, lines = _run(tmp_path, {"0": " 143 0 n1", "1": "100.4 7 1 n2"}, srun_code=143)
    assert code == 7 and lines == ["gpuscale: rank 1 on n2 failed first, with exit code 7 (srun: 143); the job ends with 7"]


def test_a_term_while_the_batch_script_picks_the_first_failure_does_not_lose_it(tmp_path):
    """SLURM signals every process of the job, the batch shell's children too: a TERM that comes while the script
    sorts the notes must not end its sort (the job would fall back to srun's highest code). A `sort` on the PATH says
    when it runs and waits there; the test then sends TERM to the whole process group, as SLURM does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real_sort = subprocess.run(["bash", "-c", "command -v sort"], capture_output=True, text=True, check=True).stdout.strip()
    (bin_dir / "sort").write_text(f'#!/bin/bash\necho sorting >&2\nsleep 1\nexec {real_sort} "$@"\n')
    (bin_dir / "sort").chmod(0o755)
    plant = 'printf "100.5 143 0 n1\\n" > "$GPUSCALE_EXIT_DIR/task-0"; printf "100.2 1 1 n2\\n" > "$GPUSCALE_EXIT_DIR/task-1"'
    script = "\n".join(["set -euo pipefail", *stop_handling(), f"( {plant}; exit 143 ) &", *requeue_block(0)])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "78", "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path)}
    job = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    assert job.stderr is not None
    said = []
    for line in job.stderr:
        said.append(line.rstrip("\n"))
        if line == "sorting\n":
            os.killpg(job.pid, signal.SIGTERM)
            break
    said += job.stderr.read().splitlines()
    assert job.wait(timeout=30) == 1, said
    assert [line for line in said if line.startswith("gpuscale:")] == [
        "gpuscale: rank 1 on n2 failed first, with exit code 1 (srun: 143); the job ends with 1"], said


def test_a_rank_that_exits_75_first_ends_the_job_with_75_and_requeues_it(tmp_path):
    code, lines = _run(tmp_path, {"0": "100.6 143 0 n1", "1": "100.3 75 1 n2"}, srun_code=143, max_requeues=3)
    assert code == 75
    assert lines[0] == ("gpuscale: rank 1 on n2 ended first, with exit code 75 (srun: 143), which asks for the job to run again; "
                        "the job ends with 75")
    assert lines[1].startswith("gpuscale: the step stopped at a checkpoint; requeueing job 77 (restart 1 of at most 3)")
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "77"]


def test_the_requeue_survives_slurms_term_to_the_job_without_a_word_from_bash(tmp_path):
    """At `scontrol requeue` SLURM ends the job's processes with TERM, scontrol too when it has not exited yet: the
    stand-in does that (TERM to its process group) before it exits 0. The job still ends with 75, says nothing of a
    failed requeue, and bash prints no "Terminated" for scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = shlex.quote(str(tmp_path / "scontrol.calls"))
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nkill -TERM 0\nsleep 0.3\necho exited >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    plant = 'echo "100.1 75 0 n1" > "$GPUSCALE_EXIT_DIR/task-0"; touch "$GPUSCALE_STOP_MARKER.stopped"'
    script = "\n".join(["set -euo pipefail", *stop_handling(), f"( {plant}; exit 75 ) &", *requeue_block(3)])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "79", "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, start_new_session=True)
    assert result.returncode == 75, result.stderr
    assert (tmp_path / "scontrol.calls").read_text().split("\n")[:2] == ["requeue 79", "exited"]
    assert "Terminated" not in result.stderr and "could not requeue" not in result.stderr, result.stderr
    assert "requeueing job 79 (restart 1 of at most 3)" in result.stderr


def test_a_stop_at_a_checkpoint_is_not_told_as_a_failure(tmp_path):
    """Every rank stopped at a checkpoint (StopSignal's note): 75 from each, and no rank 'failed first'."""
    code, lines = _run(tmp_path, {"0": "100.1 75 0 n1", "1": "100.2 75 1 n2"}, srun_code=75, stopped=True)
    assert code == 75 and lines == ["gpuscale: the step stopped at a checkpoint; not requeued (--max-requeues 0); submit the job again "
                                    "to resume from its checkpoint"]


def test_a_job_that_succeeded_says_nothing(tmp_path):
    assert _run(tmp_path, {}, srun_code=0) == (0, [])


@pytest.mark.parametrize("how, code, said", [("os.kill(os.getpid(), signal.SIGKILL)", 137, "was killed by SIGKILL (exit code 137)"),
                                             ("os.kill(os.getpid(), signal.SIGTERM)", 143, None),
                                             ("sys.exit(3)", 3, None)])
def test_an_srun_task_notes_its_code_and_host_and_names_a_kill_in_place_of_bashs_notice(tmp_path, how, code, said):
    program = f"{shlex.quote(sys.executable)} -c {shlex.quote(f'import os, signal, sys; print(1, file=sys.stderr); {how}')}"
    env = {"PATH": os.environ["PATH"], "GPUSCALE_EXIT_DIR": str(tmp_path), "SLURM_PROCID": "3", "SLURM_NTASKS": "4",
           "HOSTNAME": "first-node"}  # as srun passes it on from the batch shell: not this task's host
    result = subprocess.run(["bash", "-c", task_exit_note(program)], env=env, capture_output=True, text=True, timeout=30)
    host = socket.gethostname()
    assert result.returncode == code
    expected = ["1"] + ([f"[gpuscale] rank 3/4 on {host} {said}"] if said else [])
    assert result.stderr.splitlines() == expected  # the program's own stderr stays; no "Killed" or "Terminated" from bash
    when, noted, rank, where = (tmp_path / "task-3").read_text().split()
    assert (int(noted), rank, where) == (code, "3", host) and float(when) > 1e9


def test_srun_tasks_under_a_storm_of_term_still_note_whole_lines_and_say_nothing_else(tmp_path):
    """At the time limit SLURM signals every process of the step, and more signals follow while a task's shell notes
    its exit. Hundreds of tasks, one after another, in a process group that gets a TERM every 3 ms: each task either
    died of the TERM before its trap was set (no note; its loop says "Terminated"), or ended with its program's code,
    1, or 143 when the TERM ended the program, and noted that code in a whole line "<time> <code> <rank> <host>".
    Nothing else is said (bash 5.2's broken command substitutions, its aborts and pending-trap warnings are what this
    stress brought out before)."""
    task = task_exit_note("env false")  # an external program, which a TERM can end
    loop = (f'trap : TERM; echo ready >&2; i=0; while [ "$i" -lt 300 ]; do SLURM_PROCID=$i bash -c {shlex.quote(task)}; '
            f'echo "$i $?" >> {shlex.quote(str(tmp_path / "status"))}; i=$((i + 1)); done; echo finished >&2')
    notes_dir = tmp_path / "notes"
    notes_dir.mkdir()
    env = {"PATH": os.environ["PATH"], "GPUSCALE_EXIT_DIR": str(notes_dir), "SLURM_NTASKS": "300"}
    shells = subprocess.Popen(["bash", "-c", loop], env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    assert shells.stderr is not None and shells.stderr.readline() == "ready\n"
    deadline = time.monotonic() + 120
    while shells.poll() is None and time.monotonic() < deadline:
        os.killpg(shells.pid, signal.SIGTERM)
        time.sleep(0.003)
    if shells.poll() is None:
        os.killpg(shells.pid, signal.SIGKILL)
    said = shells.stderr.read().splitlines()
    assert [line for line in said if line != "Terminated"] == ["finished"], said
    status = dict(line.split() for line in (tmp_path / "status").read_text().splitlines())
    assert len(status) == 300 and set(status.values()) <= {"1", "143"}, sorted(set(status.values()))
    notes = {path.name.removeprefix("task-"): path.read_text() for path in notes_dir.glob("task-*")}
    unnoted = [task for task in status if task not in notes]
    assert len(unnoted) == said.count("Terminated"), "a task ended without its note, and not by a TERM before its trap"
    assert all(status[task] == "143" for task in unnoted)
    assert len(notes) >= 30, f"only {len(notes)} of 300 tasks got past their trap: the storm tested nothing"
    host = socket.gethostname()
    garbled = {task: text for task, text in notes.items()
               if not (len(text.split()) == 4 and float(text.split()[0]) > 1e9
                       and text.split()[1:] == [status[task], task, host] and text.endswith("\n"))}
    assert not garbled, f"{len(garbled)} of {len(notes)} notes garbled, e.g. {sorted(garbled.items())[:3]}"


def test_a_note_that_cannot_be_written_is_said_and_the_code_kept(tmp_path):
    (tmp_path / "task-3").mkdir()  # where the note goes: a folder (a full disk, a stale handle fail the same way)
    env = {"PATH": os.environ["PATH"], "GPUSCALE_EXIT_DIR": str(tmp_path), "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    result = subprocess.run(["bash", "-c", task_exit_note("sh -c 'exit 3'")], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 3
    assert "task-3: Is a directory" in result.stderr, result.stderr


GOLDEN = Path(__file__).parent / "golden"


def _substitutions(shell: str) -> list[str]:
    """The command substitutions `$(...)` in `shell`, leaving out arithmetic `$((...))` and single-quoted text."""
    unquoted = re.sub(r"'[^']*'", "''", shell.replace("""'"'"'""", ""))  # a quote inside single quotes: '"'"'
    return re.findall(r"\$\((?!\()[^)]*\)?", unquoted)


@pytest.mark.parametrize("script", sorted(GOLDEN.glob("*.sh")), ids=lambda path: path.stem)
def test_no_shell_runs_a_command_substitution_while_a_trap_of_its_own_is_set(script):
    """bash 5.2 breaks a command substitution that a trap interrupts (docs/traps.md): once the batch shell has set
    its traps it reads nothing through `$(...)` (the task's own shell, single-quoted, is checked below); a task's shell
    reads none between its `trap :` and the `trap ''` that follows its program."""
    text = script.read_text()
    after = text[text.index("trap 'on_signal TERM' TERM"):]
    code = "\n".join(line for line in after.splitlines() if not line.lstrip().startswith("#"))
    assert _substitutions(code) == [], script.name
    task = task_exit_note("python3 train.py")
    trapped = task[task.index("trap : USR1 TERM"):task.index("trap '' USR1 TERM")]
    assert "$(" not in trapped and "`" not in trapped
    assert _substitutions("""x=$(date) y=$((1 + 2)) z='$(a '"'"'b'"'"' c)'""") == ["$(date)"]  # the finder finds


def test_every_rank_refusing_the_same_input_names_the_one_that_printed_it(tmp_path):
    """2 nodes refuse the same --data: rank 1 (n2) printed it, rank 0 (n1) noted a repeat of rank 1's and ended first.
    The last line names rank 1, whose error is the one in the log."""
    code, lines = _run(tmp_path, {"0": "100.1 2 0 n1", "1": "100.3 2 1 n2"}, srun_code=2, repeats={0: 1})
    assert code == 2
    assert lines == ["gpuscale: rank 1 on n2 failed first, with exit code 2 (srun: 2); the job ends with 2"]
