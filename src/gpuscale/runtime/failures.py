"""How a failure is told by the ranks: the failing rank first, with its rank and host, once; the launcher's last line names it.

In the rank, `gpuscale.init()` calls `report_failure` when the training raises: the failing rank's
traceback (one line for a ValueError, gpuscale's way of saying the input was wrong), a single line
for a rank that only lost its peer (`is_peer_symptom`: the peer's report says why; one such line per
node, a moment after the peer's), the exception recorded for torchrun's summary, and a note in
``$GPUSCALE_FAILURE_DIR/rank-N.json`` (time, symptom, message). What it printed is not printed again:
Python's traceback on the way out is skipped for it (`quiet_excepthook`), and under `gpuscale run` or a
gpuscale batch script an error that another rank already printed (every rank refusing the same input)
is only noted, as a repeat of that rank's. gpuscale's start-up hook does the same for a script without
gpuscale (`one_line_for_a_lost_peer`).

The launcher reads those notes (`gpuscale.launch.verdicts`, `gpuscale.agent`) and names in its last line the rank
that failed first (the cause, not the first victim) and its exit code; a batch script does so for all its
nodes (`slurm.stopping`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuscale.base.exits import EXIT_STOPPED
from gpuscale.base.files import atomic_write_json
from gpuscale.detect.env import DistEnv

__all__ = ["FAILURE_DIR", "EXIT_DIR", "PEER_SYMPTOMS", "PEER_REFUSED", "report_failure", "report_refusal", "is_peer_symptom",
           "already_reported",
           "note_failure", "quiet_excepthook", "one_line_for_a_lost_peer", "one_usage_message_per_job", "lost_peer_report",
           "LOST_PEER_PAUSE_S"]

FAILURE_DIR = "GPUSCALE_FAILURE_DIR"
"""Set by `gpuscale run`: where each failing rank writes rank-N.json (time, symptom, message, repeat_of)."""
EXIT_DIR = "GPUSCALE_EXIT_DIR"
"""Set by a gpuscale batch script (to the same folder as FAILURE_DIR, which all its nodes see): where each of its
tasks notes a non-zero exit, in task-<SLURM_PROCID>, one line `<unix time> <code> <rank> <host>` (rank `-`: a
node's torchrun that a signal ended before any of its ranks failed). The batch script names the earliest."""
PEER_REFUSED = "a peer refused to start"
"""How a rank that stopped because a peer refused to start notes it (`gpuscale.runtime.refusal`): a victim."""
PEER_SYMPTOMS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
                 "NCCL communicator was aborted", "ProcessGroupNCCL is aborted", PEER_REFUSED)
"""Error texts of a collective whose peer went away: a rank failing so is a victim, not the cause."""
_REPORTED = "_gpuscale_reported"  # set on an exception whose report went out: Python's hook must not print it again


def report_refusal(environ: Mapping[str, str], exc: ValueError) -> None:
    """One line for a rank whose launcher variables gpuscale refused (no DistEnv could be made of them), named as the
    variables name it, instead of Python's traceback; nothing for one process (the caller says it, once)."""
    try:
        world = int(environ.get("WORLD_SIZE") or environ.get("SLURM_NTASKS") or 1)
    except ValueError:
        world = 0  # unreadable: several processes, likely
    if world == 1:
        return
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or "?"
    sys.stderr.write(f"[gpuscale] rank {rank}/{world or '?'} on {socket.gethostname()} failed: {exc}\n")
    sys.stderr.flush()
    _mark_reported(exc)


def report_failure(env: DistEnv, exc: BaseException) -> None:
    """Name the failing rank, its host and traceback first, and tell torchrun's summary about it.

    A ValueError is gpuscale's (and the examples') way to say the input was wrong: one line, no
    traceback; so is a `sys.exit` with a code (75 asks for a requeue). With one process the caller
    (the CLI, or Python's traceback) says it, once. A rank that only lost its peer notes that first
    (it may be stopped any moment now), then says it in one line, once per node (`lost_peer_report`).
    """
    repeat_of = None if is_peer_symptom(exc) else _said_before(env.rank, exc)
    note_failure(env, exc, repeat_of)
    _record_for_torchrun(exc)
    who = f"[gpuscale] rank {env.rank}/{env.world_size} on {socket.gethostname()}"
    if is_peer_symptom(exc):
        text, reported = lost_peer_report(who, exc, env.rank), True
    else:
        text = "" if repeat_of is not None else _report_text(who, env.world_size, exc)
        reported = bool(text) or repeat_of is not None
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    if reported:
        _mark_reported(exc)


