"""The script's command line in each cell of a study: templates, exact batches, gpuscale's own options. Pure.

Any script can be studied. Its arguments may hold templates that each cell fills in:

    {out}              the cell's folder              {scaling}         weak or strong
    {world_size}       devices in the cell            {nproc_per_node}  processes per node
    {nodes}            nodes in the cell              {per_device_batch} samples per device per pass
    {global_batch}     samples per optimizer step     {grad_accum_steps} passes per optimizer step

    gpuscale study --nproc 1,2 --scaling weak,strong --global-batch 64 -- train.py --batch-size {per_device_batch}

The three batch templates need the batch: ``--global-batch N`` (strong scaling keeps it; weak
scaling keeps the baseline's per-device share, N / its devices) or ``--per-device-batch N`` (weak
scaling keeps it; strong scaling keeps the baseline's global batch, N x its devices), or both.
Every cell's numbers are exact (`gpuscale.plan_batch`): a global batch that does not divide among
a cell's devices is refused with the nearest ones that divide among every cell's. With
``--max-device-batch M`` a device's share above M is split into equal gradient-accumulation passes.

A script that imports gpuscale and uses no template gets ``--scaling <scaling> --out <cell>``
appended, as every example expects. Any other script gets its arguments as given, templates
filled; gpuscale's probe measures it.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from functools import reduce
from typing import Any

from gpuscale.base.batchplan import BatchPlan, plan_batch
from gpuscale.study.matrix import Cell

__all__ = ["TEMPLATES", "BATCH_TEMPLATES", "StudyCommand", "check_batch_reaches_script", "uses_gpuscale"]

TEMPLATES = ("out", "scaling", "world_size", "nproc_per_node", "nodes", "per_device_batch", "global_batch", "grad_accum_steps")
BATCH_TEMPLATES = ("per_device_batch", "global_batch", "grad_accum_steps")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def uses_gpuscale(source: str) -> bool:
    """Whether a script's source imports gpuscale (then it takes --scaling and --out and writes its summary)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gpuscale" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "gpuscale":
            return True
    return False


def _templates_in(args: tuple[str, ...]) -> set[str]:
    return {name for arg in args for name in _PLACEHOLDER.findall(arg)}


