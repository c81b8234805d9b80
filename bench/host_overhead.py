"""Host time per optimizer step of each training path gpuscale offers, against a bare torch loop, and every call in
the step that would wait for the device.

    python -m bench host_overhead [--repeat 3]

The same tiny GPT-neo (the GPT-neo example's attention through SDPA; 2 layers of width 16, 32-token rows, batch 4)
trains through each path, one fresh process per path and round, the paths taken in turn every round. Its compute is
a fraction of a millisecond, so what a step costs is host work: Python, the framework, the launches a GPU would get.

    bare              a plain torch loop: DataLoader, forward, backward, clip_grad_norm_, AdamW, zero_grad
    bare+probe        the same under gpuscale's probe (what `gpuscale run` loads into an unchanged script)
    training          gpuscale.init, make_loader, setup's Training (backward, step), Meter.iter
    epochloop         the same through EpochLoop, with a per-epoch Average updated every step (docs/training.md's loop)
    trainer           the HF Trainer (the GPT-neo example's arguments) without gpuscale's callbacks
    trainer+gpuscale  the same with MeterCallback and StopCallback, as the GPT-neo example runs it

Every step's end is stamped by torch.optim's global post-step hook; the first WARMUP steps and the steps the sync
probe replays (gpuscale.measure.syncprobe.is_probe_step: documented, charged to the run's "probe" phase) are left out. Each
run's figure is its median and mean host milliseconds per step. Then each path runs FINDER_STEPS more steps under
`gpuscale.measure.device_waits.find_device_waits`, which names every call that would wait for the device, by file and line.

On a shared machine the same path varies by more than a millisecond from one process to the next, so gpuscale's
additions are measured inside one process each, where that drift cancels:

    training vs bare     steps alternate (bare, gpuscale, bare, ...) on the same model and optimizer: a bare step
                         from a plain DataLoader, a gpuscale step from Meter.iter over make_loader through
                         Training's autocast, backward and step; the addition is the median of the pairs' difference
    epochloop vs bare    the same with EpochLoop.batches(), loop.step() and an Average updated every step
    HF callbacks         the time inside MeterCallback's and StopCallback's methods per optimizer step, timed
                         around each call (pure host work: what they add is what they take)
    probe hooks          the time inside the probe's hooks per step: its optimizer post-step hook, and its
                         DataLoader wrapper less the loader's own __next__

Target (issue 27): gpuscale's additions <= 1 ms of host time and no device wait per optimizer step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.stats import examples_on_path
from gpuscale.measure.syncprobe import is_probe_step  # the steps the sync probe replays: documented, left out

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("bare", "bare+probe", "training", "epochloop", "trainer", "trainer+gpuscale")
STEPS, WARMUP, FINDER_STEPS = 300, 20, 3
TARGET_MS = 1.0
SHAPE = {"vocab": 128, "block": 32, "batch": 4, "samples": 8192}


def tiny_model() -> Any:
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    examples_on_path()
    from gptneo_attention import use_sdpa_attention

    torch.manual_seed(0)
    model = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=SHAPE["vocab"], max_position_embeddings=SHAPE["block"], hidden_size=16,
                                           num_layers=2, num_heads=2, intermediate_size=32, window_size=256,
                                           attention_types=[[["global", "local"], 1]]))
    use_sdpa_attention(model)
    return model


class Tokens:
    """Random rows of token ids, as dicts (what a language-modelling collator gives)."""

    def __init__(self) -> None:
        import torch

        self.ids = torch.randint(0, SHAPE["vocab"], (SHAPE["samples"], SHAPE["block"]), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Stamps:
    """Every optimizer step's end (torch.optim's global post-step hook); opens and closes the device-wait finder."""

    def __init__(self, steps: int, model: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.times: list[float] = []
        self.steps, self.model = steps, model
        self.sites: list[dict[str, Any]] | None = None
        self._finder: Any = None
        register_optimizer_step_post_hook(self.after_step)

    def after_step(self, *_: Any) -> None:
        from gpuscale.measure.device_waits import find_device_waits

        self.times.append(time.perf_counter())
        if len(self.times) == self.steps:
            self._finder = find_device_waits(self.model)
            self._found = self._finder.__enter__()
        elif len(self.times) == self.steps + FINDER_STEPS:
            self._finder.__exit__(None, None, None)
            self.sites = self._found.sites()


def _endless(loader: Any) -> Iterator[Any]:
    """`loader`'s batches, epoch after epoch."""
    while True:
        yield from loader


def _plain_batches() -> Iterator[Any]:
    import torch

    return _endless(torch.utils.data.DataLoader(Tokens(), batch_size=SHAPE["batch"], shuffle=True))