def _record_for_torchrun(exc: BaseException) -> None:
    """torchrun's error file for `exc` (its summary's source), written whole or not at all: torch writes it in place,
    and a rank its launcher stops mid-write (its peer failed first) would leave an empty file, on which torch's launcher
    fails. So torch writes it beside, and a rename puts it in place. A courtesy: the report is what counts."""
    target = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not target:
        return
    partial = f"{target}.{os.getpid()}.partial"
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        os.environ["TORCHELASTIC_ERROR_FILE"] = partial
        try:
            get_error_handler().record_exception(exc)
        finally:
            os.environ["TORCHELASTIC_ERROR_FILE"] = target
        os.replace(partial, target)
    except Exception:
        pass


def _report_text(who: str, world_size: int, exc: BaseException) -> str:
    """What this rank prints about `exc`: one line for a ValueError or an exit with a code, else its traceback."""
    if isinstance(exc, ValueError):
        return f"{who} failed: {exc}\n" if world_size > 1 else ""
    if isinstance(exc, SystemExit):
        why = " (EX_TEMPFAIL: it asks for the job to run again)" if exc.code == EXIT_STOPPED else ""
        return f"{who} exited with code {exc.code}{why}\n" if world_size > 1 else ""
    return f"{who} failed:\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


USAGE_PAUSE_S = 0.5
"""How long a rank whose usage error another rank prints waits before it exits: its launcher stops the other ranks
once one exited, and the one saying it must have said it by then."""
LOST_PEER_PAUSE_S = 1.0
"""How long a rank that lost its peer waits before it says so: the peer's own report, or the line its launcher
prints for a rank a signal ended, is the one its line points up to. (A launcher that stops the rank meanwhile
leaves it unsaid: the last line names the first failure either way.)"""


def lost_peer_report(who: str, exc: BaseException, rank: int | None) -> str:
    """The line of a rank that lost its peer: one per node, after LOST_PEER_PAUSE_S, by the first of its ranks to
    claim it where the launcher shares a failure folder (GPUSCALE_FAILURE_DIR); "" for the others."""
    if rank is not None and _claim(f"lost-peer on {socket.gethostname()}", rank) is not None:
        return ""
    time.sleep(LOST_PEER_PAUSE_S)
    return _lost_peer_line(who, exc)


