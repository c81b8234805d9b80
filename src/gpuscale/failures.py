"""How a rank that fails says so: first, with its rank and host, and once.

`gpuscale.init()` calls `report_failure` when the training raises: the failing rank's traceback
(one line for a ValueError, gpuscale's way of saying the input was wrong), a single line for a rank
that only lost its peer (`is_peer_symptom`: the peer's report says why), the exception recorded
for torchrun's summary, and a note in ``$GPUSCALE_FAILURE_DIR/rank-N.json`` (time, symptom,
message) from which `gpuscale run` tells the first failure from its victims.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path

from gpuscale.env import DistEnv
from gpuscale.files import atomic_write_json

__all__ = ["FAILURE_DIR", "PEER_SYMPTOMS", "report_failure", "is_peer_symptom", "note_failure"]

FAILURE_DIR = "GPUSCALE_FAILURE_DIR"
"""Set by `gpuscale run`: where each failing rank writes rank-N.json (time, symptom, message)."""
PEER_SYMPTOMS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
                 "NCCL communicator was aborted", "ProcessGroupNCCL is aborted")
"""Error texts of a collective whose peer went away: a rank failing so is a victim, not the cause."""


def report_failure(env: DistEnv, exc: BaseException) -> None:
    """Name the failing rank, its host and traceback first, and tell torchrun's summary about it.

    A ValueError is gpuscale's (and the examples') way to say the input was wrong: one line, no
    traceback (if nobody catches it, Python still prints the traceback on its way out).
    """
    who = f"[gpuscale] rank {env.rank}/{env.world_size} on {socket.gethostname()}"
    where = f"{who} failed"
    if is_peer_symptom(exc):  # one line: the traceback that matters is the peer's, which comes first
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.write(f"{who} stopped: a peer rank failed first ({first[:160]}); its report above says why\n")
    elif isinstance(exc, ValueError):
        if env.world_size > 1:  # one process: the caller (the CLI, or Python's traceback) says it once
            sys.stderr.write(f"{where}: {exc}\n")
    else:
        sys.stderr.write(f"{where}:\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    sys.stderr.flush()
    note_failure(env, exc)
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        try:
            from torch.distributed.elastic.multiprocessing.errors import get_error_handler

            get_error_handler().record_exception(exc)
        except Exception:  # the report above already went out; the error file is a courtesy
            pass


def is_peer_symptom(exc: BaseException) -> bool:
    """True if `exc` says a collective lost its peer (the peer failed first), not what went wrong."""
    text = str(exc)
    return isinstance(exc, (RuntimeError, OSError)) and any(s in text for s in PEER_SYMPTOMS)


def note_failure(env: DistEnv, exc: BaseException) -> None:
    directory = os.environ.get(FAILURE_DIR)
    if not directory:
        return
    try:
        atomic_write_json(Path(directory) / f"rank-{env.rank}.json",
                          {"rank": env.rank, "time": time.time(), "symptom": is_peer_symptom(exc), "message": str(exc)[:500]})
    except Exception:  # a courtesy for the launcher's summary; the report above went out
        pass
