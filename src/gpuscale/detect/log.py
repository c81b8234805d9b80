"""Talk once: rank-aware logging, `print0`, and a progress bar on rank 0.

Eight ranks that all print make logs unreadable, and the one warning that matters is lost in them.
The rule here: INFO and `print0` come from rank 0 only; warnings and errors come from every rank,
tagged with the rank and host so you know which one complained. This works before the process
group exists, because the rank is read from the launcher's environment.

    log = gpuscale.get_logger("train")
    log.info("epoch %d", epoch)          # rank 0 only
    log.warning("loss is NaN")           # every rank, as "WARNING [rank 3/8 nid005001] loss is NaN"
    gpuscale.print0("done")              # print on rank 0 only
    for batch in gpuscale.progress(loader, desc="epoch 1"): ...

Also the fixed-width tables the CLI prints (`format_table`; `format_placements`, where every rank runs).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, TypeVar

from gpuscale.detect.env import detect_env

__all__ = ["get_logger", "print0", "progress", "current_rank", "configure_logging"]

T = TypeVar("T")
ROOT = "gpuscale"
LOG_INTERVAL_S = 30.0  # progress lines in a non-terminal stream (SLURM log files)
_placement: tuple[int, int] | None = None  # (rank, world_size) once init() knows them


def current_rank() -> tuple[int, int]:
    """(rank, world_size) of this process: from init() once it ran, else from the environment."""
    if _placement is not None:
        return _placement

    try:
        env = detect_env(os.environ)
        return env.rank, env.world_size
    except ValueError:  # init() will report the contradiction; logging must not fail before that
        ranks = []
        for name, default in (("RANK", 0), ("WORLD_SIZE", 1)):
            try:
                ranks.append(int(os.environ.get(name) or default))
            except ValueError:
                ranks.append(default)
        return ranks[0], ranks[1]


class _RankFilter(logging.Filter):
    """Lets INFO and below through on rank 0 only; adds `rank`, `world_size` and `host`."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank, world_size = current_rank()
        record.rank, record.world_size, record.host = rank, world_size, _HOST
        return rank == 0 or record.levelno >= logging.WARNING


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if record.levelno < logging.WARNING:
            return f"[gpuscale] {message}"
        rank, world, host = (getattr(record, key, None) for key in ("rank", "world_size", "host"))  # set by the rank filter
        where = f" [rank {rank}/{world} {host}]" if isinstance(world, int) and world > 1 else ""
        return f"[gpuscale] {record.levelname}{where} {message}"


_HOST = socket.gethostname()


def configure_logging(rank: int, world_size: int, level: int = logging.INFO) -> None:
    """Record the rank for the filter and make sure the gpuscale logger has its one handler."""
    global _placement
    _placement = (rank, world_size)
    _root_logger().setLevel(level)


def _root_logger() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not any(getattr(h, "_gpuscale", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._gpuscale = True  # type: ignore[attr-defined]
        handler.addFilter(_RankFilter())
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # one line per message, even if the user configured the root logger
    return logger


def get_logger(name: str | None = None) -> logging.Logger:
    """A logger whose INFO goes out on rank 0 and whose warnings go out on every rank, tagged."""
    root = _root_logger()
    return root if not name else root.getChild(name)


def print0(*args: Any, **kwargs: Any) -> None:
    """`print`, on rank 0 only. Flushes, so lines are not lost if a rank dies."""
    if current_rank()[0] == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


class progress(Iterator[T]):  # noqa: N801 - used like a function, as tqdm is
    """Iterate and show progress on rank 0; other ranks iterate silently.

    On a terminal it redraws one line; in a log file (SLURM output) it writes a line at most
    every 30 seconds and one at the end, so the file stays short but shows the run is alive. ``bar.postfix["loss"] = 0.31`` adds a value to the line.
    ``initial``: items done before this pass (a pass resumed part-way), counted toward `total` but not the rate.
    """

    def __init__(self, iterable: Iterable[T], desc: str = "", total: int | None = None, stream: Any = None,
                 initial: int = 0) -> None:
        self._it = iter(iterable)
        self.desc = desc
        self.total = total if total is not None else (len(iterable) if isinstance(iterable, Sized) else None)
        self.postfix: dict[str, Any] = {}
        self.initial = initial
        self.count = initial
        self._stream = stream or sys.stderr
        self._enabled = current_rank()[0] == 0
        self._tty = self._enabled and getattr(self._stream, "isatty", lambda: False)()
        self._start = time.perf_counter()
        self._last_draw = self._start

    def __iter__(self) -> progress[T]:
        return self

    def __next__(self) -> T:
        try:
            item = next(self._it)
        except StopIteration:
            self._draw(final=True)
            raise
        self.count += 1
        self._draw(final=False)
        return item

    def _line(self, now: float) -> str:
        elapsed = now - self._start
        rate = (self.count - self.initial) / elapsed if elapsed > 0 else 0.0
        done = f"{self.count}/{self.total}" if self.total else str(self.count)
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.postfix.items())
        bar = ""
        if self.total and self._tty:
            filled = int(20 * min(self.count / self.total, 1.0))
            bar = "[" + "#" * filled + "." * (20 - filled) + "] "
        return f"{self.desc} {bar}{done} {rate:.1f} it/s {elapsed:.1f}s {extra}".strip()

    def _draw(self, final: bool) -> None:
        if not self._enabled:
            return
        now = time.perf_counter()
        if self._tty:
            if final or now - self._last_draw > 0.1 or self.count == self.initial + 1:
                self._stream.write("\r" + self._line(now) + ("\n" if final else ""))
                self._stream.flush()
                self._last_draw = now
            return
        if final or now - self._last_draw >= LOG_INTERVAL_S:
            self._stream.write(self._line(now) + "\n")
            self._stream.flush()
            self._last_draw = now


def format_placements(placements: list[dict[str, Any]]) -> str:
    """A fixed-width table: host, rank, local rank, device, cores, one line per rank."""
    header = ("host", "rank", "local", "device", "name", "cores", "binding", "threads")
    rows = [
        (p["host"], str(p["rank"]), str(p["local_rank"]), p["device"], p["device_name"], p["cores"], p["binding"], str(p["threads"]))
        for p in placements
    ]
    return format_table(header, rows)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks. Pure."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in [header, *rows])
