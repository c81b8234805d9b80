"""gpuscale doctor in real processes: 2 ranks under `gpuscale run`, on gloo, right and deliberately wrong."""

from __future__ import annotations

import json
import socket

from procs import assert_ok, gpuscale_cmd, run


def _table(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.split("placement:\n")[1].split("\n\n")[0].splitlines()[1:]]


def test_doctor_under_gpuscale_run_prints_the_table_and_bandwidth_and_passes():
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "-m", "gpuscale", "doctor", "--max-size", "4M"), timeout=300)
    assert_ok(result)
    rows = _table(result.stdout)
    assert [r[1] for r in rows] == ["0", "1"] and [r[2] for r in rows] == ["0", "1"]  # rank, local rank
    assert rows[0][7] != rows[1][7], rows  # each rank on its own core(s)
    assert "launcher torchrun, backend gloo" in result.stdout
    sizes = [line.split()[0] + " " + line.split()[1] for line in result.stdout.split("busbw GB/s\n")[1].split("\n\n")[0].splitlines()]
    assert sizes == ["4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB"]
    assert "info  bandwidth    busbw peak" in result.stdout
    assert "  FAIL  " not in result.stdout and "doctor passed" in result.stdout
    assert "measured by the probe" not in result.stderr and "optimizer step" not in result.stderr, result.stderr  # no training here
    # the network section: one line for this one node, gloo's address by torch's rule (what the host name resolves to)
    host = socket.gethostname()
    network = result.stdout.split("network (gloo's address by torch's rule, one line per node):\n")[1].split("\n\n")[0].splitlines()
    first_address = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)[0][4][0]
    assert network == [f"  {host}: gloo over TCP on {network[0].split(' on ')[1].split()[0]} {first_address} "
                       f"(host name {host} resolves to it)"], network
    assert "info  network      one node: gloo's traffic stays on this host" in result.stdout


def test_two_ranks_forced_onto_one_core_fail_and_say_so():
    """taskset gives the launcher one core; both ranks inherit it (`gpuscale run` refuses two CPU ranks on one core
    unless told --bind none, as any other launcher would start them): doctor must flag the shared core and exit 1."""
    result = run(["taskset", "-c", "0", *gpuscale_cmd("run", "--nproc-per-node", "2", "--bind", "none", "-m", "gpuscale", "doctor",
                                                      "--no-bandwidth")], timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  placement    ranks 0 and 1 on " in result.stdout and "share core(s) 0 (rank 0: 0, rank 1: 0)" in result.stdout
    assert "doctor FAILED: 1 failed" in result.stdout
    assert "every rank exited with code 1" in result.stderr and "Traceback" not in result.stderr


def test_doctor_json_carries_every_rank_and_correct_sums():
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "-m", "gpuscale", "doctor", "--json", "--max-size", "64K",
                              "--expect-busbw", "1000"), timeout=300)
    # 1000 GB/s cannot be had from gloo on two cores: the bandwidth check must fail, and the exit code with it
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and len({r["pid"] for r in data["ranks"]}) == 2
    assert [row["bytes"] for row in data["bandwidth"]] == [4096, 16384, 65536]
    assert all(row["correct"] and row["busbw_gbps"] > 0 for row in data["bandwidth"])
    assert [f["level"] for f in data["findings"] if f["area"] == "bandwidth"] == ["fail"]
    assert data["passed"] is False
    assert [n["host"] for n in data["network"]["nodes"]] == [socket.gethostname()] and data["network"]["ranks"] is None
    assert all(r["gloo"]["devices"][0]["address"] for r in data["ranks"])


def test_doctor_alone_checks_the_rendezvous_port():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = run(gpuscale_cmd("doctor"), timeout=120, MASTER_PORT=str(port))
    assert busy.returncode == 1 and f"port {port} is already in use" in busy.stdout, busy.stdout + busy.stderr
    free = run(gpuscale_cmd("doctor", "--json"), timeout=120, TOKENIZERS_PARALLELISM="false")
    assert_ok(free)
    data = json.loads(free.stdout)
    assert data["passed"] and data["bandwidth"] is None and len(data["ranks"]) == 1
