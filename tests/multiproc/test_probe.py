"""The probe measures scripts nobody changed: each kind of client under `gpuscale run` and in a study,
checked against what the script itself printed and against gpuscale.Meter in the same run."""

from __future__ import annotations

import json
import re
import signal

import pytest

from gpuscale.measure.probe import read_records
from gpuscale.measure.probe.merge import merge_records

from procs import ROOT, SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

CLIENTS = ROOT / "tests" / "clients"
CLIENT_LINE = re.compile(r"^CLIENT rank=(\d+) world_size=(\d+) steps=(\d+) samples=(\d+) train_s=(\d+\.\d+)$", re.M)
# each client as its own library's documentation has it; the study fills the templates per cell
CLIENT_ARGS = {
    "ddp_plain": ["--epochs", "2", "--samples", "1024"],
    "accelerate_script": ["--epochs", "2", "--samples", "1024"],
    "lightning_script": ["--epochs", "2", "--samples", "1024", "--devices", "{nproc_per_node}", "--num-nodes", "{nodes}"],
    "hf_trainer_script": ["--epochs", "2", "--samples", "1024", "--out", "{out}/hf"],
}


def _client_lines(text: str) -> dict[int, dict[str, float]]:
    return {int(m[0]): {"world_size": int(m[1]), "steps": int(m[2]), "samples": int(m[3]), "train_s": float(m[4])}
            for m in CLIENT_LINE.findall(text)}


def _assert_timed_as_the_script_timed_itself(summary: dict, said: dict[int, dict[str, float]], name: str) -> None:
    """The probe's throughput and training times against the script's own clock (each client times its
    training with its library's public hooks: first training batch requested .. last optimizer step,
    less the evaluation loops in between, as the probe defines it)."""
    own = sum(s["samples"] for s in said.values()) / max(s["train_s"] for s in said.values())
    assert summary["samples_per_s"] == pytest.approx(own, rel=0.10), (name, summary["samples_per_s"], own)
    for account in summary["probe"]["ranks"]:
        # 10%, or 50 ms where that is more (a short run): the hooks sit a few ms off the probe's edges, which
        # are the loader's first request and its last batch of a validation. Lightning and Accelerate make a
        # collective (a broadcast) between the epoch's start and that first request, where a rank waits for
        # the others; Lightning's validation goes on after its loader gave the last batch (that batch's
        # step, the epoch's end): up to ~16 ms at the start, ~5 ms per validation seen, per rank
        assert account["train_s"] == pytest.approx(said[account["rank"]]["train_s"], rel=0.10, abs=0.05), (name, account, said)


def assert_placed(records: list[dict], name: str) -> None:
    """Each rank trained on cores of its own, with as many threads as cores: what the rank itself saw at its
    first batch or step (its affinity, torch.get_num_threads()), written into its probe record."""
    from gpuscale.detect.topology import parse_cpulist

    cores = {r["rank"]: set(parse_cpulist(r["placement"]["cores"])) for r in records}
    for record in records:
        mine = cores[record["rank"]]
        assert record["placement"]["threads"] == len(mine), (name, record["placement"])
        assert all(not mine & theirs for rank, theirs in cores.items() if rank != record["rank"]), (name, cores)


def test_probe_and_meter_agree_on_the_same_run(tmp_path):
    """A gpuscale script is measured twice in one run: by its Meter and by the probe's records."""
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--summary", str(tmp_path / "probe_out"),
                              str(SCRIPTS / "meter_twin.py"), "--out", str(tmp_path / "meter")), timeout=240)
    assert_ok(result)
    meter = json.loads((tmp_path / "meter" / "summary.json").read_text())
    assert not (tmp_path / "probe_out" / "summary.json").exists()  # left to the Meter, and the user told so
    assert (f"gpuscale run: nothing written to {tmp_path / 'probe_out'}: the script measures itself with gpuscale.Meter"
            in result.stderr), result.stderr
    records = read_records(tmp_path / "probe_out" / "probe")
    assert [r["rank"] for r in records] == [0, 1] and all(r["meter"] for r in records)
    probe, _ = merge_records(records, world_size=2, scaling="weak")
    assert probe["complete"] and probe["steps"] == meter["steps"] == 2 * 1024 // 16
    assert probe["samples"] == meter["samples"] == 2 * 2048
    assert probe["epochs"] == meter["epochs"] == 2
    assert probe["samples_per_s"] == pytest.approx(meter["samples_per_s"], rel=0.10)
    assert probe["time_split_s"]["eval"] == pytest.approx(meter["time_split_s"]["eval"], rel=0.5, abs=0.2)


