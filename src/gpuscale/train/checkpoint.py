"""Checkpoints that survive a kill and resume exactly where the run stopped.

    ckpt = gpuscale.Checkpointer(out / "checkpoints", keep=3)
    state = ckpt.resume(model=model, optimizer=opt, scheduler=sched, loader=train)   # None if fresh
    step = state.step if state else 0
    ...
    ckpt.save(step=step, model=model, optimizer=opt, scheduler=sched, loader=train)  # collective

What a checkpoint holds: the model's own state dict (no ``module.`` prefix), the optimizer's and
scheduler's, the loader's epoch and position inside it, every rank's RNG states (torch, CUDA,
Python, NumPy), the step, and whatever the caller adds under ``extra``.

Two layouts. Replicated strategies (DDP, one process): rank 0 writes one file ``step-N.pt``.
Sharding strategies write a directory ``step-N/`` (plus ``gpuscale.pt`` with the rest): fsdp's
shards through torch.distributed.checkpoint, which load back on any number of ranks; deepspeed's
ZeRO partitions in DeepSpeed's own format under ``step-N/deepspeed/``, which load back on the same
number of ranks. `consolidate` turns any layout into one plain state dict.

Writes are atomic: a file is written under a temporary name, fsynced and renamed; a sharded
directory is filled under a temporary name and renamed when every shard and the metadata are
written. A kill at any moment leaves the previous checkpoint intact; the last `keep` are kept. Files are read with
``torch.load(weights_only=True)``: a checkpoint cannot run code (docs/reliability.md).

Integrity: torch.load does not notice flipped bits in tensor data, so every checkpoint carries
SHA-256 sums in ``sha256sum`` format: ``step-N.pt.sha256`` beside a file, ``step-N/SHA256SUMS``
inside a directory (written last, before the rename). Loading verifies them; a mismatch or a
missing file is reported in one line and `resume` falls back to the previous good checkpoint.
Check by hand with ``sha256sum -c step-N.pt.sha256`` (in the checkpoint directory). Verifying
reads every byte once more: for a sharded checkpoint every rank reads all shards.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpuscale.base.files import atomic_write, fsync_dir
from gpuscale.base.rng import capture_rng, restore_rng
from gpuscale.detect.log import get_logger
from gpuscale.runtime.init import Runtime, current
from gpuscale.runtime.sharded import load_all
from gpuscale.runtime.speed import keeping_implementation
from gpuscale.strategy import Strategy, strategy_of
from gpuscale.strategy.deepspeed import consolidate_deepspeed, deepspeed_tag

__all__ = ["Checkpointer", "ResumeState", "capture_rng", "restore_rng", "consolidate"]

FORMAT = "gpuscale-checkpoint-1"
_NAME = re.compile(r"^step-(\d{9})(\.pt)?$")  # a file (full state) or a directory (sharded, DCP)
META = "gpuscale.pt"  # inside a sharded checkpoint directory: step, epoch, RNG, loader, scheduler, extra
SUMS = "SHA256SUMS"  # inside a sharded checkpoint directory: sha256sum lines of every other file, written last
SUM_SUFFIX = ".sha256"  # beside a checkpoint file: its sha256sum line
NOT_A_PICKLE = (IndexError, TypeError, AttributeError, OverflowError, UnicodeDecodeError, struct.error)
"""What torch's weights-only unpickler raises, besides UnpicklingError, on bytes that are no pickle at all
(measured on random and truncated files)."""
log = get_logger("checkpoint")


@dataclass(frozen=True)
class ResumeState:
    """What `Checkpointer.resume` restored."""

    path: Path
    step: int
    epoch: int | None
    extra: dict[str, Any] = field(default_factory=dict)


def _resume_state(source: Path, payload: dict[str, Any]) -> ResumeState:
    return ResumeState(path=source, step=int(payload["step"]), epoch=payload["epoch"], extra=payload["extra"])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sum_lines(directory: Path, names: list[str]) -> bytes:
    """``sha256sum`` output for `names` (relative to `directory`)."""
    return "".join(f"{_sha256(directory / name)}  {name}\n" for name in names).encode()


def write_checksums(source: Path) -> None:
    """Write the sums of a checkpoint file (beside it) or of every file in a checkpoint directory (inside it)."""
    if source.is_dir():
        names = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and p.name != SUMS)
        text = _sum_lines(source, names)
        atomic_write(source / SUMS, lambda f: f.write(text))
    else:
        text = _sum_lines(source.parent, [source.name])
        atomic_write(source.with_name(source.name + SUM_SUFFIX), lambda f: f.write(text))


def verify_checksums(source: Path) -> bool:
    """Check a checkpoint against its sums. False if it has none (written elsewhere); ValueError if it is damaged."""
    sums = source / SUMS if source.is_dir() else source.with_name(source.name + SUM_SUFFIX)
    if not sums.is_file():
        return False
    base = source if source.is_dir() else source.parent
    for line in sums.read_text(errors="replace").splitlines():
        expected, _, name = line.partition("  ")
        target = (base / name).resolve()
        if not name or base.resolve() not in (target, *target.parents):
            raise ValueError(f"{sums} has a line that is not '<sha256>  <file inside the checkpoint>': {line[:80]!r}")
        if not target.is_file():
            raise ValueError(f"{source} is incomplete: {name} is missing")
        if _sha256(target) != expected:
            raise ValueError(f"{source} is damaged: {name} does not match its SHA-256 sum")
    return True


class Checkpointer:
    """Atomic, rotating checkpoints in one directory. `save` is collective; `resume` is not."""

    def __init__(self, directory: str | Path, keep: int = 3, rt: Runtime | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep} must be at least 1: the newest checkpoint is always kept")
        self.directory = Path(directory)
        self.keep = keep
        self.rt = rt or current()

    def checkpoints(self) -> list[Path]:
        """Checkpoints in this directory (files, or directories for sharded ones), oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if _NAME.match(p.name))

    def latest(self) -> Path | None:
        """The newest checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def peek(self, path: str | Path | None = None) -> ResumeState | None:
        """What the newest readable checkpoint (or `path`) holds: step, epoch, extra; None if there is none.

        An unreadable newest checkpoint is skipped with a warning for the one before it; if none
        can be read, ValueError. Resume from the returned state's `path`.

        Use it to rebuild what the checkpoint needs before `resume` (a later training phase with
        other trainable parameters and another optimizer, say).
        """
        if path is not None:
            return _resume_state(Path(path), self._load(Path(path)))
        # Newest first; one that cannot be read (truncated by a full disk, damaged by hand) is
        # reported in one line and the one before it is used: a run never restarts from zero
        # while a readable checkpoint exists, and never trusts an unreadable one.
        found = self.checkpoints()
        first_error: ValueError | None = None
        for source in reversed(found):
            try:
                state = _resume_state(source, self._load(source))
            except ValueError as exc:
                first_error = first_error or exc
                if self.rt.local_rank == 0:  # once per node (a node-local disk may differ), not once per rank
                    log.warning("skipping %s: %s", source.name, exc)
                continue
            if first_error is not None and self.rt.local_rank == 0:
                log.warning("resuming from %s, the newest readable checkpoint", source.name)
            return state
        if first_error is not None:
            raise ValueError(f"no checkpoint in {self.directory} can be read ({first_error}); "
                             "move the directory away to start afresh") from None
        return None

    @staticmethod
    def _load(source: Path, verify: bool = True) -> dict[str, Any]:
        if verify and source.exists() and not verify_checksums(source):
            log.warning("%s has no SHA-256 sums (not written by this gpuscale?); loading it unverified", source.name)
        try:
            payload = torch.load(source / META if source.is_dir() else source, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if "unsupported global" not in str(exc).lower():  # not a pickle of forbidden objects: not ours at all
                raise ValueError(f"{source} is not a checkpoint (not a torch.save file); give a step-* file or directory") from None
            raise ValueError(f"{source} holds objects other than tensors and plain data; refusing to load it "
                             "(checkpoints are read with weights_only=True and never run code)") from None
        except (OSError, RuntimeError, EOFError, KeyError, *NOT_A_PICKLE) as exc:
            raise ValueError(f"{source} cannot be read as a gpuscale checkpoint ({type(exc).__name__}); "
                             "it may be truncated or not a checkpoint") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{source} is not a gpuscale checkpoint; pass the path of a step-*.pt file or start fresh")
        return payload

    def save(
        self,
        *,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        loader: Any = None,
        epoch: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``step-NNNNNNNNN.pt`` (collective: every rank calls it). Returns its path."""
        if step < 0:
            raise ValueError(f"step={step} must not be negative")
        newest = self.latest()  # every rank checks, before any collective, so all refuse alike
        if newest is not None and (named := _NAME.match(newest.name)) and int(named.group(1)) > step:
            raise ValueError(
                f"{self.directory} already holds {newest.name}, newer than step {step} (an earlier run?); "
                "resume from it, or start in an empty directory, so rotation never deletes the new checkpoints"
            )
        rt = self.rt
        rng = capture_rng(rt.device)
        rngs: list[Any] = [rng]
        if rt.is_distributed:
            rngs = [None] * rt.world_size
            dist.all_gather_object(rngs, rng)
        strategy = strategy_of(model)
        sharded = strategy.sharded and rt.is_distributed
        path = self.directory / (f"step-{step:09d}" if sharded else f"step-{step:09d}.pt")
        meta = {
            "format": FORMAT,
            "step": step,
            "epoch": epoch,
            "world_size": rt.world_size,
            "strategy": strategy.name,
            "sharded": sharded,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "loader": loader.state_dict() if loader is not None else None,
            "rng": rngs,
            "extra": extra or {},
        }
        if sharded:
            self._save_sharded(strategy, model, optimizer, path, meta)
        else:
            # Collective for sharding strategies: every rank helps gather, rank 0 ends up with the whole.
            model_state = strategy.state_dict(model)
            optimizer_state = strategy.optimizer_state_dict(model, optimizer) if optimizer is not None else None
            if strategy.writes_checkpoint(rt):
                payload = {**meta, "model": model_state, "optimizer": optimizer_state}
                atomic_write(path, lambda f: torch.save(payload, f))
                write_checksums(path)
        if rt.is_main:
            for old in self.checkpoints()[: -self.keep]:
                if old.is_dir():
                    shutil.rmtree(old)
                else:
                    old.unlink(missing_ok=True)
                    old.with_name(old.name + SUM_SUFFIX).unlink(missing_ok=True)
        rt.barrier()  # nobody reads or moves on before the checkpoint is complete
        return path

    def _save_sharded(self, strategy: Strategy, model: nn.Module, optimizer: Any, path: Path, meta: dict[str, Any]) -> None:
        """Every rank writes its shards into a temporary directory; rank 0 adds the metadata and
        renames it into place only when all shards are written (the rename is the commit)."""
        rt = self.rt
        tmp = self.directory / f".{path.name}.tmp"
        if rt.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # left over from a kill in the middle of a save
            tmp.mkdir(parents=True)
        rt.barrier()
        strategy.save_sharded(model, optimizer, str(tmp))  # collective; DCP writes .metadata last
        rt.barrier()
        if rt.is_main:
            atomic_write(tmp / META, lambda f: torch.save(meta, f))
            write_checksums(tmp)  # last: a directory without its sums is incomplete
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
            fsync_dir(self.directory)

    def resume(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        loader: Any = None,
        path: str | Path | None = None,
    ) -> ResumeState | None:
        """Restore the newest readable checkpoint (or `path`) into the given objects; None if there is none."""
        verify = path is not None
        if path is None:
            newest = self.peek()  # verified it already
            path = newest.path if newest is not None else None
        source = Path(path) if path is not None else None
        if source is None:
            return None
        payload = self._load(source, verify=verify)
        strategy = strategy_of(model)
        rt = self.rt
        if payload.get("sharded"):
            if payload["strategy"] != strategy.name:
                raise ValueError(f"{source} is a sharded {payload['strategy']} checkpoint but the model uses {strategy.name}; "
                                 f"run with strategy {payload['strategy']!r}, or consolidate it first (gpuscale consolidate) "
                                 "and load the weights before wrapping")
            if not strategy.reshards and payload["world_size"] != rt.world_size:
                raise ValueError(f"{source} was written by {payload['world_size']} ranks and a {strategy.name} checkpoint "
                                 f"resumes on the same number; run with {payload['world_size']} ranks, or consolidate it "
                                 "(gpuscale consolidate) and start from its weights")
            with keeping_implementation(optimizer):  # this run's --fused, whatever the checkpoint's run chose
                strategy.load_sharded(model, optimizer, str(source))
        else:
            strategy.load_state_dict(model, payload["model"])
        for name, target in (("optimizer", optimizer), ("scheduler", scheduler), ("loader", loader)):
            if target is not None and not (name == "optimizer" and payload.get("sharded")):
                if payload[name] is None:
                    raise ValueError(f"{source} holds no {name} state; resume without passing {name}")
                if name == "optimizer":
                    with keeping_implementation(target):
                        strategy.load_optimizer_state_dict(model, target, payload[name])
                elif name == "loader" and isinstance(payload[name], dict) and "batches_done" in payload[name]:
                    # a gpuscale loader's position per rank: older ones do not say of how many ranks; the checkpoint does
                    target.load_state_dict({"world_size": payload["world_size"], **payload[name]})
                else:
                    target.load_state_dict(payload[name])
        if payload["world_size"] == rt.world_size:
            restore_rng(payload["rng"][rt.rank], rt.device)
        elif rt.is_main:
            log.warning(
                "checkpoint %s was written by %d ranks, this job has %d: model and optimizer are restored, and a "
                "gpuscale loader continues the interrupted epoch after the samples it had trained; the random states "
                "(dropout, augmentation) are not reproduced",
                source.name, payload["world_size"], rt.world_size,
            )
        if rt.is_main:
            log.info("resumed from %s (step %d)", source, payload["step"])
        return _resume_state(source, payload)


def consolidate(source: str | Path, target: str | Path) -> Path:
    """Write the plain model state dict of any gpuscale checkpoint (file or sharded directory), or of a DeepSpeed
    checkpoint another program wrote (the HF Trainer's checkpoint-N, or its global_stepN), to `target`.

    The result is what ``model.load_state_dict(torch.load(target, weights_only=True))`` takes, on
    one process, with no gpuscale and no process group. Runs without a process group.
    """
    source, target = Path(source), Path(target)
    if not source.exists():
        raise ValueError(f"checkpoint {source} does not exist")
    if source.name.endswith(SUM_SUFFIX) or source.name == SUMS:
        meant = source.with_name(source.name[:-len(SUM_SUFFIX)]) if source.name.endswith(SUM_SUFFIX) else source.parent
        raise ValueError(f"{source} holds the SHA-256 sums of a checkpoint, not the checkpoint; give {meant}")
    deepspeed = deepspeed_tag(source)
    if deepspeed is not None:
        model = consolidate_deepspeed(*deepspeed)
    elif source.is_dir():
        model = load_all(source)["model"]
    else:
        model = Checkpointer._load(source)["model"]
    atomic_write(target, lambda f: torch.save(model, f))
    return target
