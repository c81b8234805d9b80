"""The strategy options of examples/vit.py and examples/gptneo_imdb.py, parsed and carried through the code path each
example takes to DeepSpeed's config (`gpuscale.setup` for vit, `trainer_arguments` for gptneo_imdb), without training.

A default of the script's (vit's ZeRO stage 1, its clipping at 1.0, the Trainer's 1.0) yields to a --ds-config that
states the setting; only a value typed on the command line that disagrees with the config is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gpuscale
from gpuscale.strategy.deepspeed import DeepSpeedStrategy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # as when the examples run as scripts: their helpers lie beside them

import gptneo_imdb  # noqa: E402
import vit  # noqa: E402

CPU = torch.device("cpu")
# The user's config of the report: hjson (a comment, a trailing comma), ZeRO-2, clipping at 1.0, the batch of vit's
# defaults on 2 ranks (32 per rank, weak scaling).
COURSE_HJSON = """{ // comment
  "train_batch_size": 64, "train_micro_batch_size_per_gpu": 32,
  "zero_optimization": {"stage": 2}, "gradient_clipping": 1.0, }
"""


class _Built(Exception):
    """Raised in place of building the engine: carries the config `gpuscale.setup` hands to DeepSpeed."""

    def __init__(self, config: dict) -> None:
        super().__init__("engine not built")
        self.config = config


@pytest.fixture
def ds_config(tmp_path):
    def write(text: str = COURSE_HJSON) -> str:
        path = tmp_path / "ds.hjson"
        path.write_text(text)
        return str(path)

    return write


def _vit_config(monkeypatch, argv: list[str]) -> dict:
    """The DeepSpeed config vit.py's `train` would build on 2 ranks from `argv`: its own calls, up to the engine."""
    def initialize(self, module, optimizer, config):
        raise _Built(config)

    monkeypatch.setattr(DeepSpeedStrategy, "initialize", initialize)
    args = vit.parse_args(argv)
    rt = SimpleNamespace(device=CPU, world_size=2, rank=0, is_main=True, ensure_process_group=lambda: None)
    plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling)
    with pytest.raises(_Built) as built:
        gpuscale.setup(torch.nn.Linear(4, 2), lambda params: torch.optim.Adam(params, lr=args.lr), plan=plan, rt=rt,
                       clip_grad_norm=vit.clip_grad_norm(args), **gpuscale.training_options(args))
    return built.value.config


def _gptneo_arguments(argv: list[str]) -> dict:
    """The Trainer's strategy arguments gptneo_imdb.py's `train` would build on 2 ranks from `argv`."""
    from gpuscale.integrations.hf import trainer_arguments

    args = gptneo_imdb.parse_args(argv)
    plan = gpuscale.plan_batch(args.global_batch, 2, scaling="strong", max_per_device=args.max_per_device)
    return trainer_arguments(plan, max_grad_norm=gptneo_imdb.max_grad_norm(args), rt=SimpleNamespace(world_size=2, device=CPU),
                             **gpuscale.training_options(args))


# --------------------------------------------------------------------------------------------------
# vit.py: --zero-stage (default 1, the course's) and --clip-grad-norm (default 1.0) against --ds-config


def test_vit_takes_the_stage_of_the_users_config(monkeypatch, ds_config):
    config = _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", ds_config(), "--epochs", "1"])
    assert config["zero_optimization"]["stage"] == 2 and config["gradient_clipping"] == 1.0
    assert config["train_batch_size"] == 64 and config["train_micro_batch_size_per_gpu"] == 32


def test_vit_keeps_its_own_stage_without_one_in_a_config(monkeypatch, ds_config):
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed"])["zero_optimization"]["stage"] == 1
    silent = ds_config('{"train_batch_size": 64}')
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", silent])["zero_optimization"]["stage"] == 1


def test_vit_refuses_a_typed_stage_the_config_contradicts(monkeypatch, ds_config):
    with pytest.raises(ValueError, match="ZeRO stage is 1 on the command line but 2 in the DeepSpeed config; make them agree"):
        _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", ds_config(), "--zero-stage", "1"])
    typed = _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", ds_config(), "--zero-stage", "2"])
    assert typed["zero_optimization"]["stage"] == 2
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed", "--zero-stage", "3"])["zero_optimization"]["stage"] == 3