def test_a_plain_ddp_script_under_gpuscale_run(tmp_path):
    out = tmp_path / "ddp"
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--summary", str(out), str(CLIENTS / "ddp_plain.py"),
                              "--epochs", "2", "--samples", "1024"), timeout=240)
    assert_ok(result)
    said = _client_lines(result.stdout)
    assert sorted(said) == [0, 1] and all(s["world_size"] == 2 for s in said.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measured_by"] == "probe" and summary["complete"] and summary["world_size"] == 2
    assert summary["backend"] == "gloo" and summary["launcher"] == "torchrun" and summary["device"] == "cpu"
    assert summary["steps"] == said[0]["steps"] and summary["samples"] == sum(s["samples"] for s in said.values())
    assert summary["per_device_batch"] == 16 and summary["global_batch"] == 32 and summary["epochs"] == 2
    split = summary["time_split_s"]
    train_only = summary["samples"] / summary["samples_per_s"]
    # DDP's own timers split the step (exposed communication, imbalance; see test_probe_ddp_timers.py)
    parts = ("data_wait", "compute", "exposed_comm", "imbalance")
    assert sum(split[k] for k in parts) == pytest.approx(train_only, rel=1e-6)
    _assert_timed_as_the_script_timed_itself(summary, said, "ddp")
    assert 0 < split["data_wait"] < train_only and split["startup"] > 0
    assert [d["rank"] for d in summary["utilisation"]["devices"]] == [0, 1]
    assert (out / "timeline.json").is_file()
    assert "measured by the probe: 2 ranks (gloo)" in result.stderr and "samples/s" in result.stderr
    # the phases add up to the time to result, the script's own end after its last step included
    assert sum(v or 0.0 for v in split.values()) == pytest.approx(summary["time_to_result_s"])
    assert f"after training {split['after_training']:.1f} s, time to result {summary['time_to_result_s']:.1f} s" in result.stderr
    assert_placed(read_records(out / "probe"), "ddp")


def test_the_probe_can_be_turned_off(tmp_path):
    out = tmp_path / "off"
    result = run(gpuscale_cmd("run", "--nproc-per-node", "1", "--summary", str(out), str(CLIENTS / "ddp_plain.py"),
                              "--epochs", "1", "--samples", "64"), timeout=120, GPUSCALE_PROBE="0")
    assert_ok(result)
    assert not (out / "summary.json").exists() and not list(out.glob("probe/*")) and "probe" not in result.stderr


def test_a_run_that_takes_no_step_keeps_the_summary_of_the_run_that_trained(tmp_path):
    """An unchanged script started again with nothing left to train (here: no epochs) writes no zero summary over the
    measurement of the run that trained in the same folder, and says so."""
    out = tmp_path / "again"
    assert_ok(run(gpuscale_cmd("run", "--nproc-per-node", "1", "--summary", str(out), str(CLIENTS / "ddp_plain.py"),
                               "--epochs", "1", "--samples", "64"), timeout=120))
    trained = json.loads((out / "summary.json").read_text())
    again = run(gpuscale_cmd("run", "--nproc-per-node", "1", "--summary", str(out), str(CLIENTS / "ddp_plain.py"),
                             "--epochs", "0", "--samples", "64"), timeout=120)
    assert_ok(again)
    assert trained["steps"] > 0 and json.loads((out / "summary.json").read_text()) == trained
    assert not (out / "summary-incomplete.json").exists()
    assert f"this run took no optimizer step: kept {out / 'summary.json'}" in again.stderr


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_a_rank_that_dies_leaves_its_record(tmp_path, mode):
    out = tmp_path / "victim"
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--summary", str(out), str(SCRIPTS / "probe_victim.py"),
                              "--mode", mode), timeout=180)
    assert result.returncode != 0
    records = {r["rank"]: r for r in read_records(out / "probe")}
    victim = records[1]
    assert victim["optimizers"][0]["steps"] == 12  # what it did before it died
    if mode == "kill":
        assert victim["ended"] == "signal" and victim["signal"] == "SIGTERM"
        assert result.returncode == 128 + signal.SIGTERM  # the signal took its default course
    else:
        assert victim["ended"] == "exception" and victim["error"] == "RuntimeError: rank 1 gives up after 12 steps"
    assert not (out / "summary.json").exists()  # what a failed run measured is never taken for a result
    summary = json.loads((out / "summary-incomplete.json").read_text())
    assert summary["complete"] is False
    why = summary["probe"]["why"]
    assert ("rank 1 was ended by SIGTERM" if mode == "kill" else "rank 1 raised RuntimeError: rank 1 gives up") in why
    assert "incomplete:" in result.stderr and "summary-incomplete.json" in result.stderr


