"""Verbs that neither train nor measure load no torch: each runs in a fresh interpreter, does its real work
on real input, and the modules it left behind are checked. (How fast they answer is a benchmark:
`python -m bench cli_start`, BENCHMARKS.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs `gpuscale ARGV` in this interpreter, then prints which heavy modules it imported, after the verb's output.
PROBE = textwrap.dedent("""
    import json, sys
    from gpuscale.cli import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    print("\\nLOADED " + json.dumps(sorted(m for m in ("torch", "numpy", "matplotlib", "transformers") if m in sys.modules)))
    sys.exit(code)
""")


def run_verb(cwd: Path, *argv: str) -> tuple[int, str, list[str]]:
    result = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)
    output, _, loaded = result.stdout.rpartition("\nLOADED ")
    return result.returncode, output + result.stderr, json.loads(loaded)


def _study(folder: Path) -> Path:
    """A finished two-cell study, written as `gpuscale study` writes one."""
    from gpuscale.study import runner
    from gpuscale.study.matrix import Cell

    cells = [Cell("weak", 1, 1), Cell("weak", 1, 2)]
    runner.record_study(folder, ["train.py"], "local", cells)
    for cell, samples_per_s in zip(cells, (100.0, 180.0), strict=True):
        (folder / cell.name).mkdir()
        (folder / cell.name / "summary.json").write_text(json.dumps({
            "world_size": cell.world_size, "scaling": "weak", "samples_per_s": samples_per_s, "train_time_s": 10.0,
            "epochs": 1, "global_batch": 32 * cell.world_size, "per_device_batch": 32, "grad_accum_steps": 1, "steps": 10,
            "samples": 320 * cell.world_size, "step_time_s": 0.32, "gradient_bytes": 4_000_000, "device": "cpu",
            "strategy": "ddp"}))
    return folder


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("light")
    (folder / "train.py").write_text("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
                                     "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
                                     "print('loss', 1.0)\n")
    _study(folder / "study")
    return folder


VERBS = {
    "help": (["--help"], "usage: gpuscale"),
    "lint": (["lint", "train.py"], "GS"),
    "lint --help": (["lint", "--help"], "usage: gpuscale lint"),
    "slurm script": (["slurm", "script", "--profile", "lumi-g", "--account", "project_1", "--container", "/x/lumi-pytorch-rocm.sif",
                      "--", "train.py"], "#SBATCH"),
    "slurm --help": (["slurm", "--help"], "ACTION"),
    "profiles": (["profiles"], "lumi-g"),
    "profiles lumi-g": (["profiles", "lumi-g"], "MI250X"),
    "report --no-files": (["report", "study", "--no-files"], "weak-1x2"),
    "predict": (["predict", "study/weak-1x1", "--profile", "lumi-g", "--nproc", "1,8", "--nodes", "1,2",
                             "--step-time", "0.1"], "2x8"),
    "a typo": (["lnit", "train.py"], "invalid choice: 'lnit'"),
}


@pytest.mark.parametrize("name", VERBS)
def test_a_verb_that_does_not_train_loads_no_torch(workdir, name):
    argv, expected = VERBS[name]
    code, output, loaded = run_verb(workdir, *argv)
    assert expected in output, output[-2000:]
    assert code in (0, 1, 2) and "Traceback" not in output, output[-2000:]
    assert loaded == [], f"gpuscale {' '.join(argv)} imported {loaded}"


def test_writing_a_report_draws_its_plots_without_torch(workdir):
    code, output, loaded = run_verb(workdir, "report", "study")
    assert code == 0, output[-2000:]
    assert (workdir / "study" / "report.html").is_file() and list((workdir / "study" / "plots").glob("*.png"))
    assert "torch" not in loaded and "matplotlib" in loaded  # matplotlib only because it drew


def test_a_verb_that_trains_still_finds_its_options(workdir):
    """Only the verb typed is built in full; every other verb's options still parse when it is the one typed."""
    from gpuscale.cli import build_parser, verb_in

    assert verb_in(["--version"]) is None and verb_in(["run", "--nproc-per-node", "2", "x.py"]) == "run"
    assert build_parser("run").parse_args(["run", "--nproc-per-node", "2", "x.py"]).nproc_per_node == "2"
    everything = build_parser()
    for verb in ("demo", "run", "env", "doctor", "study", "report", "predict", "slurm", "profiles", "consolidate", "lint"):
        assert everything._subparsers._group_actions[0].choices[verb].format_help()  # every verb's full parser builds


