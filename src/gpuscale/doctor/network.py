"""The network preflight: what each node really uses to talk to the others, in one line per node, and its verdict.

Multi-node hangs and crawls most often come from the network path, not from the script: a wrong
interface, NCCL/RCCL silently falling back to TCP sockets, a container without the OFI plugin, a
host name that resolves to a loopback address. Two sources say what was chosen:

* GPU ranks: NCCL's/RCCL's own initialisation log (``gpuscale.doctor.ncclog`` reads it; the doctor
  captures it around a small all-reduce, see ``gpuscale.doctor.nccl_capture``): the network
  (IB, OFI with its provider and NICs, or Socket), the interfaces, the plugin, the channel paths.
* CPU ranks (gloo): no log exists; ``gpuscale.doctor.gloonet`` replays torch's rule for the
  address gloo binds to, and each rank reports it with its facts (``facts['gloo']``).

`judge_network` turns them into one line per node and `Finding`s (area 'network'):

    fail   NCCL/RCCL could not start (no socket interface found, a plugin NCCL_NET names is missing,
           an init error); nodes that chose different transports (they hang or crawl); a multi-node
           gloo rank bound to a loopback address (the others cannot reach it)
    warn   a multi-node GPU job on TCP sockets (with the cost: the measured busbw against the
           profile's figure off the node, and the fix); OFI over libfabric's tcp provider
    ok     every node on the fabric (IB, OFI) or, on CPU, gloo on a routable address
    info   one node (only P2P/SHM inside it: the network is not exercised); IB without GPUDirect
           RDMA; a log that did not say

Pure: reads the gathered facts and parsed logs only.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscale.doctor.checks import Finding
from gpuscale.doctor.ncclog import NET_NOT_FOUND, NO_IB_DEVICE, NO_IBVERBS, NO_INTERFACE, NO_OFI_PROVIDER, NcclInit, merge

__all__ = ["judge_network", "node_lines", "gloo_loopback", "LUMI_BINDINGS", "GLOO_FIX"]

Facts = Mapping[str, Any]

LUMI_BINDINGS = "module use /appl/local/laifs/modules; module load lumi-aif-singularity-bindings"
GLOO_FIX = ("export GLOO_SOCKET_IFNAME=<the interface toward the other nodes> (ip -br addr), or make the host name resolve "
            "to that interface's address in /etc/hosts, not 127.0.1.1")
SLOW_OFI_PROVIDERS = ("tcp", "sockets", "udp")


# ---------------------------------------------------------------------------------------------- per node

def _by_host(facts: Sequence[Facts]) -> dict[str, list[Facts]]:
    hosts: dict[str, list[Facts]] = defaultdict(list)
    for f in sorted(facts, key=lambda f: f["rank"]):
        hosts[f["host"]].append(f)
    return dict(sorted(hosts.items()))


def _node_init(here: Sequence[Facts], nccl: Mapping[int, Mapping[str, Any]]) -> NcclInit | None:
    """The node's ranks' parsed logs folded into one (None: no rank of the node has one)."""
    found = [NcclInit.from_dict(nccl[f["rank"]]["init"]) for f in here if nccl.get(f["rank"], {}).get("init")]
    if not found:
        return None
    node = NcclInit(host=here[0]["host"])
    for init in found:
        merge(node, init)
    return node


def _errors(here: Sequence[Facts], nccl: Mapping[int, Mapping[str, Any]]) -> list[str]:
    return [str(nccl[f["rank"]]["error"]) for f in here if nccl.get(f["rank"], {}).get("error")]


def _library(init: NcclInit | None, first: Facts) -> str:
    versions = first.get("versions") or {}
    library = (init and init.library) or ("RCCL" if versions.get("hip") else "NCCL")
    version = (init and init.version) or versions.get("nccl") or "?"
    return f"{library} {version}"


def _names(interfaces: Sequence[str]) -> str:
    return ", ".join(dict.fromkeys(i.split(":")[0] for i in interfaces))


def _nics(init: NcclInit) -> str | None:
    if init.ofi_nics is not None:
        return f"{init.ofi_nics} NIC{'s' if init.ofi_nics != 1 else ''}"
    used = init.net_devices
    return f"{len(used)} NIC{'s' if len(used) != 1 else ''} in use" if used else None


def _gdr(init: NcclInit) -> str | None:
    return None if init.gdrdma is None else "GPUDirect RDMA" if init.gdrdma else "no GPUDirect RDMA"


def _describe(init: NcclInit, multi_node: bool, ranks: int) -> str:
    """'over IB (...)', 'over OFI (...)', 'over TCP sockets (...)', 'within the node only: ...', or what else the log said."""
    kind = init.transport
    if not multi_node and not init.net_paths:
        unused = f" (network {init.network} set up, used only across nodes)" if init.network else ""
        paths = ", ".join(_short_local(init.local_paths)) or ("one rank, no peer" if ranks == 1 else "no channel paths in the log")
        return f"within the node only: {paths}{unused}"
    if kind == "IB":
        parts = [", ".join(init.ib_devices) or None, _gdr(init), f"plugin {init.plugin}" if init.plugin else None,
                 f"OOB {init.ib_oob.split(':')[0]}" if init.ib_oob else None]
        return f"over IB ({'; '.join(p for p in parts if p)})"
    if kind == "OFI":
        parts = [init.plugin or "OFI plugin", f"provider {init.ofi_provider}" if init.ofi_provider else None, _nics(init), _gdr(init)]
        return f"over OFI ({', '.join(p for p in parts if p)})"
    if kind == "Socket":
        interfaces = init.socket_interfaces or init.bootstrap
        parts = [_names(interfaces) or None, _why_no_ib(init),
                 f"no net plugin: {_short_missing(init.plugin_missing)}" if init.plugin_missing else None]
        return f"over TCP sockets ({'; '.join(p for p in parts if p)})"
    if kind:
        return f"over {init.network or kind}" + (f" ({_gdr(init)})" if _gdr(init) else "")
    return "network not stated in its log (NCCL_DEBUG_SUBSYS must include INIT and NET)"


def _why_no_ib(init: NcclInit) -> str | None:
    return ("libibverbs not found" if NO_IBVERBS in init.problems else "no IB device" if NO_IB_DEVICE in init.problems
            else None)


def _short_missing(text: str) -> str:
    """dlerror's 'libnccl-net.so: cannot open shared object file: No such file or directory' -> 'libnccl-net.so not found'."""
    m = re.match(r"^(?P<lib>\S+\.so\S*): cannot open shared object file", text)
    return f"{m.group('lib')} not found" if m else text


