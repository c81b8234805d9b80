"""What `gpuscale doctor` judges, as pure functions of what the ranks reported.

Every rank describes itself in one plain dict (its *facts*, see `gpuscale.doctor.facts`): host, ranks,
the GPUs it sees and the one it uses, the cores it is bound to, NUMA nodes, versions and the
environment it started with. Rank 0 gathers them all and these functions turn the list into
`Finding`s. They read nothing else, so every check is tested on crafted lists (a LUMI node with a
rank on the wrong socket, two ranks on one GPU) without the hardware.

Levels: ``fail`` (the placement or setup is wrong: training would be wrong, hang or crawl; the exit
code is 1), ``warn`` (likely to cost speed or to bite later), ``ok`` and ``info`` (stated so that a
pasted report shows it was checked).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuscale.detect.topology import format_cpulist
from gpuscale.runtime.init import OMP_FROM_LAUNCHER

__all__ = ["Finding", "LEVELS", "check_placement", "check_software", "check_environment", "worst"]

LEVELS = ("fail", "warn", "ok", "info")

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    """One verdict: its level, the area it belongs to, what was found, and how to fix it."""

    level: str
    """'fail', 'warn', 'ok' or 'info'."""
    area: str
    """'placement', 'software', 'environment', 'rendezvous' or 'bandwidth'."""
    message: str
    """What was found, naming hosts and ranks."""
    fix: str | None = None
    """What to do about it (None for ok and info)."""

    def __post_init__(self) -> None:
        assert self.level in LEVELS, self.level

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(findings: Iterable[Finding]) -> str:
    """The most serious level among `findings` ('ok' if there are none)."""
    levels = {f.level for f in findings}
    return "fail" if "fail" in levels else "warn" if "warn" in levels else "ok"


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _by_host(facts: Sequence[Facts]) -> dict[str, list[Facts]]:
    hosts: dict[str, list[Facts]] = defaultdict(list)
    for f in facts:
        hosts[f["host"]].append(f)
    return dict(hosts)


# ---------------------------------------------------------------------------------------------- placement

def check_placement(facts: Sequence[Facts], gpu_cores: Sequence[Sequence[int] | None] | None = None) -> list[Finding]:
    """Ranks that agree on the world, one GPU each, disjoint cores next to their GPU, no GPU left idle.

    gpu_cores: a cluster profile's map, GPU index -> the cores next to it (LUMI's GCD table), used
    where a rank's physical GPU index is known; the kernel's NUMA nodes are used otherwise.
    """
    found = _check_world(facts)
    if any(f.level == "fail" for f in found):
        return found  # the rest would judge a world the ranks do not agree on
    found += _check_gpus(facts)
    found += _check_cores(facts)
    found += _check_nearness(facts, gpu_cores)
    return found


def _check_world(facts: Sequence[Facts]) -> list[Finding]:
    found = []
    sizes = defaultdict(list)
    for f in facts:
        sizes[f["world_size"]].append(f["rank"])
    if len(sizes) > 1:
        views = "; ".join(f"{size} for {_ranks(r)}" for size, r in sorted(sizes.items()))
        found.append(Finding("fail", "placement", f"the ranks disagree on the world size (WORLD_SIZE): {views}",
                             "every rank must get the same WORLD_SIZE (srun: --ntasks; torchrun: --nnodes x --nproc-per-node)"))
    elif (size := next(iter(sizes))) != len(facts):
        found.append(Finding("fail", "placement", f"every rank says the world size is {size}, but {len(facts)} ranks reported",
                             "start as many processes as WORLD_SIZE says"))
    ranks = sorted(f["rank"] for f in facts)
    if ranks != list(range(len(facts))):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        found.append(Finding("fail", "placement", f"ranks are not 0..{len(facts) - 1} once each (got {ranks}"
                             + (f"; {_ranks(twice)} started more than once)" if twice else ")"),
                             "each process needs its own RANK (srun: RANK=$SLURM_PROCID, escaped so each task expands its own)"))
    for host, here in sorted(_by_host(facts).items()):
        local = sorted(f["local_rank"] for f in here)
        if local != list(range(len(here))):
            found.append(Finding("fail", "placement", f"on {host} the local ranks are {local}, expected 0..{len(here) - 1}",
                                 "LOCAL_RANK must count the processes of each node from 0 (srun: LOCAL_RANK=$SLURM_LOCALID)"))
        claimed = sorted({f["local_world_size"] for f in here})
        if claimed != [len(here)]:
            found.append(Finding("fail", "placement", f"on {host} {len(here)} rank(s) run but they say LOCAL_WORLD_SIZE is "
                                 f"{', '.join(map(str, claimed))}", "set LOCAL_WORLD_SIZE to the number of ranks per node"))
    if not found:
        hosts = len(_by_host(facts))
        found.append(Finding("ok", "placement", f"{len(facts)} rank(s) on {hosts} node(s) agree on the world size and ranks"))
    return found


def _check_gpus(facts: Sequence[Facts]) -> list[Finding]:
    found = []
    if not any(f.get("gpu") for f in facts):
        allocated = sum(max((f.get("gpus_allocated") or 0) for f in here) for here in _by_host(facts).values())
        if not allocated:
            return [Finding("info", "placement", "no rank uses a GPU (CPU run)")]
        versions = facts[0]["versions"]
        if versions.get("cuda") or versions.get("hip"):
            return [Finding("fail", "placement", f"SLURM gave this job {allocated} GPU(s) but torch "
                            f"({'CUDA ' + versions['cuda'] if versions.get('cuda') else 'ROCm ' + str(versions['hip'])}) sees none",
                            "a driver or visibility problem on the node: check nvidia-smi / rocm-smi and CUDA_VISIBLE_DEVICES / "
                            "ROCR_VISIBLE_DEVICES in the job")]
        return [Finding("warn", "placement", f"SLURM gave this job {allocated} GPU(s) but this torch is a CPU-only build: "
                        "the ranks run on CPU", "install a CUDA or ROCm build of torch in the job's environment")]
    for host, here in sorted(_by_host(facts).items()):
        users = defaultdict(list)
        for f in here:
            if f.get("gpu"):
                users[f["gpu"]].append(f["rank"])
            else:
                found.append(Finding("fail", "placement", f"rank {f['rank']} on {host} runs on {f['device']} although other ranks use GPUs",
                                     "give every rank a GPU (torch must see one: check CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES)"))
        for gpu, ranks in sorted(users.items()):
            if len(ranks) > 1:
                found.append(Finding("fail", "placement", f"{_ranks(ranks)} on {host} share one GPU ({gpu})",
                                     "one rank per GPU: with torchrun each worker takes GPU LOCAL_RANK; with srun use "
                                     "--gpus-per-task=1 or let gpuscale.init() pick the device from the local rank"))
        seen = set().union(*(set(f.get("gpus_seen") or ()) for f in here))
        idle = sorted(seen - set(users))
        allocated = max((f.get("gpus_allocated") or 0 for f in here), default=0)
        if idle:
            found.append(Finding("warn", "placement", f"{len(idle)} GPU(s) on {host} are visible but no rank uses them: {', '.join(idle)}",
                                 f"start one rank per GPU (gpuscale run --nproc-per-node {len(seen)}), or ask SLURM for fewer GPUs"))
        elif allocated > len(users):
            found.append(Finding("warn", "placement", f"SLURM gave {host} {allocated} GPU(s) but only {len(users)} are used",
                                 "one task (srun) or one torchrun worker per GPU; or ask for fewer GPUs"))
    if not any(f.area == "placement" and f.level in ("fail", "warn") for f in found):
        found.append(Finding("ok", "placement", f"every rank has a GPU of its own ({len(facts)} GPU(s) in use)"))
    return found


def _check_cores(facts: Sequence[Facts]) -> list[Finding]:
    found = []
    for host, here in sorted(_by_host(facts).items()):
        for i, a in enumerate(here):
            for b in here[i + 1:]:
                shared = sorted(set(a["cores"]) & set(b["cores"]))
                if shared:
                    found.append(Finding(
                        "fail", "placement",
                        f"ranks {a['rank']} and {b['rank']} on {host} share core(s) {format_cpulist(shared)} "
                        f"(rank {a['rank']}: {format_cpulist(a['cores'])}, rank {b['rank']}: {format_cpulist(b['cores'])})",
                        "give each rank its own cores: let gpuscale.init() bind (GPUSCALE_BIND=auto, the default), or srun "
                        "--cpu-bind with disjoint masks; do not start several ranks under one taskset",
                    ))
        threads = sum(int(f.get("threads") or 1) for f in here)
        cores = set().union(*(set(f["cores"]) for f in here))
        if cores and threads > len(cores):
            found.append(Finding("warn", "placement", f"the {len(here)} rank(s) on {host} run {threads} compute threads on "
                                 f"{len(cores)} core(s): they will take turns", "one thread per core of the rank: "
                                 "unset OMP_NUM_THREADS under gpuscale, or set it to cores per rank"))
    if not found:
        found.append(Finding("ok", "placement", "no two ranks share a core"))
    return found


def _check_nearness(facts: Sequence[Facts], gpu_cores: Sequence[Sequence[int] | None] | None) -> list[Finding]:
    found = []
    judged = 0
    for f in facts:
        if not f.get("gpu") or not f["cores"]:
            continue
        index = f.get("gpu_index")
        if gpu_cores is not None and index is not None and 0 <= index < len(gpu_cores) and gpu_cores[index]:
            near = set(gpu_cores[index] or ())
            judged += 1
            far = sorted(set(f["cores"]) - near)
            if far:
                found.append(Finding(
                    "fail" if not set(f["cores"]) & near else "warn", "placement",
                    f"rank {f['rank']} on {f['host']} uses GPU {index} but is bound to core(s) {format_cpulist(far)}, "
                    f"not next to it (its cores: {format_cpulist(sorted(near))})",
                    "bind each rank to the cores next to its GPU: gpuscale's batch scripts do (CPU masks in GPU order); "
                    "or GPUSCALE_GPU_CORES with the profile's map",
                ))
            continue
        gpu_numa, core_numa = f.get("gpu_numa"), f.get("cores_numa") or []
        if gpu_numa is None or not core_numa:
            continue
        judged += 1
        if gpu_numa not in core_numa:
            found.append(Finding("fail", "placement",
                                 f"rank {f['rank']} on {f['host']} has its GPU on NUMA node {gpu_numa} but runs on cores of NUMA "
                                 f"node(s) {', '.join(map(str, core_numa))}: every batch crosses the socket link",
                                 "bind each rank to the cores next to its GPU (gpuscale.init() does by default; check what "
                                 "srun --cpu-bind or taskset set)"))
        elif len(core_numa) > 1:
            found.append(Finding("warn", "placement",
                                 f"rank {f['rank']} on {f['host']} runs on cores of NUMA nodes {', '.join(map(str, core_numa))}; "
                                 f"its GPU is on node {gpu_numa}", f"bind it to cores of NUMA node {gpu_numa} only"))
    if judged and not found:
        found.append(Finding("ok", "placement", f"every rank is bound next to its GPU ({judged} checked)"))
    elif not judged and any(f.get("gpu") for f in facts):
        found.append(Finding("info", "placement", "which cores sit next to each GPU is unknown here (no NUMA information "
                             "and no profile map): nearness not checked"))
    return found


# ---------------------------------------------------------------------------------------------- software

def check_software(facts: Sequence[Facts], want_deepspeed: bool = False) -> list[Finding]:
    """The same torch everywhere, a collective library for the GPUs, DeepSpeed if asked for."""
    found = []
    for key, what in (("torch", "torch"), ("python", "Python"), ("cuda", "CUDA"), ("hip", "ROCm/HIP"), ("nccl", "NCCL/RCCL"),
                      ("deepspeed", "DeepSpeed")):
        versions = defaultdict(list)
        for f in facts:
            versions[f["versions"].get(key)].append(f["rank"])
        if len(versions) > 1:
            views = "; ".join(f"{_ranks(r)}: {v or 'none'}" for v, r in sorted(versions.items(), key=lambda kv: min(kv[1])))
            found.append(Finding("fail", "software", f"the ranks run different {what} versions ({views})",
                                 "use one environment (container or venv) on every node"))
    first = facts[0]["versions"]
    runtime = f"CUDA {first['cuda']}" if first.get("cuda") else f"ROCm {first['hip']}" if first.get("hip") else "CPU build"
    found.append(Finding("ok" if not found else "info", "software", f"torch {first['torch']} ({runtime}), Python {first['python']}"))
    if any(f.get("gpu") for f in facts):
        library = "RCCL" if first.get("hip") else "NCCL"
        nccl = first.get("nccl")
        if nccl:
            found.append(Finding("ok", "software", f"{library} {nccl}"))
        else:
            found.append(Finding("fail", "software", f"torch has no {library}: GPUs cannot all-reduce",
                                 f"install a torch build with {library} (the CUDA or ROCm wheels have it)"))
    elif len(facts) > 1 and not first.get("gloo"):
        found.append(Finding("fail", "software", "torch was built without gloo: CPU ranks cannot communicate",
                             "install the official torch wheel"))
    if want_deepspeed:
        ds = first.get("deepspeed")
        if ds:
            found.append(Finding("ok", "software", f"DeepSpeed {ds}"))
        else:
            found.append(Finding("fail", "software", "DeepSpeed is not importable",
                                 "DS_BUILD_OPS=0 pip install deepspeed (or pip install -e '.[deepspeed]')"))
    return found


# ---------------------------------------------------------------------------------------------- environment

_NODE_LOCAL = ("/tmp", "/dev/shm", "/var/tmp", "/run", "/scratch/local", "/local")


def _interface_matches(spec: str, interfaces: Sequence[str]) -> bool:
    """NCCL_SOCKET_IFNAME semantics: a comma list of prefixes ('=' exact, '^' excludes)."""
    exclude = spec.startswith("^")
    names = [n.strip() for n in spec.lstrip("^").split(",") if n.strip()]
    exact = any(n.startswith("=") for n in names)
    names = [n.lstrip("=") for n in names]
    hit = [i for i in interfaces if any((i == n) if exact else i.startswith(n) for n in names)]
    return bool(set(interfaces) - set(hit)) if exclude else bool(hit)


def check_environment(facts: Sequence[Facts]) -> list[Finding]:
    """The network interface across nodes, MIOpen's cache on AMD, tokenizers and thread counts."""
    found = []
    hosts = _by_host(facts)
    env0 = facts[0].get("environ") or {}
    if len(hosts) > 1:
        uses_gpu = any(f.get("gpu") for f in facts)
        name = "NCCL_SOCKET_IFNAME" if uses_gpu else "GLOO_SOCKET_IFNAME"
        spec = env0.get(name)
        if not spec:  # no longer a warning: the network check reads which interface and transport were really chosen
            found.append(Finding("info", "environment", f"{len(hosts)} nodes and {name} is not set: the library picks the "
                                 "interface itself (the network lines say which it chose; LUMI's AI Factory images want it unset)",
                                 None))
        else:
            missing = sorted(h for h, here in hosts.items() if not _interface_matches(spec, here[0].get("interfaces") or []))
            if missing:
                found.append(Finding("fail", "environment", f"{name}={spec} matches no network interface on {', '.join(missing)}",
                                     f"list interfaces that exist on every node (ip -br link); found there: "
                                     f"{', '.join(hosts[missing[0]][0].get('interfaces') or [])}"))
            else:
                found.append(Finding("ok", "environment", f"{name}={spec} matches interfaces on all {len(hosts)} nodes"))
    if facts[0]["versions"].get("hip") and any(f.get("gpu") for f in facts):
        paths = {n: env0.get(n) for n in ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")}
        unset = [n for n, p in paths.items() if not p]
        shared = [n for n, p in paths.items() if p and not p.startswith(_NODE_LOCAL)]
        if unset or shared:
            where = f"not set ({', '.join(unset)})" if unset else f"not node-local ({', '.join(shared)})"
            found.append(Finding("warn", "environment",
                                 f"MIOpen's cache is {where}: "
                                 "all ranks of all nodes share one database in $HOME and lock each other out",
                                 "export MIOPEN_USER_DB_PATH=/tmp/$USER-miopen-cache-$SLURM_JOB_ID "
                                 "MIOPEN_CUSTOM_CACHE_DIR=/tmp/$USER-miopen-cache-$SLURM_JOB_ID "
                                 "(the lumi-g profile sets both)"))
        else:
            found.append(Finding("ok", "environment", "MIOpen's cache is node-local"))
    if facts[0].get("has_tokenizers") and not env0.get("TOKENIZERS_PARALLELISM"):
        found.append(Finding("warn", "environment", "TOKENIZERS_PARALLELISM is not set: tokenizers warn and can deadlock "
                             "once data-loader workers fork", "export TOKENIZERS_PARALLELISM=false (gpuscale.init() sets it for "
                             "scripts that use it; a plain script does not)"))
    for host, here in sorted(hosts.items()):
        omp = (here[0].get("environ") or {}).get("OMP_NUM_THREADS")
        cores = set().union(*(set(f["cores"]) for f in here))
        if len(here) > 1 and not omp:
            found.append(Finding("info", "environment", f"OMP_NUM_THREADS is not set on {host}: gpuscale.init() sizes each "
                                 "rank's threads to its cores, but a script without gpuscale starts one thread per core of "
                                 f"the node in each of its {len(here)} ranks", None))
            break
        if omp and omp.isdigit() and int(omp) * len(here) > len(cores) and not (here[0].get("environ") or {}).get(OMP_FROM_LAUNCHER):
            found.append(Finding("warn", "environment", f"OMP_NUM_THREADS={omp} for each of the {len(here)} ranks on {host}, "
                                 f"which have {len(cores)} core(s) between them", f"OMP_NUM_THREADS={max(1, len(cores) // len(here))} "
                                 "or unset it under gpuscale"))
            break
    if not any(f.area == "environment" and f.level in ("warn", "fail") for f in found):
        found.append(Finding("ok", "environment", "network, caches, tokenizers and thread settings look right"))
    return found
