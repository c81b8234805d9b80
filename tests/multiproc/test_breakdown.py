"""Lost efficiency, split by measured cause: known losses injected into real 2-process runs, recovered by `gpuscale study`.

One study, four variants of tests/multiproc/scripts/injected_losses.py, each with its own clean
1-process baseline (the injections act only with more than one rank):

    clean    nothing injected: the control
    data     every rank's loader sleeps 8 ms per batch       -> the "data" part
    onerank  only rank 1's loader sleeps 8 ms per batch      -> "imbalance" (rank 0 waits for rank 1), not "data"
    comm     a DDP communication hook sleeps 8 ms per bucket -> "exposed communication": the sleep plus the
             run's own all-reduce, both timed inside the hook

Each injected share of ideal throughput is known from the sleeps that really happened and the run's
own step time; the breakdown must recover it within 10% of ideal throughput (the issue's bar).

Imbalance is checked against the ranks' own clocks: the script's communication hook reads, on the probed steps,
when each rank arrived at the all-reduce, and the gap between first and last arrival is how long the fastest rank
waited. On this shared machine a neighbour can slow one core for a whole run (rank 0's compute 30% slower than
rank 1's in one CI run), and that imbalance is real: the breakdown must show it, not the injected sleep alone.
"""

from __future__ import annotations

import json

import pytest

from procs import SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

SCRIPT = str(SCRIPTS / "injected_losses.py")
SLEEP = 0.008
TOLERANCE = 0.10
VARIANTS = {"clean": "", "data": f"--data-sleep {SLEEP}", "onerank": f"--data-sleep {SLEEP} --sleep-ranks 1",
            "comm": f"--comm-sleep {SLEEP}"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("breakdown") / "study"
    variants = [arg for name, extra in VARIANTS.items() for arg in ("--variant", f"{name}={extra}")]
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak", "--no-predict", *variants, "--out", str(out),
                              "--", SCRIPT, "--steps", "100"), timeout=600, GPUSCALE_MONITOR="0")
    assert_ok(result)
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    injected = {name: json.loads((out / f"{name}-weak-1x2" / "injected.json").read_text()) for name in VARIANTS}
    return out, result, rows, injected


def _step(row: dict) -> float:
    return row["step_breakdown_s"]["step"]


def _report(rows: dict) -> str:
    return "\n".join(f"{name}: efficiency {row['efficiency']:.2f}, " +
                     ", ".join(f"{k} {v:+.3f}" for k, v in row["loss_breakdown"].items() if v is not None)
                     for name, row in rows.items() if row["world_size"] == 2)


def test_every_part_was_measured_by_the_sync_probe(study):
    _, result, rows, _ = study
    for name in VARIANTS:
        row = rows[f"{name}-weak-1x2"]
        assert row["sync_probe"]["status"] == "measured" and row["sync_probe"]["probes"] >= 5, row["sync_probe"]
        assert all(v is not None for v in row["loss_breakdown"].values())
        assert sum(row["loss_breakdown"].values()) == pytest.approx(1 - row["efficiency"])
    assert "Why not more" in result.stdout and "clean-weak-1x2: " in result.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_imbalance_is_how_far_apart_the_ranks_arrived(study, variant):
    _, _, rows, injected = study
    row = rows[f"{variant}-weak-1x2"]
    gap = injected[variant]["arrival_gap_s_on_probed_steps"]
    expected = gap / _step(row)
    measured = row["loss_breakdown"]["imbalance"] + row["loss_breakdown"]["jitter"]
    assert abs(measured - expected) <= TOLERANCE, f"expected imbalance {expected:.3f} ({1000 * gap:.1f} ms)\n{_report(rows)}"


def test_a_loader_sleeping_on_every_rank_is_recovered_as_data(study):
    _, _, rows, injected = study
    row = rows["data-weak-1x2"]
    expected = injected["data"]["data_sleep_per_step_s"] / _step(row)
    assert abs(row["loss_breakdown"]["data"] - expected) <= TOLERANCE, f"expected data {expected:.3f}\n{_report(rows)}"


def test_a_loader_sleeping_on_one_rank_is_recovered_as_imbalance(study):
    _, _, rows, injected = study
    row = rows["onerank-weak-1x2"]
    gap = injected["onerank"]["arrival_gap_s_on_probed_steps"]
    assert row["sync_probe"]["slow_rank"] == 1, f"rank 1 sleeps {1000 * SLEEP:.0f} ms a step\n{_report(rows)}"
    assert row["loss_breakdown"]["imbalance"] > 0.5 * gap / _step(row), _report(rows)  # mostly persistent, not jitter
    assert abs(row["loss_breakdown"]["data"]) <= TOLERANCE, _report(rows)
    waits = {r["rank"]: r["data_wait_s"] for r in json.loads((study[0] / "onerank-weak-1x2" / "summary.json").read_text())["ranks"]}
    assert waits[1] > waits[0] + 0.5 * SLEEP  # every rank recorded its own data wait


def test_a_sleeping_communication_hook_is_recovered_as_exposed_communication(study):
    _, _, rows, injected = study
    row = rows["comm-weak-1x2"]
    assert injected["comm"]["hook_calls_per_step"] >= 1
    hook_s = injected["comm"]["comm_hook_s_on_probed_steps"]
    assert hook_s >= injected["comm"]["comm_sleep_per_step_s"]
    # The hook held the backward pass for the injected sleep plus this run's own all-reduce (one bucket, so none of it
    # overlaps the backward pass): timed by the hook itself, on the very steps the sync probe measured, not taken from
    # the clean run (a different run, whose all-reduce on a busy 2-core machine can take a third of a step more or less).
    expected = hook_s / _step(row)
    measured = row["step_breakdown_s"]["exposed_comm"] / _step(row)
    assert abs(measured - expected) <= TOLERANCE, f"expected exposed comm {expected:.3f}, measured {measured:.3f}\n{_report(rows)}"
    assert abs(row["loss_breakdown"]["exposed_comm"] - expected) <= TOLERANCE, _report(rows)


def test_the_report_shows_the_waterfall(study):
    out, _, _, _ = study
    html = (out / "report.html").read_text()
    assert 'data-plot="waterfall-' in html and 'id="breakdown"' in html
    assert all(path.stat().st_size > 5000 for path in (out / "plots").glob("waterfall-*.png"))
    assert sorted(path.name for path in (out / "plots").glob("waterfall-*.png"))
