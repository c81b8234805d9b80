"""The network preflight on NCCL's/RCCL's own logs: parsed field by field, judged node by node.

The fixtures (tests/unit/fixtures/nccl_logs, their sources in SOURCES.md) are logs in the exact line
format NCCL and RCCL print: InfiniBand with and without GPUDirect RDMA, RCCL over OFI/cxi on LUMI,
RCCL and NCCL falling back to TCP sockets, an NCCL_SOCKET_IFNAME that names no interface, one node.
gloo's address is judged from torch's rule, replayed on crafted resolvers and interface tables.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from gpuscale.doctor.gloonet import gloo_endpoint, is_loopback
from gpuscale.doctor.nccl_capture import NcclLogCapture, expand_debug_file
from gpuscale.doctor.ncclog import (
    NET_NOT_FOUND,
    NO_IB_DEVICE,
    NO_IBVERBS,
    NO_INTERFACE,
    NO_OFI_PROVIDER,
    NcclInit,
    parse_log,
    parse_process,
    transport_kind,
)
from gpuscale.doctor.network import LUMI_BINDINGS, gloo_loopback, judge_network
from gpuscale.doctor.report import as_json, format_text

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_logs"


def processes(name: str) -> list[NcclInit]:
    return parse_log((FIXTURES / name).read_text())


def world(*inits: NcclInit, hip: str | None = None, nccl: str = "2.21.5") -> tuple[list[dict], dict[int, dict]]:
    """Facts and captured logs of one rank per parsed process, as the doctor gathers them."""
    facts, logs = [], {}
    for r, init in enumerate(inits):
        facts.append({"host": init.host, "rank": r, "local_rank": 0, "gpu": f"GPU-{r}", "device": "cuda:0",
                      "versions": {"hip": hip, "cuda": None if hip else "12.4", "nccl": nccl}})
        logs[r] = {"init": init.as_dict(), "error": None}
    return facts, logs


def judged(name: str, **kwargs) -> tuple[list[str], list]:
    hip = kwargs.pop("hip", None)
    facts, logs = world(*processes(name), hip=hip, nccl=kwargs.pop("nccl", "2.21.5"))
    lines, found = judge_network(facts, logs, **kwargs)
    return [ln["line"] for ln in lines], found


def levels(found, level: str) -> list[str]:
    return [f.message for f in found if f.level == level]


# ---------------------------------------------------------------------------------------------- the parser, fixture by fixture

def test_nccl_over_infiniband_with_gpudirect_rdma():
    first, second, third, fourth = processes("nccl_ib_gdrdma.log")
    assert (first.host, first.pid, first.library, first.version, first.build) == ("gpu-a01", 41234, "NCCL", "2.21.5", "+cuda12.4")
    assert second.library is None and second.version is None  # only rank 0 prints the version
    assert first.plugin is None and first.plugin_missing == "libnccl-net.so: cannot open shared object file: No such file or directory"
    assert first.network == "IB" and first.transport == "IB"
    assert first.ib_devices == ["mlx5_0:1/IB", "mlx5_1:1/IB"] and first.ib_oob == "ib0:10.0.35.1"
    assert first.bootstrap == ["ib0:10.0.35.1"] and first.socket_interfaces == []
    assert first.net_paths == ["NET/IB/0/GDRDMA"] and first.local_paths == ["P2P/CUMEM"] and first.gdrdma is True
    assert second.net_paths == ["NET/IB/1/GDRDMA"] and second.net_devices == [1]
    assert first.nodes == 2 and first.complete and first.problems == [] and first.warnings == []
    assert third.host == fourth.host == "gpu-a02" and third.ib_oob == "ib0:10.0.35.2"


def test_nccl_over_infiniband_without_gpudirect_rdma_in_older_formats():
    one, two = processes("nccl_ib_no_gdr.log")
    assert (one.library, one.version, one.build) == ("NCCL", "2.8.3", "+cuda10.2")
    assert one.plugin_missing == "libnccl-net.so not found" and one.settings == {"NCCL_IB_DISABLE": "0"}
    assert one.ib_devices == ["mlx5_0:1/IB"] and one.ib_oob == "eth0:10.11.170.43"
    assert one.gdr_disabled == ["mlx5_0"] and one.net_paths == ["NET/IB/0"] and one.gdrdma is False
    assert one.complete and two.host == "node-2" and two.transport == "IB"


def test_rccl_over_ofi_cxi_on_lumi():
    inits = processes("rccl_ofi_lumi.log")
    assert [i.host for i in inits] == ["nid005001"] * 4 + ["nid005002"] * 4
    first = inits[0]
    assert (first.library, first.version, first.build) == ("RCCL", "2.18.3", "+hip6.0")
    assert first.plugin == "aws-ofi-rccl 1.4.0" and first.plugin_missing is None
    assert first.network == "AWS Libfabric" and first.transport == "OFI"
    assert (first.ofi_provider, first.ofi_fabric, first.ofi_nics) == ("cxi", None, None)
    assert first.settings == {"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3"} and first.bootstrap == ["hsn0:10.253.6.188"]
    assert first.net_paths == ["NET/AWS Libfabric/0/GDRDMA"] and first.local_paths == ["P2P/IPC"] and first.gdrdma
    assert sorted({d for i in inits[:4] for d in i.net_devices}) == [0, 1, 2, 3]
    assert all(i.complete and i.problems == [] for i in inits)


def test_rccl_without_the_plugin_falls_back_to_sockets():
    one, two = processes("rccl_socket_fallback.log")
    assert (one.host, one.library, one.version, one.build) == ("crusher002", "RCCL", "2.10.3", "+hip5.0")
    assert one.plugin_missing == "librccl-net.so not found" and one.plugin is None
    assert one.network == "Socket" and one.transport == "Socket" and one.problems == [NO_IB_DEVICE]
    assert one.socket_interfaces == ["bond0:100.65.2.2", "hsn0:10.129.0.13", "hsn1:10.129.0.14", "hsn2:10.129.0.15", "hsn3:10.129.0.16"]
    assert one.bootstrap == ["bond0:100.65.2.2"] and one.net_paths == ["NET/Socket/1"] and one.local_paths == []
    assert two.host == "crusher003" and two.version is None and two.complete


def test_nccl_socket_fallback_on_two_nodes():
    one, two = processes("nccl_socket_fallback.log")
    assert (one.host, one.version, one.build) == ("node-a", "2.18.3", "+cuda12.2")
    assert one.plugin_missing == "libnccl-net.so: cannot open shared object file: No such file or directory"
    assert one.problems == [NO_IBVERBS] and one.transport == "Socket"
    assert one.socket_interfaces == ["ens4:10.0.0.2"] and two.socket_interfaces == ["ens4:10.0.0.1"]
    assert one.net_paths == ["NET/Socket/0"] and one.gdrdma is False


def test_an_interface_setting_that_matches_nothing():
    one, two = processes("nccl_no_interface.log")
    assert one.settings == {"NCCL_SOCKET_IFNAME": "ib0"} and one.problems == [NO_INTERFACE]
    assert one.warnings == ["Bootstrap : no socket interface found"] and one.network is None and not one.complete
    assert two.host == "gpu618" and two.problems == [NO_INTERFACE]


def test_one_node_uses_only_p2p_and_shared_memory():
    one, two = processes("nccl_single_node.log")
    assert one.nodes == 1 and one.net_paths == [] and one.local_paths == ["P2P/IPC/read"] and two.local_paths == ["SHM/direct/direct"]
    assert one.network == "Socket" and one.problems == [NO_IB_DEVICE] and one.gdrdma is None


# ---------------------------------------------------------------------------------------------- the parser, other spellings

def _one(*messages: str, prefix: str = "h1:100:100 [0] NCCL INFO ") -> NcclInit:
    return parse_process("\n".join(prefix + m if not m.startswith(("NCCL version", "RCCL version")) else m for m in messages))


def test_ofi_provider_lines_of_every_plugin_version():
    assert _one("NET/OFI Selected Provider is cxi (found 8 nics)").ofi_nics == 8            # aws/aws-ofi-nccl#801
    newer = _one("NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)")          # aws-ofi-nccl's nccl_ofi_net.cpp
    assert (newer.ofi_provider, newer.ofi_fabric, newer.ofi_nics) == ("cxi", "cxi", 4)
    assert _one("NET/OFI Selected Provider is efa").ofi_provider == "efa"                    # aws/aws-ofi-nccl#161
    assert _one("NET/OFI Initializing aws-ofi-nccl 1.11.0-aws").plugin == "aws-ofi-nccl 1.11.0-aws"  # aws/aws-ofi-nccl#715
    assert _one("NET/OFI Using aws-ofi-nccl 1.3.0aws").plugin == "aws-ofi-nccl 1.3.0aws"
    assert _one("NET/OFI Using Libfabric version 1.22").plugin is None
    warned = _one("NET/OFI Couldn't find any optimal provider", prefix="h1:100:100 [0] nccl_ofi_net.c:612 NCCL WARN ")
    assert warned.problems == [NO_OFI_PROVIDER] and warned.warnings == ["NET/OFI Couldn't find any optimal provider"]


def test_plugin_lines_of_every_nccl_version():
    assert _one("NET/Plugin: Loaded net plugin AWS Libfabric (v10)").plugin == "AWS Libfabric (v10)"  # NVIDIA/nccl src/plugin/net
    gone = _one("NET/Plugin: Could not find: libnccl-net.so", "Initialized NET plugin IB", "Assigned NET plugin IB to comm")
    assert gone.plugin_missing == "libnccl-net.so not found" and gone.network == "IB"        # NVIDIA/nccl#1925
    dl = _one("NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found "
              "(libnccl-net.so), using internal implementation")                            # NVIDIA/nccl#1231
    assert dl.plugin_missing == "libnccl-net.so: cannot open shared object file: No such file or directory"
    sharp = _one("Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "P2P plugin IBext_v8",
                 "NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/IB/SHARP [4]mlx5_2:1/RoCE [RO]; OOB ib0.0065:10.1.32.3<0>",
                 "Using network IBext_v8")                                                   # NVIDIA/nccl#1737
    assert sharp.plugin == "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so" and sharp.transport == "IB"
    assert sharp.ib_devices == ["mlx5_0:1/IB/SHARP", "mlx5_1:1/IB/SHARP", "mlx5_2:1/RoCE"] and sharp.ib_oob == "ib0.0065:10.1.32.3"
    missing = _one("Error: network AWS Libfabric not found.", prefix="nid006352:34157:34217 [1] net.cc:626 NCCL WARN ")
    assert missing.problems == [NET_NOT_FOUND] and missing.host == "nid006352"               # eth-cscs/cscs-docs#75


def test_prefixes_versions_and_settings_in_other_spellings():
    stamped = parse_log("[2026-05-05 06:16:47] node-01:189884:189884 [3] NCCL INFO Using network Socket")
    assert [(p.host, p.pid, p.network) for p in stamped] == [("node-01", 189884, "Socket")]  # NCCL_DEBUG_TIMESTAMP_FORMAT
    assert _one("NCCL version 2.22.3+cuda12.6").version == "2.22.3"                           # 2.22: an INFO line
    rccl = parse_log("z292:58192:58192 [0] NCCL INFO NET/Plugin: No plugin found (librccl-net.so)\nRCCL version : 2.21.5-HEAD:9a0e6a1")
    assert (rccl[0].library, rccl[0].version, rccl[0].build, rccl[0].plugin_missing) == ("RCCL", "2.21.5", "-HEAD:9a0e6a1",
                                                                                         "librccl-net.so not found")
    assert _one("NCCL_SOCKET_IFNAME set to eth2").settings == {"NCCL_SOCKET_IFNAME": "eth2"}  # NVIDIA/nccl#1837
    assert _one("NCCL_IB_HCA set to mlx5_4").settings == {"NCCL_IB_HCA": "mlx5_4"}            # NVIDIA/nccl#1052
    ipv6 = _one("NET/Socket : Using [0]enx785ee8a015a1:10.59.6.30<0> [1]veth6f0b7dd:fe80::90a4:35ff:fe22:2c98%veth6f0b7dd<0>")
    assert ipv6.socket_interfaces == ["enx785ee8a015a1:10.59.6.30", "veth6f0b7dd:fe80::90a4:35ff:fe22:2c98%veth6f0b7dd"]
    assert _one("garbage", "Channel 00/02 :    0   1", "Trees [0] 1/-1/-1->0->-1").as_dict() == NcclInit(pid=100, host="h1").as_dict()


def test_the_process_asked_for_is_picked_from_a_shared_file():
    text = (FIXTURES / "nccl_socket_fallback.log").read_text()
    assert parse_process(text, pid=39964).host == "node-b"
    assert parse_process(text, pid=1).host in (None, "node-a")  # unknown pid: the processes merged
    assert transport_kind("IBext_v8") == "IB" and transport_kind("OFI") == "OFI" and transport_kind("Socket") == "Socket"


# ---------------------------------------------------------------------------------------------- the judge

def test_infiniband_passes_with_one_line_per_node():
    lines, found = judged("nccl_ib_gdrdma.log", expected_gbps=200.0)
    assert lines == ["gpu-a01: NCCL 2.21.5 over IB (mlx5_0:1/IB, mlx5_1:1/IB; GPUDirect RDMA; OOB ib0)",
                     "gpu-a02: NCCL 2.21.5 over IB (mlx5_0:1/IB, mlx5_1:1/IB; GPUDirect RDMA; OOB ib0)"]
    assert [(f.level, f.message) for f in found] == [("ok", "all 2 nodes talk over IB")]


def test_infiniband_without_gpudirect_rdma_is_ok_with_a_note():
    lines, found = judged("nccl_ib_no_gdr.log", nccl="2.8.3")
    assert lines[0] == "node-1: NCCL 2.8.3 over IB (mlx5_0:1/IB; no GPUDirect RDMA; OOB eth0)"
    assert levels(found, "ok") == ["all 2 nodes talk over IB"]
    assert levels(found, "info") == ["IB without GPUDirect RDMA: every byte is staged through host memory"]
    assert "nvidia_peermem" in found[1].fix


def test_lumi_ofi_passes():
    lines, found = judged("rccl_ofi_lumi.log", hip="6.0", nccl="2.18.3", expected_gbps=100.0)
    assert lines == ["nid005001: RCCL 2.18.3 over OFI (aws-ofi-rccl 1.4.0, provider cxi, 4 NICs in use, GPUDirect RDMA)",
                     "nid005002: RCCL 2.18.3 over OFI (aws-ofi-rccl 1.4.0, provider cxi, 4 NICs in use, GPUDirect RDMA)"]
    assert [(f.level, f.message) for f in found] == [("ok", "all 2 nodes talk over OFI")]


def test_rccl_socket_fallback_warns_with_its_cost_and_the_lumi_fix():
    sweep = [{"bytes": 2**28, "busbw_gbps": 1.1}]
    lines, found = judged("rccl_socket_fallback.log", hip="5.0", nccl="2.10.3", sweep=sweep, expected_gbps=100.0)
    assert lines[0] == ("crusher002: RCCL 2.10.3 over TCP sockets (bond0, hsn0, hsn1, hsn2, hsn3; no IB device; "
                        "no net plugin: librccl-net.so not found)")
    assert [f.level for f in found] == ["warn"]
    assert found[0].message == ("2 nodes talk over TCP sockets, not the fabric: the all-reduce reached 1.1 GB/s busbw, "
                                "1% of the 100 GB/s the profile expects off the node")
    assert LUMI_BINDINGS in found[0].fix and "aws-ofi-rccl" in found[0].fix and "lumi-multitorch-*" in found[0].fix


def test_nccl_socket_fallback_warns_and_names_the_missing_library():
    lines, found = judged("nccl_socket_fallback.log", nccl="2.18.3", expected_gbps=200.0)
    assert lines == ["node-a: NCCL 2.18.3 over TCP sockets (ens4; libibverbs not found; no net plugin: libnccl-net.so not found)",
                     "node-b: NCCL 2.18.3 over TCP sockets (ens4; libibverbs not found; no net plugin: libnccl-net.so not found)"]
    assert levels(found, "warn") == ["2 nodes talk over TCP sockets, not the fabric: expect a fraction of the 200 GB/s the "
                                     "profile expects off the node"]
    assert "rdma-core" in found[0].fix and "/dev/infiniband" in found[0].fix
    _, bare = judged("nccl_socket_fallback.log", nccl="2.18.3")
    assert bare[0].message.endswith("expect a fraction of the fabric's bandwidth")


def test_no_interface_fails_with_the_fix():
    lines, found = judged("nccl_no_interface.log", nccl="2.4.8")
    assert lines == ["gpu617: NCCL 2.4.8 could not start: no socket interface found (NCCL_SOCKET_IFNAME=ib0)",
                     "gpu618: NCCL 2.4.8 could not start: no socket interface found (NCCL_SOCKET_IFNAME=ib0)"]
    assert [(f.level, f.message) for f in found] == [
        ("fail", "NCCL found no socket interface on gpu617, gpu618 (NCCL_SOCKET_IFNAME=ib0): it cannot start across ranks")]
    assert "set NCCL_SOCKET_IFNAME to interfaces every node has" in found[0].fix


def test_nodes_with_different_transports_fail():
    ib = processes("nccl_ib_gdrdma.log")[:2]        # gpu-a01 over IB
    socket_node = processes("nccl_socket_fallback.log")[1]  # node-b over sockets
    facts, logs = world(*ib, socket_node)
    lines, found = judge_network(facts, logs)
    assert [ln["transport"] for ln in lines] == ["IB", "Socket"]
    assert [(f.level, f.message) for f in found] == [
        ("fail", "the nodes chose different transports (gpu-a01: IB, node-b: Socket): mismatched transports hang or crawl")]


def test_one_node_is_information_only():
    lines, found = judged("nccl_single_node.log")
    assert lines == ["dgx01: NCCL 2.21.5 within the node only: P2P/IPC, SHM (network Socket set up, used only across nodes)"]
    assert [(f.level, f.message) for f in found] == [
        ("info", "one node: NCCL connects its GPUs with P2P/IPC, SHM; the network path (Socket here) is only exercised across nodes")]


def test_one_rank_says_its_network_is_set_up_but_unused_and_the_capture_notes_are_reported():
    one = parse_process("gpu-a01:41234:41301 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.0.35.1<0>\n"
                        "gpu-a01:41234:41301 [0] NCCL INFO Using network IB\nNCCL version 2.21.5+cuda12.4\n")
    facts, logs = world(one)
    logs[0]["notes"] = ["NCCL_DEBUG=WARN raised to INFO for the doctor's run"]
    lines, found = judge_network(facts, logs)
    assert lines[0]["line"] == "gpu-a01: NCCL 2.21.5 within the node only: one rank, no peer (network IB set up, used only across nodes)"
    assert [(f.level, f.message) for f in found] == [
        ("info", "NCCL's log: NCCL_DEBUG=WARN raised to INFO for the doctor's run"),
        ("info", "one node: one rank: nothing to connect; the network path (IB here) is only exercised across nodes")]


def test_an_nccl_error_without_a_log_fails_and_a_missing_capture_is_said():
    facts, logs = world(*processes("nccl_ib_gdrdma.log")[:1], *processes("nccl_socket_fallback.log")[1:])
    logs[1] = {"init": None, "error": "Bootstrap : no socket interface found"}
    lines, found = judge_network(facts, logs)
    assert lines[1]["line"] == "node-b: NCCL 2.21.5 could not start: Bootstrap : no socket interface found"
    assert [f.level for f in found] == ["fail"] and found[0].message == lines[1]["line"]
    _, none = judge_network(facts, None, note="ranks share a GPU (NCCL refuses that)")
    assert [(f.level, f.message) for f in none] == [("info", "NCCL's log was not read: ranks share a GPU (NCCL refuses that)")]


def test_ofi_on_libfabrics_tcp_provider_warns():
    inits = processes("rccl_ofi_lumi.log")
    for init in inits:
        init.ofi_provider = "tcp"
    facts, logs = world(*inits, hip="6.0")
    _, found = judge_network(facts, logs)
    assert levels(found, "warn") == ["OFI runs on libfabric's tcp provider: sockets by another name, expect a fraction of "
                                     "the fabric's bandwidth"]
    assert "/dev/cxi" in found[0].fix


# ---------------------------------------------------------------------------------------------- gloo

INTERFACES = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.99.0.11"], "hsn0": ["10.253.6.188"]}


def test_gloo_binds_what_the_host_name_resolves_to():
    found = gloo_endpoint({}, "n1", resolve=lambda h: ["10.99.0.11"], bindable=lambda a: True, interfaces=INTERFACES)
    assert found["rule"] == "host name" and found["devices"] == [{"interface": "eth0", "address": "10.99.0.11"}]
    assert not found["loopback"]


def test_a_host_name_on_127_0_1_1_or_unresolvable_means_loopback():
    debian = gloo_endpoint({}, "n1", resolve=lambda h: ["127.0.1.1"], bindable=lambda a: True, interfaces=INTERFACES)
    assert debian["devices"] == [{"interface": "lo", "address": "127.0.1.1"}] and debian["loopback"]
    lost = gloo_endpoint({}, "n1", resolve=lambda h: [], bindable=lambda a: True, interfaces=INTERFACES)
    assert lost["rule"] == "loopback fallback" and lost["devices"][0]["address"] == "127.0.0.1" and lost["loopback"]
    foreign = gloo_endpoint({}, "n1", resolve=lambda h: ["10.0.0.9"], bindable=lambda a: False, interfaces=INTERFACES)
    assert foreign["rule"] == "loopback fallback"


def test_gloo_socket_ifname_picks_the_interfaces():
    chosen = gloo_endpoint({"GLOO_SOCKET_IFNAME": "hsn0,eth9"}, "n1", resolve=lambda h: ["127.0.1.1"], interfaces=INTERFACES)
    assert chosen["rule"] == "GLOO_SOCKET_IFNAME" and not chosen["loopback"]
    assert chosen["devices"] == [{"interface": "hsn0", "address": "10.253.6.188"}, {"interface": "eth9", "address": None}]
    assert gloo_endpoint({"GLOO_SOCKET_IFNAME": "lo"}, "n1", interfaces=INTERFACES)["loopback"]
    assert is_loopback("127.0.1.1") and is_loopback("::1") and not is_loopback("10.0.0.1") and not is_loopback("eth0")


def test_gloo_endpoint_on_this_machine_is_consistent():
    here = gloo_endpoint(os.environ | {"GLOO_SOCKET_IFNAME": ""})
    assert here["devices"] and here["devices"][0]["address"]


def _gloo_facts(*hosts_addresses):
    facts = []
    for r, (host, address) in enumerate(hosts_addresses):
        gloo = gloo_endpoint({}, host, resolve=lambda h, a=address: [a], bindable=lambda a: True, interfaces=INTERFACES)
        facts.append({"host": host, "rank": r, "gpu": None, "versions": {}, "gloo": gloo})
    return facts


def test_gloo_lines_and_verdicts():
    lines, found = judge_network(_gloo_facts(("n1", "10.99.0.11"), ("n2", "10.99.0.11")))
    assert [ln["line"] for ln in lines] == ["n1: gloo over TCP on eth0 10.99.0.11 (host name n1 resolves to it)",
                                            "n2: gloo over TCP on eth0 10.99.0.11 (host name n2 resolves to it)"]
    assert [(f.level, f.message) for f in found] == [("ok", "gloo binds a routable address on all 2 nodes")]
    _, bad = judge_network(_gloo_facts(("n1", "10.99.0.11"), ("n2", "127.0.1.1")))
    assert [f.level for f in bad] == ["fail"]
    assert bad[0].message == ("gloo binds a loopback address (rank 1 on n2: 127.0.1.1): ranks on other nodes cannot reach it, "
                              "the classic multi-node hang")
    assert "GLOO_SOCKET_IFNAME" in bad[0].fix and "/etc/hosts" in bad[0].fix
    _, alone = judge_network(_gloo_facts(("n1", "127.0.1.1"), ("n1", "127.0.1.1")))
    assert [f.level for f in alone] == ["info"]


def test_gloo_loopback_before_the_ranks_meet():
    gloo = gloo_endpoint({}, "n2", resolve=lambda h: ["127.0.1.1"], bindable=lambda a: True, interfaces=INTERFACES)
    said = gloo_loopback(gloo, "n2", 1, num_nodes=2)
    assert said.startswith("rank 1 on n2: gloo would bind the loopback address 127.0.1.1 (host name n2 resolves to it), "
                           "which ranks on the other 1 node(s) cannot reach: the classic multi-node hang. Fix: export GLOO_SOCKET_IFNAME=")
    assert gloo_loopback(gloo, "n2", 1, num_nodes=1) is None
    by_name = gloo_endpoint({"GLOO_SOCKET_IFNAME": "lo"}, "n2", interfaces=INTERFACES)
    assert "(GLOO_SOCKET_IFNAME=lo)" in gloo_loopback(by_name, "n2", 0, num_nodes=2)


# ---------------------------------------------------------------------------------------------- capture and report

def test_capture_points_nccl_at_a_private_file_and_restores_everything():
    environ = {"PATH": "/bin"}
    with NcclLogCapture(environ, host="gpu-a01.cluster") as capture:
        assert environ["NCCL_DEBUG"] == "INFO" and environ["NCCL_DEBUG_SUBSYS"] == "INIT,NET,ENV"
        folder = capture.folder
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        path = capture.path(4242)
        assert path == folder / "nccl.gpu-a01.4242.log"
        path.write_text("gpu-a01:4242:4242 [0] NCCL INFO Using network IB\n")
        assert parse_process(capture.read(4242), 4242).network == "IB" and capture.read(7) == ""
    assert environ == {"PATH": "/bin"} and not folder.exists()


def test_capture_keeps_the_users_file_and_filter_and_raises_a_low_level(tmp_path):
    environ = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": str(tmp_path / "mine.%h.%p")}
    with NcclLogCapture(environ, host="n1") as capture:
        assert environ["NCCL_DEBUG"] == "INFO" and environ["NCCL_DEBUG_SUBSYS"] == "INIT" and capture.folder is None
        (tmp_path / "mine.n1.99").write_text("n1:99:99 [0] NCCL INFO Using network Socket\n")
        assert "Using network Socket" in capture.read(99)
    assert environ["NCCL_DEBUG"] == "WARN" and (tmp_path / "mine.n1.99").exists()
    assert capture.notes == ["NCCL_DEBUG=WARN raised to INFO for the doctor's run", "NCCL_DEBUG_SUBSYS=INIT kept",
                             f"read from NCCL_DEBUG_FILE={tmp_path}/mine.%h.%p"]
    assert expand_debug_file("/tmp/nccl.%h.%p.log", "nid005001.lumi", 12) == "/tmp/nccl.nid005001.12.log"
    kept = {"NCCL_DEBUG": "trace"}
    with NcclLogCapture(kept, host="n1"):
        assert kept["NCCL_DEBUG"] == "trace"


def test_the_report_has_a_network_section_and_json_carries_it():
    facts, logs = world(*processes("rccl_ofi_lumi.log"), hip="6.0", nccl="2.18.3")
    for f in facts:
        f.update({"local_rank": 0, "world_size": 8, "local_world_size": 4, "launcher": "slurm", "master": "nid005001:29500",
                  "visible_devices": None, "gpus_seen": ["x"], "gpu_index": 0, "gpu_numa": None, "cores": [1], "cores_numa": [],
                  "threads": 7, "device_name": "AMD Instinct MI250X", "environ": {}})
    network, found = judge_network(facts, logs)
    text = format_text(facts, found, None, "nccl", now=datetime.datetime(2026, 1, 1), network=network)
    section = text.split("network (NCCL/RCCL's own log, one line per node):\n")[1].split("\n\n")[0].splitlines()
    assert section == ["  nid005001: RCCL 2.18.3 over OFI (aws-ofi-rccl 1.4.0, provider cxi, 4 NICs in use, GPUDirect RDMA)",
                       "  nid005002: RCCL 2.18.3 over OFI (aws-ofi-rccl 1.4.0, provider cxi, 4 NICs in use, GPUDirect RDMA)"]
    assert "  ok    network      all 2 nodes talk over OFI" in text
    data = json.loads(json.dumps(as_json(facts, found, None, "nccl", network=network, nccl=logs)))
    assert [n["host"] for n in data["network"]["nodes"]] == ["nid005001", "nid005002"]
    assert data["network"]["ranks"]["0"]["init"]["ofi_provider"] == "cxi"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_every_fixture_is_named_in_sources(name):
    assert f"`{name}`" in (FIXTURES / "SOURCES.md").read_text()