def _lost_peer_line(who: str, exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    first = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", first)  # gloo's "[.../pair.cc:553] " source location
    return (f"{who} stopped: a peer rank failed or ended first ({_shortened(first, 160)}); its report says why (its own, or "
            "for a rank a signal ended or one that ended without an error, its launcher's)\n")


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
        rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None
        if _a_collective_lost_its_peer(value):
            if rank is not None:
                note_failure(rank, value)
            sys.stderr.write(lost_peer_report(who, value, rank))
        else:
            first = _said_before(rank, value) if rank is not None and not isinstance(value, SystemExit) else None
            if rank is not None:
                note_failure(rank, value, None if first == rank else first)
            if first is None or first == rank:
                sys.stderr.write(f"{who} failed:\n")
                sys.stderr.flush()
                previous(kind, value, tb)
                return
            sys.stderr.write(f"{who} failed with the error rank {first} printed: {type(value).__name__}\n")
        sys.stderr.flush()
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            previous(kind, value, tb)
        finally:
            sys.stderr = stderr

    sys.excepthook = hook


def one_usage_message_per_job() -> None:
    """For any script: argparse's usage error, and its --help, printed by one rank of the job, not by every rank.

    Every rank parses the same command line, so one wrong argument has each rank print the same usage and error
    (16 ranks, 32 lines), and --help prints the whole help once per rank. Where the launcher shares a failure
    folder (`gpuscale run`, a gpuscale batch script), the first rank to say a message says it, unchanged; the
    others print nothing and exit as argparse would (code 2 after an error, 0 after --help). Each rank notes its
    error, the others' as a repeat of the first's, so the launcher's last line names the rank that printed it
    and the ranks with the same error. Installed by gpuscale's start-up hook once the script imports argparse;
    a parser class that overrides `error` or `print_help` without calling argparse's own is left as it is.
    """
    import argparse

    rank = os.environ.get("RANK", "")
    if not os.environ.get(FAILURE_DIR) or not rank.isdigit() or os.environ.get("WORLD_SIZE", "1") in ("", "0", "1"):
        return
    parser_class = argparse.ArgumentParser
    error, print_help = parser_class.error, parser_class.print_help
    if getattr(error, _REPORTED, False):
        return

    def error_once(self: argparse.ArgumentParser, message: str) -> Any:
        said = f"{self.prog}: error: {message}"
        first = _claim(f"usage {said}", int(rank))
        if first in (None, int(rank)):  # this rank says it (again, where it parses again): argparse's own words
            try:
                error(self, message)  # usage and error, exit code 2
            finally:
                note_failure(int(rank), SystemExit(said))  # once said
        note_failure(int(rank), SystemExit(said), first)
        time.sleep(USAGE_PAUSE_S)  # the rank that says it is not stopped mid-line by this one's exit
        self.exit(2)

    def help_once(self: argparse.ArgumentParser, file: Any = None) -> None:
        if file in (None, sys.stdout) and _claim(f"help {self.prog}", int(rank)) not in (None, int(rank)):
            return
        print_help(self, file)

    setattr(error_once, _REPORTED, True)
    parser_class.error = error_once  # type: ignore[method-assign]
    parser_class.print_help = help_once  # type: ignore[method-assign]


def _a_collective_lost_its_peer(exc: BaseException) -> bool:
    """`is_peer_symptom`, and surely from a collective of a job of several ranks: raised by torch (its
    distributed errors) or by gloo (its "[.../pair.cc:N]" source location). A failed download's "Connection
    reset by peer" or a closed pipe's "Broken pipe" in a script keeps its traceback."""
    if not is_peer_symptom(exc) or os.environ.get("WORLD_SIZE", "1") in ("", "0", "1"):
        return False
    from_torch = type(exc).__module__.startswith("torch")
    return from_torch or re.match(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]", str(exc)) is not None


def _said_before(rank: int, exc: BaseException) -> int | None:
    """The rank that already printed this very error (None: this rank is the first, or no `gpuscale run` or batch
    script to share with): every rank refusing the same start-up says it once."""
    return _claim(f"{type(exc).__name__}: {exc}", rank)


def _claim(what: str, rank: int) -> int | None:
    """Claim saying `what` for `rank`: None if this rank is the first to, else the rank that claimed it. The first
    rank claims its name in $GPUSCALE_FAILURE_DIR by a hard link, which only one rank can make; restarts
    (--max-restarts) claim anew. Without that folder every rank is the first."""
    directory = os.environ.get(FAILURE_DIR)
    if not directory:
        return None
    text = f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\0{what}"
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


def already_reported(exc: BaseException) -> bool:
    """Whether gpuscale already told `exc` (``gpuscale.init()``'s failure report, on a run of several ranks: this rank's
    line, or a peer's for the same error). A script that catches a bad-input error to say it in its own words says it
    only where this is False (one process, or an error raised outside ``gpuscale.init()``), so it is said once:

        except ValueError as exc:
            if not gpuscale.already_reported(exc):
                gpuscale.print0(f"train.py: error: {exc}")
            return 2
    """
    return bool(getattr(exc, _REPORTED, False))


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
    """Leave $GPUSCALE_FAILURE_DIR/rank-N.json for the launcher (`gpuscale run`, a batch script): when, whether a
    symptom, the message, and which rank already printed the same error (`repeat_of`). `env`: the rank's, or its rank."""
    directory = os.environ.get(FAILURE_DIR)
    if not directory:
        return
    rank = env if isinstance(env, int) else env.rank
    note = {"rank": rank, "time": time.time(), "host": socket.gethostname(), "symptom": is_peer_symptom(exc),
            "message": str(exc)[:500], "repeat_of": repeat_of}
    try:
        atomic_write_json(Path(directory) / f"rank-{rank}.json", note)
    except Exception:  # a courtesy for the launcher's summary; the report above went out
        pass
