"""Where a training step's time goes on a GPU: torch.profiler over a few steady steps, summarised.

`StepProfiler` records ``torch.profiler`` (host and device activity) over `steps` optimizer steps after
`start` steps, from any loop that calls ``after_step()`` once per optimizer step (`ProfileCallback` does it
for the HF Trainer). The trace is reduced by `summarise` to what decides whether a step can get faster:

- ``gpu_busy``: the share of the profiled steps during which the GPU ran a kernel, a copy or a fill (the union of
  their intervals, so overlapping streams count once), over the host's step boundaries (``ProfilerStep#N``);
- ``gaps``: the longest stretches without device work, each with what the host ran meanwhile (the host events that
  overlap it most, by overlapped time: an optimizer step, the data loader's ``__next__``, a synchronising copy), and
  ``untraced_ms``, the part in which no traced operator ran: plain Python (a trainer's loop, callbacks, logging);
- ``syncs_per_step``: the host's calls that wait for the device (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, a blocking ``cudaMemcpy``, and their HIP names), each attributed to the operator that
  made it (``aten::_local_scalar_dense`` is ``.item()``, ``bool()`` or ``float()`` of a device tensor);
- ``top_kernels`` and ``top_host_ops``: the device work and the host's outermost operators (main thread) that took
  most time per step, and ``host_untraced_ms_per_step``, the host time in no traced operator (Python);
- ``attention_ms_per_step``: the device time per step of attention's kernels by implementation (flash, efficient,
  cudnn, and math: an explicit softmax over a score matrix), sorted by kernel name (`attention_kind`), which tells a
  fused attention from one computed the long way without opening the trace;
- ``bound``: one line, the step is bound by the **device** (busy >= 90%), the **data** (the loader's waits hold
  half of the idle time or more) or the **host** (the rest: Python, launches, synchronisations).

Before the profiled steps, one step runs under ``torch.cuda.set_sync_debug_mode("warn")``: every synchronising call
then warns, and the first Python frame outside torch at the warning names the code that made it (``sync_sites``),
which the trace alone cannot. The trace is read in Chrome's trace format (``export_chrome_trace``), whose fields (``ph``, ``cat``,
``name``, ``ts``, ``dur`` in microseconds) are stable across torch releases.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cudaMemcpy2D", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
                        "hipMemcpy", "hipMemcpy2D"})
STEP_PREFIX = "ProfilerStep#"
LOADER_MARK = "DataLoader"  # torch's loader annotates each batch: enumerate(DataLoader)#_...Iter.__next__
WARM_STEPS = 10  # steps left out of the step times: compilation, the allocator's and the loader's start
DEVICE_BOUND = 0.90
DATA_BOUND = 0.50


ATTENTION_KINDS = ("flash", "efficient", "cudnn", "math")


def attention_kind(name: str) -> str | None:
    """Which attention implementation a kernel (or, on a CPU, an operator) named `name` belongs to; None for other
    work (copies, casts, matrix products, and the loss's log-softmax)."""
    low = name.lower()
    if "cudnn" in low:  # cuDNN's attention kernels (cudnn_generated_fort_native_sdpa_...), whatever else they name
        return "cudnn"
    if "flash" in low:
        return "flash"
    if "fmha" in low or "efficient" in low or "mem_eff" in low:
        return "efficient"
    if "softmax" in low and "log_softmax" not in low and "logsoftmax" not in low:
        return "math"
    return None


def _largest(totals: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The `n` largest of `totals`, largest first (ties in the order they came)."""
    return sorted(totals.items(), key=lambda item: item[1], reverse=True)[:n]


def format_attention(ms_by_kind: dict[str, float], digits: int = 1) -> str:
    """Milliseconds by attention kind in words ("flash 2.1 ms, math 0.4 ms"); empty where there are none."""
    return ", ".join(f"{kind} {ms:.{digits}f} ms" for kind, ms in ms_by_kind.items())


def _interval(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0.0))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clip(intervals: list[tuple[float, float]], low: float, high: float) -> list[tuple[float, float]]:
    return [(max(s, low), min(e, high)) for s, e in intervals if e > low and s < high]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """The complete events ("ph": "X") of a Chrome trace that torch.profiler exported."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "ts" in e]


def _enclosing_op(sync: dict[str, Any], ops: list[dict[str, Any]]) -> str:
    """The innermost operator on the same thread whose interval holds the synchronising call."""
    start, end = _interval(sync)
    holders = [op for op in ops if op.get("tid") == sync.get("tid") and op.get("pid") == sync.get("pid")
               and float(op["ts"]) <= start and _interval(op)[1] >= end]
    if not holders:
        return "(no operator)"
    return min(holders, key=lambda op: float(op.get("dur", 0.0)))["name"]


def bound_line(summary: dict[str, Any]) -> str:
    """One line: whether the host, the device or the data bounds the step, and the figure that says so."""
    busy, syncs = summary["gpu_busy"], summary["syncs_per_step"]
    step_ms = summary["step_ms"]
    sync_note = f"; {syncs:g} device sync{'s' if syncs != 1 else ''} per step" if syncs else "; no device sync"
    gaps = summary["gaps"]
    top = gaps[0]["host"][0]["name"] if gaps and gaps[0]["host"] else None  # what the host ran in the longest gap
    if not summary["kernels_per_step"]:
        return f"no device activity traced (a CPU run): {step_ms:.1f} ms per step on the host, most in {top or 'nothing traced'}"
    if busy >= DEVICE_BOUND:
        return (f"bound by the device: the GPU was busy {100 * busy:.0f}% of each {step_ms:.1f} ms step{sync_note}; "
                "a faster step needs less arithmetic or faster kernels")
    idle_ms = (1.0 - busy) * step_ms
    if summary["data_share_of_idle"] >= DATA_BOUND:
        return (f"bound by the data: the GPU idled {idle_ms:.1f} ms of each {step_ms:.1f} ms step, "
                f"{100 * summary['data_share_of_idle']:.0f}% of it in the loader's __next__{sync_note}")
    return (f"bound by the host: the GPU idled {idle_ms:.1f} ms of each {step_ms:.1f} ms step "
            f"(busy {100 * busy:.0f}%){sync_note}; the longest gap ran {top or 'unattributed host time'}")


def summarise(events: list[dict[str, Any]], top_gaps: int = 5, top_host: int = 3) -> dict[str, Any]:
    """The profiled steps' GPU busy share, longest device-idle gaps (with the host work in them), device syncs
    per step and the bound (see the module docstring). Times in milliseconds."""
    steps = sorted((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX) and e.get("cat") == "user_annotation"),
                   key=lambda e: float(e["ts"]))  # the host's annotations (a GPU trace repeats them as gpu_user_annotation)
    if not steps:
        raise ValueError("the trace has no ProfilerStep# annotations: call profiler.step() once per optimizer step")
    low, high = float(steps[0]["ts"]), max(_interval(s)[1] for s in steps)
    window = high - low
    device = _union(_clip([_interval(e) for e in events if e.get("cat") in DEVICE_CATEGORIES], low, high))
    busy = sum(e - s for s, e in device)
    idle, cursor = [], low
    for start, end in device:
        if start > cursor:
            idle.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < high:
        idle.append((cursor, high))
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES and not str(e.get("name", "")).startswith(STEP_PREFIX)]
    gaps = []
    for gap in sorted(idle, key=lambda g: g[0] - g[1])[:top_gaps]:
        by_name: defaultdict[str, float] = defaultdict(float)
        inside = []
        for e in host:
            if (shared := _overlap(gap, _interval(e))) > 0:
                by_name[e["name"]] += shared
                inside.append(_interval(e))
        traced = sum(e - s for s, e in _union(_clip(inside, *gap)))
        gaps.append({"at_ms": (gap[0] - low) / 1e3, "ms": (gap[1] - gap[0]) / 1e3,
                     "host": [{"name": n, "ms": t / 1e3} for n, t in _largest(by_name, top_host)],
                     "untraced_ms": (gap[1] - gap[0] - traced) / 1e3})
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    syncs = [e for e in events if e.get("name") in SYNC_CALLS and e.get("cat") in ("cuda_runtime", "cuda_driver")
             and low <= float(e["ts"]) < high]
    made_by = Counter(_enclosing_op(s, ops) for s in syncs)
    loader = _union(_clip([_interval(e) for e in host if LOADER_MARK in str(e.get("name", ""))], low, high))
    idle_total = sum(e - s for s, e in idle)
    data_in_idle = sum(_overlap(gap, load) for gap in idle for load in loader)
    summary = {
        "steps": len(steps), "step_ms": window / len(steps) / 1e3, "step_ms_each": [float(s.get("dur", 0.0)) / 1e3 for s in steps],
        "gpu_busy": busy / window if window > 0 else 0.0, "gaps": gaps,
        "syncs_per_step": len(syncs) / len(steps), "sync_ms_per_step": sum(float(s.get("dur", 0.0)) for s in syncs) / len(steps) / 1e3,
        "syncs_made_by": dict(made_by.most_common()),
        "data_share_of_idle": data_in_idle / idle_total if idle_total > 0 else 0.0,
        "kernels_per_step": sum(1 for e in events if e.get("cat") == "kernel" and low <= float(e["ts"]) < high) / len(steps),
    }
    summary["top_kernels"] = _top([e for e in events if e.get("cat") in DEVICE_CATEGORIES], low, high, len(steps))
    attention: defaultdict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel" and low <= float(e["ts"]) < high and (kind := attention_kind(str(e.get("name", "")))):
            attention[kind] += float(e.get("dur", 0.0))
    summary["attention_ms_per_step"] = {kind: attention[kind] / len(steps) / 1e3 for kind in ATTENTION_KINDS if kind in attention}
    main = Counter(e.get("tid") for e in ops).most_common(1)
    marked = [e for e in host if e.get("cat") in ("cpu_op", "user_annotation")]  # operators, optimizer and loader marks
    outer = _outermost([e for e in marked if main and e.get("tid") == main[0][0]])
    summary["top_host_ops"] = _top(outer, low, high, len(steps))
    traced = sum(b - a for a, b in _union(_clip([_interval(e) for e in outer], low, high)))
    summary["host_untraced_ms_per_step"] = (window - traced) / len(steps) / 1e3
    summary["bound"] = bound_line(summary)
    return summary


