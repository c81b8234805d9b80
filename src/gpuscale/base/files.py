"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary name in the same directory, flush and fsync, rename over the target (atomic
on POSIX within one file system), then fsync the directory so the rename itself survives a crash
(docs/reliability.md). Files are created 0644: readable by colleagues, writable only by their owner.

Nothing gpuscale writes is world-writable, whatever the user's umask (a shared cluster's scratch
is read by many: a world-writable batch script or checkpoint is anyone's to replace). Two guards:

- `tighten_umask` adds "not writable by others" (002) to the process umask. The CLI does it for
  every verb, so the processes it starts (torchrun's workers, sbatch, whose jobs inherit it as
  SLURM_UMASK) inherit it, and `gpuscale.init()` does it for the training script, restoring the
  old umask on exit. That covers files written with plain ``open()`` by libraries (the shards of
  torch.distributed.checkpoint, matplotlib's PNGs, a study's logs).
- `make_dir` and `atomic_write` do not depend on the umask at all: directories are 0775 at most,
  files exactly 0644 (or the mode asked for).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

__all__ = ["atomic_write", "atomic_write_json", "fsync_dir", "make_dir", "tighten_umask", "write_run_files"]

NOT_BY_OTHERS = 0o002


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tighten_umask() -> int:
    """Make files and directories created from now on not world-writable; return the old umask.

    Restore it with ``os.umask(old)``. The umask can only be read by setting it: the momentary
    value is the strict 077, so a file another thread creates in between is private, never open.
    """
    old = os.umask(0o077)
    os.umask(old | NOT_BY_OTHERS)
    return old


def make_dir(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p`` whose new directories are never world-writable, whatever the umask (0775 at most).

    `Path.mkdir(parents=True)` gives the parents it creates the umask's default mode, ignoring
    `mode`; here every new level gets 0775 minus the umask. Existing directories are left as they are.
    """
    target = Path(path)
    missing = []
    for level in (target, *target.parents):
        if level.is_dir():
            break
        missing.append(level)
    for level in reversed(missing):
        try:
            os.mkdir(level, 0o775)
        except FileExistsError:
            if not level.is_dir():
                raise
            # made by someone else meanwhile (another rank): theirs to keep
    return target


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any], mode: int = 0o644) -> Path:
    """Call `write(f)` on a temporary file next to `path`, then atomically move it to `path`."""
    target = Path(path)
    make_dir(target.parent)
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


def write_run_files(out_dir: str | os.PathLike[str], summary: Any, timeline: Any, summary_name: str = "summary.json") -> None:
    """A run's summary and timeline.json in `out_dir`, each written atomically; with no timeline (the
    monitor was off) an old timeline.json is removed, so that it never describes another run."""
    out = make_dir(out_dir)
    if timeline is not None:
        atomic_write_json(out / "timeline.json", timeline)
    else:
        (out / "timeline.json").unlink(missing_ok=True)
    atomic_write_json(out / summary_name, summary)


RUN_KEYS = ("world_size", "scaling", "global_batch", "per_device_batch", "grad_accum_steps")
"""What makes two runs' summaries the same experiment: the ranks, the scaling and the batches."""


def trained_summary(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The summary at `path` if a run that took optimizer steps wrote it; None where there is none, it is unreadable,
    or its run took no step. A run that takes none (a finished run started again) never writes over it."""
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and kept.get("steps") else None


def experiment_differences(kept: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """How the experiment of summary `kept` differs from `other`'s, key by key of `RUN_KEYS` ("world_size 1, not
    2"); empty for the same experiment. A key `other` does not know (None: a probed run that took no step saw no
    batch) differs in nothing."""
    return [f"{key} {kept.get(key)}, not {other.get(key)}" for key in RUN_KEYS
            if other.get(key) is not None and kept.get(key) != other.get(key)]


class Written(NamedTuple):
    """What `write_or_keep` did: the summary that stands for the run, whether this run's was written, and the line to
    say (``warn``: at WARNING, where the summary kept is another experiment's)."""

    summary: dict[str, Any]
    written: bool
    warn: bool
    line: str


def write_or_keep(out_dir: str | os.PathLike[str], summary: dict[str, Any], timeline: Any, name: str = "summary.json") -> Written:
    """Write a run's `summary` (as `name`) and `timeline` (`write_run_files`), unless the run took no optimizer step (a
    finished run started again) and `out_dir` holds the summary.json of a run that trained: that one is never written
    over, nor removed. The summary that stands is the one kept where it is of the same experiment, else this run's."""
    path = Path(out_dir) / "summary.json"
    trained = None if summary.get("steps") else trained_summary(path)
    if trained is None:
        write_run_files(out_dir, summary, timeline, name)
        rate = summary.get("samples_per_s") or 0.0
        shown = f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
        steps = summary.get("steps") or 0
        return Written(summary, True, False, f"wrote {Path(out_dir) / name}: {shown} train samples/s over {steps} optimizer steps")
    if not (differences := experiment_differences(trained, summary)):
        return Written(trained, False, False, f"this run took no optimizer step: kept {path}, the summary of the run that trained")
    return Written(summary, False, True, f"this run took no optimizer step: {path} stays the summary of the run that trained "
                                         f"({'; '.join(differences)}), and this run's is not written; train anew in another output folder")


def has_python_shebang(path: str | os.PathLike[str]) -> bool:
    """Whether the file's first line is a `#!` line that runs python (a script without the .py suffix)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first
