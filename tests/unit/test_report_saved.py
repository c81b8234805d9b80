"""What a study saved stays the study's: its date, and the prediction a report puts beside its runs, from the
library's `write_report(analyse(d), d)` as from `gpuscale report d`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuscale.study import analysis, predict, runner
from gpuscale.study.matrix import Cell
from gpuscale.study.report import write_report

STUDY_DATE = "2026-01-02T21:50:17+00:00"
CELLS = [Cell("weak", 1, 1), Cell("weak", 1, 2)]


def _summary(world: int, samples_per_s: float) -> dict:
    return {"world_size": world, "scaling": "weak", "samples_per_s": samples_per_s, "train_time_s": 10.0, "epochs": 1,
            "global_batch": 32 * world, "per_device_batch": 32, "steps": 10, "samples": 320 * world, "step_time_s": 0.1,
            "gradient_bytes": 4_000_000, "grad_accum_steps": 1, "device": "cpu", "device_name": "cpu",
            "time_split_s": {"startup": 1.0, "data_wait": 0.0, "compute": 10.0}}


def _study(out: Path, **record) -> Path:
    """A finished study of 1 and 2 processes (320 and 500 samples/s) as `gpuscale study` leaves it, before its results."""
    runner.record_study(out, ["train.py"], "local", CELLS, **record)
    for cell, rate in zip(CELLS, (320.0, 500.0), strict=True):
        (out / cell.name).mkdir()
        (out / cell.name / "summary.json").write_text(json.dumps(_summary(cell.world_size, rate)))
    return out


def _dated(out: Path, created: str | None) -> None:
    """study.json with `created` as its date (None: one written before study.json kept a date)."""
    study = json.loads((out / "study.json").read_text())
    study.pop("created", None)
    (out / "study.json").write_text(json.dumps({**study, **({"created": created} if created else {})}))


def _prediction(out: Path) -> dict:
    link = predict.Link(intra_bandwidth=1e9, intra_latency=1e-4, source="measured (gloo, 2 processes)")
    summaries = {c.name: json.loads((out / c.name / "summary.json").read_text()) for c in CELLS}
    prediction = predict.predict_study(CELLS, summaries, link, 0.0)
    assert prediction is not None
    return prediction


def test_a_report_keeps_the_studys_date_and_writes_its_own_beside_it(tmp_path, capsys):
    """The study was made at 21:50:17; `gpuscale report` a minute later wrote 21:51:18 over it, in results.json and
    report.md. The study's date is study.json's; the report's is a line of its own."""
    from gpuscale.cli import main

    out = _study(tmp_path / "study")
    _dated(out, STUDY_DATE)
    for _ in range(2):
        assert main(["report", str(out)]) == 0
    capsys.readouterr()
    saved = json.loads((out / "results.json").read_text())
    assert saved["created"] == STUDY_DATE and saved["report_written"] != STUDY_DATE
    md = (out / "report.md").read_text()
    assert f"- created: {STUDY_DATE}\n" in md and f"- report written: {saved['report_written']}\n" in md
    assert f'<dd data-key="created">{STUDY_DATE}</dd>' in (out / "report.html").read_text()
    assert json.loads((out / "study.json").read_text())["created"] == STUDY_DATE  # a report does not touch it


def test_the_study_keeps_its_first_date_on_a_rerun_and_an_older_study_its_results_date(tmp_path):
    out = _study(tmp_path / "study")
    _dated(out, STUDY_DATE)
    runner.record_study(out, ["train.py"], "local", [*CELLS, Cell("weak", 1, 4)])  # resumed with a cell more
    assert json.loads((out / "study.json").read_text())["created"] == STUDY_DATE
    # a study.json from before it kept a date: results.json's (the study's own analysis) is the study's date
    _dated(out, None)
    (out / "results.json").write_text(json.dumps({"created": STUDY_DATE, "prediction": None}))
    assert analysis.analyse(out)["created"] == STUDY_DATE
    runner.record_study(out, ["train.py"], "local", CELLS)
    assert json.loads((out / "study.json").read_text())["created"] == STUDY_DATE


def test_the_library_report_carries_the_studys_saved_prediction_as_the_cli_does(tmp_path, capsys):
    """docs/api.md: `gpuscale report` is `analyse` then `write_report`. The study saved its prediction in results.json;
    `write_report(analyse(d), d)` lost it (no "## Prediction", no predicted column) where the CLI kept it."""
    from gpuscale.cli import main

    out = _study(tmp_path / "study", target_efficiency=0.9)
    saved = {"created": STUDY_DATE, "prediction": _prediction(out)}
    (out / "results.json").write_text(json.dumps(saved))
    results = analysis.analyse(out)
    assert results["prediction"] == saved["prediction"]
    two = next(row for row in results["rows"] if row["name"] == "weak-1x2")
    predicted = next(cell for cell in saved["prediction"]["cells"] if cell["name"] == "weak-1x2")
    assert two["predicted_efficiency"] == pytest.approx(predicted["efficiency"])
    assert results["target_efficiency"] == results["study_target_efficiency"] == 0.9  # the study's own target too
    library = write_report(results, out)["report.md"].read_text()
    assert "\n## Prediction\n" in library and "predicted" in library.split("## Runs")[1].split("\n\n")[1]
    assert main(["report", str(out)]) == 0
    capsys.readouterr()
    cli = (out / "report.md").read_text()

    def undated(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("- report written: ")]

    assert undated(cli) == undated(library)
    # a prediction asked away is away; a damaged results.json is refused with the fix, by the library as by the CLI
    assert analysis.analyse(out, prediction=None)["prediction"] is None
    (out / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"results.json is damaged; delete it and run `gpuscale report .*` again"):
        analysis.analyse(out)
    assert main(["report", str(out)]) == 2
    assert "results.json is damaged" in capsys.readouterr().err
