"""Set up: `gpuscale.init()`, the one place that changes process state, and always undoes it.

    with gpuscale.init() as rt:
        model = Net().to(rt.device)
        ...

On entry, in this order:

1. find out where this process is (`gpuscale.detect.env.detect_env`): torchrun, an srun step, ranks set
   by hand, or a single process. Under torchrun, have the kernel send SIGTERM should torchrun die
   (`gpuscale.base.lifeline`): a SIGKILLed launcher leaves no workers training on;
2. pick the device (`gpuscale.runtime.placement`): the GPU of this local rank (honouring CUDA_VISIBLE_DEVICES or
   ROCR_VISIBLE_DEVICES set per task), or the CPU when torch sees no GPU. On SLURM's fake GPUs or
   a CPU build of torch it says so once and goes on with gloo, keeping SLURM's ranks and cores;
3. bind the process to CPU cores as `gpuscale.runtime.placement` plans (`gpuscale.detect.topology`): the cores next to its GPU (from the
   cluster profile's map in GPUSCALE_GPU_CORES, else sysfs), disjoint shares on a CPU-only node,
   or the cores srun already chose. ``bind="none"`` (or GPUSCALE_BIND=none)
   leaves the affinity alone;
4. size the thread pools: OMP_NUM_THREADS = cores of this rank and TOKENIZERS_PARALLELISM=false,
   unless the user set them; on the CPU, LOCAL_SIZE = the node's process count unless set, as DeepSpeed's
   own launcher sets it for its CPU accelerator (`gpuscale.runtime.pinning.DEEPSPEED_CPU_DEVICES`);
5. export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT so libraries that
   read them (HF Trainer, DeepSpeed) agree with gpuscale, then start the process group (nccl on
   GPUs, CUDA and ROCm alike; gloo on CPU) with a timeout (``timeout=`` seconds, or
   GPUSCALE_TIMEOUT; default 600 s);
6. gather every rank's placement and print it once, on rank 0.

On exit, always, even after an exception: the process group is destroyed in an order that avoids
gloo's abort at interpreter exit, and environment variables, affinity, thread count, the umask
(tightened so that nothing the script writes is world-writable) and the parent-death signal are
put back. If the block
raised, the failing rank logs its rank, host and traceback (and hands them to
torchrun's error file, so torchrun's summary names the root cause) before the exception goes on.
Under `gpuscale run` it also leaves a note of when it failed and whether the error is only the
symptom of a peer that died first (a closed connection), so that `gpuscale run` names the rank
that failed first, not the one whose report happened to come first.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from gpuscale.base import wrapped
from gpuscale.base.exits import Stopped
from gpuscale.base.files import tighten_umask
from gpuscale.base.lifeline import end_with_parent, parent_death_signal
from gpuscale.detect.env import DistEnv, detect_env, visible_devices
from gpuscale.detect.launchtime import launch_time, process_start_time
from gpuscale.detect.log import configure_logging, format_placements, get_logger
from gpuscale.detect.topology import BindingPlan, allowed_cores, format_cpulist, set_affinity
from gpuscale.runtime.failures import PEER_REFUSED, note_failure, report_failure, report_refusal
from gpuscale.runtime.pinning import DEEPSPEED_CPU_DEVICES, OMP_FROM_LAUNCHER  # OMP_...: gpuscale run put OMP_NUM_THREADS=1
from gpuscale.runtime.placement import choose_device, plan_cores
from gpuscale.runtime.refusal import announce_refusal, watch_for_refusal
from gpuscale.runtime.teardown import end_process_group

__all__ = ["Runtime", "init", "current", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 600.0

log = get_logger("runtime")
_current: Runtime | None = None


@dataclass
class Runtime:
    """What `init()` set up: this process's place, device, cores and process group."""

    env: DistEnv
    """Where this process sits in the job (rank, world size, launcher, ...)."""
    device: torch.device
    """The device this rank computes on."""
    backend: str | None
    """Process-group backend ('nccl' or 'gloo'), or None for a single process."""
    binding: BindingPlan
    """The core plan of this node; `cores` is this rank's row."""
    cores: tuple[int, ...]
    """CPU cores this rank is bound to."""
    host: str
    """This node's host name."""
    started_at: float
    """Wall-clock time the job was launched (the launcher's clock, else this process's start)."""
    ready_at: float
    """Wall-clock time init() finished."""
    placements: list[dict[str, Any]] = field(default_factory=list)
    """One entry per rank (host, rank, local_rank, device, cores), the same on every rank."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds a collective may wait before failing."""
    owns_single_group: bool = False
    """True when `ensure_process_group` started a one-rank group (always destroyed at teardown)."""
    _restorer: Any = field(default=None, repr=False)

    # Short names for what training loops ask most often.
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.env.rank == 0

    @property
    def is_distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def environment_set(self) -> dict[str, str | None]:
        """The environment variables init() set in this process, each with the value it had before (None: unset);
        the block's end puts them back."""
        return dict(self._restorer.environ) if self._restorer is not None else {}

    def barrier(self) -> None:
        """Wait for every rank (no-op for a single process)."""
        if self.is_distributed:
            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def ensure_process_group(self) -> None:
        """Start a one-rank process group if there is none (DeepSpeed needs one even for one process).

        Its store is an in-process HashStore, not a TCP rendezvous: under a launcher of one process (`gpuscale run
        --nproc-per-node 1`, torchrun, a study's baseline) torch would take a tcp:// rendezvous for a client of the
        agent's store (TORCHELASTIC_USE_AGENT_STORE), and wait for a server that never comes. The launcher variables
        DeepSpeed reads are exported too, and put back at teardown with the rest.
        """
        if self.is_distributed:
            return
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        port = _free_port()
        for name, value in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1),
                            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port)):
            if self._restorer is not None:
                self._restorer.setenv(name, str(value))
            else:  # a Runtime built by hand (tests): nothing to restore into
                os.environ[name] = str(value)
        dist.init_process_group(backend=self.backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=self.timeout_s),
                                device_id=self.device if self.device.type == "cuda" else None)
        self.owns_single_group = True

    def placement(self) -> dict[str, Any]:
        """This rank's placement as a plain dict (the row `gpuscale env` prints)."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {
            "host": self.host,
            "rank": self.env.rank,
            "local_rank": self.env.local_rank,
            "node_rank": self.env.node_rank,
            "device": str(self.device),
            "device_name": name,
            "visible_devices": ",".join(visible_devices(os.environ) or []) or None,
            "cores": format_cpulist(self.cores),
            "num_cores": len(self.cores),
            "binding": self.binding.source,
            "threads": torch.get_num_threads(),
            "pid": os.getpid(),
        }


def current() -> Runtime:
    """The Runtime of the enclosing `init()` block; raises if there is none."""
    if _current is None:
        raise RuntimeError("gpuscale.init() is not active; wrap your training in `with gpuscale.init() as rt:`")
    return _current


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Restorer:
    """Remembers what init() changed so that teardown puts it back."""

    def __init__(self) -> None:
        self.environ: dict[str, str | None] = {}
        self.affinity = allowed_cores()
        self.threads = torch.get_num_threads()
        self.umask = tighten_umask()  # nothing the script writes (checkpoints, summaries) is world-writable
        self.death_signal: int | None = None

    def end_with_launcher(self) -> None:
        """SIGTERM when torchrun dies: a SIGKILLed agent must not leave its workers training on (gpuscale.base.lifeline)."""
        self.death_signal = parent_death_signal()
        end_with_parent(signal.SIGTERM)

    def setenv(self, name: str, value: str) -> None:
        self.environ.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def restore(self) -> None:
        for name, old in self.environ.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        set_affinity(self.affinity)
        torch.set_num_threads(self.threads)
        os.umask(self.umask)
        if self.death_signal is not None:
            end_with_parent(self.death_signal)


@contextmanager
def init(
    *,
    device: str = "auto",
    backend: str | None = None,
    bind: str | None = None,
    timeout: float | None = None,
    show_placement: bool = True,
) -> Iterator[Runtime]:
    """Set this process up for (distributed) training; undo it on exit. See the module docstring.

    device: 'auto' (the local rank's GPU if torch sees one, else CPU), 'cuda' or 'cpu'.
    backend: process-group backend; default nccl on GPUs, gloo on CPU.
    bind: 'auto' (default; or GPUSCALE_BIND) binds to cores as planned, 'none' leaves affinity alone.
    timeout: seconds a collective may wait before failing (default GPUSCALE_TIMEOUT or 600).
    show_placement: log the table of where every rank runs, on rank 0.
    """
    global _current
    if _current is not None:
        raise RuntimeError("gpuscale.init() is already active in this process; call it once, around your training")
    wrapped.forget()  # nothing announced outside a runtime (a model wrapped with an old rt) leaks into this one
    bind, timeout_s = _resolve_options(bind, timeout)
    try:
        env = detect_env(os.environ)
    except ValueError as exc:  # this rank will not join the rendezvous: its peers must not wait there for it
        report_refusal(os.environ, exc)
        announce_refusal(str(exc))
        raise
    configure_logging(env.rank, env.world_size)
    restorer = _Restorer()
    if env.launcher == "torchrun":
        restorer.end_with_launcher()
    started_at = launch_time(os.environ, time.time()) or process_start_time()
    rt: Runtime | None = None
    failed = False
    try:
        dev = choose_device(env, device)
        plan = plan_cores(env, dev, bind)
        cores = _bind(env, plan, restorer)
        if dev.type == "cpu" and DEEPSPEED_CPU_DEVICES not in os.environ:  # else DeepSpeed on CPU asks numactl each step
            restorer.setenv(DEEPSPEED_CPU_DEVICES, str(env.local_world_size))
        chosen_backend = _start_process_group(env, dev, backend, timeout_s, restorer) if env.world_size > 1 else None
        rt = Runtime(
            env=env, device=dev, backend=chosen_backend, binding=plan, cores=tuple(cores),
            host=socket.gethostname(), started_at=started_at, ready_at=time.time(), timeout_s=timeout_s, _restorer=restorer,
        )
        rt.placements = _gather_placements(rt)
        if show_placement and env.world_size > 1 and rt.is_main:
            log.info("placement of %d ranks on %d node(s):\n%s", env.world_size, env.num_nodes, format_placements(rt.placements))
        _say_restart(rt, os.environ)
        _current = rt
        yield rt
    except Stopped:  # a requested stop after a checkpoint (gpuscale.StopSignal): every rank ends here together
        raise
    except BaseException as exc:
        failed = True
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            report_failure(env, exc)
        if isinstance(exc, ValueError) and rt is None and env.world_size > 1 and not dist.is_initialized():
            announce_refusal(str(exc))  # refused before the rendezvous (device, cores): the peers wait there
        raise
    finally:
        _current = None
        wrapped.forget()
        _teardown(rt, failed)
        restorer.restore()


def _say_restart(rt: Runtime, environ: Mapping[str, str]) -> None:
    """On rank 0 of workers torchrun started again after a failure (--max-restarts): say so, once per restart (torchrun
    says it only at INFO, which it does not show)."""
    restarts = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if rt.is_main and restarts.isdigit() and int(restarts) > 0:
        most = environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        log.warning("torchrun restarted the workers after a failure (restart %s of at most %s); a script with a "
                    "Checkpointer resumes from its newest checkpoint", restarts, most)


def _resolve_options(bind: str | None, timeout: float | None) -> tuple[str, float]:
    """`init`'s bind and timeout, from the arguments or GPUSCALE_BIND / GPUSCALE_TIMEOUT, checked."""
    bind = bind or os.environ.get("GPUSCALE_BIND", "auto")
    if bind not in ("auto", "none"):
        raise ValueError(f"bind={bind!r} is not one of 'auto', 'none' (from the argument or GPUSCALE_BIND)")
    try:
        timeout_s = float(timeout if timeout is not None else os.environ.get("GPUSCALE_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        raise ValueError(f"GPUSCALE_TIMEOUT={os.environ.get('GPUSCALE_TIMEOUT')!r} is not a number of seconds") from None
    if timeout_s <= 0:
        raise ValueError(f"timeout={timeout_s} must be a positive number of seconds")
    return bind, timeout_s


def _bind(env: DistEnv, plan: BindingPlan, restorer: _Restorer) -> list[int]:
    """Apply this rank's share of `plan` and size the thread pools to it (unless the user set them); its cores."""
    cores = plan.for_rank(env.local_rank)
    if plan.source in ("gpu-local", "even-split"):
        set_affinity(cores)
    if plan.note and env.local_rank == 0:
        log.warning("CPU binding: %s", plan.note)
    if "OMP_NUM_THREADS" not in os.environ or os.environ.get(OMP_FROM_LAUNCHER):
        restorer.setenv("OMP_NUM_THREADS", str(len(cores)))
        torch.set_num_threads(len(cores))
    if "TOKENIZERS_PARALLELISM" not in os.environ:
        restorer.setenv("TOKENIZERS_PARALLELISM", "false")
    return list(cores)


def _start_process_group(env: DistEnv, device: torch.device, backend: str | None, timeout_s: float,
                         restorer: _Restorer) -> str:
    """Export the launcher variables libraries read, start the process group; the backend it uses."""
    chosen = backend or ("nccl" if device.type == "cuda" else "gloo")
    for name, value in (
        ("RANK", env.rank), ("LOCAL_RANK", env.local_rank), ("WORLD_SIZE", env.world_size),
        ("LOCAL_WORLD_SIZE", env.local_world_size), ("MASTER_ADDR", env.master_addr),
        ("MASTER_PORT", env.master_port),
    ):
        restorer.setenv(name, str(value))
    def victim(reason: str) -> None:  # for the launcher's last line: this rank did not fail on its own
        note_failure(env, RuntimeError(f"{PEER_REFUSED}: {reason}"))

    # torch's own init_process_group: gpuscale's start-up hook gives the launcher's timeout to a script's own calls
    # (gpuscale.runtime.collective_timeout), and init(timeout=) must win over it here
    start_group = dist.init_process_group
    if getattr(start_group, "_gpuscale_timeout", None) is not None:  # only gpuscale's own wrapper is taken off
        start_group = start_group.__wrapped__
    with watch_for_refusal(env.rank, on_refusal=victim):  # a peer that refused to start never comes: stop waiting for it
        start_group(
            backend=chosen, init_method="env://", rank=env.rank, world_size=env.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" and chosen == "nccl" else None,  # binds NCCL's communicator to it
        )
    return chosen


def _gather_placements(rt: Runtime) -> list[dict[str, Any]]:
    mine = rt.placement()
    if not rt.is_distributed:
        return [mine]
    everyone: list[Any] = [None] * rt.world_size
    dist.all_gather_object(everyone, mine)
    return sorted(everyone, key=lambda p: p["rank"])


def _teardown(rt: Runtime | None, failed: bool) -> None:
    """Destroy the process group so that gloo does not abort at interpreter exit (`gpuscale.runtime.teardown`).

    After a failure with NCCL the group is left alone: destroying a communicator whose peers
    are gone can block, and the process is about to exit with the error anyway.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if failed and dist.get_backend() == "nccl" and not (rt is not None and rt.owns_single_group):
        return  # a one-rank group has no peers to wait for: it is always destroyed
    end_process_group(None if failed else (rt.barrier if rt is not None else dist.barrier))