def test_vit_takes_the_clipping_of_the_users_config(monkeypatch, ds_config):
    path = ds_config(COURSE_HJSON.replace('"gradient_clipping": 1.0', '"gradient_clipping": 0.5'))
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", path])["gradient_clipping"] == 0.5
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed"])["gradient_clipping"] == 1.0  # the course's
    with pytest.raises(ValueError, match="gradient clipping is 0.0 on the command line but 0.5 in the DeepSpeed config"):
        _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", path, "--clip-grad-norm", "0"])
    assert vit.clip_grad_norm(vit.parse_args([])) == 1.0
    assert vit.clip_grad_norm(vit.parse_args(["--clip-grad-norm", "0"])) is None  # off (ddp, fsdp: no clipping at all)


def test_vit_refuses_a_typed_stage_outside_deepspeed_even_if_it_is_the_default():
    for typed in ("1", "3"):
        with pytest.raises(ValueError, match="--zero-stage: for --strategy deepspeed only"):
            gpuscale.training_options(vit.parse_args(["--strategy", "ddp", "--zero-stage", typed]))
    assert gpuscale.training_options(vit.parse_args(["--strategy", "fsdp"])) == {"strategy": "fsdp", "precision": "auto"}


def test_vit_help_states_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        vit.parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "the --ds-config's stage, else 1)" in said
    assert "else 2" not in said


# --------------------------------------------------------------------------------------------------
# gptneo_imdb.py: the Trainer's strategies only; --zero-stage (default 2) and --max-grad-norm (the Trainer's 1.0)


def test_gptneo_offers_only_the_trainers_strategies(capsys):
    from gpuscale.integrations.hf import TRAINER_STRATEGIES

    assert gptneo_imdb.STRATEGIES == TRAINER_STRATEGIES
    with pytest.raises(SystemExit) as refused:
        gptneo_imdb.parse_args(["--strategy", "fsdp"])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "argument --strategy: invalid choice: 'fsdp' (choose from 'ddp', 'deepspeed')" in said
    assert gptneo_imdb.parse_args(["--strategy", "deepspeed"]).strategy == "deepspeed"
    with pytest.raises(SystemExit):
        gptneo_imdb.parse_args(["--help"])
    assert "{ddp,deepspeed}" in capsys.readouterr().out


def test_gptneo_takes_the_stage_and_clipping_of_the_users_config(ds_config):
    path = ds_config('{"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}')
    arguments = _gptneo_arguments(["--strategy", "deepspeed", "--ds-config", path])
    assert arguments["deepspeed"]["zero_optimization"]["stage"] == 1
    assert arguments["deepspeed"]["gradient_clipping"] == arguments["max_grad_norm"] == 0.5
    plain = _gptneo_arguments(["--strategy", "deepspeed"])
    assert plain["deepspeed"]["zero_optimization"]["stage"] == 2 and plain["max_grad_norm"] == 1.0
    assert _gptneo_arguments([])["max_grad_norm"] == 1.0
    with pytest.raises(ValueError, match="ZeRO stage is 3 on the command line but 1 in the DeepSpeed config"):
        _gptneo_arguments(["--strategy", "deepspeed", "--ds-config", path, "--zero-stage", "3"])
    with pytest.raises(ValueError, match="gradient clipping is 1.0 on the command line but 0.5 in the DeepSpeed config"):
        _gptneo_arguments(["--strategy", "deepspeed", "--ds-config", path, "--max-grad-norm", "1"])


def test_gptneo_help_states_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        gptneo_imdb.parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "the --ds-config's stage, else 2)" in said
    assert "gradient_clipping under deepspeed, else 1.0" in said


def test_an_auto_in_the_users_config_is_the_scripts_to_fill(monkeypatch, ds_config):
    """The HF Trainer's configs say "auto" for what the script fills in: "gradient_clipping": "auto" takes the
    script's clipping (gptneo: the Trainer's 1.0, or --max-grad-norm; vit: the course's 1.0), never refused."""
    path = ds_config('{"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}')
    arguments = _gptneo_arguments(["--strategy", "deepspeed", "--ds-config", path])
    assert arguments["deepspeed"]["gradient_clipping"] == arguments["max_grad_norm"] == 1.0
    typed = _gptneo_arguments(["--strategy", "deepspeed", "--ds-config", path, "--max-grad-norm", "0.3"])
    assert typed["deepspeed"]["gradient_clipping"] == typed["max_grad_norm"] == 0.3
    vit_path = ds_config(COURSE_HJSON.replace('"gradient_clipping": 1.0', '"gradient_clipping": "auto"'))
    assert _vit_config(monkeypatch, ["--strategy", "deepspeed", "--ds-config", vit_path])["gradient_clipping"] == 1.0
