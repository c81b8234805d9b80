"""Which rank failed first, and the launcher's last line: from torchrun's failures and the ranks' own notes.

The launcher's side of `gpuscale.runtime.failures` (`gpuscale.agent`, for `gpuscale run` and a batch script's node task):
the ranks' notes in the failure folder (`read_notes`; for a script without gpuscale, the probe's record of its
uncaught exception: `note_from_record`) and torchrun's failures tell which rank failed first (the cause, not the
first victim: `first_failure`) and with what exit code (`verdict`). torchrun's FAILED block is left out: its
tracebacks are the ones the ranks printed (`unseen_tracebacks` keeps one no rank printed), its exit codes are in
the last line, and so are its log lines on the workers' ends (`quiet_torchrun_logs`). A rank that a signal ended
gets a line of its launcher's (`killed_rank_line`): it could not say so itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuscale.base.exits import EXIT_STOPPED
from gpuscale.runtime.failures import PEER_SYMPTOMS

__all__ = ["read_notes", "note_from_record", "first_failure", "verdict", "killed_rank_line", "unseen_tracebacks",
           "quiet_torchrun_logs"]


def read_notes(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The ranks' notes in `directory`, by rank (a damaged one is skipped)."""
    notes = {}
    for path in Path(directory).glob("rank-*.json"):
        try:
            note = json.loads(path.read_text())
            notes[int(note["rank"])] = note
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return notes


