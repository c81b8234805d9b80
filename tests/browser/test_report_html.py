"""report.html in a real headless Chromium: it renders, every plot loads, the numbers match results.json."""

from __future__ import annotations

import io
import json
import math
import shlex
import struct
from pathlib import Path

import pytest

from gpuscale.study.report import write_report

pytestmark = pytest.mark.browser

DASH = "\u2014"


def _timeline(world: int) -> dict:
    t = [0.5 * i for i in range(30)]
    return {"version": 1, "interval_s": 0.5, "started": 1_700_000_000.0, "series": [
        {"rank": r, "host": "n1", "device": f"cuda:{r}", "name": "NVIDIA H100", "source": "nvml", "t": t,
         "util_pct": [90.0 - 10 * r + (i % 3) for i in range(len(t))], "mem_bytes": [40 * 2**30] * len(t),
         "power_w": [None if i % 7 == 0 else 500.0 for i in range(len(t))]} for r in range(world)]}


def _study(directory: Path) -> dict:
    """A CUDA study: weak and strong at 1, 2, 4 GPUs; one run without a baseline, one without a timeline."""
    rows = []
    for scaling in ("strong", "weak"):
        for world in (1, 2, 4):
            name = f"{scaling}-1x{world}"
            sps, time_s = 812.37 * world ** 0.93, 120.04 / world ** (0.93 if scaling == "weak" else 0.85)
            timeline = None
            if name != "weak-1x2":
                (directory / name).mkdir(parents=True)
                (directory / name / "timeline.json").write_text(json.dumps(_timeline(world)))
                timeline = f"{name}/timeline.json"
            rows.append({
                "name": name, "scaling": scaling, "nodes": 1, "nproc_per_node": world, "world_size": world,
                "global_batch": 256 * world if scaling == "weak" else 256, "per_device_batch": 256 if scaling == "weak"
                else 256 // world, "epochs": 3, "steps": 300, "samples": 76800, "samples_per_s": sps,
                "train_time_s": time_s, "step_time_s": time_s / 300, "time_to_result_s": time_s + 9.5,
                "time_speedup": (120.04 + 9.5) / (time_s + 9.5), "ideal_samples_per_s": 812.37 * world,
                "time_split_s": {"startup": 9.5, "data_wait": 1.25, "compute": time_s - 4.5, "exposed_comm": 0.5, "imbalance": None,
                                 "eval": 2.0, "checkpoint": 0.75, "probe": 0.0},
                "loss_breakdown": {"data": 0.004 * world, "exposed_comm": 0.03 * (world - 1), "imbalance": None,
                                   "compute": -0.002 * world, "rest": 1 - world ** -0.07 - 0.002 * world - 0.03 * (world - 1)},
                "predicted_breakdown": {"data": None, "exposed_comm": 0.05, "imbalance": None, "compute": 0.0, "rest": None},
                "sync_probe": {"status": "not measured", "why": "<b>fsdp</b>: cannot"},
                "speedup": world ** 0.93, "efficiency": world ** -0.07, "metric": "perplexity",
                "metric_value": 23.456 - world, "final_loss": 3.1, "predicted_samples_per_s": 812.37 * world * 0.95,
                "predicted_efficiency": 0.95, "utilisation": None, "timeline": timeline,
                "flags": ["<script>alert('flag')</script> data wait is 8% of the run"] if world == 4 else [],
                "device_hours_per_m_samples": world * 1e6 / sps / 3600, "cost_ratio": world ** 0.07,
            })
    strong2 = rows[1]
    strong2.update(speedup=None, efficiency=None, metric_value=None, predicted_samples_per_s=None,
                   predicted_efficiency=None, loss_breakdown=None, time_speedup=None, cost_ratio=None)
    return {"version": 2, "command": ["torchrun", "train.py", "--tag", "<script>alert('cmd')</script>"],
            "launcher": "slurm", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
            "created": "2026-11-21T08:00:00+00:00", "rows": rows,
            "baseline": {"weak": "weak-1x1", "strong": "strong-1x1"},
            "prediction": {"batch_sweet_spot": 1024, "comm_dominates_below_batch": {"1x2": 97, "1x4": 128},
                           "cells": [{"name": r["name"], "world_size": r["world_size"], "nodes": 1,
                                      "per_device_batch": r["per_device_batch"], "compute_s": 0.1, "comm_s": 0.0052,
                                      "exposed_comm_s": 0.0052, "step_time_s": 0.1052,
                                      "samples_per_s": r["predicted_samples_per_s"], "efficiency": r["predicted_efficiency"]}
                                     for r in rows]}}