def _bare_step(model: Any, optimizer: Any, batches: Iterator[Any]) -> float:
    """One bare step from `batches`: forward, backward, clip_grad_norm_, step, zero_grad; its host seconds."""
    import torch

    start = time.perf_counter()
    loss = model(**next(batches)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _bare(model: Any, total: int) -> None:
    import torch

    optimizer, batches = torch.optim.AdamW(model.parameters(), lr=1e-3), _plain_batches()
    for _ in range(total):
        _bare_step(model, optimizer, batches)


@contextmanager
def _gpuscale_training(model: Any, loop: bool) -> Iterator[tuple[Any, Iterator[Any], Any]]:
    """gpuscale.init and setup's Training of `model` (AdamW, clipping at 1.0), with this rank's batches from
    make_loader through Meter.iter, or (`loop`) through an EpochLoop's first epoch: (training, batches, the EpochLoop
    or None)."""
    import torch

    import gpuscale

    with gpuscale.init() as rt, tempfile.TemporaryDirectory() as tmp:
        torch.set_num_threads(1)  # as every path: init() sizes the pool to the rank's cores, a placement, not step work
        plan = gpuscale.plan_batch(SHAPE["batch"], rt.world_size)
        training = gpuscale.setup(model, lambda p: torch.optim.AdamW(p, lr=1e-3), plan=plan, clip_grad_norm=1.0)
        loader = gpuscale.make_loader(Tokens(), plan)
        if not loop:
            yield training, gpuscale.Meter(plan).iter(loader), None
            return
        epochs = gpuscale.EpochLoop(training, loader, epochs=1, checkpoints=Path(tmp) / "ckpt", resume=False)
        next(iter(epochs))  # into the first epoch (the runs end long before it does)
        yield training, epochs.batches(), epochs


def _gpuscale_step(training: Any, batches: Iterator[Any], epochs: Any) -> float:
    """One step the way docs/training.md writes it: autocast, Training.backward, then Training.step, or EpochLoop.step and a per-epoch
    Average updated with the batch's loss; its host seconds."""
    start = time.perf_counter()
    batch = next(batches)
    with training.autocast():
        loss = training.model(**batch).loss
    training.backward(loss)
    if epochs is None:
        training.step()
    else:
        epochs.step()
        epochs.average("loss").update(loss.detach() * len(batch["input_ids"]), len(batch["input_ids"]))
    return time.perf_counter() - start


def _training(model: Any, total: int, loop: bool) -> None:
    with _gpuscale_training(model, loop) as (training, batches, epochs):
        for _ in range(total):
            _gpuscale_step(training, batches, epochs)


def _trainer(model: Any, total: int, callbacks: bool, out: str) -> None:
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    import gpuscale
    from gpuscale.integrations.hf import MeterCallback, StopCallback, trainer_arguments

    with gpuscale.init() as rt:
        torch.set_num_threads(1)
        plan = gpuscale.plan_batch(SHAPE["batch"], rt.world_size)
        args = TrainingArguments(output_dir=out, report_to=[], max_steps=total, logging_steps=10, save_strategy="no",
                                 eval_strategy="no", learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
                                 logging_nan_inf_filter=False, **trainer_arguments(plan))
        extra = [MeterCallback(gpuscale.Meter(plan)), StopCallback(gpuscale.StopSignal())] if callbacks else []
        Trainer(model=model, args=args, train_dataset=Tokens(), data_collator=default_data_collator, callbacks=extra).train()


ADDITION_WORKERS = ("training vs bare", "epochloop vs bare", "HF callbacks", "probe hooks")


def _alternating(steps: int, loop: bool) -> list[float]:
    """Pairs of (bare step, gpuscale step) on one model and optimizer: the gpuscale step's extra seconds, per pair."""
    with _gpuscale_training(tiny_model(), loop) as (training, batches, epochs):
        plain = _plain_batches()
        extra = []
        for i in range(WARMUP + steps):
            bare = _bare_step(training.model, training.optimizer, plain)
            mine = _gpuscale_step(training, batches, epochs)
            # the sync probe's schedule counts Training's steps: a probed one is documented and left out
            if i >= WARMUP and not is_probe_step(i):
                extra.append(mine - bare)
        return extra


class _Timed:
    """Forwards a callback's event methods, adding the seconds each takes to `spent`."""

    def __init__(self, callback: Any, spent: list[float]) -> None:
        self._callback, self._spent = callback, spent

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._callback, name)
        if not name.startswith("on_"):
            return method

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._spent[0] += time.perf_counter() - start

        return timed


