"""The dogs-vs-cats example refuses, before any training, options its two phases cannot both honour."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dogs_vs_cats", ROOT / "examples" / "dogs_vs_cats.py")
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)


def test_fused_on_is_refused_up_front_when_fine_tuning_would_need_rmsprop(capsys):
    with pytest.raises(SystemExit) as stopped:
        ex.parse_args(["--fused", "on"])
    assert stopped.value.code == 2 and "fine-tuning uses RMSprop, which has no fused kernel" in capsys.readouterr().err
    assert ex.parse_args(["--fused", "on", "--finetune-epochs", "0"]).fused == "on"
    assert ex.parse_args(["--fused", "off", "--loader-workers", "0", "--pin-memory", "off"]).loader_workers == 0
