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
    node_mem = "480G"                    # optional: the most memory a job may ask for on one node (checked)
    full_node_mem = "0"                  # optional: --mem of a job that owns whole nodes ("0": all of each node's
                                         #   memory; the default per CPU is often a fraction of it); else mem_per_gpu
    forbid_cpus_per_gpu = false          # refuse --cpus-per-gpu (it breaks GPU peer access on LUMI)
    full_node_partition = "standard-g"   # used when a job takes all GPUs of its nodes
    partial_node_partition = "small-g"   # used otherwise
    gpu_cores = ["49-55", ...]           # optional: cores next to each GPU, in GPU order
    [partitions.NAME]  whole_node = true|false, max_time = "D-HH:MM:SS", max_nodes = N (both optional: SLURM's)
    other_partitions = false             # true: --partition may name one not listed (a generic profile), taken as
                                         #   sharing nodes, its limits SLURM's (`gpuscale.slurm.partitions`)
    require_account = true               # refuse a job without --account (LUMI's SLURM refuses such jobs)
    require_software = true              # refuse a job that names no software environment: --container IMAGE,
                                         #   --module NAME, --venv DIR, or --no-container (the host's python3)
    [container]        exec = "singularity exec", activate = "$WITH_CONDA", binds = [...], image = "..."
                       (how to start any image; `image` is the default image, if the site has one)
    [containers."PATTERN"]               # what one family of images needs, matched on the image's file name
                       exec = "...", activate = "...", binds = [...],      (exec/activate replace [container]'s,
                       module_use = [...], modules = [...],                 binds add to them; modules are loaded
                       env = { NAME = "value" }                             before srun; env is exported for it)
    [env]              NAME = "literal value"         (quoted in the script)
    [env_shell]        NAME = "shell ${EXPRESSION}"   (expanded by the batch shell: trusted profile text)
    setup = ["module load ...", ...]     # optional shell lines run first (trusted profile text)
    clean_modules = true                 # start every job from a clean module environment (`module --quiet purge`,
                                         #   inherited SINGULARITYENV_*/APPTAINERENV_* cleared), as the site's own
                                         #   job scripts do; --module and --env come after it
    node_dirs = ["MIOPEN_USER_DB_PATH"]  # folders (named by environment variables) each task makes before the script
    intra_node_gbps = 50.0               # optional: all-reduce bandwidth between GPUs of a node, GB/s per direction
    intra_node_latency_us = 10.0         #   ... and the latency of one ring step, microseconds
    inter_node_gbps = 100.0              # optional: a node's bandwidth off the node, GB/s per direction
    inter_node_latency_us = 20.0         #   (these four feed `gpuscale predict`)
    warn_before_end_s = 120              # optional: SLURM sends USR1 this long before the time limit, so the job
                                         #   checkpoints and requeues itself (default 120; SLURM may send it 60 s early)
    billing_unit = "GPU-hours"           # optional: the unit the cluster bills in, and where its rule is published;
    billing_source = "https://..."       #   each partition's rate: [partitions.NAME] billing = { node_hour = 4.0 } or
                                         #   { slice_hour = 0.5, slice_gpus = 1, slice_cores = 8, slice_mem_gb = 64 }

Unknown keys are errors that name the valid ones, so a typo never silently does nothing.

Container images: what one family of images needs lives in a ``[containers."PATTERN"]`` table, matched on
the image's file name (`gpuscale.slurm.containers`); `Profile.container_for` resolves an image to a
`ContainerSetup`.
"""

from __future__ import annotations

import difflib
import math
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

from gpuscale.detect.topology import parse_cpulist
from gpuscale.slurm.billing import check_billing
from gpuscale.slurm.containers import (
    Container,
    ContainerImage,
    ContainerSetup,
    check_containers,
    container_from_dict,
    images_from_dict,
    resolve,
)
from gpuscale.slurm.partitions import UNLISTED, Partition, check_partitions, partitions_from_dict, table_name
from gpuscale.slurm.times import format_time, parse_time
from gpuscale.slurm.values import ENV_NAME, MEMORY, check_keys

__all__ = ["Profile", "Partition", "Container", "ContainerImage", "ContainerSetup", "load_profile", "list_profiles", "parse_override",
           "parse_time", "format_time", "profile_dirs"]

BUILTIN_DIR = Path(__file__).with_name("profiles")
VENDORS = ("amd", "nvidia", "none")
LINK_KEYS = ("intra_node_gbps", "intra_node_latency_us", "inter_node_gbps", "inter_node_latency_us")
# A core list as the kernel writes it: "49-55", "0-3,8,10-11", "0-15:2" (a stride).
_CPULIST = re.compile(r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*\Z")
MAX_CORE = 65535
"""Highest core number a profile may name (a cpumask of 64 Ki cores; no node has more)."""


def profile_dirs() -> list[Path]:
    """Where profiles are looked up by name, first match wins: user dirs, then the built-in ones."""
    dirs: list[Path] = []
    if os.environ.get("GPUSCALE_PROFILES"):
        dirs.extend(Path(p) for p in os.environ["GPUSCALE_PROFILES"].split(os.pathsep) if p)
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    dirs.append(config_home / "gpuscale" / "profiles")
    dirs.append(BUILTIN_DIR)
    return dirs


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
    other_partitions: bool = False
    mem_per_gpu: str | None = None
    node_mem: str | None = None
    full_node_mem: str | None = None
    forbid_cpus_per_gpu: bool = False
    gpu_cores: tuple[str, ...] | None = None
    container: Container | None = None
    containers: dict[str, ContainerImage] = field(default_factory=dict)
    require_account: bool = False
    require_software: bool = False
    env: dict[str, str] = field(default_factory=dict)
    env_shell: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    clean_modules: bool = False
    node_dirs: tuple[str, ...] = ()
    intra_node_gbps: float | None = None
    intra_node_latency_us: float | None = None
    inter_node_gbps: float | None = None
    inter_node_latency_us: float | None = None
    warn_before_end_s: int = 120
    billing_unit: str | None = None
    billing_source: str | None = None
    source: str = "<built-in>"

    def __post_init__(self) -> None:
        where = _where(self.name, self.source)
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            # the name goes into the batch script's comments: a line break there would start a command
            raise ValueError(f"profile name {self.name!r} ({_show(self.source)}) must be printable text on one line; rename the file")
        for key in ("description", "gpu_vendor", "full_node_partition", "partial_node_partition"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} must be a string, e.g. {key} = \"...\"")
        if self.gpu_vendor not in VENDORS:
            raise ValueError(f"{where}: gpu_vendor={self.gpu_vendor!r} is not one of {', '.join(VENDORS)}")
        for key in ("gpus_per_node", "cpus_per_node"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}: {key}={value!r} must be a positive whole number")
        for key in ("forbid_cpus_per_gpu", "require_account", "require_software", "clean_modules", "other_partitions"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} must be true or false")
        for key in ("mem_per_gpu", "full_node_mem", "node_mem"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and MEMORY.match(value)):
                raise ValueError(f"{where}: {key}={value!r} is not a SLURM size; write e.g. \"60G\", \"4000M\" or \"0\" (all)")
        check_partitions(self.partitions, where)
        for key in ("full_node_partition", "partial_node_partition"):
            if getattr(self, key) not in self.partitions and not self.other_partitions:
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} is not one of its partitions: {', '.join(map(_show, self.partitions))}")
        if self.gpu_cores is not None:
            if len(self.gpu_cores) != self.gpus_per_node:
                raise ValueError(f"{where}: gpu_cores lists {len(self.gpu_cores)} GPUs but gpus_per_node is {self.gpus_per_node}")
            for cores in self.gpu_cores:
                _check_cpulist(cores, where)
        for key in LINK_KEYS:
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf):
                raise ValueError(f"{where}: {key}={value!r} must be a positive number")
        warn = self.warn_before_end_s
        if not isinstance(warn, int) or isinstance(warn, bool) or not 0 <= warn <= 65535:  # sbatch --signal's range
            raise ValueError(f"{where}: warn_before_end_s={warn!r} must be a whole number of seconds in 0..65535")
        check_billing(self.billing_unit, self.billing_source, [table_name(n) for n, p in self.partitions.items() if p.billing], where)
        check_containers(self.container, self.containers, where)
        _check_node_dirs(self.node_dirs, where)
        for table in ("env", "env_shell"):
            for key, value in getattr(self, table).items():
                if not isinstance(key, str) or not ENV_NAME.match(key):
                    raise ValueError(f"{where}: [{table}] key {key!r} is not a valid environment variable name")
                if not isinstance(value, str):
                    raise ValueError(f"{where}: [{table}] {_show(key)} = {value!r} must be a string, e.g. NAME = \"...\"")

    def container_for(self, image: str, pattern: str | None = None) -> ContainerSetup:
        """How `image` starts here: [container]'s settings, with those of the first [containers."PATTERN"] table
        whose pattern matches the image's file name (exec and activate replaced, binds added); or those of the
        table `pattern` names, to show it."""
        return resolve(self.container or Container(), self.containers, image, pattern)

    def partition(self, name: str) -> Partition:
        """The partition `name`: one the profile lists, or, where it takes others (``other_partitions``), `UNLISTED`;
        ValueError naming the ones it has otherwise."""
        if name in self.partitions:
            return self.partitions[name]
        if self.other_partitions:
            return UNLISTED
        raise ValueError(f"--partition {name!r} is not a partition of {self.name}: {', '.join(self.partitions)}")

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


def _show(text: Any) -> str:
    """A name or path for a message: as it is, or quoted with its escapes if it would break the line."""
    return text if isinstance(text, str) and text.isprintable() else repr(text)


def _where(name: Any, source: Any) -> str:
    return f"profile {_show(name)} ({_show(source)})"


def _check_cpulist(cores: Any, where: str) -> None:
    """A gpu_cores entry: a core list like "49-55" that names at least one core, none past MAX_CORE."""
    hint = "write e.g. \"49-55\" or \"0-3,8\""
    if not isinstance(cores, str) or not _CPULIST.match(cores.replace(" ", "")):
        raise ValueError(f"{where}: gpu_cores entry {cores!r} is not a core list; {hint}")
    if any(len(n) > 5 or int(n) > MAX_CORE for n in re.findall(r"[0-9]+", cores)) or re.search(r":0+(,|\Z)", cores):
        raise ValueError(f"{where}: gpu_cores entry {cores!r} names cores past {MAX_CORE} or a zero stride; {hint}")
    if not parse_cpulist(cores):
        raise ValueError(f"{where}: gpu_cores entry {cores!r} names no cores; {hint}")


_TOP_KEYS = {f.name for f in fields(Profile)} - {"name", "source"}


def profile_from_dict(name: str, data: dict[str, Any], source: str = "<dict>") -> Profile:
    """Build and validate a Profile from parsed TOML."""
    where = _where(name, source)
    check_keys(data, _TOP_KEYS, where)
    required = {"description", "gpu_vendor", "gpus_per_node", "cpus_per_node", "full_node_partition", "partial_node_partition", "partitions"}
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r} (required: {', '.join(sorted(required))})")
    partitions = partitions_from_dict(data["partitions"], where)
    container = container_from_dict(data["container"], where) if "container" in data else None
    containers = images_from_dict(data.get("containers", {}), where)
    values = {k: v for k, v in data.items() if k not in ("partitions", "container", "containers")}
    for key in ("gpu_cores", "setup", "node_dirs"):
        if key in values and values[key] is not None:
            if not isinstance(values[key], list) or not all(isinstance(v, str) for v in values[key]):
                raise ValueError(f"{where}: {key} must be a list of strings, e.g. {key} = [\"...\", \"...\"]")
            values[key] = tuple(values[key])
    for table in ("env", "env_shell"):
        if table not in values:
            continue
        if not isinstance(values[table], dict):
            raise ValueError(f"{where}: [{table}] must be a table of NAME = \"value\"")
        for key, value in values[table].items():
            # numbers are written as TOML writes them; true/false, lists and tables would be guesses
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"{where}: [{table}] {_show(key)} = {value!r} must be a string, e.g. NAME = \"...\"")
        values[table] = {str(k): str(v) for k, v in values[table].items()}
    return Profile(name=name, source=source, partitions=partitions, container=container, containers=containers, **values)


def load_profile(name_or_path: str, overrides: dict[str, Any] | None = None) -> Profile:
    """Load a profile by name (see `profile_dirs`) or by path to a .toml file; apply `overrides`.

    overrides: top-level keys to replace (``--set gpus_per_node=4``), validated like the file.
    """
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        if not path.is_file():
            raise ValueError(f"profile file {_show(name_or_path)} does not exist")
        name = path.stem
    else:
        name = name_or_path
        candidates = [d / f"{name}.toml" for d in profile_dirs()]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            available = ", ".join(map(_show, sorted(list_profiles())))
            close = difflib.get_close_matches(name, list_profiles(), n=1, cutoff=0.7)
            hint = f"did you mean {_show(close[0])}? " if close else ""
            raise ValueError(f"unknown profile {name!r}; {hint}available: {available} (or give a path to a .toml file)")
        path = found
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"profile {_show(str(path))} is not UTF-8 text; save it as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"profile {_show(str(path))} is not valid TOML: {exc}") from None
    if overrides:
        tables = {"partitions", "container", "containers", "env", "env_shell", "gpu_cores", "setup", "node_dirs"} & set(overrides)
        if tables:
            raise ValueError(
                f"--set cannot change {sorted(tables)[0]!r} (only single values); copy the profile "
                f"(gpuscale profiles {_show(name)} --raw > mine.toml), edit it and pass --profile mine.toml"
            )
        data.update(overrides)
    return profile_from_dict(name, data, source=str(path))


def _check_node_dirs(names: tuple[str, ...], where: str) -> None:
    for name in names:
        if not ENV_NAME.match(name):
            raise ValueError(f"{where}: node_dirs entry {name!r} is not an environment variable name; "
                             "name the variable that holds the folder, e.g. node_dirs = [\"MIOPEN_USER_DB_PATH\"]")


def parse_override(key: str, text: str) -> Any:
    """The value of one ``--set KEY=VALUE``, converted to the type the key's field declares.

    Typed by key, not guessed from the text: ``--set mem_per_gpu=4000`` stays the string "4000"
    and ``--set description=1`` stays "1". Unknown keys and tables are left to `load_profile`,
    which names the valid keys or says how to change a table.
    """
    kind = str(_FIELD_TYPES.get(key, "str")).split(" |")[0]
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--set {key}={text!r}: {key} must be a whole number, e.g. {key}=8") from None
    if kind == "bool":
        if text.strip().lower() not in ("true", "false"):
            raise ValueError(f"--set {key}={text!r}: write {key}=true or {key}=false")
        return text.strip().lower() == "true"
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"--set {key}={text!r}: {key} must be a number, e.g. {key}=50") from None
    return text


_FIELD_TYPES = {f.name: f.type for f in fields(Profile)}  # strings ("int", "float | None"): annotations are postponed


def list_profiles() -> dict[str, Path]:
    """Every profile visible by name: name -> file (user profiles shadow built-in ones)."""
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found