def _hf_callbacks(steps: int) -> list[float]:
    """Seconds inside gpuscale's Trainer callbacks per optimizer step, for each step after WARMUP."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    import gpuscale
    from gpuscale.integrations.hf import MeterCallback, StopCallback, trainer_arguments

    spent, per_step = [0.0], []

    class Reader(TrainerCallback):
        """Last in the list: reads (and resets) what the timed callbacks took during this step."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            per_step.append(spent[0])
            spent[0] = 0.0

    with gpuscale.init() as rt, tempfile.TemporaryDirectory() as tmp:
        torch.set_num_threads(1)
        plan = gpuscale.plan_batch(SHAPE["batch"], rt.world_size)
        args = TrainingArguments(output_dir=tmp, report_to=[], max_steps=WARMUP + steps, logging_steps=10, save_strategy="no",
                                 eval_strategy="no", learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
                                 logging_nan_inf_filter=False, **trainer_arguments(plan))
        ours = [_Timed(MeterCallback(gpuscale.Meter(plan)), spent), _Timed(StopCallback(gpuscale.StopSignal()), spent)]
        trainer = Trainer(model=tiny_model(), args=args, train_dataset=Tokens(), data_collator=default_data_collator,
                          callbacks=[*ours, Reader()])
        trainer.train()
    return per_step[WARMUP:]


def _probe_hooks(steps: int) -> list[float]:
    """Seconds inside the probe's hooks per step of a bare loop: its post-step hook and its loader wrapper, less the
    loader's own __next__ (timed beneath the wrapper)."""
    from torch.utils.data import dataloader

    from gpuscale.measure.probe import recorder

    spent, per_step = [0.0], []
    iterator_class = dataloader._BaseDataLoaderIter
    plain_next = iterator_class.__next__

    def inner(self: Any) -> Any:  # the loader's own work, beneath the probe's wrapper
        start = time.perf_counter()
        try:
            return plain_next(self)
        finally:
            spent[0] -= time.perf_counter() - start

    iterator_class.__next__ = inner  # type: ignore[method-assign]
    active = recorder.install()
    assert active is not None, "the probe worker runs with GPUSCALE_PROBE_DIR set (_subprocess(probe=True))"
    wrapped_next = iterator_class.__next__

    def outer(self: Any) -> Any:
        start = time.perf_counter()
        try:
            return wrapped_next(self)
        finally:
            spent[0] += time.perf_counter() - start

    iterator_class.__next__ = outer  # type: ignore[method-assign]
    hook = active.step

    def timed_step(*args: Any) -> None:
        start = time.perf_counter()
        hook(*args)
        spent[0] += time.perf_counter() - start
        per_step.append(spent[0])
        spent[0] = 0.0

    active.step = timed_step  # type: ignore[method-assign,assignment]
    from torch.optim.optimizer import _global_optimizer_post_hooks

    for key, registered in list(_global_optimizer_post_hooks.items()):
        if registered == hook:
            _global_optimizer_post_hooks[key] = timed_step
    _bare(tiny_model(), WARMUP + steps)
    return per_step[WARMUP:]


def addition_worker(name: str, steps: int, out: Path) -> None:
    """One in-process measurement of a gpuscale addition (see the module docstring): milliseconds per step."""
    import torch

    torch.set_num_threads(1)
    seconds = {"training vs bare": lambda: _alternating(steps, loop=False),
               "epochloop vs bare": lambda: _alternating(steps, loop=True),
               "HF callbacks": lambda: _hf_callbacks(steps), "probe hooks": lambda: _probe_hooks(steps)}[name]()
    ms = [1e3 * x for x in seconds]
    out.write_text(json.dumps({"addition": name, "steps": len(ms), "median_ms": statistics.median(ms),
                               "mean_ms": statistics.fmean(ms)}))


def worker(path: str, steps: int, out: Path) -> None:
    """One run of `path` in this process: `steps` timed steps after WARMUP, then FINDER_STEPS watched ones."""
    import torch

    torch.set_num_threads(1)
    model = tiny_model()
    total = WARMUP + steps + FINDER_STEPS
    stamps = Stamps(WARMUP + steps, model)
    if path == "bare+probe":
        from gpuscale.measure.probe import recorder

        recorder.install()
    with tempfile.TemporaryDirectory() as tmp:
        if path in ("bare", "bare+probe"):
            _bare(model, total)
        elif path in ("training", "epochloop"):
            _training(model, total, loop=path == "epochloop")
        else:
            _trainer(model, total, callbacks=path == "trainer+gpuscale", out=tmp)
    gaps = [(b - a) * 1e3 for i, (a, b) in enumerate(zip(stamps.times, stamps.times[1:], strict=False), start=1)
            if WARMUP <= i < WARMUP + steps and not is_probe_step(i)]
    out.write_text(json.dumps({"path": path, "steps": len(gaps), "median_ms": statistics.median(gaps),
                               "mean_ms": statistics.fmean(gaps), "device_waits": stamps.sites or []}))


