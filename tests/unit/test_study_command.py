"""A study's script command per cell: templates, exact batches, gpuscale's options; StudySpec's checks."""

from __future__ import annotations

import pytest

from gpuscale.study import matrix
from gpuscale.study.command import StudyCommand, uses_gpuscale
from gpuscale.study.spec import StudySpec, plan_cells

FOREIGN = "import torch\n"


def _cells(nproc=(1, 2, 4), scalings=("weak", "strong")):
    return matrix.cells(list(nproc), [1], list(scalings))


def _argv(command, cells, name):
    cell = next(c for c in cells if c.name == name)
    return command.argv_for(cell, f"out/{name}", min(c.world_size for c in cells if c.scaling == cell.scaling))


def test_templates_are_filled_with_exact_batches_for_both_scalings():
    command = StudyCommand.for_script(["train.py", "--batch-size", "{per_device_batch}", "--dir={out}", "--n",
                                       "{world_size}x{nproc_per_node}/{nodes}", "--accum", "{grad_accum_steps}",
                                       "--config", '{"gb": 1}'], FOREIGN, global_batch=64)
    cells = _cells()
    assert not command.appends_cell_options
    # strong keeps 64: 64, 32, 16 per device; weak keeps the baseline's share (64 on 1 device)
    assert _argv(command, cells, "strong-1x4")[:4] == ["train.py", "--batch-size", "16", "--dir=out/strong-1x4"]
    assert _argv(command, cells, "weak-1x4")[2] == "64"
    assert _argv(command, cells, "weak-1x2")[5] == "2x2/1"
    assert _argv(command, cells, "weak-1x2")[-1] == '{"gb": 1}'  # braces that are no template stay


def test_per_device_batch_and_accumulation():
    command = StudyCommand.for_script(["t.py", "-b", "{per_device_batch}", "-g", "{global_batch}", "-a", "{grad_accum_steps}"],
                                      FOREIGN, per_device_batch=48, max_device_batch=16)
    cells = _cells((1, 2))
    # weak keeps 48 per device: 3 passes of 16; strong keeps the baseline's 48 in all: 24 per device, 2 passes of 12
    assert _argv(command, cells, "weak-1x2") == ["t.py", "-b", "16", "-g", "96", "-a", "3"]
    assert _argv(command, cells, "strong-1x2") == ["t.py", "-b", "12", "-g", "48", "-a", "2"]


def test_a_global_batch_that_does_not_divide_is_refused_with_choices_that_fit_every_cell():
    command = StudyCommand.for_script(["t.py", "{per_device_batch}"], FOREIGN, global_batch=60)
    with pytest.raises(ValueError, match=r"--global-batch 60 does not divide among the 8 devices of strong-1x8; use 56 or 64"):
        command.check_cells(_cells((1, 2, 4, 8)))
    with pytest.raises(ValueError, match=r"use 36 or 48 \(multiples of 12"):
        StudyCommand.for_script(["t.py", "{global_batch}"], FOREIGN, global_batch=40).check_cells(_cells((1, 3, 4), ("strong",)))
    with pytest.raises(ValueError, match="weak scaling's baseline"):
        StudyCommand.for_script(["t.py", "{per_device_batch}"], FOREIGN, global_batch=5).check_cells(matrix.cells([2, 4], [1], ["weak"]))


def test_bad_templates_and_missing_batches_are_refused():
    with pytest.raises(ValueError, match=r"unknown template \{per_device_batc\}"):
        StudyCommand.for_script(["t.py", "{per_device_batc}"], FOREIGN)
    with pytest.raises(ValueError, match="--global-batch N"):
        StudyCommand.for_script(["t.py", "--bs", "{per_device_batch}"], FOREIGN)
    with pytest.raises(ValueError, match="--global-batch 0 must be a positive"):
        StudyCommand.for_script(["t.py"], FOREIGN, global_batch=0)