def _expected(row: dict) -> dict[str, str]:
    """The cell texts, formatted here from the JSON independently of gpuscale.study.report."""
    def maybe(value, fmt):
        return DASH if value is None else fmt(value)
    return {
        "name": row["name"], "scaling": row["scaling"],
        "layout": f"{row['nodes']}x{row['nproc_per_node']} ({row['world_size']})",
        "global_batch": str(row["global_batch"]), "per_device_batch": str(row["per_device_batch"]),
        "samples_per_s": _sig3(row["samples_per_s"]), "time_to_result_s": f"{row['time_to_result_s']:.1f}s",
        "speedup": maybe(row["speedup"], lambda v: f"{v:.2f}x"),
        "efficiency": maybe(row["efficiency"], lambda v: f"{round(v * 100)}%"),
        "time_speedup": maybe(row["time_speedup"], lambda v: f"{v:.2f}x"),
        "metric_value": maybe(row["metric_value"], lambda v: f"{v:.2f}"),  # perplexity: 2 decimals
        "predicted_efficiency": maybe(row["predicted_efficiency"], lambda v: f"{round(v * 100)}%"),
        "device_hours_per_m_samples": _sig3(row["device_hours_per_m_samples"]),
        "cost_ratio": maybe(row["cost_ratio"], lambda v: f"{v:.2f}x"),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict, dict]:
    directory = tmp_path_factory.mktemp("study")
    (directory / "results.json").write_text(json.dumps(_study(directory), indent=2))
    results = json.loads((directory / "results.json").read_text())
    files = write_report(results, directory)
    return directory, results, files


def _sig3(value: float) -> str:
    """Three significant figures, the report's way for throughput: %.3g's rounding, written without an exponent."""
    rounded = float(f"{value:.3g}")
    return f"{rounded:.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"


