"""Cluster profiles: what a cluster's nodes look like, as small TOML data files.

A profile says how many GPUs and usable cores a node has, which cores sit next to which GPU,
which partitions exist (their time limit, whether they hand out whole nodes), how software is
started (a container, its bind mounts) and which environment every job needs. gpuscale ships
``lumi-g``, ``generic-nvidia`` and ``local`` (the test cluster of scripts/local-slurm); you add
your own as ``NAME.toml`` in ``$GPUSCALE_PROFILES`` or ``~/.config/gpuscale/profiles``, or pass a
path. ``gpuscale profiles`` lists them, ``gpuscale profiles NAME`` shows one.

Schema (top level, then tables):

    description = "..."                  # one line for `gpuscale profiles`
    gpu_vendor = "amd" | "nvidia" | "none"
    gpus_per_node = 8                    # GPUs (GCDs on MI250X) per node
    cpus_per_node = 56                   # cores a job may use per node
    mem_per_gpu = "60G"                  # optional default for --mem-per-gpu
    forbid_cpus_per_gpu = false          # refuse --cpus-per-gpu (it breaks GPU peer access on LUMI)
    full_node_partition = "standard-g"   # used when a job takes all GPUs of its nodes
    partial_node_partition = "small-g"   # used otherwise
    gpu_cores = ["49-55", ...]           # optional: cores next to each GPU, in GPU order
    [partitions.NAME]  whole_node = true|false, max_time = "D-HH:MM:SS", max_nodes = N (optional)
    [container]        exec = "singularity exec", activate = "$WITH_CONDA", binds = [...], image = "..."
    [env]              NAME = "literal value"         (quoted in the script)
    [env_shell]        NAME = "shell ${EXPRESSION}"   (expanded by the batch shell: trusted profile text)
    setup = ["module load ...", ...]     # optional shell lines run first (trusted profile text)
    intra_node_gbps = 50.0               # optional: all-reduce bandwidth between GPUs of a node, GB/s per direction
    intra_node_latency_us = 10.0         #   ... and the latency of one ring step, microseconds
    inter_node_gbps = 100.0              # optional: a node's bandwidth off the node, GB/s per direction
    inter_node_latency_us = 20.0         #   (these four feed `gpuscale predict`)

Unknown keys are errors that name the valid ones, so a typo never silently does nothing.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from gpuscale.topology import parse_cpulist

__all__ = ["Profile", "Partition", "Container", "load_profile", "list_profiles", "parse_time", "format_time", "PROFILE_DIRS"]

BUILTIN_DIR = Path(__file__).with_name("profiles")
VENDORS = ("amd", "nvidia", "none")
LINK_KEYS = ("intra_node_gbps", "intra_node_latency_us", "inter_node_gbps", "inter_node_latency_us")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def PROFILE_DIRS() -> list[Path]:  # noqa: N802 - reads like the constant it stands for
    """Where profiles are looked up by name, first match wins: user dirs, then the built-in ones."""
    dirs = []
    if os.environ.get("GPUSCALE_PROFILES"):
        dirs.extend(Path(p) for p in os.environ["GPUSCALE_PROFILES"].split(os.pathsep) if p)
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    dirs.append(config_home / "gpuscale" / "profiles")
    dirs.append(BUILTIN_DIR)
    return dirs


def parse_time(text: str) -> int:
    """SLURM time ('MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS') -> seconds."""
    value = str(text).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not match:
        raise ValueError(f"time {text!r} is not a SLURM time; write e.g. 30 (minutes), 01:30:00 or 1-12:00:00")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif c is not None:  # HH:MM:SS
        total = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        total = int(a) * 60 + int(b)
    else:  # MM
        total = int(a) * 60
    if total <= 0:
        raise ValueError(f"time {text!r} must be longer than zero")
    return total


def format_time(seconds: int) -> str:
    """Seconds -> SLURM's D-HH:MM:SS (or HH:MM:SS under a day)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


@dataclass(frozen=True, kw_only=True)
class Partition:
    """A SLURM partition of the cluster."""

    whole_node: bool
    """True if jobs always get whole nodes (then CPU masks are safe without --exclusive)."""
    max_time: str
    """The partition's time limit (SLURM time)."""
    max_nodes: int | None = None
    """Most nodes one job may use, if limited."""


