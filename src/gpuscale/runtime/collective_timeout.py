"""The collective timeout asked for on the command line, for a script that starts its own process group.

`gpuscale.init()` starts the process group itself, with its timeout (``init(timeout=)``, else GPUSCALE_TIMEOUT, else
600 s). A script that calls torch's ``init_process_group`` itself (plain DDP, Accelerate, Lightning, the HF Trainer)
gets what it passes, or torch's default: 30 minutes for gloo, 10 for NCCL; Lightning and the Trainer pass 30 minutes
themselves. So a rank that hangs alive would hold its peers for half an hour, whatever ``gpuscale run --timeout``
said. Where a timeout is asked for (``gpuscale run --timeout S`` or GPUSCALE_TIMEOUT), gpuscale's start-up hook has
the process group the script starts (``init_process_group``) use it where the script passes none or torch's own 30
minutes, as Lightning and the Trainer pass it by default (`use_requested_timeout`). A timeout the script chose
itself (``ddp_timeout=7200`` for a long tokenisation behind a barrier) is kept, and rank 0 says so. Subgroups
(``new_group``) keep their own. Without the request nothing changes.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
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
    """Have ``torch.distributed.init_process_group`` calls of this process use the requested timeout where they pass
    none or torch's default (a timeout of the script's own choosing is kept, and said); the seconds, or None where
    none is requested. Once per process."""
    seconds = requested_timeout_s(environ)
    if seconds is None:
        return None
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, _PATCHED, None) is not None:
        return seconds
    timeout = datetime.timedelta(seconds=seconds)

    from torch.distributed.constants import default_pg_timeout

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        given = args[2] if len(args) >= 3 else kwargs.get("timeout")  # (backend, init_method, timeout, ...)
        if given is not None and given != default_pg_timeout:
            if environ.get("RANK", "0") == "0":
                print(f"gpuscale: the script's own collective timeout ({given}) is kept; {TIMEOUT_ENV}={seconds:g} s "
                      "replaces torch's default only", file=sys.stderr, flush=True)
        elif len(args) >= 3:
            args = (*args[:2], timeout, *args[3:])
        else:
            kwargs["timeout"] = timeout
        return original(*args, **kwargs)

    setattr(init_process_group, _PATCHED, seconds)
    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    return seconds
