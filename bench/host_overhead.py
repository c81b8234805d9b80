"""Host time per optimizer step of each training path gpuscale offers, against a bare torch loop, and every call in
the step that would wait for the device.

    python -m bench host_overhead [--repeat 3]

The same tiny GPT-neo (the GPT-neo example's attention through SDPA; 2 layers of width 16, 32-token rows, batch 4)
trains through each path, one fresh process per path and round, the paths taken in turn every round. Its compute is
a fraction of a millisecond, so what a step costs is host work: Python, the framework, the launches a GPU would get.

    bare              a plain torch loop: DataLoader, forward, backward, clip_grad_norm_, AdamW, zero_grad
    bare+probe        the same under gpuscale's probe (what `gpuscale run` loads into an unchanged script)
    training          gpuscale.init, make_loader, setup's Training (backward, step), Meter.iter
    epochloop         the same through EpochLoop, with a per-epoch Average updated every step (the README's loop)
    trainer           the HF Trainer (the GPT-neo example's arguments) without gpuscale's callbacks
    trainer+gpuscale  the same with MeterCallback and StopCallback, as the GPT-neo example runs it

Every step's end is stamped by torch.optim's global post-step hook; the first WARMUP steps and the steps the sync
probe replays (gpuscale.syncprobe.is_probe_step: documented, charged to the run's "probe" phase) are left out. Each
run's figure is its median and mean host milliseconds per step; gpuscale's additions are the paired differences
within a round (training - bare, epochloop - bare, bare+probe - bare, trainer+gpuscale - trainer), reported as the
median over rounds with the spread. Then each path runs FINDER_STEPS more steps under
`gpuscale.device_waits.find_device_waits`, which names every call that would wait for the device, by file and line.

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("bare", "bare+probe", "training", "epochloop", "trainer", "trainer+gpuscale")
ADDITIONS = {"training": "bare", "epochloop": "bare", "bare+probe": "bare", "trainer+gpuscale": "trainer"}
STEPS, WARMUP, FINDER_STEPS = 300, 20, 3
TARGET_MS = 1.0
SHAPE = {"vocab": 128, "block": 32, "batch": 4, "samples": 8192}


def tiny_model() -> Any:
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    sys.path.insert(0, str(ROOT / "examples"))
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
        from gpuscale.device_waits import find_device_waits

        self.times.append(time.perf_counter())
        if len(self.times) == self.steps:
            self._finder = find_device_waits(self.model, device=_device())
            self._found = self._finder.__enter__()
        elif len(self.times) == self.steps + FINDER_STEPS:
            self._finder.__exit__(None, None, None)
            self.sites = self._found.sites()


def _device() -> Any:
    import torch

    return torch.device("cpu")


def _bare(model: Any, total: int) -> None:
    import torch

    loader = torch.utils.data.DataLoader(Tokens(), batch_size=SHAPE["batch"], shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    done = 0
    while done < total:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == total:
                return


def _training(model: Any, total: int, loop: bool) -> None:
    import torch

    import gpuscale

    with gpuscale.init() as rt:
        torch.set_num_threads(1)  # as every path: init() sizes the pool to the rank's cores, a placement, not step work
        plan = gpuscale.plan_batch(SHAPE["batch"], rt.world_size)
        loader = gpuscale.make_loader(Tokens(), plan)
        training = gpuscale.setup(model, lambda p: torch.optim.AdamW(p, lr=1e-3), plan=plan, clip_grad_norm=1.0)
        if not loop:
            meter = gpuscale.Meter(plan)
            done = 0
            for batch in meter.iter(loader):
                with training.autocast():
                    loss = training.model(**batch).loss
                training.backward(loss)
                done += training.step()
                if done == total:
                    return
            return
        with tempfile.TemporaryDirectory() as tmp:
            epochs = gpuscale.EpochLoop(training, loader, epochs=1, checkpoints=Path(tmp) / "ckpt", resume=False)
            average = epochs.average("loss")
            for _ in epochs:
                for batch in epochs.batches():
                    with training.autocast():
                        loss = training.model(**batch).loss
                    training.backward(loss)
                    epochs.step()
                    average.update(loss.detach() * len(batch["input_ids"]), len(batch["input_ids"]))
                    if epochs.steps == total:
                        return


def _trainer(model: Any, total: int, callbacks: bool, out: str) -> None:
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    import gpuscale
    from gpuscale.hf import MeterCallback, StopCallback, trainer_arguments

    with gpuscale.init() as rt:
        torch.set_num_threads(1)
        plan = gpuscale.plan_batch(SHAPE["batch"], rt.world_size)
        args = TrainingArguments(output_dir=out, report_to=[], max_steps=total, logging_steps=10, save_strategy="no",
                                 eval_strategy="no", learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
                                 logging_nan_inf_filter=False, **trainer_arguments(plan))
        extra = [MeterCallback(gpuscale.Meter(plan)), StopCallback(gpuscale.StopSignal())] if callbacks else []
        Trainer(model=model, args=args, train_dataset=Tokens(), data_collator=default_data_collator, callbacks=extra).train()


def worker(path: str, steps: int, out: Path) -> None:
    """One run of `path` in this process: `steps` timed steps after WARMUP, then FINDER_STEPS watched ones."""
    import torch

    torch.set_num_threads(1)
    model = tiny_model()
    total = WARMUP + steps + FINDER_STEPS
    stamps = Stamps(WARMUP + steps, model)
    if path == "bare+probe":
        from gpuscale.probe import recorder

        recorder.install()
    with tempfile.TemporaryDirectory() as tmp:
        if path in ("bare", "bare+probe"):
            _bare(model, total)
        elif path in ("training", "epochloop"):
            _training(model, total, loop=path == "epochloop")
        else:
            _trainer(model, total, callbacks=path == "trainer+gpuscale", out=tmp)
    from gpuscale.syncprobe import is_probe_step

    gaps = [(b - a) * 1e3 for i, (a, b) in enumerate(zip(stamps.times, stamps.times[1:]), start=1)
            if WARMUP <= i < WARMUP + steps and not is_probe_step(i)]
    out.write_text(json.dumps({"path": path, "steps": len(gaps), "median_ms": statistics.median(gaps),
                               "mean_ms": statistics.fmean(gaps), "device_waits": stamps.sites or []}))


def run_one(path: str, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", "GPUSCALE_MONITOR": os.environ.get("GPUSCALE_MONITOR", "1")}
        if path == "bare+probe":
            env["GPUSCALE_PROBE_DIR"] = str(Path(tmp) / "probe")
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-m", "bench.host_overhead", "--worker", path, "--steps", str(steps),
                               "--worker-out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"host_overhead {path} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def run(repeat: int = 3, steps: int = STEPS, paths: tuple[str, ...] = PATHS) -> dict[str, Any]:
    """Each path `repeat` times, in turn; per-path figures, gpuscale's additions, and the device waits found."""
    rounds = [{path: run_one(path, steps) for path in paths} for _ in range(repeat)]
    per_path = {}
    for path in paths:
        medians = [r[path]["median_ms"] for r in rounds]
        per_path[path] = {"median_ms": statistics.median(medians), "spread_ms": [min(medians), max(medians)],
                          "mean_ms": statistics.median(r[path]["mean_ms"] for r in rounds),
                          "device_waits": rounds[-1][path]["device_waits"]}
    additions = {}
    for path, base in ADDITIONS.items():
        if path in paths and base in paths:
            deltas = [r[path]["median_ms"] - r[base]["median_ms"] for r in rounds]
            mean_deltas = [r[path]["mean_ms"] - r[base]["mean_ms"] for r in rounds]
            waits = [w for w in per_path[path]["device_waits"] if "gpuscale/" in w["where"]]
            additions[f"{path} - {base}"] = {"median_ms": statistics.median(deltas), "spread_ms": [min(deltas), max(deltas)],
                                             "mean_ms": statistics.median(mean_deltas), "gpuscale_device_waits": waits}
    met = all(a["median_ms"] <= TARGET_MS and not a["gpuscale_device_waits"] for a in additions.values())
    return {"repeat": repeat, "steps": steps, "warmup": WARMUP, "shape": SHAPE, "paths": per_path, "additions": additions,
            "target": f"gpuscale's additions <= {TARGET_MS:g} ms and no device wait per step", "target_met": met}


