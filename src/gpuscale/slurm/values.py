"""What may be written into a batch script: the patterns every value is checked against before it
goes onto an ``#SBATCH`` line or into an ``export``. One home for them, used by the profiles (their
partitions, memory, environment) and by the renderer (the user's job options).

Each pattern ends with ``\\Z``, not ``$``: ``$`` also matches before a final newline, which would
let ``"NAME\\n"`` through and onto the next line of the script.
"""

from __future__ import annotations

import re
import shlex

__all__ = ["ENV_NAME", "SBATCH_SAFE", "MEMORY", "memory_gb", "check_keys", "shell_word"]

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
"""An environment variable's name."""
SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.,:%@/+=-]+\Z")
"""A value for an #SBATCH line (partition, account, ...): sbatch splits the line itself, so no spaces, quotes or newlines."""
MEMORY = re.compile(r"^[0-9]+[KMGT]?\Z")
"""A SLURM memory size: a number with an optional K, M, G or T."""
_UNIT_GB = {"K": 1 / 2**20, "M": 1 / 1024, "": 1 / 1024, "G": 1.0, "T": 1024.0}  # SLURM sizes: M is the default unit


def memory_gb(size: str | None) -> float | None:
    """A SLURM memory size in GB (a bare number is megabytes, as SLURM reads it); None for none, "0" (all of a node's
    memory) or a text that is not a size."""
    if not size or size == "0" or not MEMORY.match(size):
        return None
    unit = size[-1] if size[-1].isalpha() else ""
    return int(size[:-1] if unit else size) * _UNIT_GB[unit]


def check_keys(found: dict, valid: set[str], where: str) -> None:
    """Refuse a table's unknown key, naming the valid ones: a typo in a profile never silently does nothing."""
    unknown = sorted(set(found) - valid)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; valid keys are: {', '.join(sorted(valid))}")


_RESERVED = frozenset("! case coproc do done elif else esac fi for function if in select then time until while { } [[ ]]".split())


def shell_word(value: str) -> str:
    """Shell-quote `value`. A word shlex leaves bare is quoted anyway when it is a reserved word (`fi`) or starts
    with '=' (NAME==x): bash takes both as plain words there, but a reader (and shellcheck) should not have to."""
    quoted = shlex.quote(value)
    if quoted == value and (value in _RESERVED or value.startswith("=")):
        return f"'{value}'"  # bare for shlex: holds no quote
    return quoted