def _positive(value: int | None, option: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{option} {value!r} must be a positive whole number of samples")


@dataclass(frozen=True, kw_only=True)
class StudyCommand:
    """A study's script command (templates allowed) and the batch it asks for."""

    argv: tuple[str, ...]
    """The script and its arguments, as the user wrote them."""
    appends_cell_options: bool
    """True for a gpuscale script without templates: ``--scaling S --out DIR`` are appended."""
    global_batch: int | None = None
    """--global-batch: strong scaling keeps it; weak scaling keeps the baseline's per-device share."""
    per_device_batch: int | None = None
    """--per-device-batch: weak scaling keeps it; strong scaling keeps the baseline's global batch."""
    max_device_batch: int | None = None
    """--max-device-batch: above it, a device's share is split into gradient-accumulation passes."""

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("no training script given; put it after --, e.g. `-- train.py --epochs 2`")
        _positive(self.global_batch, "--global-batch")
        _positive(self.per_device_batch, "--per-device-batch")
        _positive(self.max_device_batch, "--max-device-batch")
        used = _templates_in(self.argv)
        unknown = sorted(used - set(TEMPLATES))
        if unknown:
            raise ValueError(f"unknown template {{{unknown[0]}}} in the script's arguments; the study fills "
                             + ", ".join("{" + t + "}" for t in TEMPLATES))
        if used & set(BATCH_TEMPLATES) and self.global_batch is None and self.per_device_batch is None:
            raise ValueError(f"the script's arguments use {{{sorted(used & set(BATCH_TEMPLATES))[0]}}}: give the batch with "
                             "--global-batch N (strong scaling keeps it) or --per-device-batch N (weak scaling keeps it)")
        if self.appends_cell_options:
            check_no_cell_options(self.argv[1:])

    @classmethod
    def for_script(cls, argv: list[str] | tuple[str, ...], source: str, **batch: Any) -> StudyCommand:
        """The command for a script whose source is `source` (read by the caller): gpuscale's options are
        appended only to a script that imports gpuscale and uses no template."""
        appends = uses_gpuscale(source) and not _templates_in(tuple(argv))
        return cls(argv=tuple(argv), appends_cell_options=appends, **batch)

    @property
    def has_batch(self) -> bool:
        return self.global_batch is not None or self.per_device_batch is not None

    def batch_plan(self, cell: Cell, baseline_world_size: int) -> BatchPlan | None:
        """The cell's exact batch (None without --global-batch/--per-device-batch); ValueError if it does not divide."""
        if not self.has_batch:
            return None
        if cell.scaling == "strong":
            total = self.global_batch if self.global_batch is not None else self.per_device_batch * baseline_world_size  # type: ignore[operator]
            return plan_batch(total, cell.world_size, "strong", self.max_device_batch)
        share = self.per_device_batch
        if share is None:
            assert self.global_batch is not None
            if self.global_batch % baseline_world_size:
                raise ValueError(f"--global-batch {self.global_batch} does not divide among the {baseline_world_size} devices of "
                                 f"weak scaling's baseline; use a multiple of {baseline_world_size}, or give --per-device-batch")
            share = self.global_batch // baseline_world_size
        return plan_batch(share, cell.world_size, "weak", self.max_device_batch)

    def step_samples(self, cell: Cell, baseline_world_size: int) -> int | None:
        """Samples per optimizer step over all ranks, where the script's arguments carry the cell's batch (a batch
        template): what the probe counts a step as when the script's batches come from neither a DataLoader
        nor a DDP model's forward passes. None otherwise."""
        if not _templates_in(self.argv) & set(BATCH_TEMPLATES):
            return None
        plan = self.batch_plan(cell, baseline_world_size)
        return plan.global_batch if plan is not None else None

    def check_cells(self, cells: list[Cell]) -> None:
        """Refuse, before anything runs, a batch that some cell cannot have exactly (naming the choices that fit all)."""
        if not self.has_batch:
            return
        for cell in cells:
            try:
                self.batch_plan(cell, baseline_world_size(cells, cell))
            except ValueError as exc:
                strong = sorted({c.world_size for c in cells if c.scaling == "strong"})
                if cell.scaling != "strong" or self.global_batch is None:
                    raise ValueError(f"{cell.name}: {exc}") from None
                step = reduce(math.lcm, strong, 1)
                lower, upper = self.global_batch // step * step, (self.global_batch // step + 1) * step
                choices = " or ".join(str(c) for c in (lower, upper) if c > 0)
                raise ValueError(f"--global-batch {self.global_batch} does not divide among the {cell.world_size} devices of "
                                 f"{cell.name}; use {choices} (multiples of {step}, which every cell's devices divide)") from None

    def argv_for(self, cell: Cell, cell_dir: str, baseline_world: int) -> list[str]:
        """The script and its arguments in this cell: templates filled, the variant's arguments, gpuscale's options."""
        plan = self.batch_plan(cell, baseline_world)
        values = {"out": cell_dir, "scaling": cell.scaling, "world_size": cell.world_size,
                  "nproc_per_node": cell.nproc_per_node, "nodes": cell.nodes}
        if plan is not None:
            values.update(per_device_batch=plan.per_device_batch, global_batch=plan.global_batch,
                          grad_accum_steps=plan.grad_accum_steps)
        filled = [_PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), arg) for arg in (*self.argv, *cell.variant_args)]
        if self.appends_cell_options:
            filled += ["--scaling", cell.scaling, "--out", cell_dir]
        return filled

    def as_record(self) -> dict[str, Any]:
        """What study.json keeps of the batch options (a rerun with other ones is another experiment)."""
        return {"global_batch": self.global_batch, "per_device_batch": self.per_device_batch,
                "max_device_batch": self.max_device_batch}


def check_batch_reaches_script(argv: tuple[str, ...], variants: tuple[tuple[str, tuple[str, ...]], ...], option: str) -> None:
    """Refuse a batch option (`option`, e.g. "--global-batch 64") that some cell's command would never pass on: the
    study hands its batch to a script only through {per_device_batch} or {global_batch} in the script's arguments (or
    a variant's). A script without one trains its own batch, and the study's batch would be a number in study.json that no run used."""
    for name, extra in variants or (("", ()),):
        if not _templates_in((*argv, *extra)) & {"per_device_batch", "global_batch"}:  # {grad_accum_steps} alone is no batch
            whose = f"variant {name!r}'s arguments and the script's" if name else "the script's arguments"
            raise ValueError(f"{option} reaches the script only through a batch template, and {whose} hold none: write it "
                             "where the script reads its batch, e.g. -- train.py --batch-size {per_device_batch} (a gpuscale "
                             f"script then takes --scaling {{scaling}} --out {{out}} too), or leave {option.split()[0]} out "
                             "to train the script's own batch")


def check_no_cell_options(args: tuple[str, ...] | list[str]) -> None:
    """A gpuscale script gets --scaling and --out from the study: refuse them in its own arguments."""
    if any(a in ("--out", "--scaling") or a.startswith(("--out=", "--scaling=")) for a in args):
        raise ValueError("leave --out and --scaling out of the script's arguments: the study sets them for each cell "
                         "(or write them as templates: --out {out} --scaling {scaling})")


def baseline_world_size(cells: list[Cell], cell: Cell) -> int:
    """The devices of the cell's baseline: the smallest run of its variant and scaling."""
    return min(c.world_size for c in cells if c.variant == cell.variant and c.scaling == cell.scaling)