def note_from_record(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The note of a rank that raised without gpuscale's report, from its probe record (None if it did not raise).

    A script that does not use gpuscale leaves no note, but the probe saw its uncaught exception
    (after Python's hook printed it), also when the agent's SIGTERM ended the rank before its exit:
    enough to tell the rank that raised from the one that only lost its peer.
    """
    if not record.get("error") or not isinstance(record.get("rank"), int):
        return None
    error = str(record.get("error") or "")
    return {"rank": record["rank"], "time": record.get("written_at") or time.time(), "host": record.get("host"),
            "symptom": any(symptom in error for symptom in PEER_SYMPTOMS), "message": error, "repeat_of": None}


def first_failure(failures: Mapping[int, Any], notes: Mapping[int, Mapping[str, Any]]) -> int:
    """The rank that failed first, of torchrun's `failures` (each with exitcode and timestamp). Pure.

    torchrun orders failures by whole-second timestamps, and a rank whose collective lost its
    peer fails within the same second as the peer: on ties it would name rank 0, the victim. The
    ranks' own notes (precise time, and whether the error is only a lost peer) decide instead: a
    real failure before a symptom, then the earliest; a rank without a note (killed, os._exit)
    counts as a real failure at torchrun's time. SIGTERM is how the agent stops the survivors once
    one rank failed, even one already on its way out: a rank it ended comes after the real failures
    that ended on their own even with a note of its own error, before the symptoms; without such a
    note it comes last. A rank that failed with the error another rank printed (every rank refusing
    the same input) stands for that rank, which is named: its report is the one on screen.
    """
    def key(rank: int) -> tuple[int, float, int]:
        note = notes.get(rank)
        stopped = failures[rank].exitcode == -signal.SIGTERM
        if note is None or (stopped and note.get("symptom")):
            return (3 if stopped else 0), float(failures[rank].timestamp), rank
        return (2 if note.get("symptom") else 1 if stopped else 0), float(note.get("time", failures[rank].timestamp)), rank

    first = min(failures, key=key)
    printed = notes.get(first, {}).get("repeat_of")
    return printed if isinstance(printed, int) and printed in failures else first


def verdict(failures: Mapping[int, Any], notes: Mapping[int, Mapping[str, Any]], nproc: int, host: str) -> tuple[int, str]:
    """`gpuscale run`'s exit code and last line for torchrun's `failures` of the `nproc` ranks on `host`. Pure."""
    if all(failure.exitcode == EXIT_STOPPED for failure in failures.values()):
        return EXIT_STOPPED, (f"gpuscale run: every rank stopped on request after writing a checkpoint (exit code {EXIT_STOPPED}); "
                              "run the same command again to resume")
    codes = {failure.exitcode for failure in failures.values()}
    if len(failures) == nproc and len(codes) == 1 and min(codes) > 0 and not notes:
        # every rank returned the same status and none raised: most likely the script's own verdict (gpuscale doctor's 1);
        # anything a rank printed is above. (One rank's exit that made the agent stop the others is a failure, below.)
        return min(codes), f"gpuscale run: every rank exited with code {min(codes)}"
    ended = _ended_first(failures, notes, nproc)
    if ended:
        waited = ", ".join(map(str, sorted(failures)))
        return 1, (f"gpuscale run: rank{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))} on {host} ended (exit code 0) "
                   f"while rank{'s' if len(failures) > 1 else ''} {waited} still waited in a collective (its error is above): "
                   "the ranks did not run the same collectives (uneven batches per rank, or one that returned early)")
    rank = first_failure(failures, notes)
    same = sorted(r for r, note in notes.items() if note.get("repeat_of") == rank and r in failures)
    code = _story_code(failures, notes, (rank, *same))
    where = f"signal {_signal_name(-code)}" if code < 0 else f"exit code {code}"
    line = f"gpuscale run: rank {rank} on {host} failed first ({where}{'; its error is above' if rank in notes else ''})"
    if same:
        line += f", and rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))} with the same error"
    others = set(failures) - {rank, *same}
    absent = sorted(r for r in others if r not in notes and failures[r].exitcode == -signal.SIGTERM)
    if absent and _timed_out(notes.get(rank)):
        # a collective that timed out waited for ranks that never joined it: still running, with nothing to say
        line += (f"; it timed out waiting in a collective, while rank{'s' if len(absent) > 1 else ''} "
                 f"{', '.join(map(str, absent))} still ran (stuck elsewhere, or slower than the timeout) and "
                 f"{'were' if len(absent) > 1 else 'was'} stopped")
    elif others:
        line += "; the other ranks were stopped"
    return (128 - code if code < 0 else (code or 1)), line


def _ended_first(failures: Mapping[int, Any], notes: Mapping[int, Mapping[str, Any]], nproc: int) -> list[int]:
    """This node's ranks that exited 0 while every rank that failed only lost its peer (or, with no note, was stopped
    by the agent once one did): those ended first. (torchrun gives each node a block of `nproc` consecutive ranks, and
    names only the failed ones.)"""
    def lost(rank: int) -> bool:
        note = notes.get(rank)
        return bool(note.get("symptom")) if note else failures[rank].exitcode == -signal.SIGTERM
    if not any((notes.get(rank) or {}).get("symptom") for rank in failures) or not all(lost(rank) for rank in failures):
        return []
    first = min(failures) // nproc * nproc
    return sorted(set(range(first, first + nproc)) - set(failures))


TIMEOUT_SYMPTOMS = (re.compile(r"Timed out waiting \d+ms for (recv|send) operation"),  # gloo
                    re.compile(r"Watchdog caught collective operation timeout"))  # NCCL's watchdog
"""Error texts of a collective that waited out its timeout: its peers never joined it. (A download's "timed out"
is not one: the rank that timed out there was the one others waited for.)"""


def _timed_out(note: Mapping[str, Any] | None) -> bool:
    return note is not None and any(pattern.search(str(note.get("message") or "")) for pattern in TIMEOUT_SYMPTOMS)


def _story_code(failures: Mapping[int, Any], notes: Mapping[int, Mapping[str, Any]], ranks: tuple[int, ...]) -> int:
    """The exit code of a failure shared by `ranks` (the first of them named): the first that ended on its own.

    When the agent stopped them all (SIGTERM) on their way out after an exception they noted, 1: what
    Python's exit after an uncaught exception is, which the agent only cut short; else the first rank's.
    """
    for rank in ranks:
        if failures[rank].exitcode != -signal.SIGTERM:
            return failures[rank].exitcode
    note = notes.get(ranks[0])
    return 1 if note is not None and not note.get("symptom") else failures[ranks[0]].exitcode


def killed_rank_line(rank: int, exitcode: int, world_size: int | None, host: str) -> str:
    """A line for a rank that a signal ended (negative `exitcode`, as torchrun reports it), which could not say so
    itself: SIGKILL from the out-of-memory killer or by hand. Nothing for SIGTERM: that is how a launcher or SLURM
    stops the ranks once one failed (or at the time limit), told by the last line. Pure."""
    if exitcode >= 0 or exitcode == -signal.SIGTERM:
        return ""
    who = f"rank {rank}/{world_size}" if world_size else f"rank {rank}"
    return f"[gpuscale] {who} on {host} was killed by {_signal_name(-exitcode)} (exit code {128 - exitcode})\n"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def unseen_tracebacks(failures: Mapping[int, Any], notes: Mapping[int, Any], host: str) -> str:
    """The traceback in torchrun's error file of each failed rank whose own output did not show it.

    An exception that reached a rank's excepthook was printed there (gpuscale run never redirects
    the workers' output), and one gpuscale reported was printed by its report: both left a note. An
    error file written otherwise (torch's @record around code that then exits quietly, or with the
    probe off) may be the only trace of the error: it is shown, with the rank.
    """
    shown = []
    for rank, failure in sorted(failures.items()):
        message = failure.message if isinstance(failure.message, dict) else {}
        text = message.get("extraInfo", {}).get("py_callstack") or ""
        if text and rank not in notes:
            shown.append(f"[gpuscale] rank {rank} on {host} failed (from torchrun's error file):\n{text.rstrip()}\n")
    return "".join(shown)


@contextlib.contextmanager
def quiet_torchrun_logs() -> Iterator[None]:
    """Drop torchrun's routine log lines about its workers' ends while it runs here; the last line says it instead.

    They are the elastic agent's warnings and errors that a worker failed (exit code, pid) and that
    the others are being sent SIGTERM, printed between the failing rank's report and gpuscale's
    line. Everything else torchrun logs stays; with LOGLEVEL set (torchrun's own switch) nothing is dropped.
    """
    if os.environ.get("LOGLEVEL"):
        yield
        return
    routine = _RoutineLines()
    loggers = [logging.getLogger(name) for name in _ROUTINE_LOGGERS]
    for logger in loggers:
        logger.addFilter(routine)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(routine)


_ROUTINE_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api",
                    "torch.distributed.elastic.multiprocessing.errors")


class _RoutineLines(logging.Filter):
    """Passes every record but the routine ones on a worker's end (matched on torchrun's message formats), and the
    traceback of an error file torch could not parse, which `gpuscale.launch.agent` says in its last line instead."""

    ROUTINE = ("failed (exitcode: ", "Sending process %s closing signal", "Closing process %s via signal",
               "Received %s death signal, shutting down workers", "Failed to parse reply file")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))