def test_gpuscale_scripts_get_scaling_and_out_unless_they_use_templates():
    assert uses_gpuscale("import gpuscale\n") and uses_gpuscale("from gpuscale.runtime.data import plan_batch\n")
    assert not uses_gpuscale("import gpuscale_other\nimport torch\n") and not uses_gpuscale("def broken(:\n")
    cells = _cells((1,))
    plain = StudyCommand.for_script(["ex.py", "--epochs", "2"], "import gpuscale\n")
    assert _argv(plain, cells, "weak-1x1") == ["ex.py", "--epochs", "2", "--scaling", "weak", "--out", "out/weak-1x1"]
    templated = StudyCommand.for_script(["ex.py", "--scaling", "{scaling}", "--out", "{out}"], "import gpuscale\n")
    assert _argv(templated, cells, "strong-1x1") == ["ex.py", "--scaling", "strong", "--out", "out/strong-1x1"]
    foreign = StudyCommand.for_script(["t.py", "--out", "x"], FOREIGN)  # its own --out is its business
    assert _argv(foreign, cells, "weak-1x1") == ["t.py", "--out", "x"]
    with pytest.raises(ValueError, match="leave --out and --scaling out"):
        StudyCommand.for_script(["ex.py", "--out", "x"], "import gpuscale\n")


def test_study_spec_checks_before_anything_runs(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(FOREIGN)
    spec = StudySpec(command=(str(script), "{per_device_batch}"), out=tmp_path / "s", nproc=(1, 2), global_batch=64)
    assert [c.name for c in plan_cells(spec, 2)] == ["weak-1x1", "weak-1x2", "strong-1x1", "strong-1x2"]
    assert spec.out == tmp_path / "s" and isinstance(spec.command, tuple)
    with pytest.raises(ValueError, match="does not exist"):
        StudySpec(command=("missing.py",), out=tmp_path)
    with pytest.raises(ValueError, match="needs --profile"):
        StudySpec(command=(str(script),), out=tmp_path, launcher="slurm")
    with pytest.raises(ValueError, match="needs --launcher slurm"):
        StudySpec(command=(str(script),), out=tmp_path, nodes=(1, 2))
    with pytest.raises(ValueError, match="use 60 or 66"):
        plan_cells(StudySpec(command=(str(script), "{global_batch}"), out=tmp_path, nproc=(1, 2, 3), global_batch=64), 3)
    with pytest.raises(ValueError, match="unknown template"):
        StudySpec(command=(str(script),), out=tmp_path, variants=(("v", ("{bogus}",)),))


@pytest.mark.parametrize("source", [FOREIGN, "import gpuscale\n"])
def test_a_batch_the_script_would_never_see_is_refused(tmp_path, source):
    """The study passes its batch only through a batch template: without one, a plain script (probe-measured) and a
    gpuscale script (given --scaling and --out) alike train their own batch, and --global-batch 64 would be a number no
    run used. Each cell's command counts: the script's arguments with each variant's."""
    script = tmp_path / "t.py"
    script.write_text(source)
    for batch in ({"global_batch": 64}, {"per_device_batch": 16}, {"max_device_batch": 8}):
        option = next(iter(batch)).replace("_", "-")
        with pytest.raises(ValueError, match=rf"^--{option} \d+ reaches the script only through a batch template, and the "
                                             rf"script's arguments hold none: .* or leave --{option} out"):
            StudySpec(command=(str(script), "--batch-size", "32"), out=tmp_path / "s", **batch)
    # a variant without one, beside another that has one: the first cell's command would drop the batch
    variants = (("big", ("--batch-size", "{per_device_batch}")), ("small", ("--layers", "2")))
    with pytest.raises(ValueError, match="variant 'small'"):
        StudySpec(command=(str(script),), out=tmp_path / "s", variants=variants, global_batch=64)
    StudySpec(command=(str(script), "--batch-size", "{per_device_batch}"), out=tmp_path / "s", variants=variants, global_batch=64)
    StudySpec(command=(str(script), "--batch-size", "32"), out=tmp_path / "s")  # no batch asked: the script's own
    with pytest.raises(ValueError, match="reaches the script only through a batch template"):  # passes, not the batch
        StudySpec(command=(str(script), "--accum", "{grad_accum_steps}"), out=tmp_path / "s", global_batch=64)