def _short_local(paths: Sequence[str]) -> list[str]:
    """'P2P/IPC/read', 'P2P/IPC' -> 'P2P/IPC'; 'SHM/direct/direct' -> 'SHM': the transport, not its variant."""
    return list(dict.fromkeys("/".join(p.split("/")[:2]) if p.startswith("P2P/") else p.split("/")[0] for p in paths))


def _nccl_line(host: str, here: Sequence[Facts], nccl: Mapping[int, Mapping[str, Any]], multi_node: bool) -> dict[str, Any]:
    init = _node_init(here, nccl)
    errors = _errors(here, nccl)
    head = f"{host}: {_library(init, here[0])}"
    if NO_INTERFACE in (init.problems if init else []):
        spec = init.settings.get("NCCL_SOCKET_IFNAME") if init else None
        text = f"{head} could not start: no socket interface found" + (f" (NCCL_SOCKET_IFNAME={spec})" if spec else "")
    elif errors:
        text = f"{head} could not start: {errors[0].splitlines()[0][:160]}"
    elif init is None:
        text = f"{head} (its log was not read)"
    else:
        text = f"{head} {_describe(init, multi_node, len(here))}"
    return {"host": host, "ranks": [f["rank"] for f in here], "line": text,
            "transport": init.transport if init else None, "init": init.as_dict() if init else None}