@pytest.mark.parametrize("client", list(CLIENT_ARGS))
def test_each_kind_of_script_is_studied_unchanged(tmp_path, client):
    out = tmp_path / client
    command = [str(CLIENTS / f"{client}.py"), "--batch-size", "{per_device_batch}", *CLIENT_ARGS[client]]
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak,strong", "--global-batch", "32",
                              "--no-predict", "--out", str(out), "--", *command), timeout=600)
    assert_ok(result)
    rows = {row["name"]: row for row in json.loads((out / "results.json").read_text())["rows"]}
    assert sorted(rows) == ["strong-1x1", "strong-1x2", "weak-1x1", "weak-1x2"]
    # on one device weak and strong scaling run the same command (--batch-size 32): it ran once, for both
    assert rows["strong-1x1"]["same_as"] == "weak-1x1" and not (out / "strong-1x1" / "output.log").exists()
    for name, row in rows.items():
        folder = out / (row["same_as"] or name)
        summary = json.loads((folder / "summary.json").read_text())
        said = _client_lines((folder / "output.log").read_text())
        world = row["world_size"]
        assert sorted(said) == list(range(world)) and all(s["world_size"] == world for s in said.values()), (name, said)
        assert summary["measured_by"] == "probe" and summary["complete"]
        assert summary["steps"] == said[0]["steps"], (name, summary["steps"], said)
        assert summary["samples"] == sum(s["samples"] for s in said.values()), name
        expected = 16 if name == "strong-1x2" else 32  # strong keeps 32 in all; weak keeps 32 per device
        assert row["per_device_batch"] == expected and row["global_batch"] == expected * world, name
        assert row["samples_per_s"] == summary["samples_per_s"] > 0 and row["time_split_s"]["data_wait"] is not None
        _assert_timed_as_the_script_timed_itself(summary, said, name)
        assert len(row["utilisation"]["devices"]) == world
        assert_placed(read_records(folder / "probe"), name)  # the script unchanged, its ranks placed all the same
        if world == 2:  # every client trains a DDP model on two ranks: DDP's timers split the step
            assert row["sync_probe"]["status"] == "measured" and row["sync_probe"]["source"] == "ddp_timers", (name, row["sync_probe"])
            assert row["time_split_s"]["exposed_comm"] is not None and row["time_split_s"]["imbalance"] is not None
            # one model, not copies: the HF Trainer and Accelerate too, written as their docs write them (on CPUs gpuscale
            # sets ACCELERATE_USE_CPU for them: docs/studies.md)
            assert row["synchronised"] is True and row["speedup"] is not None, name
    report = (out / "report.md").read_text()
    # says which runs the probe measured and what it could not measure
    assert "Measured by the probe, the script unchanged (all runs)" in report and "Not measured there: " in report
