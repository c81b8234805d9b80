"""The scaling report: formatted numbers, report.md, a self-contained escaped report.html, valid PNG plots."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import pytest

from gpuscale.study.numbers import three_figures
from gpuscale.study.plots import plot_paths, utilisation_plot
from gpuscale.study.report import DASH, format_markdown, format_table, render_html, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _timeline(world: int, busy: float) -> dict:
    t = [0.5 * i - 1.0 for i in range(20)]  # t < 0: sampled before training started
    return {"version": 1, "interval_s": 0.5, "started": 1_700_000_000.0, "series": [
        {"rank": r, "host": "h", "device": "cpu", "name": "cpu", "source": "proc", "t": t,
         "util_pct": [min(100.0, busy + 3 * r + (i % 4)) for i in range(len(t))],
         "mem_bytes": [2**30] * len(t), "power_w": [None] * len(t)} for r in range(world)]}


def make_results(study: Path) -> dict:
    """Two scalings x 1, 2, 4 processes, as analysis.analyse would write them, timelines on disk."""
    rows = []
    for scaling in ("strong", "weak"):
        for world, sps, time_s in ((1, 101.25, 40.0), (2, 190.04, 21.5), (4, 351.66, 12.25)):
            name = f"{scaling}-1x{world}"
            batch = 32 * world if scaling == "weak" else 64
            (study / name).mkdir(parents=True)
            (study / name / "timeline.json").write_text(json.dumps(_timeline(world, 60 + 5 * world)))
            speedup = sps / 101.25
            efficiency = speedup / world
            lost = 1 - efficiency
            breakdown = {"data": 0.0, "exposed_comm": 0.0, "imbalance": 0.0, "compute": 0.0, "rest": 0.0} if world == 1 else \
                {"data": 0.01, "exposed_comm": lost / 2, "imbalance": 0.02, "compute": -0.01, "rest": lost / 2 - 0.02}
            rows.append({
                "name": name, "scaling": scaling, "nodes": 1, "nproc_per_node": world, "world_size": world,
                "global_batch": batch, "per_device_batch": batch // world, "grad_accum_steps": 1, "epochs": 2, "steps": 125,
                "samples": 4000, "samples_per_s": sps, "train_time_s": time_s, "time_to_result_s": time_s + 2.0,
                "step_time_s": time_s / 125,
                "time_split_s": {"startup": 2.0, "data_wait": 0.5 * world, "compute": time_s - 1.5 - 0.5 * world - 0.2 * (world - 1),
                                 "exposed_comm": 0.2 * (world - 1), "imbalance": 0.0, "eval": 1.0, "checkpoint": 0.5, "probe": 0.0},
                "ideal_samples_per_s": 101.25 * world, "speedup": speedup, "efficiency": efficiency,
                "cost_ratio": 1 / efficiency, "device_hours_per_m_samples": world * 1e6 / sps / 3600,
                "time_speedup": 42.0 / (time_s + 2.0), "loss_breakdown": breakdown,
                "predicted_breakdown": None if world == 1 else {"data": None, "exposed_comm": 0.03, "imbalance": None,
                                                                "compute": 0.0, "rest": None},
                "sync_probe": {"status": "measured", "why": None, "probes": 11},
                "metric": "accuracy", "metric_value": 0.9 + 0.01 * world, "final_loss": 0.2,
                "lr": {"rule": "linear", "factor": world if scaling == "weak" else 1.0},
                "predicted_samples_per_s": 101.25 * world * 0.97, "predicted_efficiency": 0.97,
                "utilisation": {"mean_util_pct": 70.0}, "timeline": f"{name}/timeline.json",
                "flags": [f"rank 1 (cpu) used 12% of its cores while rank 0 used 95% ({scaling})"] if world == 4 else [],
            })
    return {"version": 2, "command": ["python", "examples/dogs_vs_cats.py", "--epochs", "2"], "launcher": "local",
            "device": "cpu", "device_name": "cpu", "created": "2026-11-21T08:00:00+00:00", "rows": rows,
            "baseline": {"weak": "weak-1x1", "strong": "strong-1x1"},
            "prediction": {"link": {"intra_bandwidth": 12.5e9, "intra_latency": 2e-05, "source": "measured (gloo, 2 processes)"},
                           "overlap": 0.5, "gradient_bytes": 4_000_000,
                           "cells": [{"name": f"weak-1x{w}", "world_size": w, "nodes": 1, "per_device_batch": 32,
                                      "compute_s": 0.1, "comm_s": 0.003 * (w - 1), "exposed_comm_s": 0.003 * (w - 1),
                                      "step_time_s": 0.1 + 0.003 * (w - 1), "samples_per_s": 101.25 * w * 0.97,
                                      "efficiency": 0.97} for w in (1, 2, 4)],
                           "comm_dominates_below_batch": {"1x2": 12, "1x4": 18.5}, "batch_sweet_spot": 256}}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def study(tmp_path: Path) -> tuple[Path, dict]:
    return tmp_path, make_results(tmp_path)


def test_write_report_writes_markdown_html_and_valid_pngs(study):
    study_dir, results = study
    files = write_report(results, study_dir)
    compared = [r["name"] for r in results["rows"] if r["name"] not in results["baseline"].values()]
    expected_plots = {"plots/throughput.png", "plots/efficiency.png", "plots/cost.png", "plots/time_breakdown.png",
                      *(f"plots/waterfall-{name}.png" for name in compared),  # one legible waterfall per run
                      *(f"plots/utilisation-{r['name']}.png" for r in results["rows"])}
    assert set(files) == {"report.md", "report.html", *expected_plots}
    for rel, path in files.items():
        assert path == study_dir / rel and path.is_file() and path.stat().st_size > 0
    for rel in expected_plots:
        width, height = png_size(files[rel])
        assert 300 <= width <= 3000 and 200 <= height <= 3000, (rel, width, height)
        assert files[rel].stat().st_size > 5000, f"{rel} looks empty"
    width, _ = png_size(files["plots/throughput.png"])
    assert width > png_size(files["plots/efficiency.png"])[0], "two scalings: two throughput panels"


def test_markdown_holds_every_rows_formatted_numbers(study):
    study_dir, results = study
    write_report(results, study_dir)
    md = (study_dir / "report.md").read_text()
    for row in results["rows"]:
        line = next(line for line in md.splitlines() if line.startswith(f"| {row['name']} |") and "x" in line)
        assert f"| {three_figures(row['samples_per_s'])} |" in line
        assert f"| {row['time_to_result_s']:.1f}s |" in line and f"| {row['time_speedup']:.2f}x |" in line
        assert f"| {row['speedup']:.2f}x |" in line
        assert f"| {round(100 * row['efficiency'])}% |" in line
        assert f"| {row['metric_value']:.3f} |" in line
        assert f"| {row['nodes']}x{row['nproc_per_node']} ({row['world_size']}) |" in line
    assert "| accuracy |" in md.splitlines()[next(i for i, line in enumerate(md.splitlines()) if line == "## Runs") + 2]
    assert "python examples/dogs_vs_cats.py --epochs 2" in md
    assert "- **weak-1x4**: rank 1 (cpu) used 12%" in md
    assert "## Prediction" in md and "| batch sweet spot | 256 |" in md
    # a whole number of samples, units everywhere
    assert "| a step communicates longer than it computes below a per-device batch of | 1x2: 12 samples; 1x4: 19 samples |" in md
    assert "| interconnect | measured (gloo, 2 processes): within a node 12.5 GB/s per direction, 20 µs per ring step |" in md
    assert "| synchronised per optimizer step | 3.81 MiB of gradients |" in md
    assert "### Predicted runs" in md and "| weak-1x4 | 4 | 1 | 32 | 100 | 9 | 9 | 109 | 393 | 97% |" in md
    # why not more: each part in % of ideal, the prediction beside the one it models
    weak4 = next(r for r in results["rows"] if r["name"] == "weak-1x4")
    half, rest = round(100 * (1 - weak4["efficiency"]) / 2), round(100 * weak4["loss_breakdown"]["rest"])
    assert f"| weak-1x4 | 1% | {half}% (pred. 3%) | 2% | — | -1% (pred. 0%) | {rest}% | 13% |" in md
    assert f"- **weak-1x4**: 87% of an ideal 405 samples/s; lost 13%: data 1%, exposed communication {half}% (predicted 3%)" in md
    # startup 2.0 s of strong-1x1's 41.5 s
    assert re.search(r"^\| strong-1x1 \| 2\.0s \(5%\) \|", md, re.M)
    for rel in plot_paths(results).values():
        assert f"]({rel})" in md and (study_dir / rel).is_file()


@pytest.mark.parametrize("value, text", [(1479.31, "1480"), (351.7, "352"), (12.345, "12.3"), (0.01234, "0.0123"),
                                         (999.6, "1000"), (99.96, "100"), (5, "5.00"), (123456.7, "123000")])
def test_throughput_is_written_to_three_significant_figures(value, text):
    assert three_figures(value) == text


def test_format_table_is_deterministic_aligned_and_lists_flags(study):
    _, results = study
    text = format_table(results)
    assert text == format_table(json.loads(json.dumps(results)))
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["run", "scaling"] and "accuracy" in lines[0] and "predicted efficiency" in lines[0]
    assert "train samples/s" in lines[0] and "time to result" in lines[0] and "lr rule" in lines[0]
    body = lines[2:2 + len(results["rows"])]
    assert [line.split()[0] for line in body] == [r["name"] for r in results["rows"]]
    assert len(lines[1]) == max(len(line) for line in lines[:2 + len(results["rows"])]), "the rule spans the table"
    weak4 = next(line for line in body if line.startswith("weak-1x4"))
    assert " 352 " in weak4 and "14.2s" in weak4 and "3.47x" in weak4 and "87%" in weak4 and "0.940" in weak4
    assert "linear x4" in weak4
    assert "  strong-1x4: rank 1 (cpu) used 12%" in text and "  weak-1x4: rank 1" in text
    assert "  weak-1x4: 87% of an ideal 405 samples/s; lost 13%: data 1%, exposed communication 7% (predicted 3%), " \
           "imbalance 2%, jitter —, per-device compute -1% (predicted 0%), rest (unexplained) 5%" in text


def test_prediction_columns_only_when_a_row_has_one(study):
    _, results = study
    for row in results["rows"]:
        row["predicted_samples_per_s"] = row["predicted_efficiency"] = row["predicted_breakdown"] = None
    results["prediction"] = None
    text = format_table(results)
    assert "predicted" not in text
    md = format_markdown(results)
    assert "## Prediction" not in md and "predicted" not in md


def test_none_values_render_as_a_dash(study):
    study_dir, results = study
    row = results["rows"][1]
    for key in ("speedup", "efficiency", "metric_value", "metric", "predicted_samples_per_s",
                "predicted_efficiency", "utilisation", "timeline", "cost_ratio"):
        row[key] = None
    row["device_hours_per_m_samples"] = 1.234
    results["rows"][2]["timeline"] = "strong-1x4/missing.json"
    files = write_report(results, study_dir)
    line = next(line for line in format_table(results).splitlines() if line.startswith(row["name"]))
    assert line.count(DASH) == 5, line  # speed-up, efficiency, predicted efficiency, cost/sample, metric
    assert " 1.23 " in line  # device-h/1M samples
    assert "plots/utilisation-strong-1x2.png" not in files and "plots/utilisation-strong-1x4.png" not in files
    page = (study_dir / "report.html").read_text()
    for key in ("speedup", "efficiency", "metric_value", "predicted_efficiency"):
        assert f'data-key="{key}" data-row="{row["name"]}">{DASH}</td>' in page


def test_script_in_command_and_flags_is_escaped_in_html(study):
    study_dir, results = study
    results["command"] = ["python", "train.py", "--note", "<script>alert(1)</script>"]
    results["rows"][0]["flags"] = ['<img src=x onerror="alert(2)"> & friends']
    results["rows"][0]["name"] = 'strong-"1x1"'
    write_report(results, study_dir)
    page = (study_dir / "report.html").read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt; &amp; friends" in page
    assert 'data-row="strong-&quot;1x1&quot;"' in page


def test_html_is_self_contained(study):
    study_dir, results = study
    files = write_report(results, study_dir)
    page = files["report.html"].read_text()
    srcs = re.findall(r'<img src="([^"]*)"', page)
    assert len(srcs) == len(files) - 2
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_SIGNATURE
    assert not re.search(r"(href|src)=\"(?!data:|#)", page), "nothing is fetched (a link within the page fetches nothing)"
    assert "<link" not in page and "http://" not in page and "https://" not in page
    assert len(re.findall(r'<tr data-row=', page.split('id="runs"')[1].split("</table>")[0])) == len(results["rows"])


def test_empty_rows_are_a_value_error(tmp_path):
    results = make_results(tmp_path)
    results["rows"] = []
    for call in (lambda: format_table(results), lambda: format_markdown(results),
                 lambda: render_html(results, {}), lambda: write_report(results, tmp_path)):
        with pytest.raises(ValueError, match="no finished runs; run `gpuscale study` first"):
            call()
    assert not (tmp_path / "report.md").exists()


def test_utilisation_plot_skips_empty_series_and_missing_files(tmp_path):
    timeline = _timeline(2, 50)
    timeline["series"][0].update(t=[], util_pct=[])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "timeline.json").write_text(json.dumps(timeline))
    row = {"name": "run", "timeline": "run/timeline.json"}
    assert utilisation_plot(row, tmp_path, tmp_path / "one.png") == tmp_path / "one.png"
    timeline["series"][1].update(t=[], util_pct=[])
    (tmp_path / "run" / "timeline.json").write_text(json.dumps(timeline))
    assert utilisation_plot(row, tmp_path, tmp_path / "none.png") is None
    assert utilisation_plot({**row, "timeline": "run/absent.json"}, tmp_path, tmp_path / "x.png") is None
    (tmp_path / "run" / "timeline.json").write_text("{truncated")
    assert utilisation_plot(row, tmp_path, tmp_path / "x.png") is None
    assert not (tmp_path / "none.png").exists() and not (tmp_path / "x.png").exists()


def test_single_scaling_without_baseline_values(tmp_path):
    results = make_results(tmp_path)
    results["rows"] = [r for r in results["rows"] if r["scaling"] == "weak"]
    for row in results["rows"]:
        row["speedup"] = row["efficiency"] = None
    files = write_report(results, tmp_path)
    assert "plots/efficiency.png" not in files and "plots/throughput.png" in files
    assert "efficiency.png" not in files["report.md"].read_text()


def test_monitored_devices_get_a_utilisation_table(tmp_path):
    results = make_results(tmp_path)
    results["rows"][1]["utilisation"] = {"source": "nvml", "interval_s": 0.5, "devices": [
        {"rank": 0, "host": "n1", "device": "cuda:0", "name": "H100", "source": "nvml", "util_mean": 93.4,
         "util_max": 100.0, "mem_peak_bytes": 3 * 2**30, "power_mean_w": 611.6},
        {"rank": 1, "host": "n1", "device": "cuda:1", "name": "H100", "source": "nvml", "util_mean": 12.0,
         "util_max": 40.0, "mem_peak_bytes": None, "power_mean_w": None}]}
    markdown = format_markdown(results)
    assert "## Utilisation" in markdown
    assert "| strong-1x2 | 0 | cuda:0 | n1 | nvml | 93% | 100% | 3.00 GiB | 612 W |" in markdown
    assert f"| strong-1x2 | 1 | cuda:1 | n1 | nvml | 12% | 40% | {DASH} | {DASH} |" in markdown
    page = render_html(results, {})
    assert '<table id="utilisation">' in page and '>93%</td>' in page
    without = make_results(tmp_path / "other")
    assert "## Utilisation" not in format_markdown(without) and 'id="utilisation"' not in render_html(without, {})


def test_the_waterfall_labels_a_part_within_its_noise_as_the_table_does():
    """data -1% and imbalance 2% are within a noise of 3%: the table reads them "~0% (±3%)", and so does the bar."""
    from gpuscale.study.plot_runs import _waterfall_panel
    from gpuscale.study.plotting import pyplot

    row = {"name": "strong-1x2", "world_size": 2, "ideal_samples_per_s": 200.0, "efficiency": 0.8,
           "loss_breakdown": {"data": -0.01, "exposed_comm": 0.15, "imbalance": 0.02, "jitter": 0.0, "compute": 0.04, "rest": 0.0},
           "part_noise": dict.fromkeys(("data", "exposed_comm", "imbalance", "jitter", "compute", "rest"), 0.03)}
    fig, ax = pyplot().subplots()
    _waterfall_panel(ax, row)
    assert [t.get_text() for t in ax.texts] == ["~0%", "-15%", "~0%", "~0%", "-4%", "~0%", "80%"]
    pyplot().close(fig)


def test_each_page_points_to_its_own_prediction_section(study):
    """The answer's "Predicted, not run", the exposed-communication flag and the predicted column's basis name the
    model's section: report.html links its own heading, report.md its own; the terminal (no sections) names report.md's.
    It said "the model: report.md's Prediction" on the HTML page."""
    study_dir, results = study
    PREDICTION_SECTION = "report.md's Prediction"  # as results.json and the terminal name it
    results["answer"] = [f"Weak scaling to 4 processes: 3.51x the samples/s (87% of ideal). Predicted, not run (the model: "
                         f"{PREDICTION_SECTION}): 8 processes 7.8x (97% of ideal)."]
    results["rows"][2]["flags"] = [f"a faster interconnect ({PREDICTION_SECTION} models it)"]
    pointers = 3  # the answer, the flag, the predicted column's basis
    write_report(results, study_dir)
    page, md = (study_dir / "report.html").read_text(), (study_dir / "report.md").read_text()
    assert "report.md&#x27;s Prediction" not in page and "report.md's Prediction" not in page
    assert page.count('the <a href="#prediction-section">Prediction</a> section') == pointers
    assert page.count('<h2 id="prediction-section">Prediction</h2>') == 1
    assert "report.md's Prediction" not in md and md.count("the [Prediction](#prediction) section") == pointers
    assert "\n## Prediction\n" in md
    assert "(the model: the [Prediction](#prediction) section): 8 processes" in md
    assert format_table(results).count(PREDICTION_SECTION) >= 2  # the terminal points to the file
    # no prediction, no section: the page names the command that makes one rather than a link to nothing
    results["prediction"], results["answer"] = None, []
    for row in results["rows"]:
        row["predicted_samples_per_s"] = row["predicted_efficiency"] = row["predicted_breakdown"] = None
    write_report(results, study_dir)
    page = (study_dir / "report.html").read_text()
    assert "#prediction-section" not in page and "a faster interconnect (<code>gpuscale predict</code> models it)" in page
    assert "a faster interconnect (`gpuscale predict` models it)" in (study_dir / "report.md").read_text()