def _gloo_line(host: str, here: Sequence[Facts]) -> dict[str, Any]:
    seen = []
    for f in here:
        gloo = f.get("gloo") or {}
        for dev in gloo.get("devices") or []:
            seen.append((dev.get("interface") or "?", dev.get("address") or "no address", _gloo_reason(gloo)))
    unique = list(dict.fromkeys(seen))
    if not unique:
        return {"host": host, "ranks": [f["rank"] for f in here], "line": f"{host}: gloo: its address was not reported", "transport": "gloo"}
    described = "; ".join(f"{iface} {addr} ({why})" for iface, addr, why in unique)
    return {"host": host, "ranks": [f["rank"] for f in here], "line": f"{host}: gloo over TCP on {described}",
            "transport": "gloo", "loopback": any((f.get("gloo") or {}).get("loopback") for f in here)}


def _gloo_reason(gloo: Mapping[str, Any]) -> str:
    rule = gloo.get("rule")
    if rule == "GLOO_SOCKET_IFNAME":
        return "GLOO_SOCKET_IFNAME"
    if rule == "loopback fallback":
        return f"host name {gloo.get('hostname')} resolves to no local address: loopback fallback"
    return f"host name {gloo.get('hostname')} resolves to it"


def node_lines(facts: Sequence[Facts], nccl: Mapping[int, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One entry per node: {'host', 'ranks', 'line', 'transport', ...}; NCCL's log where read, else gloo's address."""
    gpu = any(f.get("gpu") for f in facts)
    hosts = _by_host(facts)
    lines = []
    for host, here in hosts.items():
        if gpu and nccl is not None:
            lines.append(_nccl_line(host, here, nccl, len(hosts) > 1))
        else:
            lines.append(_gloo_line(host, here))
    return lines


# ---------------------------------------------------------------------------------------------- verdicts

def _best_busbw(sweep: Sequence[Mapping[str, Any]] | None) -> float | None:
    return max((r["busbw_gbps"] for r in sweep), default=None) if sweep else None


def _socket_cost(sweep: Sequence[Mapping[str, Any]] | None, expected_gbps: float | None) -> str:
    """The price of the socket fallback, from what was measured and what the profile expects off the node."""
    measured = _best_busbw(sweep)
    if measured is not None and expected_gbps:
        return (f"the all-reduce reached {measured:.3g} GB/s busbw, {measured / expected_gbps:.0%} of the {expected_gbps:g} GB/s "
                "the profile expects off the node")
    if measured is not None:
        return f"the all-reduce reached {measured:.3g} GB/s busbw"
    if expected_gbps:
        return f"expect a fraction of the {expected_gbps:g} GB/s the profile expects off the node"
    return "expect a fraction of the fabric's bandwidth"


def _socket_fix(inits: Sequence[NcclInit], amd: bool) -> str:
    """The fix that fits the evidence: the OFI plugin (Slingshot, LUMI), IB's device or library, the interface."""
    problems = {p for i in inits for p in i.problems}
    names = {n.split(":")[0] for i in inits for n in i.socket_interfaces + i.bootstrap}
    slingshot = any(n.startswith("hsn") for n in names)
    if NO_OFI_PROVIDER in problems:
        return ("the OFI plugin loaded but libfabric offered no provider for the fabric: the host's libfabric and devices "
                f"are not visible to the job (LUMI: `{LUMI_BINDINGS}`; elsewhere bind /opt/cray and libcxi, or /dev/infiniband "
                "for EFA/verbs)")
    if amd or slingshot:
        plugin = "aws-ofi-rccl (librccl-net.so)" if amd else "aws-ofi-nccl (libnccl-net.so)"
        return (f"give the job the {plugin} plugin and Slingshot's libfabric: on LUMI an AI Factory image (lumi-multitorch-*) "
                f"after `{LUMI_BINDINGS}`, as the lumi-g profile's batch scripts do (or bind /opt/cray, libcxi and the plugin's "
                "folder on LD_LIBRARY_PATH), or an image that carries the plugin")
    if NO_IBVERBS in problems:
        return ("the image has no libibverbs: install rdma-core (libibverbs) in it and expose /dev/infiniband, then NCCL "
                "picks IB; check NCCL_IB_HCA and NCCL_SOCKET_IFNAME")
    if NO_IB_DEVICE in problems:
        return ("NCCL saw no InfiniBand/RoCE device: expose /dev/infiniband to the job (container --device / --privileged "
                "network), check NCCL_IB_HCA names an active HCA (ibstat) and NCCL_IB_DISABLE is unset; on EFA or Slingshot "
                "install the aws-ofi-nccl plugin")
    return "check NCCL_SOCKET_IFNAME, NCCL_IB_HCA and NCCL_NET, and that the fabric's plugin or libibverbs is in the image"


def _start_failures(lines: Sequence[Mapping[str, Any]]) -> list[Finding]:
    found = []
    no_if = [ln for ln in lines if ln.get("init") and NO_INTERFACE in ln["init"]["problems"]]
    if no_if:
        spec = next((ln["init"]["settings"].get("NCCL_SOCKET_IFNAME") for ln in no_if if ln["init"]["settings"].get("NCCL_SOCKET_IFNAME")), None)
        found.append(Finding("fail", "network", f"NCCL found no socket interface on {', '.join(ln['host'] for ln in no_if)}"
                             + (f" (NCCL_SOCKET_IFNAME={spec})" if spec else "") + ": it cannot start across ranks",
                             "set NCCL_SOCKET_IFNAME to interfaces every node has (ip -br addr; LUMI: hsn0,hsn1,hsn2,hsn3), "
                             "or unset it to let NCCL pick"))
    missing = [ln for ln in lines if ln.get("init") and NET_NOT_FOUND in ln["init"]["problems"]]
    if missing:
        net = missing[0]["init"]["settings"].get("NCCL_NET") or "the network NCCL_NET names"
        found.append(Finding("fail", "network", f"NCCL_NET={net} did not load on {', '.join(ln['host'] for ln in missing)}: "
                             "NCCL refuses to start without it", f"make the plugin loadable (its folder on LD_LIBRARY_PATH; LUMI: "
                             f"`{LUMI_BINDINGS}`), or unset NCCL_NET"))
    failed = [ln for ln in lines if "could not start" in ln["line"] and ln not in no_if]
    for ln in failed:
        found.append(Finding("fail", "network", ln["line"], "read NCCL's WARN lines (NCCL_DEBUG=INFO) for the cause; "
                             "the checks above name the usual ones"))
    return found


def _multi_node(lines: Sequence[Mapping[str, Any]], sweep: Any, expected_gbps: float | None, amd: bool) -> list[Finding]:
    """Verdicts on the transport between nodes: the same one everywhere, and the fabric rather than sockets."""
    kinds = {ln["host"]: ln["transport"] for ln in lines if ln["transport"]}
    if len(set(kinds.values())) > 1:
        views = ", ".join(f"{h}: {k}" for h, k in kinds.items())
        return [Finding("fail", "network", f"the nodes chose different transports ({views}): mismatched transports hang or crawl",
                        "run every node with the same image, modules and fabric libraries; compare NCCL_NET, NCCL_IB_HCA, "
                        "NCCL_SOCKET_IFNAME and the plugin's presence on the odd node(s)")]
    if not kinds:
        return [Finding("info", "network", "the log did not say which transport carries traffic between nodes",
                        "keep NCCL_DEBUG_SUBSYS unset (doctor sets INIT,NET,ENV) so that NCCL says")]
    kind = next(iter(kinds.values()))
    inits = [NcclInit.from_dict(ln["init"]) for ln in lines if ln.get("init")]
    if kind == "Socket":
        return [Finding("warn", "network", f"{len(lines)} nodes talk over TCP sockets, not the fabric: "
                        f"{_socket_cost(sweep, expected_gbps)}", _socket_fix(inits, amd))]
    slow = sorted({i.ofi_provider for i in inits if i.ofi_provider in SLOW_OFI_PROVIDERS})
    if kind == "OFI" and slow:
        return [Finding("warn", "network", f"OFI runs on libfabric's {', '.join(slow)} provider: sockets by another name, "
                        f"{_socket_cost(sweep, expected_gbps)}", "give the job the fabric's devices (Slingshot: /dev/cxi*, "
                        "FI_PROVIDER=cxi; EFA: /dev/infiniband) and the host's libfabric")]
    found = [Finding("ok", "network", f"all {len(lines)} nodes talk over {kind}")]
    if kind == "IB" and any(i.gdrdma is False for i in inits):
        found.append(Finding("info", "network", "IB without GPUDirect RDMA: every byte is staged through host memory",
                             "load the nvidia_peermem kernel module (or use a driver with DMA-BUF), then check "
                             "NCCL_NET_GDR_LEVEL"))
    return found


def _gloo_verdicts(lines: Sequence[Mapping[str, Any]], facts: Sequence[Facts]) -> list[Finding]:
    if len(lines) < 2:
        return [Finding("info", "network", "one node: gloo's traffic stays on this host; the network path is only used across nodes")]
    bad = [f for f in facts if (f.get("gloo") or {}).get("loopback")]
    if not bad:
        return [Finding("ok", "network", f"gloo binds a routable address on all {len(lines)} nodes")]
    where = "; ".join(f"rank {f['rank']} on {f['host']}: {(f['gloo']['devices'] or [{}])[0].get('address')}" for f in bad)
    return [Finding("fail", "network", f"gloo binds a loopback address ({where}): ranks on other nodes cannot reach it, "
                    "the classic multi-node hang", GLOO_FIX)]


def gloo_loopback(gloo: Mapping[str, Any], host: str, rank: int, num_nodes: int) -> str | None:
    """Before the ranks meet: why this rank's gloo cannot reach other nodes (one line with its fix), or None.

    gloo's own group would fail or hang on it, and the doctor meets over gloo: said first, in words.
    """
    if num_nodes < 2 or not gloo.get("loopback"):
        return None
    address = next((d["address"] for d in gloo.get("devices") or [] if d.get("address")), "?")
    why = (f"GLOO_SOCKET_IFNAME={','.join(d['interface'] for d in gloo['devices'])}" if gloo.get("rule") == "GLOO_SOCKET_IFNAME"
           else f"host name {gloo.get('hostname')} resolves to it" if gloo.get("rule") == "host name"
           else f"host name {gloo.get('hostname')} resolves to no local address")
    return (f"rank {rank} on {host}: gloo would bind the loopback address {address} ({why}), which ranks on the other "
            f"{num_nodes - 1} node(s) cannot reach: the classic multi-node hang. Fix: {GLOO_FIX}")


def _one_node(line: Mapping[str, Any]) -> Finding:
    init = NcclInit.from_dict(line["init"]) if line.get("init") else NcclInit()
    chosen = f" ({init.network} here)" if init.network else ""
    if len(line["ranks"]) == 1:
        inside = "one rank: nothing to connect"
    else:
        inside = f"{init.library or 'NCCL'} connects its GPUs with {', '.join(_short_local(init.local_paths)) or 'paths its log did not name'}"
    return Finding("info", "network", f"one node: {inside}; the network path{chosen} is only exercised across nodes")


def judge_network(facts: Sequence[Facts], nccl: Mapping[int, Mapping[str, Any]] | None = None, *,
                  sweep: Sequence[Mapping[str, Any]] | None = None, expected_gbps: float | None = None,
                  note: str | None = None) -> tuple[list[dict[str, Any]], list[Finding]]:
    """(one entry per node with its 'line', the network Findings) for the gathered facts and parsed logs.

    nccl: rank -> {'init': NcclInit.as_dict() or None, 'error': NCCL's error text or None}, for GPU
    ranks whose NCCL log was captured (None: not captured; `note` then says why). sweep and
    expected_gbps price a socket fallback: the measured busbw against the profile's figure.
    """
    lines = node_lines(facts, nccl)
    gpu = any(f.get("gpu") for f in facts)
    if not gpu:
        return lines, _gloo_verdicts(lines, facts)
    if nccl is None:
        return lines, [Finding("info", "network", f"NCCL's log was not read: {note or 'no NCCL group was made'}")]
    notes = [Finding("info", "network", f"NCCL's log: {'; '.join(n)}") for n in [(nccl.get(0) or {}).get("notes")] if n]
    found = _start_failures(lines)
    if found:
        return lines, notes + found
    if len(lines) < 2:
        return lines, notes + [_one_node(lines[0])]
    amd = any((f.get("versions") or {}).get("hip") for f in facts)
    return lines, notes + _multi_node(lines, sweep, expected_gbps, amd)
