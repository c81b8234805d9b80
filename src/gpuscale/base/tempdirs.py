"""A launcher's temporary folders, and the ones that launchers killed with SIGKILL left behind.

`gpuscale run` keeps its ranks' failure notes and the probe's records in temporary folders that it removes when it
ends. A launcher killed with SIGKILL (a closed terminal, an out-of-memory killer, ``kill -9``) cannot: its folders
stay in /tmp. So each folder's name carries its launcher's process id and host (``gpuscale-<kind>-<pid>@<host>@XXXX``),
and `launcher_temp_dir` first removes the folders of that kind, of this host and this user, whose launcher is gone.
The host matters where the temporary folder is shared (TMPDIR on a cluster's shared file system): another node's
process ids mean nothing here.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

__all__ = ["launcher_temp_dir", "remove_orphaned"]


def _gone(pid: int) -> bool:
    """Whether no process `pid` runs on this host (a process of another user still counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _host() -> str:
    """This host's name as a folder name may carry it (no path separators)."""
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def remove_orphaned(kind: str, where: str | Path | None = None) -> list[Path]:
    """Remove this user's ``gpuscale-<kind>-<pid>@<this host>@*`` folders in `where` (the system's temporary folder)
    whose process is gone; the folders removed. Folders of other hosts, or without a host and process id in their
    name, are left alone."""
    pattern = re.compile(rf"gpuscale-{re.escape(kind)}-(\d+)@{re.escape(_host())}@")  # "@": in no host name
    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob(f"gpuscale-{kind}-*"):
        found = pattern.match(folder.name)
        if not found:
            continue
        try:
            mine = folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and _gone(int(found.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def launcher_temp_dir(kind: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder of this process for `kind` (``gpuscale-<kind>-<pid>@<host>@``), after `remove_orphaned`."""
    remove_orphaned(kind)
    return tempfile.TemporaryDirectory(prefix=f"gpuscale-{kind}-{os.getpid()}@{_host()}@")
