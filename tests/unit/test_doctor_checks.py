"""gpuscale doctor's verdicts on crafted worlds: what ranks would report on nodes we do not have.

LUMI-G's GCD-to-cores map (docs/clusters.md, LUMI-G), an NVIDIA node with NUMA information, ranks that disagree,
two ranks on one GPU, shared cores, idle GPUs, version skew, a NIC setting that names no interface.
"""

from __future__ import annotations

import datetime
import json

import pytest

from gpuscale.detect.topology import parse_cpulist
from gpuscale.doctor import check_port_free, judge
from gpuscale.doctor.bandwidth import bus_bandwidth, message_sizes, parse_size, verdict
from gpuscale.doctor.checks import check_environment, check_placement, check_software, worst
from gpuscale.doctor.report import as_json, exit_code, format_text

LUMI_GPU_CORES = [parse_cpulist(c) for c in ["49-55", "57-63", "17-23", "25-31", "1-7", "9-15", "33-39", "41-47"]]
VERSIONS = {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.8", "hip": None, "nccl": "2.27.3", "gloo": True, "deepspeed": None}


def rank(r: int, *, host: str = "node1", local: int | None = None, world: int = 2, local_world: int | None = None,
         cores: list[int] | None = None, gpu: str | None = None, gpu_index: int | None = None, gpu_numa: int | None = None,
         cores_numa: list[int] | None = None, seen: list[str] | None = None, threads: int = 1, environ: dict | None = None,
         versions: dict | None = None, allocated: int | None = None, interfaces: list[str] | None = None) -> dict:
    return {
        "host": host, "rank": r, "local_rank": r if local is None else local, "node_rank": 0, "world_size": world,
        "local_world_size": world if local_world is None else local_world, "launcher": "torchrun", "master": "node1:29500",
        "device": f"cuda:{gpu_index or 0}" if gpu else "cpu", "device_name": "GPU" if gpu else "cpu", "visible_devices": None,
        "gpu": gpu, "gpu_index": gpu_index, "gpu_pci": None, "gpu_numa": gpu_numa, "gpus_seen": seen or ([gpu] if gpu else []),
        "gpus_allocated": allocated, "cores": cores if cores is not None else [r], "cores_numa": cores_numa or [],
        "threads": threads, "binding": "gpu-local", "versions": versions or VERSIONS, "has_tokenizers": False,
        "interfaces": interfaces or ["lo", "eth0"], "environ": environ if environ is not None else {"OMP_NUM_THREADS": "7"},
        "pid": 1000 + r,
    }


def levels(findings, level: str) -> list[str]:
    return [f.message for f in findings if f.level == level]


def test_a_correct_lumi_node_passes_every_placement_check():
    gpus = [f"GCD{i}" for i in range(8)]
    facts = [rank(i, world=8, cores=LUMI_GPU_CORES[i], gpu=gpus[i], gpu_index=i, seen=gpus, threads=7) for i in range(8)]
    found = check_placement(facts, LUMI_GPU_CORES)
    assert levels(found, "fail") == [] and levels(found, "warn") == []
    assert any("bound next to its GPU (8 checked)" in m for m in levels(found, "ok"))


def test_a_rank_on_the_wrong_socket_fails_by_the_profile_map():
    gpus = [f"GCD{i}" for i in range(8)]
    cores = list(LUMI_GPU_CORES)
    cores[2], cores[3] = LUMI_GPU_CORES[3], LUMI_GPU_CORES[2]  # ranks 2 and 3 swapped their masks
    facts = [rank(i, world=8, cores=cores[i], gpu=gpus[i], gpu_index=i, seen=gpus, threads=7) for i in range(8)]
    fails = levels(check_placement(facts, LUMI_GPU_CORES), "fail")
    assert len(fails) == 2
    assert "rank 2 on node1 uses GPU 2 but is bound to core(s) 25-31, not next to it (its cores: 17-23)" in fails[0]


def test_a_rank_bound_far_from_its_gpu_fails_by_numa_nodes():
    facts = [rank(0, cores=[0, 1], gpu="GPU-a", gpu_numa=0, cores_numa=[0]),
             rank(1, cores=[2, 3], gpu="GPU-b", gpu_numa=1, cores_numa=[0])]
    fails = levels(check_placement(facts), "fail")
    assert fails == ["rank 1 on node1 has its GPU on NUMA node 1 but runs on cores of NUMA node(s) 0: every batch crosses the socket link"]


def test_cores_spanning_two_numa_nodes_warn():
    facts = [rank(0, world=1, cores=[0, 8], gpu="GPU-a", gpu_numa=0, cores_numa=[0, 1])]
    assert levels(check_placement(facts), "warn") == ["rank 0 on node1 runs on cores of NUMA nodes 0, 1; its GPU is on node 0"]


def test_two_ranks_on_one_gpu_fail_and_the_idle_gpu_is_named():
    seen = ["GPU-a", "GPU-b"]
    facts = [rank(0, gpu="GPU-a", seen=seen), rank(1, gpu="GPU-a", seen=seen)]
    found = check_placement(facts)
    assert "ranks 0 and 1 on node1 share one GPU (GPU-a)" in levels(found, "fail")[0]
    assert levels(found, "warn") == ["1 GPU(s) on node1 are visible but no rank uses them: GPU-b"]
    assert worst(found) == "fail"


def test_srun_tasks_seeing_one_gpu_each_are_judged_by_slurm_allocation():
    facts = [rank(0, gpu="GPU-a", allocated=4), rank(1, gpu="GPU-b", allocated=4)]
    assert levels(check_placement(facts), "warn") == ["SLURM gave node1 4 GPU(s) but only 2 are used"]


def test_shared_cores_fail_and_oversubscribed_threads_warn():
    facts = [rank(0, cores=[0, 1], threads=2), rank(1, cores=[1, 2], threads=2)]
    found = check_placement(facts)
    assert levels(found, "fail") == ["ranks 0 and 1 on node1 share core(s) 1 (rank 0: 0-1, rank 1: 1-2)"]
    assert levels(found, "warn") == ["the 2 rank(s) on node1 run 4 compute threads on 3 core(s): they will take turns"]


def test_ranks_on_different_nodes_may_use_the_same_core_numbers():
    facts = [rank(0, host="n1", local=0, local_world=1, cores=[0]), rank(1, host="n2", local=0, local_world=1, cores=[0])]
    assert levels(check_placement(facts), "fail") == []


def test_ranks_that_disagree_on_the_world_size_fail_first_and_alone():
    facts = [rank(0, world=2), rank(1, world=4)]
    found = check_placement(facts)
    assert found[0].level == "fail" and found[0].message == "the ranks disagree on the world size (WORLD_SIZE): 2 for rank 0; 4 for rank 1"
    assert all(f.area == "placement" and f.level == "fail" for f in found)


def test_duplicate_ranks_and_wrong_local_ranks_fail():
    facts = [rank(0), rank(0, local=1)]  # every task thinks it is rank 0: RANK=$SLURM_PROCID expanded by the batch shell
    fails = levels(check_placement(facts), "fail")
    assert any("rank 0 started more than once" in m for m in fails)
    facts = [rank(0, local=0), rank(1, local=0)]
    assert any("on node1 the local ranks are [0, 0], expected 0..1" in m for m in levels(check_placement(facts), "fail"))


def test_a_rank_on_cpu_among_gpu_ranks_fails():
    facts = [rank(0, gpu="GPU-a"), rank(1)]
    assert any("rank 1 on node1 runs on cpu although other ranks use GPUs" in m for m in levels(check_placement(facts), "fail"))


def test_version_skew_and_missing_nccl_fail_deepspeed_when_asked():
    other = {**VERSIONS, "torch": "2.5.1"}
    facts = [rank(0, gpu="GPU-a"), rank(1, gpu="GPU-b", versions=other)]
    assert levels(check_software(facts), "fail") == ["the ranks run different torch versions (rank 0: 2.13.0; rank 1: 2.5.1)"]
    no_nccl = {**VERSIONS, "nccl": None}
    facts = [rank(0, gpu="GPU-a", versions=no_nccl), rank(1, gpu="GPU-b", versions=no_nccl)]
    assert levels(check_software(facts), "fail") == ["torch has no NCCL: GPUs cannot all-reduce"]
    assert levels(check_software([rank(0, world=1)], want_deepspeed=True), "fail") == ["DeepSpeed is not importable"]
    with_ds = {**VERSIONS, "deepspeed": "0.16.4"}
    assert "DeepSpeed 0.16.4" in levels(check_software([rank(0, world=1, versions=with_ds)], want_deepspeed=True), "ok")


def test_multi_node_network_interface_setting():
    two = dict(host="n1", local=0, local_world=1)
    other = dict(host="n2", local=0, local_world=1)
    unset = [rank(0, gpu="a", **two), rank(1, gpu="b", **other)]
    assert "NCCL_SOCKET_IFNAME is not set" in levels(check_environment(unset), "info")[0]  # the network lines say what NCCL chose
    assert not [w for w in levels(check_environment(unset), "warn") if "SOCKET_IFNAME" in w]
    wrong = [rank(0, gpu="a", environ={"NCCL_SOCKET_IFNAME": "hsn0,hsn1", "OMP_NUM_THREADS": "7"}, interfaces=["lo", "eth0"], **two),
             rank(1, gpu="b", interfaces=["lo", "eth0"], **other)]
    assert levels(check_environment(wrong), "fail") == ["NCCL_SOCKET_IFNAME=hsn0,hsn1 matches no network interface on n1, n2"]
    right = [rank(0, gpu="a", environ={"NCCL_SOCKET_IFNAME": "hsn", "OMP_NUM_THREADS": "7"}, interfaces=["hsn0", "nmn0"], **two),
             rank(1, gpu="b", interfaces=["hsn0", "hsn1"], **other)]
    assert levels(check_environment(right), "fail") == [] and "matches interfaces on all 2 nodes" in levels(check_environment(right), "ok")[0]
    excluded = [rank(0, gpu="a", environ={"NCCL_SOCKET_IFNAME": "^lo,docker"}, interfaces=["lo", "eth0"], **two),
                rank(1, gpu="b", interfaces=["lo", "eth0"], **other)]
    assert levels(check_environment(excluded), "fail") == []


def test_amd_needs_a_node_local_miopen_cache():
    amd = {**VERSIONS, "cuda": None, "hip": "6.2", "nccl": "2.20.5"}
    facts = [rank(0, world=1, gpu="GCD0", versions=amd, environ={})]
    assert "MIOpen's cache is not set" in levels(check_environment(facts), "warn")[0]
    local = {"MIOPEN_USER_DB_PATH": "/tmp/me-miopen-1", "MIOPEN_CUSTOM_CACHE_DIR": "/tmp/me-miopen-1"}
    assert levels(check_environment([rank(0, world=1, gpu="GCD0", versions=amd, environ=local)]), "warn") == []
    shared = {"MIOPEN_USER_DB_PATH": "/users/me/.cache", "MIOPEN_CUSTOM_CACHE_DIR": "/tmp/x"}
    found = check_environment([rank(0, world=1, gpu="GCD0", versions=amd, environ=shared)])
    assert "not node-local (MIOPEN_USER_DB_PATH)" in levels(found, "warn")[0]


def test_tokenizers_and_thread_settings():
    facts = [dict(rank(0, world=1, environ={}), has_tokenizers=True)]
    assert "TOKENIZERS_PARALLELISM is not set" in levels(check_environment(facts), "warn")[0]
    crowded = [rank(0, cores=[0], environ={"OMP_NUM_THREADS": "4"}), rank(1, cores=[1])]
    assert levels(check_environment(crowded), "warn") == ["OMP_NUM_THREADS=4 for each of the 2 ranks on node1, which have 2 core(s) between them"]
    placeholder = [rank(0, cores=[0], environ={"OMP_NUM_THREADS": "1", "GPUSCALE_OMP_FROM_LAUNCHER": "1"}), rank(1, cores=[1])]
    assert levels(check_environment(placeholder), "warn") == []
    unset = [rank(0, cores=[0], environ={}), rank(1, cores=[1])]
    assert levels(check_environment(unset), "warn") == [] and "OMP_NUM_THREADS is not set" in levels(check_environment(unset), "info")[0]


def test_rendezvous_port_in_use_fails(tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = check_port_free(None, port, is_local=True)
    assert busy.level == "fail" and f"port {port} is already in use" in busy.message
    assert check_port_free(None, port, is_local=True).level == "ok"
    assert check_port_free("no-such-host.invalid", 29500, is_local=False).level == "fail"


def test_bandwidth_helpers_and_verdict():
    assert parse_size("256M") == 256 * 2**20 and parse_size("64KiB") == 65536 and parse_size("4096") == 4096
    for bad in ("", "1T", "12X", "-4K", "1K"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert message_sizes(parse_size("1M")) == [4096, 16384, 65536, 262144, 1048576]
    assert message_sizes(parse_size("3M"))[-1] == 3 * 2**20
    assert bus_bandwidth(100.0, 8) == pytest.approx(175.0) and bus_bandwidth(10.0, 2) == 10.0
    rows = [{"bytes": 2**20, "seconds": 1e-3, "repeats": 5, "algbw_gbps": 1.0, "busbw_gbps": 40.0, "correct": True}]
    assert verdict(rows, 50.0, "nccl")[0].level == "ok"
    assert verdict(rows, 100.0, "nccl")[0].level == "warn"
    assert verdict(rows, 400.0, "nccl")[0].level == "fail"
    assert verdict(rows, None, "gloo")[0].level == "info"
    assert verdict([{**rows[0], "correct": False}], 50.0, "nccl")[0].message == "all-reduce returned wrong sums at 1 MiB"


def test_report_is_paste_ready_text_and_json():
    facts = [rank(0, cores=[0]), rank(1, cores=[0])]
    findings = judge(facts)
    rows = [{"bytes": 4096, "seconds": 1e-3, "repeats": 9, "algbw_gbps": 0.004, "busbw_gbps": 0.004, "correct": True}]
    text = format_text(facts, findings, rows, "gloo", now=datetime.datetime(2026, 11, 21, 12, 0))
    assert text.splitlines()[0].startswith("gpuscale doctor ") and "2 rank(s) on 1 node(s) (node1), launcher torchrun" in text
    table = text.split("placement:\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split() == ["host", "rank", "local", "gpus", "seen", "device", "gpu", "gpu", "numa", "cores", "cores", "numa", "threads"]
    assert table[1].split()[:3] == ["node1", "0", "0"] and len(table) == 3
    assert "  FAIL  placement    ranks 0 and 1 on node1 share core(s) 0" in text
    assert "4 KiB" in text and text.rstrip().endswith("ok") and "doctor FAILED: 1 failed" in text
    assert exit_code(findings) == 1
    data = json.loads(json.dumps(as_json(facts, findings, rows, "gloo")))
    assert data["passed"] is False and data["worst"] == "fail" and len(data["ranks"]) == 2 and data["bandwidth"] == rows


def test_gpus_allocated_but_unseen_fail_on_a_gpu_build_and_warn_on_a_cpu_build():
    facts = [rank(0, allocated=2), rank(1, allocated=2)]
    fails = levels(check_placement(facts), "fail")
    assert fails == ["SLURM gave this job 2 GPU(s) but torch (CUDA 12.8) sees none"]
    cpu_build = {**VERSIONS, "cuda": None, "nccl": None}
    facts = [rank(0, allocated=2, versions=cpu_build), rank(1, allocated=2, versions=cpu_build)]
    found = check_placement(facts)
    assert levels(found, "fail") == [] and "CPU-only build" in levels(found, "warn")[0]


def test_a_gpu_missing_from_the_map_is_judged_by_numa_instead():
    cores_map = [[0, 1], None]
    facts = [rank(0, cores=[0, 1], gpu="a", gpu_index=0), rank(1, cores=[2, 3], gpu="b", gpu_index=1, gpu_numa=0, cores_numa=[0])]
    found = check_placement(facts, cores_map)
    assert levels(found, "fail") == [] and "bound next to its GPU (2 checked)" in levels(found, "ok")[-1]


def test_nccl_version_skew_across_nodes_fails():
    other = {**VERSIONS, "nccl": "2.18.1"}
    facts = [rank(0, gpu="a"), rank(1, gpu="b", versions=other)]
    assert levels(check_software(facts), "fail") == ["the ranks run different NCCL/RCCL versions (rank 0: 2.27.3; rank 1: 2.18.1)"]