@dataclass(frozen=True, kw_only=True)
class Container:
    """How to start Python inside the cluster's container image."""

    exec: str = "singularity exec"
    """Command that runs a program in an image: `<exec> [--bind ...] IMAGE program`."""
    activate: str | None = None
    """Shell text run inside the container first (LUMI: $WITH_CONDA), expanded there."""
    binds: tuple[str, ...] = ()
    """Host paths the container needs (network libraries, SLURM's spool for RCCL)."""
    image: str | None = None
    """Default image, if the site has one; --container overrides it."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A cluster's nodes, partitions, software start-up and environment (see the module docstring)."""

    name: str
    description: str
    gpu_vendor: str
    gpus_per_node: int
    cpus_per_node: int
    full_node_partition: str
    partial_node_partition: str
    partitions: dict[str, Partition]
    mem_per_gpu: str | None = None
    forbid_cpus_per_gpu: bool = False
    gpu_cores: tuple[str, ...] | None = None
    container: Container | None = None
    env: dict[str, str] = field(default_factory=dict)
    env_shell: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    intra_node_gbps: float | None = None
    intra_node_latency_us: float | None = None
    inter_node_gbps: float | None = None
    inter_node_latency_us: float | None = None
    source: str = "<built-in>"

    def __post_init__(self) -> None:
        where = f"profile {self.name} ({self.source})"
        if self.gpu_vendor not in VENDORS:
            raise ValueError(f"{where}: gpu_vendor={self.gpu_vendor!r} is not one of {', '.join(VENDORS)}")
        for key in ("gpus_per_node", "cpus_per_node"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}: {key}={value!r} must be a positive whole number")
        if not self.partitions:
            raise ValueError(f"{where}: needs at least one [partitions.NAME] table")
        for key in ("full_node_partition", "partial_node_partition"):
            if getattr(self, key) not in self.partitions:
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} is not one of its partitions: {', '.join(self.partitions)}")
        for name, part in self.partitions.items():
            try:
                parse_time(part.max_time)
            except ValueError as exc:
                raise ValueError(f"{where} [partitions.{name}]: max_time: {exc}") from None
            if not isinstance(part.whole_node, bool):
                raise ValueError(f"{where} [partitions.{name}]: whole_node must be true or false")
            if part.max_nodes is not None and (not isinstance(part.max_nodes, int) or isinstance(part.max_nodes, bool) or part.max_nodes < 1):
                raise ValueError(f"{where} [partitions.{name}]: max_nodes={part.max_nodes!r} must be a positive whole number")
        if self.gpu_cores is not None:
            if len(self.gpu_cores) != self.gpus_per_node:
                raise ValueError(f"{where}: gpu_cores lists {len(self.gpu_cores)} GPUs but gpus_per_node is {self.gpus_per_node}")
            for cores in self.gpu_cores:
                if not parse_cpulist(cores):
                    raise ValueError(f"{where}: gpu_cores entry {cores!r} names no cores; write e.g. \"49-55\"")
        for key in LINK_KEYS:
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"{where}: {key}={value!r} must be a positive number")
        for table in ("env", "env_shell"):
            for key in getattr(self, table):
                if not _ENV_NAME.match(key):
                    raise ValueError(f"{where}: [{table}] key {key!r} is not a valid environment variable name")

    def partition_for(self, gpus_per_node: int) -> str:
        """The default partition for a job using `gpus_per_node` GPUs on each node."""
        return self.full_node_partition if gpus_per_node >= self.gpus_per_node else self.partial_node_partition

    def cores_of_gpu(self, index: int) -> list[int] | None:
        """Cores next to GPU `index`, if the profile knows them."""
        return parse_cpulist(self.gpu_cores[index]) if self.gpu_cores else None

    def cpu_masks(self, num_gpus: int) -> list[str] | None:
        """srun's mask_cpu values for the first `num_gpus` GPUs, in GPU order (hex, 16 digits)."""
        if not self.gpu_cores:
            return None
        masks = [sum(1 << c for c in self.cores_of_gpu(i) or []) for i in range(num_gpus)]
        width = max(16, (max(masks).bit_length() + 3) // 4)  # LUMI's masks are 16 hex digits
        return [f"0x{mask:0{width}x}" for mask in masks]

    def cpus_per_gpu(self) -> int:
        """Cores that go with one GPU: its listed neighbours, else an equal share of the node."""
        if self.gpu_cores:
            return min(len(self.cores_of_gpu(i) or []) for i in range(self.gpus_per_node))
        return max(1, self.cpus_per_node // max(1, self.gpus_per_node))


_TOP_KEYS = {f.name for f in fields(Profile)} - {"name", "source"}
_PARTITION_KEYS = {f.name for f in fields(Partition)}
_CONTAINER_KEYS = {f.name for f in fields(Container)}


def _check_keys(found: dict[str, Any], valid: set[str], where: str) -> None:
    unknown = sorted(set(found) - valid)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; valid keys are: {', '.join(sorted(valid))}")


def profile_from_dict(name: str, data: dict[str, Any], source: str = "<dict>") -> Profile:
    """Build and validate a Profile from parsed TOML."""
    where = f"profile {name} ({source})"
    _check_keys(data, _TOP_KEYS, where)
    required = {"description", "gpu_vendor", "gpus_per_node", "cpus_per_node", "full_node_partition", "partial_node_partition", "partitions"}
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r} (required: {', '.join(sorted(required))})")
    partitions = {}
    for part_name, part in data["partitions"].items():
        if not isinstance(part, dict):
            raise ValueError(f"{where}: partitions.{part_name} must be a table")
        _check_keys(part, _PARTITION_KEYS, f"{where} [partitions.{part_name}]")
        if "whole_node" not in part or "max_time" not in part:
            raise ValueError(f"{where} [partitions.{part_name}]: needs whole_node and max_time")
        partitions[part_name] = Partition(**part)
    container = None
    if "container" in data:
        _check_keys(data["container"], _CONTAINER_KEYS, f"{where} [container]")
        raw = dict(data["container"])
        raw["binds"] = tuple(raw.get("binds", ()))
        container = Container(**raw)
    values = {k: v for k, v in data.items() if k not in ("partitions", "container")}
    for key in ("gpu_cores", "setup"):
        if key in values and values[key] is not None:
            if not isinstance(values[key], list) or not all(isinstance(v, str) for v in values[key]):
                raise ValueError(f"{where}: {key} must be a list of strings, e.g. {key} = [\"...\", \"...\"]")
            values[key] = tuple(values[key])
    for key in ("env", "env_shell"):
        if key in values and not isinstance(values[key], dict):
            raise ValueError(f"{where}: [{key}] must be a table of NAME = \"value\"")
    for table in ("env", "env_shell"):
        if table in values:
            values[table] = {str(k): str(v) for k, v in values[table].items()}
    return Profile(name=name, source=source, partitions=partitions, container=container, **values)


def load_profile(name_or_path: str, overrides: dict[str, Any] | None = None) -> Profile:
    """Load a profile by name (see `PROFILE_DIRS`) or by path to a .toml file; apply `overrides`.

    overrides: top-level keys to replace (``--set gpus_per_node=4``), validated like the file.
    """
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        if not path.is_file():
            raise ValueError(f"profile file {name_or_path} does not exist")
        name = path.stem
    else:
        name = name_or_path
        candidates = [d / f"{name}.toml" for d in PROFILE_DIRS()]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise ValueError(f"unknown profile {name!r}; available: {', '.join(sorted(list_profiles()))} (or give a path to a .toml file)")
        path = found
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"profile {path} is not valid TOML: {exc}") from None
    if overrides:
        tables = {"partitions", "container", "env", "env_shell", "gpu_cores", "setup"} & set(overrides)
        if tables:
            raise ValueError(
                f"--set cannot change {sorted(tables)[0]!r} (only single values); copy the profile "
                f"(gpuscale profiles {name} --raw > mine.toml), edit it and pass --profile mine.toml"
            )
        data.update(overrides)
    return profile_from_dict(name, data, source=str(path))


def list_profiles() -> dict[str, Path]:
    """Every profile visible by name: name -> file (user profiles shadow built-in ones)."""
    found: dict[str, Path] = {}
    for directory in PROFILE_DIRS():
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found