def test_a_reader_that_leaves_early_ends_the_verb_quietly():
    """`gpuscale profiles --raw | true`: no "error: [Errno 32] Broken pipe", no traceback; the exit status a Unix tool
    that SIGPIPE ends has (128 + 13). The reader is gone before the verb writes (closed at once: no race)."""
    verb = subprocess.Popen([sys.executable, "-m", "gpuscale", "profiles", "--raw"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert verb.stdout is not None and verb.stderr is not None
    verb.stdout.close()
    said = verb.stderr.read().decode()
    assert verb.wait(timeout=60) == 141 and said == "", said


def test_the_demo_takes_the_repeat_its_answers_recommend(monkeypatch, tmp_path):
    """The study's answers say "--repeat 3" after a demo too: the demo passes it to its study."""
    from gpuscale.cli import demo, main

    specs = []
    monkeypatch.setattr(demo, "run_study", lambda spec: specs.append(spec) or type("R", (), {"failed": []})())
    assert main(["demo", "--repeat", "3", "--out", str(tmp_path / "d")]) == 0
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    assert [spec.repeat for spec in specs] == [3, 1]


def test_a_what_if_target_of_the_report_does_not_become_the_studys(tmp_path, capsys):
    """The study ran with 0.8; `report --target-efficiency 0.6` answers for 60% once; a plain report is back at 80%.
    90% efficiency at 2 processes (180 / (2 x 100)): above both targets, so the run is recommended in both cases."""
    from gpuscale.cli import main

    study = _study(tmp_path / "study")
    (study / "results.json").write_text(json.dumps({"study_target_efficiency": 0.8, "target_efficiency": 0.8}))
    targets = []
    for argv in (["--target-efficiency", "0.6"], []):
        assert main(["report", str(study), *argv]) == 0
        capsys.readouterr()
        saved = json.loads((study / "results.json").read_text())
        targets.append((saved["target_efficiency"], saved["study_target_efficiency"]))
    assert targets == [(0.6, 0.8), (0.8, 0.8)]
    # results.json deleted (as the damaged-file error asks): the study's own target comes from study.json, which the
    # study writes it into
    from gpuscale.study import runner
    from gpuscale.study.matrix import Cell

    runner.record_study(study, ["train.py"], "local", [Cell("weak", 1, 1), Cell("weak", 1, 2)], target_efficiency=0.8)
    (study / "results.json").unlink()
    assert main(["report", str(study), "--target-efficiency", "0.6"]) == 0
    assert main(["report", str(study)]) == 0
    capsys.readouterr()
    assert json.loads((study / "results.json").read_text())["target_efficiency"] == 0.8


def test_an_unknown_option_points_to_its_verbs_help_and_a_near_profile_is_named(capsys):
    from gpuscale.cli import main

    for argv, said in ((["demo", "--bogus"], "gpuscale demo: error: unrecognized arguments: --bogus (see 'gpuscale demo --help')"),
                       (["--bogus"], "gpuscale: error: unrecognized arguments: --bogus (see 'gpuscale --help')"),
                       (["slurm", "status", "1", "--bogus"],
                        "gpuscale slurm status: error: unrecognized arguments: --bogus (see 'gpuscale slurm status --help')")):
        with pytest.raises(SystemExit) as ended:
            main(argv)
        assert ended.value.code == 2 and capsys.readouterr().err.strip() == said
    assert main(["slurm", "script", "--profile", "local", "--", "no-such-train.py"]) == 2  # an error of the action's own
    assert capsys.readouterr().err.startswith("gpuscale slurm script: error: script 'no-such-train.py' does not exist")
    assert main(["profiles", "lumi"]) == 2
    assert "unknown profile 'lumi'; did you mean lumi-g? available:" in capsys.readouterr().err
