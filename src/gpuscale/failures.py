"""How a failure is told: the failing rank first, with its rank and host, once; `gpuscale run`'s last line names it.

In the rank, `gpuscale.init()` calls `report_failure` when the training raises: the failing rank's
traceback (one line for a ValueError, gpuscale's way of saying the input was wrong), a single line
for a rank that only lost its peer (`is_peer_symptom`: the peer's report says why), the exception
recorded for torchrun's summary, and a note in ``$GPUSCALE_FAILURE_DIR/rank-N.json`` (time,
symptom, message). What it printed is not printed again: Python's traceback on the way out is
skipped for it (`quiet_excepthook`), and under `gpuscale run` an error that another rank of this node
already printed (every rank refusing the same input) is only noted, as a repeat of that rank's.

In `gpuscale run`, `first_failure` and `verdict` read those notes (or, for a script without
gpuscale, the probe's record of an uncaught exception: `note_from_record`) and torchrun's failures,
and tell in the launcher's last line which rank failed first (the cause, not the first victim) and
with what exit code. torchrun's FAILED block is left out: its tracebacks are the ones the ranks
printed (`unseen_tracebacks` keeps one no rank printed), its exit codes are in that line, and so are
its log lines on the workers' ends (`quiet_torchrun_logs`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuscale.env import DistEnv
from gpuscale.exits import EXIT_STOPPED
from gpuscale.files import atomic_write_json

__all__ = ["FAILURE_DIR", "PEER_SYMPTOMS", "report_failure", "is_peer_symptom", "note_failure", "quiet_excepthook",
           "one_line_for_a_lost_peer",
           "read_notes", "note_from_record", "first_failure", "verdict",
           "unseen_tracebacks", "quiet_torchrun_logs"]

FAILURE_DIR = "GPUSCALE_FAILURE_DIR"
"""Set by `gpuscale run`: where each failing rank writes rank-N.json (time, symptom, message, repeat_of)."""
PEER_SYMPTOMS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
                 "NCCL communicator was aborted", "ProcessGroupNCCL is aborted")
"""Error texts of a collective whose peer went away: a rank failing so is a victim, not the cause."""
_REPORTED = "_gpuscale_reported"  # set on an exception whose report went out: Python's hook must not print it again


def report_failure(env: DistEnv, exc: BaseException) -> None:
    """Name the failing rank, its host and traceback first, and tell torchrun's summary about it.

    A ValueError is gpuscale's (and the examples') way to say the input was wrong: one line, no
    traceback. With one process the caller (the CLI, or Python's traceback) says it, once.
    """
    repeat_of = None if is_peer_symptom(exc) else _said_before(env.rank, exc)
    text = "" if repeat_of is not None else _report_text(env, exc)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    if text or repeat_of is not None:
        _mark_reported(exc)
    note_failure(env, exc, repeat_of)
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        try:
            from torch.distributed.elastic.multiprocessing.errors import get_error_handler

            get_error_handler().record_exception(exc)
        except Exception:  # the report above already went out; the error file is a courtesy
            pass


def _report_text(env: DistEnv, exc: BaseException) -> str:
    """What this rank prints about `exc`: one line for a lost peer or a ValueError, else its traceback."""
    who = f"[gpuscale] rank {env.rank}/{env.world_size} on {socket.gethostname()}"
    if is_peer_symptom(exc):  # one line: the traceback that matters is the peer's, which comes first
        return _lost_peer_line(who, exc)
    if isinstance(exc, ValueError):
        return f"{who} failed: {exc}\n" if env.world_size > 1 else ""
    return f"{who} failed:\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _lost_peer_line(who: str, exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    first = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", first)  # gloo's "[.../pair.cc:553] " source location
    return f"{who} stopped: a peer rank failed first ({_shortened(first, 160)}); its report above says why\n"


def _shortened(text: str, limit: int) -> str:
    """`text` cut at a word boundary to at most `limit` characters, with an ellipsis where it was cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:") if " " in text[: limit - 3] else text[: limit - 3]
    return cut + "..."


def one_line_for_a_lost_peer() -> None:
    """For any script, gpuscale's or not: a rank that dies only because a peer died first (a collective's
    "Connection closed by peer") prints one line instead of its traceback; the peer's story is the one that
    matters. A rank that fails with the error another rank of its node already printed (every rank refusing
    the same start-up, a Lightning `ValueError` on each) says so in one line, and the first one's traceback
    is headed by its rank and host. Installed by gpuscale's start-up hook before the script runs; the hooks
    below it still see the exception (the probe records it), with their output dropped."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if getattr(value, _REPORTED, False) or os.environ.get("WORLD_SIZE", "1") in ("", "0", "1"):
            previous(kind, value, tb)
            return
        who = f"[gpuscale] rank {os.environ.get('RANK', '?')}/{os.environ.get('WORLD_SIZE', '?')} on {socket.gethostname()}"
        if _a_collective_lost_its_peer(value):
            sys.stderr.write(_lost_peer_line(who, value))
        else:
            rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None
            first = _said_before(rank, value) if rank is not None and not isinstance(value, SystemExit) else None
            if first is None or first == rank:
                sys.stderr.write(f"{who} failed:\n")
                sys.stderr.flush()
                previous(kind, value, tb)
                return
            note_failure(rank, value, first)
            sys.stderr.write(f"{who} failed with the error rank {first} printed: {type(value).__name__}\n")
        sys.stderr.flush()
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            previous(kind, value, tb)
        finally:
            sys.stderr = stderr

    sys.excepthook = hook


def _a_collective_lost_its_peer(exc: BaseException) -> bool:
    """`is_peer_symptom`, and surely from a collective of a job of several ranks: raised by torch (its
    distributed errors) or by gloo (its "[.../pair.cc:N]" source location). A failed download's "Connection
    reset by peer" or a closed pipe's "Broken pipe" in a script keeps its traceback."""
    if not is_peer_symptom(exc) or os.environ.get("WORLD_SIZE", "1") in ("", "0", "1"):
        return False
    from_torch = type(exc).__module__.startswith("torch")
    return from_torch or re.match(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]", str(exc)) is not None


def _said_before(rank: int, exc: BaseException) -> int | None:
    """The rank of this node that already printed this very error (None: this rank is the first, or no
    `gpuscale run` to share with). The first rank claims the error's name in $GPUSCALE_FAILURE_DIR by a
    hard link, which only one rank can make; restarts (--max-restarts) claim anew."""
    directory = os.environ.get(FAILURE_DIR)
    if not directory:
        return None
    text = f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\0{type(exc).__name__}: {exc}"
    claim = Path(directory) / f"said-{hashlib.sha256(text.encode(errors='replace')).hexdigest()[:16]}"
    mine = claim.with_name(f"{claim.name}.rank-{rank}")
    try:
        mine.write_text(str(rank))
        os.link(mine, claim)
        return None
    except FileExistsError:
        try:
            return int(claim.read_text())
        except (OSError, ValueError):
            return None
    except OSError:  # no shared folder after all: say it
        return None
    finally:
        with contextlib.suppress(OSError):
            mine.unlink()


def _mark_reported(exc: BaseException) -> None:
    """Have `quiet_excepthook` skip `exc`: its report went out (or a peer's identical one did)."""
    try:
        setattr(exc, _REPORTED, True)
    except (AttributeError, TypeError):  # an exception type without attributes: Python's traceback follows, as before
        return
    if not getattr(sys.excepthook, _REPORTED, False):
        sys.excepthook = quiet_excepthook(sys.excepthook)


def quiet_excepthook(previous: Any) -> Any:
    """A sys.excepthook that prints nothing for an exception `report_failure` already reported.

    The hooks below it still see the exception, with their output dropped: the probe notes it in its
    record, torch's hook (which prefixes each line with [rankN]) and Python's print into nothing.
    Any other exception goes to `previous` unchanged.
    """
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not getattr(value, _REPORTED, False):
            previous(kind, value, tb)
            return
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            previous(kind, value, tb)
        finally:
            sys.stderr = stderr

    setattr(hook, _REPORTED, True)
    return hook


def is_peer_symptom(exc: BaseException) -> bool:
    """True if `exc` says a collective lost its peer (the peer failed first), not what went wrong."""
    text = str(exc)
    return isinstance(exc, (RuntimeError, OSError)) and any(s in text for s in PEER_SYMPTOMS)


def note_failure(env: DistEnv | int, exc: BaseException, repeat_of: int | None = None) -> None:
    """Leave $GPUSCALE_FAILURE_DIR/rank-N.json for `gpuscale run` (and srun mode's batch script): when, whether a
    symptom, the message, and which rank already printed the same error (`repeat_of`). `env`: the rank's, or its rank."""
    directory = os.environ.get(FAILURE_DIR)
    if not directory:
        return
    rank = env if isinstance(env, int) else env.rank
    note = {"rank": rank, "time": time.time(), "symptom": is_peer_symptom(exc), "message": str(exc)[:500], "repeat_of": repeat_of}
    try:
        atomic_write_json(Path(directory) / f"rank-{rank}.json", note)
    except Exception:  # a courtesy for the launcher's summary; the report above went out
        pass


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
    return {"rank": record["rank"], "time": record.get("written_at") or time.time(),
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
    return printed if printed in failures else first


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
    rank = first_failure(failures, notes)
    same = sorted(r for r, note in notes.items() if note.get("repeat_of") == rank and r in failures)
    code = _story_code(failures, notes, (rank, *same))
    where = f"signal {_signal_name(-code)}" if code < 0 else f"exit code {code}"
    line = f"gpuscale run: rank {rank} on {host} failed first ({where}{'; its error is above' if rank in notes else ''})"
    if same:
        line += f", and rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))} with the same error"
    if set(failures) - {rank, *same}:
        line += "; the other ranks were stopped"
    return (128 - code if code < 0 else (code or 1)), line


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


_ROUTINE_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api")


class _RoutineLines(logging.Filter):
    """Passes every record but the routine ones on a worker's end (matched on torchrun's message formats)."""

    ROUTINE = ("failed (exitcode: ", "Sending process %s closing signal", "Closing process %s via signal",
               "Received %s death signal, shutting down workers")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))
