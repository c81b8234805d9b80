"""report.html in a real headless Chromium: it renders, every plot loads, the numbers match results.json."""

from __future__ import annotations

import io
import json
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
                "train_time_s": time_s, "step_time_s": time_s / 300,
                "time_split_s": {"startup": 9.5, "data_wait": 1.25, "compute": time_s - 4.0, "eval": 2.0, "checkpoint": 0.75},
                "speedup": world ** 0.93, "efficiency": world ** -0.07, "metric": "perplexity",
                "metric_value": 23.456 - world, "final_loss": 3.1, "predicted_samples_per_s": 812.37 * world * 0.95,
                "predicted_efficiency": 0.95, "utilisation": None, "timeline": timeline,
                "flags": ["<script>alert('flag')</script> data wait is 8% of the run"] if world == 4 else [],
            })
    strong2 = rows[1]
    strong2.update(speedup=None, efficiency=None, metric_value=None, predicted_samples_per_s=None,
                   predicted_efficiency=None)
    return {"version": 1, "command": ["torchrun", "train.py", "--tag", "<script>alert('cmd')</script>"],
            "launcher": "slurm", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
            "created": "2026-11-21T08:00:00+00:00", "rows": rows,
            "baseline": {"weak": "weak-1x1", "strong": "strong-1x1"},
            "prediction": {"batch_sweet_spot": 1024, "comm_dominates_below_batch": {"1x2": 96.5, "1x4": 128.0},
                           "alpha_s": 1.5e-05, "cells": [{"name": r["name"], "samples_per_s": r["predicted_samples_per_s"]}
                                                         for r in rows]}}


def _expected(row: dict) -> dict[str, str]:
    """The cell texts, formatted here from the JSON independently of gpuscale.study.report."""
    def maybe(value, fmt):
        return DASH if value is None else fmt(value)
    return {
        "name": row["name"], "scaling": row["scaling"],
        "layout": "%dx%d (%d)" % (row["nodes"], row["nproc_per_node"], row["world_size"]),
        "global_batch": str(row["global_batch"]), "per_device_batch": str(row["per_device_batch"]),
        "samples_per_s": f"{row['samples_per_s']:.1f}", "train_time_s": f"{row['train_time_s']:.1f}s",
        "speedup": maybe(row["speedup"], lambda v: f"{v:.2f}x"),
        "efficiency": maybe(row["efficiency"], lambda v: "%d%%" % round(v * 100)),
        "metric_value": maybe(row["metric_value"], lambda v: f"{v:.2f}"),  # perplexity: 2 decimals
        "predicted_samples_per_s": maybe(row["predicted_samples_per_s"], lambda v: f"{v:.1f}"),
        "predicted_efficiency": maybe(row["predicted_efficiency"], lambda v: "%d%%" % round(v * 100)),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, dict, dict]:
    directory = tmp_path_factory.mktemp("study")
    (directory / "results.json").write_text(json.dumps(_study(directory), indent=2))
    results = json.loads((directory / "results.json").read_text())
    files = write_report(results, directory)
    return directory, results, files


def test_report_renders_with_plots_and_the_json_numbers(page, report):
    directory, results, files = report
    html = files["report.html"]
    page.page.goto(html.as_uri(), wait_until="load")
    p = page.page

    assert p.title() == "gpuscale scaling report"
    assert p.locator("h1").inner_text() == "gpuscale scaling report" and p.locator("h1").is_visible()
    assert p.locator("#command").inner_text() == shlex.join(results["command"])

    plots = [rel for rel in files if rel.startswith("plots/")]
    assert "plots/utilisation-weak-1x2.png" not in plots and len(plots) == 3 + 5
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
        total = sum(row["time_split_s"].values())
        assert split == f"{row['time_split_s']['startup']:.1f}s ({round(100 * 9.5 / total)}%)"

    flags = p.locator("#flags li").all_inner_texts()
    assert flags == [f"{r['name']}: {f}" for r in results["rows"] for f in r["flags"]]
    assert p.locator('#prediction td[data-key="batch_sweet_spot"]').inner_text() == "1024"
    assert p.locator('#prediction td[data-key="comm_dominates_below_batch"]').inner_text() == "1x2: 96.5; 1x4: 128"
    assert p.locator('table.prediction-records[data-key="cells"] tbody tr').count() == len(results["rows"])
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
