"""A process of gpuscale's own ends without CPython's last garbage collection: after `import torch` that
collection alone takes 0.6-2.7 s on a 2-core machine; skipping it ends a `gpuscale run` about 0.8 s sooner once its
ranks are done (from their last line to the launcher's end: 2.0 s before, 1.25 s after, 2-core VM).

    skip_final_collection()   # at the start of an entry point: the `gpuscale` command, `python -m gpuscale.agent`

At exit CPython joins the threads, runs the exit handlers, clears the modules and then collects every object left
in a reference cycle, which means walking the million objects torch's thousand modules hold. The handler this
registers first, and so runs last, calls `gc.freeze()`: the objects that exist move to a generation that
collections skip. The rest of the exit is unchanged: threads joined, handlers run (logging flushed), files closed as
their last reference goes. What is no longer done is collecting cycles at exit, whose ``__del__`` Python never
promised to run then. Only gpuscale's own processes do this: the ranks run the user's script, whose exit stays
exactly as Python makes it.
"""

from __future__ import annotations

import atexit
import gc

__all__ = ["skip_final_collection"]

_registered = False


def skip_final_collection() -> None:
    """Make this process's exit skip the last garbage collection (once per process; later calls do nothing)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
