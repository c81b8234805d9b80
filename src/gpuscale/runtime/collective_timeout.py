"""The collective timeout asked for on the command line, for a script that starts its own process group.

`gpuscale.init()` starts the process group itself, with its timeout (``init(timeout=)``, else GPUSCALE_TIMEOUT, else
600 s). A script that calls torch's ``init_process_group`` itself (plain DDP, Accelerate, Lightning, the HF Trainer)
gets what it passes, or torch's default: 30 minutes for gloo, 10 for NCCL; Lightning and the Trainer pass 30 minutes
themselves. So a rank that hangs alive would hold its peers for half an hour, whatever ``gpuscale run --timeout``
said. Where a timeout is asked for (``gpuscale run --timeout S`` or GPUSCALE_TIMEOUT), gpuscale's start-up hook has
every process group the script starts use it (`use_requested_timeout`): the command line is the user's last word,
over a library's default. Without the request nothing changes.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["TIMEOUT_ENV", "requested_timeout_s", "use_requested_timeout"]

TIMEOUT_ENV = "GPUSCALE_TIMEOUT"
"""Seconds a collective may wait for a peer, set by `gpuscale run --timeout` (or by the user)."""
_PATCHED = "_gpuscale_timeout"


def requested_timeout_s(environ: Mapping[str, str] = os.environ) -> float | None:
    """The timeout GPUSCALE_TIMEOUT asks for, in seconds (None where unset); ValueError naming it if it is no positive
    number."""
    text = environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 1e7:
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds; unset it or give e.g. 600")
    return seconds


def use_requested_timeout(environ: Mapping[str, str] = os.environ) -> float | None:
    """Have every ``torch.distributed.init_process_group`` call of this process use the requested timeout (its own
    ``timeout`` replaced); the seconds, or None where none is requested. Once per process."""
    seconds = requested_timeout_s(environ)
    if seconds is None:
        return None
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, _PATCHED, None) is not None:
        return seconds
    timeout = datetime.timedelta(seconds=seconds)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if len(args) >= 3:  # (backend, init_method, timeout, ...) by position
            args = (*args[:2], timeout, *args[3:])
        else:
            kwargs["timeout"] = timeout
        return original(*args, **kwargs)

    setattr(init_process_group, _PATCHED, seconds)
    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    return seconds