def _subprocess(flag: str, name: str, steps: int, probe: bool = False) -> dict[str, Any]:
    """Run this module's worker for `name` in a fresh process; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        if probe:
            env["GPUSCALE_PROBE_DIR"] = str(Path(tmp) / "probe")
        for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(variable, None)
        done = subprocess.run([sys.executable, "-m", "bench.host_overhead", flag, name, "--steps", str(steps),
                               "--worker-out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"host_overhead {name} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def run_one(path: str, steps: int) -> dict[str, Any]:
    return _subprocess("--worker", path, steps, probe=path == "bare+probe")


def run(repeat: int = 3, steps: int = STEPS, paths: tuple[str, ...] = PATHS,
        additions: tuple[str, ...] = ADDITION_WORKERS) -> dict[str, Any]:
    """Each path `repeat` times, in turn (host ms per step, the device waits found), and each of gpuscale's additions
    `repeat` times, each inside one process."""
    rounds = [{path: run_one(path, steps) for path in paths} for _ in range(repeat)]
    per_path = {}
    for path in paths:
        medians = [r[path]["median_ms"] for r in rounds]
        per_path[path] = {"median_ms": statistics.median(medians), "spread_ms": [min(medians), max(medians)],
                          "mean_ms": statistics.median(r[path]["mean_ms"] for r in rounds),
                          "device_waits": rounds[-1][path]["device_waits"]}
    measured = {}
    for name in additions:
        runs = [_subprocess("--addition", name, steps, probe=name == "probe hooks") for _ in range(repeat)]
        medians = [r["median_ms"] for r in runs]
        watched = {"training vs bare": "training", "epochloop vs bare": "epochloop", "HF callbacks": "trainer+gpuscale",
                   "probe hooks": "bare+probe"}[name]
        waits = [w for w in per_path.get(watched, {}).get("device_waits", []) if w["where"].startswith("gpuscale/")]
        measured[name] = {"median_ms": statistics.median(medians), "spread_ms": [min(medians), max(medians)],
                          "mean_ms": statistics.median(r["mean_ms"] for r in runs), "runs": repeat, "steps": runs[0]["steps"],
                          "gpuscale_device_waits": waits, "waits_watched_in": watched if watched in per_path else None}
    met = all(a["median_ms"] <= TARGET_MS and a["mean_ms"] <= TARGET_MS and not a["gpuscale_device_waits"]
              for a in measured.values())
    return {"repeat": repeat, "steps": steps, "warmup": WARMUP, "shape": SHAPE, "paths": per_path, "additions": measured,
            "target": f"gpuscale's additions <= {TARGET_MS:g} ms and no device wait per step", "target_met": met}


def report(record: dict[str, Any]) -> str:
    lines = [f"host ms per optimizer step, median of {record['repeat']} runs of {record['steps']} steps (min-max), mean:"]
    for path, p in record["paths"].items():
        lines.append(f"  {path:<17} {p['median_ms']:7.2f} ms ({p['spread_ms'][0]:.2f}-{p['spread_ms'][1]:.2f}), mean "
                     f"{p['mean_ms']:.2f}; device waits: {sum(w['calls'] for w in p['device_waits'])} in {FINDER_STEPS} steps")
        for w in p["device_waits"]:
            lines.append(f"      {w['calls']:3d} x {w['kind']} at {w['where']} ({w['function']})")
    lines.append("gpuscale's additions, each measured inside one process (median of the runs' medians, min-max; mean):")
    for name, a in record["additions"].items():
        where = f" (device waits watched in {a['waits_watched_in']}: {len(a['gpuscale_device_waits'])} in gpuscale)" \
            if a["waits_watched_in"] else ""
        lines.append(f"  {name:<20} {a['median_ms']:+6.3f} ms ({a['spread_ms'][0]:+.3f} to {a['spread_ms'][1]:+.3f}), mean "
                     f"{a['mean_ms']:+.3f}{where}")
    lines.append(f"target ({record['target']}): {'met' if record['target_met'] else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--worker", choices=PATHS)
    which.add_argument("--addition", choices=ADDITION_WORKERS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--worker-out", type=Path, required=True)
    options = parser.parse_args()
    if options.worker:
        worker(options.worker, options.steps, options.worker_out)
    else:
        addition_worker(options.addition, options.steps, options.worker_out)