def report(record: dict[str, Any]) -> str:
    lines = [f"host ms per optimizer step, median of {record['repeat']} runs of {record['steps']} steps (min-max), mean:"]
    for path, p in record["paths"].items():
        lines.append(f"  {path:<17} {p['median_ms']:7.2f} ms ({p['spread_ms'][0]:.2f}-{p['spread_ms'][1]:.2f}), mean "
                     f"{p['mean_ms']:.2f}; device waits: {sum(w['calls'] for w in p['device_waits'])} in {FINDER_STEPS} steps")
        for w in p["device_waits"]:
            lines.append(f"      {w['calls']:3d} x {w['kind']} at {w['where']} ({w['function']})")
    lines.append("gpuscale's additions (paired within a round):")
    for name, a in record["additions"].items():
        lines.append(f"  {name:<28} {a['median_ms']:+6.2f} ms ({a['spread_ms'][0]:+.2f} to {a['spread_ms'][1]:+.2f}), mean "
                     f"{a['mean_ms']:+.2f}; device waits in gpuscale: {len(a['gpuscale_device_waits'])}")
    lines.append(f"target ({record['target']}): {'met' if record['target_met'] else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=PATHS, required=True)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--worker-out", type=Path, required=True)
    options = parser.parse_args()
    worker(options.worker, options.steps, options.worker_out)
