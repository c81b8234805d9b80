"""The cells of a scaling study and the command line of each. Pure: nothing here runs anything.

A cell is one run: a scaling mode and a shape (nodes x processes per node). How the script learns
its cell (templates in its arguments, or ``--scaling`` and ``--out`` appended to a gpuscale
script) is `gpuscale.study.command`'s business.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

from gpuscale.base.batchplan import SCALINGS

MAX_REPEATS = 100
"""Most runs of one cell a study makes (a typo like --repeat 1000000 would plan a million runs)."""


@dataclass(frozen=True, order=True)
class Cell:
    """One run of a study."""

    scaling: str
    """'weak' (each device keeps its batch) or 'strong' (the global batch stays)."""
    nodes: int
    nproc_per_node: int
    variant: str = ""
    """Name of a variant of the command ('' for none), e.g. 'large' for a larger dataset."""
    variant_args: tuple[str, ...] = ()
    """Arguments the variant adds to the script's."""
    repeat: int = 1
    """Which run of the same cell this is (1, 2, ... with --repeat); the table shows the median run."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def name(self) -> str:
        """The cell's folder in the study directory, e.g. 'weak-1x2', or 'large-weak-1x2' for a variant."""
        return self.base_name + (f".r{self.repeat}" if self.repeat > 1 else "")

    @property
    def base_name(self) -> str:
        """The name of the cell without its repeat: the table's row name."""
        shape = f"{self.scaling}-{self.nodes}x{self.nproc_per_node}"
        return f"{self.variant}-{shape}" if self.variant else shape

    def describe(self, unit: str = "process") -> str:
        node = "node" if self.nodes == 1 else "nodes"
        units = unit if self.nproc_per_node == 1 else unit + "es" if unit.endswith("s") else unit + "s"
        what = f"{self.scaling} scaling, {self.nodes} {node} x {self.nproc_per_node} {units}"
        what += f", run {self.repeat}" if self.repeat > 1 else ""
        return f"{what}, variant {self.variant}: {shlex.join(self.variant_args) or 'as given'}" if self.variant else what


def parse_counts(text: str, option: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct, ascending; ValueError naming the option otherwise."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r} is not a comma-separated list of numbers, e.g. 1,2,4") from None
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"{option} {text!r} must list numbers of at least 1, e.g. 1,2,4")
    return sorted(set(counts))


def parse_scalings(text: str) -> list[str]:
    """'weak,strong' -> ['weak', 'strong'] (in that order); ValueError for anything else."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in SCALINGS]
    if not names or unknown:
        raise ValueError(f"--scaling {text!r}: choose from {', '.join(SCALINGS)} (comma-separated)")
    return [s for s in SCALINGS if s in names]


def default_nproc(num_devices: int) -> list[int]:
    """1, 2, 4, ... up to the devices of a node, and the count itself: 1,2,4,8 for 8 GPUs; 1,2,3 for 3."""
    counts, n = [], 1
    while n < num_devices:
        counts.append(n)
        n *= 2
    return [*counts, max(num_devices, 1)]


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """'large=--swap-train-test' -> ('large', ('--swap-train-test',)); 'small=' -> ('small', ())."""
    name, sep, args = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.]+", name):
        raise ValueError(f"--variant {text!r} is not NAME=ARGS (NAME of letters, digits, _ and .), e.g. large=--swap-train-test")
    try:
        return name, tuple(shlex.split(args))
    except ValueError as exc:
        raise ValueError(f"--variant {text!r}: its arguments do not parse as a shell would ({exc})") from None


def cells(nproc: list[int], nodes: list[int], scalings: list[str],
          variants: list[tuple[str, tuple[str, ...]]] | None = None, repeats: int = 1) -> list[Cell]:
    """Every combination, smallest first within each variant and scaling.

    With repeats > 1 the whole matrix runs that many times in rounds (all cells once, then all
    again), so that a machine that gets slower or faster over time affects every cell alike.
    """
    names = [name for name, _ in variants or []]
    if len(set(names)) != len(names):
        raise ValueError(f"--variant names must differ; got {', '.join(names)}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"--repeat {repeats} must be between 1 and {MAX_REPEATS} (3 shows a noisy machine's spread)")
    return [Cell(s, n, p, name, args, r) for r in range(1, repeats + 1)
            for name, args in (variants or [("", ())]) for s in scalings for n in nodes for p in nproc]


def local_argv(cell: Cell, script_argv: list[str], python: str = sys.executable) -> list[str]:
    """The local launch of a cell: `gpuscale run` with the cell's processes on this node, then the script's argv."""
    if cell.nodes != 1:
        raise ValueError(f"{cell.name} needs {cell.nodes} nodes, but --launcher local runs on this node only; "
                         "use --launcher slurm --profile P for several nodes")
    return [python, "-m", "gpuscale", "run", "--nproc-per-node", str(cell.nproc_per_node), *script_argv]


def cpu_cores_for(cell: Cell, max_nproc: int, cores: list[int]) -> list[int]:
    """On a CPU-only node, the cores a cell may use: the same number per process in every cell.

    A GPU study compares 1 GPU with 2 GPUs. Its CPU analogue is 1 process on k cores against 2
    processes on k cores each; giving the single process every core instead would compare the same
    hardware with itself. k = cores // the largest process count (at least 1); a cell with more
    processes than cores shares them (its speed-up cannot pass the core count).
    """
    per_process = max(len(cores) // max_nproc, 1)
    return cores[: min(per_process * cell.nproc_per_node, len(cores))]
