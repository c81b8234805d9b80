"""torchrun's elastic agent on one node, ending with gpuscale's account of what failed first.

Used by `gpuscale run` for this node's workers, and by a gpuscale batch script in torchrun mode, whose task on
each node runs ``python -m gpuscale.agent TORCHRUN_ARGS`` where the job's own Python has gpuscale (plain
torchrun otherwise). Either way:

- torchrun's routine log lines on a worker's end and its FAILED block are left out (`verdicts.quiet_torchrun_logs`):
  the ranks told their own story (`gpuscale.runtime.failures`); a traceback no rank printed is shown (`unseen_tracebacks`);
- the exit code is the first failing rank's own (torchrun's is 1 for any failure), or 128 + the signal that
  ended the agent, as a shell reports it; 75 where that signal, passed on, stopped the ranks at a checkpoint
  (`gpuscale run`: a loop around it tells "run me again" from a death).

`gpuscale run` ends with a line naming the rank that failed first (`Outcome.line`). In a batch script the node
notes that rank instead, in the job's exit-notes folder (GPUSCALE_EXIT_DIR, `slurm.stopping`): the batch script
names the first failure of all nodes in its own last line, once. The node's only line of its own is for a rank
killed by a signal (SIGKILL: the out-of-memory killer), which could not say so itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.base.exits import EXIT_STOPPED, STOP_MARKER, stopped_marker
from gpuscale.base.quickexit import skip_final_collection
from gpuscale.base.tempdirs import launcher_temp_dir
from gpuscale.launch.verdicts import first_failure, killed_rank_line, note_from_record, quiet_torchrun_logs, read_notes, unseen_tracebacks, verdict
from gpuscale.measure.probe import read_records
from gpuscale.runtime.failures import EXIT_DIR, FAILURE_DIR

__all__ = ["Outcome", "launch", "SIGNALS_OPTION", "write_exit_note", "main"]

SIGNALS_OPTION = "--signals-to-handle"


@dataclass(frozen=True)
class Outcome:
    """How the agent's run ended: its exit code, `gpuscale run`'s last line (None: nothing failed), and the rank
    that failed first with when it did (None where a signal ended the agent, or nothing failed)."""

    code: int
    line: str | None = None
    rank: int | None = None
    when: float | None = None
    unseen: str = ""  # the tracebacks no rank printed (torchrun's error files)
    killed: str = ""  # a line for each rank of this node that a signal other than TERM ended


def launch(argv: list[str], nproc: int, records: Path | None = None, *, pass_usr1: bool = True,
           notes_dir: str | None = None, world_size: int | None = None) -> Outcome:
    """torchrun with `argv` for the `nproc` workers of this node. `records`: the probe's records folder, if any (a
    script without gpuscale leaves its uncaught exception there). `pass_usr1`: before torch 2.10, catch SIGUSR1 and
    pass it on to the workers as torchrun would (`gpuscale run`); a batch script has SLURM hand it to them instead.
    `notes_dir`: where the ranks note their failures (default: a folder of this call's own). `world_size`: all
    nodes' ranks, for the lines on ranks a signal ended."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    own = launcher_temp_dir("failures") if notes_dir is None else None
    directory = own.name if own is not None else str(notes_dir)
    os.environ[FAILURE_DIR] = directory
    own_marker = STOP_MARKER not in os.environ  # a batch script names its own; `gpuscale run` learns of a stop by it too
    if own_marker:
        os.environ[STOP_MARKER] = str(Path(directory) / "stop")
    handles_usr1 = any(arg.split("=", 1)[0] == SIGNALS_OPTION for arg in argv)
    try:
        with quiet_torchrun_logs(), _usr1_like_torchrun(pass_usr1 and not handles_usr1, SignalException):
            torchrun.run(torchrun.parse_args(argv))
    except SignalException as exc:  # also one raised again while torchrun stopped its workers for the first
        return _ended_by_signal(signal.Signals(exc.sigval))
    except ChildFailedError as exc:
        host = socket.gethostname()
        notes = _notes(directory, records, exc.failures)
        code, line = verdict(exc.failures, notes, nproc, host)
        rank = first_failure(exc.failures, notes)
        when = float(notes.get(rank, {}).get("time") or exc.failures[rank].timestamp)
        killed = "".join(killed_rank_line(r, f.exitcode, world_size, host) for r, f in sorted(exc.failures.items()))
        return Outcome(code, line, rank, when, unseen_tracebacks(exc.failures, notes, host), killed)
    except json.JSONDecodeError:  # a rank's error file, cut short by the signal that stopped the rank (torch's @record)
        return _unreadable_error_file(directory, records)
    finally:
        if own_marker:
            os.environ.pop(STOP_MARKER, None)
        if own is not None:
            own.cleanup()
    return Outcome(0)


def _ended_by_signal(received: signal.Signals) -> Outcome:
    """The outcome of an agent a signal ended, after it passed the signal on to its workers: EXIT_STOPPED where a rank
    stopped at a checkpoint (`gpuscale.StopSignal` leaves the stopped marker: the checkpoint, collective, was written
    by every rank), so that a loop around `gpuscale run` can tell "run me again" from a death; else 128 + the signal.
    The marker is this agent's own (`gpuscale run`) or its batch script's (a folder of the job's run of its own): a
    node's task then ends with the code that asks for the job to run again, where 128 + 10 read as a death by USR1."""
    marker = os.environ.get(STOP_MARKER)
    if marker and os.path.exists(stopped_marker(marker)):
        return Outcome(EXIT_STOPPED, when=time.time(),
                       line=(f"gpuscale run: got {received.name}; passed it on to the workers, which stopped at a checkpoint "
                             f"(exit code {EXIT_STOPPED}): run the same command again to resume"))
    return Outcome(128 + int(received), when=time.time(),
                   line=(f"gpuscale run: got {received.name}; passed it on to the workers, which ended without stopping "
                         "at a checkpoint (a script with gpuscale.StopSignal writes one)"))


def _unreadable_error_file(directory: str, records: Path | None) -> Outcome:
    """The outcome of a run whose failure torchrun could not take in, since a rank's error file was empty or cut
    short (written in place by torch's ``@record``, the rank stopped mid-write): the agent has stopped the workers,
    and the ranks' own notes say which failed first (this node's: a batch script's nodes share the folder); the exit
    codes are unknown (1)."""
    host = socket.gethostname()
    notes = {rank: note for rank, note in _notes(directory, records, None).items() if note.get("host") in (host, None)}  # this node's
    if not notes:
        return Outcome(1, "gpuscale run: a rank failed, and torchrun could not read its error file (empty or cut short); "
                          "the ranks' output above says why", when=time.time())
    unread = {r: _Unread(float(note.get("time") or time.time())) for r, note in notes.items()}  # what torchrun would have said
    rank = first_failure(unread, notes)  # a cause before a victim, the earliest; the rank whose error is on screen
    return Outcome(1, f"gpuscale run: rank {rank} on {host} failed first (its error is above; its exit code is unknown: "
                      "torchrun could not read a rank's error file)", rank, float(notes[rank].get("time") or time.time()))


@dataclass(frozen=True)
class _Unread:
    """A failure torchrun could not read: exit code unknown (1), at its rank's noted time."""

    timestamp: float
    exitcode: int = 1


def _notes(directory: str, records: Path | None, failures: Mapping[int, Any] | None) -> dict[int, dict[str, Any]]:
    """What the failed ranks of this node said of their failure: gpuscale's notes, else the probe's record of an exception."""
    notes = {}
    for record in read_records(records) if records else []:
        note = note_from_record(record)
        if note is not None:
            notes[note["rank"]] = note
    notes.update(read_notes(directory))
    return {rank: note for rank, note in notes.items() if failures is None or rank in failures}


@contextmanager
def _usr1_like_torchrun(needed: bool, signal_exception: type[Exception]) -> Iterator[None]:
    """Before torch 2.10 torchrun cannot be told to handle SIGUSR1 (no --signals-to-handle): do what it would.

    Its own handler (for TERM, INT, HUP, QUIT there) raises SignalException in the launcher, and
    the agent then stops the workers with that very signal, waits for them (30 s), and re-raises.
    Without this USR1 (SLURM's warning before the time limit) would end the launcher at once, by
    its default action: no worker would get the USR1 that tells gpuscale.StopSignal to checkpoint.
    """
    if not needed or not hasattr(signal, "SIGUSR1"):
        yield
        return

    def raise_signal_exception(signum: int, frame: Any) -> None:
        raise signal_exception(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))  # type: ignore[call-arg]

    previous = signal.signal(signal.SIGUSR1, raise_signal_exception)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def write_exit_note(directory: str, task: str, outcome: Outcome, host: str) -> None:
    """Note `outcome` (non-zero) in `directory`/task-`task` for the batch script; a failed write loses only the note."""
    rank = "-" if outcome.rank is None else str(outcome.rank)
    try:
        Path(directory, f"task-{task}").write_text(f"{outcome.when or time.time():.6f} {outcome.code} {rank} {host}\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """A batch script's node task: torchrun's options and the script, as torchrun takes them; its exit code.

    USR1 stays as the batch script set it (ignored before torch 2.10; SLURM hands it to every process of the
    step, the workers too). The ranks' failure notes go to the job's exit-notes folder, which every node sees.
    """
    from torch.distributed import run as torchrun

    argv = sys.argv[1:] if argv is None else argv
    options = torchrun.parse_args(argv)
    nproc = int(options.nproc_per_node)
    nodes = int(str(options.nnodes).split(":")[-1])
    exits = os.environ.get(EXIT_DIR) or None
    probe = os.environ.get("GPUSCALE_PROBE_DIR")
    outcome = launch(argv, nproc, Path(probe) if probe else None, pass_usr1=False,
                     notes_dir=os.environ.get(FAILURE_DIR) or None, world_size=nodes * nproc)
    said = outcome.unseen + outcome.killed
    if outcome.code and not exits and outcome.line:  # no batch script to name the first failure: this node does
        said += outcome.line.replace("gpuscale run:", "gpuscale:", 1) + "\n"
    if said:
        sys.stderr.write(said)
        sys.stderr.flush()
    if outcome.code and exits:
        write_exit_note(exits, os.environ.get("SLURM_PROCID", "0"), outcome, socket.gethostname())
    return outcome.code


if __name__ == "__main__":
    skip_final_collection()
    sys.exit(main())