def _top(events: list[dict[str, Any]], low: float, high: float, steps: int, n: int = 8) -> list[dict[str, Any]]:
    """The names that took most time per step inside [low, high), with their calls per step."""
    took: defaultdict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    for e in events:
        if low <= float(e["ts"]) < high:
            took[e["name"]] += float(e.get("dur", 0.0))
            calls[e["name"]] += 1
    return [{"name": name[:120], "ms_per_step": t / steps / 1e3, "calls_per_step": calls[name] / steps}
            for name, t in _largest(took, n)]


def _outermost(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operators of one thread that no other operator of it encloses (their times do not double-count)."""
    outer, end = [], -1.0
    for e in sorted(ops, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0)))):
        if float(e["ts"]) >= end:
            outer.append(e)
            end = _interval(e)[1]
    return outer


def _gpu_in_use() -> bool:
    """Whether this process has started CUDA (a training step on a GPU has): only then is there device work to wait for
    or to trace."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


class StepProfiler:
    """Profile optimizer steps ``start + 1 .. start + steps`` of a loop that calls `after_step` after each step;
    the summary (`summarise`, plus ``sync_sites``) is written to `out` as JSON and kept in ``self.summary``. `close`,
    at the end of the run, adds the step's time outside the profiled steps and the first `WARM_STEPS`, and writes it
    again, two ways:

    - ``synced_step_s``: the wall time of the steps between two device synchronisations, per step: one window from
      step `WARM_STEPS` to the step before the sync-debug one, one from the last profiled step to the run's end. Each
      window ends when the device has finished its work, so this is the step's time on the device as on the host,
      whichever is longer: the throughput's figure. (A host that runs ahead of the device, as a step of a few CUDA
      graph replays can for dozens of steps, only fills the launch queue.)
    - ``median_step_s``: the median of those steps by the host's clock alone (what the host took to issue a step,
      where it did not wait for the device); below ``synced_step_s`` where the host ran ahead.

    The step before the profiled ones runs under ``torch.cuda.set_sync_debug_mode("warn")`` (on a GPU), so that
    its synchronising calls are named by file and line. `start` should leave compilation and warm-up behind.
    """

    def __init__(self, start: int, steps: int, out: str | Path, sync: Any = None) -> None:
        """`sync`: waits until the device has finished the work issued so far (default: ``torch.cuda.synchronize`` on
        a GPU, nothing elsewhere)."""
        if start < 1 or steps < 1:
            raise ValueError(f"profile steps {start}:{steps}: start after at least 1 step and profile at least 1")
        self.start, self.steps, self.out, self._sync = start, steps, Path(out), sync
        self.summary: dict[str, Any] | None = None
        self._seen = 0
        self._ends: list[float] = []  # every step's end, by the host's clock
        self._edges: list[tuple[int, float]] = []  # (steps done, time) at each synchronised window's edge
        self._profiler: Any = None
        self._step_mark: Any = None
        self._catcher: Any = None
        self._caught: list[Any] = []
        self._sync_sites: list[dict[str, Any]] = []

    def after_step(self, last: bool = False) -> None:
        """Call once after every optimizer step; `last`: it was the run's last (the window after the profile closes
        there, before the loop's own end of training: a final save, say)."""
        import torch

        self._seen += 1
        self._ends.append(time.perf_counter())
        on_gpu = _gpu_in_use()
        if self._seen in (WARM_STEPS, self.start - 1) and self.start - 1 > WARM_STEPS:  # the window before the profile
            self._synced_edge()
        if self._seen == self.start - 1 and on_gpu:
            self._catcher = warnings.catch_warnings()
            self._catcher.__enter__()
            warnings.simplefilter("always")
            warnings.showwarning = self._on_warning
            torch.cuda.set_sync_debug_mode("warn")
        elif self._seen == self.start:
            if self._catcher is not None:
                torch.cuda.set_sync_debug_mode("default")
                self._catcher.__exit__(None, None, None)  # puts showwarning back
                sites = Counter(self._caught)
                self._sync_sites = [{"where": where, "calls": n} for where, n in sites.most_common()]
                self._catcher = None
            activities = [torch.profiler.ProfilerActivity.CPU]
            if on_gpu:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()
            self._mark_step()
        elif self._profiler is not None and self._seen < self.start + self.steps:
            self._mark_step()
        elif self._profiler is not None and self._seen == self.start + self.steps:
            self._finish()
            self._synced_edge()  # the window after the profile opens
        elif last and len(self._edges) % 2 == 1:
            self._synced_edge()

    def _synced_edge(self) -> None:
        """An edge of a synchronised window: wait for the device's work so far, then note the steps done and the time."""
        import torch

        if self._sync is not None:
            self._sync()
        elif _gpu_in_use():
            torch.cuda.synchronize()
        self._edges.append((self._seen, time.perf_counter()))

    def synced_step_s(self) -> tuple[float, int] | None:
        """The wall time per step over the synchronised windows and how many steps they hold; None without one."""
        pairs = [(self._edges[i], self._edges[i + 1]) for i in range(0, len(self._edges) - 1, 2)]
        steps = sum(b[0] - a[0] for a, b in pairs)
        return (sum(b[1] - a[1] for a, b in pairs) / steps, steps) if steps > 0 else None

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        """A warning during the sync-debug step: a synchronisation's is kept with the first frame outside torch that
        made it (the warning itself names torch's own line), or the thread it came from where no Python frame did."""
        if "synchroniz" not in str(message):
            return
        import threading
        import traceback

        import torch

        torch_dir = str(Path(torch.__file__).resolve().parent)
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not str(Path(f.filename).resolve()).startswith(torch_dir) and "warnings" not in Path(f.filename).name
                  and Path(f.filename).resolve() != Path(__file__).resolve()]
        if frames:
            f = frames[-1]
            self._caught.append(f"{'/'.join(Path(f.filename).parts[-3:])}:{f.lineno} ({f.name})")
        else:
            self._caught.append(f"{'/'.join(Path(filename).parts[-3:])}:{lineno} (thread {threading.current_thread().name})")

    def _mark_step(self) -> None:
        """End the current step's ProfilerStep#N annotation (if any) and begin the next one's (profile.step() writes
        them only under a schedule, so they are made here)."""
        import torch

        if self._step_mark is not None:
            self._step_mark.__exit__(None, None, None)
        self._step_mark = torch.profiler.record_function(f"{STEP_PREFIX}{self._seen - self.start}")
        self._step_mark.__enter__()

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        self._step_mark.__exit__(None, None, None)
        self._step_mark = None
        profiler.stop()
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            profiler.export_chrome_trace(str(trace))
            summary = summarise(load_trace(trace))
        summary["sync_sites"] = self._sync_sites
        summary["profiled_steps"] = [self.start + 1, self.start + self.steps]
        self.summary = summary
        self._write()

    def close(self) -> None:
        """At the end of the run: close the synchronised window after the profile (where the last step did not), add
        ``synced_step_s`` with ``synced_steps``, and ``median_step_s`` (the host's clock: the unprofiled steps after
        the first `WARM_STEPS`, the sync-debug step and the steps right after a synchronisation left out) with
        ``median_of_steps``; write it again."""
        if len(self._edges) % 2 == 1 and self._seen > self._edges[-1][0]:
            self._synced_edge()
        edges = {seen + 1 for seen, _ in self._edges}  # a step right after a synchronisation starts on an idle device
        untouched = [b - a for step, (a, b) in enumerate(zip(self._ends, self._ends[1:], strict=False), start=2)
                     if step > WARM_STEPS and step not in edges and not self.start - 1 <= step <= self.start + self.steps]
        if self.summary is None:
            return
        if untouched:
            self.summary.update(median_step_s=statistics.median(untouched), median_of_steps=len(untouched))
        synced = self.synced_step_s()
        if synced is not None:
            self.summary.update(synced_step_s=synced[0], synced_steps=synced[1])
        self._write()

    def _write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.summary, indent=2) + "\n")


def profile_callback(start: int, steps: int, out: str | Path) -> Any:
    """A transformers TrainerCallback running a `StepProfiler` over the Trainer's optimizer steps."""
    from transformers import TrainerCallback

    class ProfileCallback(TrainerCallback):
        def __init__(self) -> None:
            self.profiler = StepProfiler(start, steps, out)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.profiler.after_step(last=bool(state.max_steps) and state.global_step >= state.max_steps)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.profiler.close()

    return ProfileCallback()
