"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary name in the same directory, flush and fsync, rename over the target (atomic
on POSIX within one file system), then fsync the directory so the rename itself survives a crash
(FACTS §8). Files are created 0644: readable by colleagues, writable only by their owner.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, BinaryIO

__all__ = ["atomic_write", "atomic_write_json", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any], mode: int = 0o644) -> Path:
    """Call `write(f)` on a temporary file next to `path`, then atomically move it to `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)
    return target


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write `data` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))