def test_report_renders_with_plots_and_the_json_numbers(page, report):
    directory, results, files = report
    html = files["report.html"]
    page.page.goto(html.as_uri(), wait_until="load")
    p = page.page

    assert p.title() == "gpuscale scaling report"
    assert p.locator("h1").inner_text() == "gpuscale scaling report" and p.locator("h1").is_visible()
    assert p.locator("#command").inner_text() == shlex.join(results["command"])

    plots = [rel for rel in files if rel.startswith("plots/")]
    # throughput, efficiency, cost, time; a waterfall for each of the 3 runs with a breakdown; 5 utilisation plots
    assert "plots/utilisation-weak-1x2.png" not in plots and len(plots) == 4 + 3 + 5
    images = p.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(images) == len(plots)
    assert all(complete and width > 0 and height > 0 for complete, width, height in images), images
    assert p.eval_on_selector_all("img", "imgs => imgs.every(i => i.src.startsWith('data:image/png;base64,'))")

    assert p.locator("#runs tbody tr").count() == len(results["rows"])
    headers = p.eval_on_selector_all("#runs thead th", "ths => ths.map(t => t.dataset.key)")
    assert "perplexity" in p.locator("#runs thead").inner_text()
    for row in results["rows"]:
        expected = _expected(row)
        assert set(headers) == set(expected)
        for key, text in expected.items():
            cell = p.locator(f'#runs td[data-row="{row["name"]}"][data-key="{key}"]')
            assert cell.count() == 1, (row["name"], key)
            assert cell.inner_text() == text, (row["name"], key)
        split = p.locator(f'#time-split td[data-row="{row["name"]}"][data-key="startup"]').inner_text()
        total = sum(v for v in row["time_split_s"].values() if v is not None)
        assert split == f"{row['time_split_s']['startup']:.1f}s ({round(100 * 9.5 / total)}%)"
        assert p.locator(f'#time-split td[data-row="{row["name"]}"][data-key="imbalance"]').inner_text() == DASH

    # why not more: every part of every run's loss, in % of ideal, the prediction beside the part it models
    shown = [r for r in results["rows"] if r["loss_breakdown"] and r["name"] not in results["baseline"].values()]
    assert p.locator("#breakdown tbody tr").count() == len(shown) == 3
    for row in shown:
        shares = row["loss_breakdown"]
        comm = p.locator(f'#breakdown td[data-row="{row["name"]}"][data-key="exposed_comm"]').inner_text()
        assert comm == f"{round(100 * shares['exposed_comm'])}% (pred. 5%)"
        assert p.locator(f'#breakdown td[data-row="{row["name"]}"][data-key="imbalance"]').inner_text() == DASH
        lost = p.locator(f'#breakdown td[data-row="{row["name"]}"][data-key="lost"]').inner_text()
        assert lost == f"{round(100 * (1 - row['efficiency']))}%"
        line = p.locator(f'#why li[data-row="{row["name"]}"]').inner_text()
        assert "(not measured: <b>fsdp</b>: cannot)" in line and f"of an ideal {_sig3(row['ideal_samples_per_s'])} samples/s;" in line
    for row in shown:  # one waterfall per run, titled with its name, at a readable size
        waterfall = p.locator(f'figure[data-plot="waterfall-{row["name"]}"]')
        assert waterfall.count() == 1 and waterfall.locator("img").evaluate("i => i.complete && i.naturalWidth > 700")
        assert waterfall.locator("figcaption").inner_text().startswith(f"Why not more, {row['name']}:")
    cost = p.locator('figure[data-plot="cost"] img')
    assert cost.count() == 1 and cost.evaluate("i => i.complete && i.naturalWidth > 600")

    flags = p.locator("#flags li").all_inner_texts()
    runs_of: dict[str, list[str]] = {}  # the same flag on several runs is said once, naming them all
    for r in results["rows"]:
        for f in r["flags"]:
            runs_of.setdefault(f, []).append(r["name"])
    assert flags == [f"{', '.join(names)}: {f}" for f, names in runs_of.items()]
    assert p.locator('#prediction td[data-key="batch_sweet_spot"]').inner_text() == "1024"
    assert p.locator('#prediction td[data-key="comm_dominates_below_batch"]').inner_text() == "1x2: 97 samples; 1x4: 128 samples"
    assert p.locator("#predicted-runs tbody tr").count() == len(results["rows"])
    assert p.locator('#predicted-runs td[data-row="weak-1x4"][data-key="exposed communication (ms/step)"]').inner_text() == "5.2"
    assert p.locator("script").count() == 0 and page.dialogs == [], "text must not run as script"

    assert page.errors == []
    assert all(url.startswith(("file:", "data:")) for url in page.requests), page.requests
    assert any(url.startswith("file:") for url in page.requests)


def test_screenshot_is_not_blank(page, report):
    _, _, files = report
    page.page.goto(files["report.html"].as_uri(), wait_until="load")
    shot = page.page.screenshot(full_page=True)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", shot[16:24])
    assert width == 1280 and height > 1500, (width, height)  # the tables and eight plots, full page
    assert len(shot) > 100_000
    import matplotlib.image
    pixels = matplotlib.image.imread(io.BytesIO(shot), format="png")
    assert pixels[..., :3].std() > 0.05, "the page rendered as one colour"
    assert page.errors == []
