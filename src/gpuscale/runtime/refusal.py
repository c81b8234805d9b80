"""A rank that refuses to start tells its peers, so that they do not wait out the rendezvous.

`gpuscale.init()` checks each rank's environment before the process group starts (`detect_env`: a RANK that srun
contradicts, a WORLD_SIZE that is not a multiple of LOCAL_WORLD_SIZE; the device and core checks after it). A rank
that fails them never joins the rendezvous, and its peers would wait there for the group's whole timeout (600 s by
default; a hand-written batch script, to its time limit). Under torchrun the agent ends the other workers; ranks
started by hand or by srun without --kill-on-bad-exit have no one to. So:

- the refusing rank leaves its one-line reason in the rendezvous store at MASTER_ADDR:MASTER_PORT
  (`announce_refusal`): as a client of the store rank 0 hosts (waiting up to CONNECT_S for it to come up), or, where
  it is itself rank 0, in a store it hosts there until every peer has read the reason (at most LINGER_S); every rank
  that read it, or refused too, marks it in the store;
- every rank waiting in the rendezvous watches for that reason in a thread (`watch_for_refusal`) and, once it is
  there, says which rank refused and why, and ends with exit code 1; rank 0, whose process hosts torch's store, only
  once every rank has marked it (at most LINGER_S), since the store ends with it.

Nothing happens under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE: the agent ends the workers), for one
process, or without MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch.distributed as dist

__all__ = ["announce_refusal", "watch_for_refusal", "REFUSED_KEY", "CONNECT_S", "LINGER_S"]

REFUSED_KEY = "gpuscale/refused"
"""The store key a refusing rank writes its reason under."""
_SEEN_KEY = "gpuscale/refusal-seen"
CONNECT_S = 20.0
"""How long a refusing rank waits for rank 0's store to come up."""
LINGER_S = 30.0
"""How long a refusing rank 0 keeps its store up for the peers to read why."""
JOIN_S = 5.0
"""How long the rendezvous waits, once formed, for its watcher to let go of the store."""
_POLL_S = 1.0  # each waiting rank asks the store once a second: light on a store of thousands of ranks


def _rendezvous(environ: Mapping[str, str]) -> tuple[str, int, int] | None:
    """(MASTER_ADDR, MASTER_PORT, world size) of a rendezvous outside torchrun's agent store; None where none applies."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return None
    try:
        port = int(environ.get("MASTER_PORT", ""))
        world = int(environ.get("WORLD_SIZE") or environ.get("SLURM_NTASKS") or 1)
    except ValueError:
        return None
    address = environ.get("MASTER_ADDR")
    return (address, port, world) if address and world > 1 else None


def _client(address: str, port: int, wait_s: float) -> dist.TCPStore | None:
    """A client of the store at address:port, trying for `wait_s`; None if none answered."""
    try:
        return dist.TCPStore(address, port, is_master=False, timeout=datetime.timedelta(seconds=wait_s),
                             wait_for_workers=False)
    except (RuntimeError, ValueError, OSError):  # DistStoreError (a RuntimeError): nothing answered in time
        return None


def _is_rank_zero(environ: Mapping[str, str]) -> bool:
    """Whether every launcher variable present calls this process rank 0 (a RANK=0 that srun's SLURM_PROCID=1
    contradicts is not: that task's node does not host the rendezvous)."""
    said = [environ[name] for name in ("RANK", "SLURM_PROCID") if environ.get(name)]
    return bool(said) and all(value == "0" for value in said)


def announce_refusal(message: str, environ: Mapping[str, str] = os.environ) -> None:
    """Leave this rank's reason for not starting where its peers, waiting in the rendezvous, will read it."""
    rendezvous = _rendezvous(environ)
    if rendezvous is None:
        return
    address, port, world = rendezvous
    who = environ.get("RANK") or environ.get("SLURM_PROCID") or "?"
    text = f"rank {who} on {socket.gethostname()} refused to start: {message}"
    if not _is_rank_zero(environ):
        store = _client(address, port, CONNECT_S)
        try:
            if store is not None:
                store.set(REFUSED_KEY, text)
                store.add(_SEEN_KEY, 1)  # a peer that refused too waits for nothing: rank 0 need not linger for it
        except (RuntimeError, OSError):  # the store went away meanwhile: this rank's own error is what counts
            pass
        return
    try:
        store = dist.TCPStore(address, port, is_master=True, timeout=datetime.timedelta(seconds=LINGER_S),
                              wait_for_workers=False)
    except (RuntimeError, ValueError, OSError):  # the port is taken: someone else hosts it
        return
    store.set(REFUSED_KEY, text)
    _wait_for_marks(store, world - 1)  # every other rank's: this one refused


def _wait_for_marks(store: dist.TCPStore, count: int) -> None:
    """Keep the store this process hosts up until `count` ranks have marked the refusal read (or refused too), at
    most LINGER_S: the store ends with the process."""
    deadline = time.monotonic() + LINGER_S
    while store.add(_SEEN_KEY, 0) < count and time.monotonic() < deadline:
        time.sleep(_POLL_S / 4)


@contextmanager
def watch_for_refusal(rank: int, environ: Mapping[str, str] = os.environ,
                      on_refusal: Callable[[str], None] | None = None) -> Iterator[None]:
    """Around the rendezvous: end this process (exit code 1, with the reason) if a peer announces it refused to start.
    `on_refusal(reason)` runs first (the launcher's note that this rank is a victim, not a cause). Rank 0, whose
    process hosts torch's store, stays until every other rank has read the reason (at most LINGER_S): the store ends
    with it."""
    rendezvous = _rendezvous(environ)
    if rendezvous is None:
        yield
        return
    address, port, world = rendezvous
    formed = threading.Event()

    def watch() -> None:
        store = _client(address, port, CONNECT_S)
        while store is None and not formed.is_set():
            store = _client(address, port, CONNECT_S)
        while store is not None and not formed.is_set():
            if store.check([REFUSED_KEY]):
                reason = store.get(REFUSED_KEY).decode(errors="replace")
                store.add(_SEEN_KEY, 1)
                if rank == 0:
                    _wait_for_marks(store, world)  # every rank's mark, its own too
                if on_refusal is not None:
                    on_refusal(reason)
                sys.stderr.write(f"[gpuscale] rank {rank} on {socket.gethostname()} stops: {reason}\n")
                sys.stderr.flush()
                os._exit(1)  # the main thread waits in the rendezvous, in C++: nothing else can end it
            formed.wait(_POLL_S)

    def guarded() -> None:
        try:
            watch()
        except Exception:  # the store went away (its rank ended): the rendezvous itself fails and says so
            return

    watcher = threading.Thread(target=guarded, name="gpuscale-refusal-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        formed.set()
        # its store client goes now, in its own thread: one still connected at the process's exit (a rank that fails
        # right after the rendezvous) can end it with "terminate called without an active exception" (SIGABRT)
        watcher.join(timeout=JOIN_S)
