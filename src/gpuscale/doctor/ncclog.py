"""NCCL's and RCCL's own initialisation log, read: which transport each process chose, over what.

With ``NCCL_DEBUG=INFO`` (and ``NCCL_DEBUG_SUBSYS`` including ``INIT`` and ``NET``) NCCL and RCCL say,
process by process, which network they use and why. RCCL prints the same lines as NCCL (it is NCCL's
fork; its lines say ``NCCL INFO`` too). Every line carries a prefix ``host:pid:tid [device]``, an
optional ``file.cc:line`` before ``NCCL WARN``, and newer versions an optional timestamp; a few lines
(``NCCL version 2.18.3+cuda12.2``, ``RCCL version 2.18.3+hip6.0``) come without one and belong to the
process that printed last. This module reads, per process:

    library and version     NCCL version 2.21.5+cuda12.4 / RCCL version 2.18.3+hip6.0 HEAD:2f6d59e+
    net plugin              NET/OFI Using aws-ofi-rccl 1.4.0 / NET/OFI Initializing aws-ofi-nccl 1.11.0-aws /
                            NET/Plugin: Loaded net plugin AWS Libfabric (v6) / Plugin Path : ... /
                            or not found: NET/Plugin : No plugin found (libnccl-net.so) ... with dlerror's text
    network chosen          Using network IB | Socket | AWS Libfabric | IBext_v8 | OFI ...
    OFI provider and NICs   NET/OFI Selected Provider is cxi (found 4 nics) (and the older and newer spellings)
    IB devices              NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.1.1.1<0>
    socket interfaces       NET/Socket : Using [0]eth0:10.0.0.5<0> [1]hsn0:10.1.0.5<0>
    bootstrap interface     Bootstrap : Using eth0:10.0.0.5<0>
    settings echoed         NCCL_SOCKET_IFNAME set by environment to hsn0,hsn1 / NCCL_IB_HCA set to mlx5_4
    channel paths           Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA | via P2P/IPC | via SHM/direct/direct
    nodes                   comm 0x.. rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
    trouble                 NET/IB : No device found. / Failed to open libibverbs.so[.1] /
                            NET/OFI Couldn't find any optimal provider / Bootstrap : no socket interface found /
                            Error: network AWS Libfabric not found. / any other NCCL WARN

Unknown lines are ignored, so a log of any version parses to whatever it did say. The formats and
where each was seen are listed in tests/unit/fixtures/nccl_logs/SOURCES.md. Pure: no torch, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["NcclInit", "parse_log", "parse_process", "merge", "transport_kind", "parse_interfaces"]

_PREFIX = re.compile(r"(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:\S+:\d+ )?"
                     r"NCCL (?P<level>INFO|WARN|TRACE|ERROR) (?P<msg>.*?)\s*$")
_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version\s*:?\s*(?P<version>\d+\.\d+\.\d+)(?P<build>\S*)")
_INTERFACE = re.compile(r"(?:\[\d+\])?(?P<name>[^\s:\[\];]+):(?P<addr>[^\s<]+)<\d+>")
_CHANNEL = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[[0-9a-fA-F]+\])? -> \d+(?:\[[0-9a-fA-F]+\])?"
                      r"(?: \[(?:send|receive)\])? via (?P<via>.+?)(?: comm 0x[0-9a-fA-F]+ nRanks \d+)?$")
_NET_VIA = re.compile(r"^NET/(?P<name>[^/]+)/(?P<dev>\d+)(?:\(\d+\))?(?P<rest>(?:/\S+)*)$")
_IB_DEVICE = re.compile(r"\[\d+\](?P<dev>[^\s\[;]+)")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (?P<prov>[^\s,]+)(?:, fabric is (?P<fabric>\S+))?"
                           r"(?: \(found (?P<nics>\d+) nics?\))?")
_OFI_PLUGIN = re.compile(r"^NET/OFI (?:Using|Initializing) (?P<plugin>aws-ofi-[rn]ccl\S*(?: \S+)?)$")
_ENV_ECHO = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set (?:by environment )?to (?P<value>.*?)\.?$")
_NNODES = re.compile(r"\bnNodes (?P<n>\d+)\b")

NO_INTERFACE = "no socket interface found"
NO_IB_DEVICE = "no InfiniBand device found"
NO_IBVERBS = "libibverbs not found"
NO_OFI_PROVIDER = "no libfabric provider found"
NET_NOT_FOUND = "requested network not found"
PLUGIN_INIT_FAILED = "net plugin initialisation failed"


@dataclass
class NcclInit:
    """What one process's NCCL/RCCL said about its network while starting up (fields None: it did not say)."""

    host: str | None = None
    pid: int | None = None
    library: str | None = None
    """'NCCL' or 'RCCL' (from the version line; None where this process did not print one: only rank 0 does)."""
    version: str | None = None
    """'2.21.5' (the build suffix, '+cuda12.4' or '+hip6.0', is in `build`)."""
    build: str | None = None
    plugin: str | None = None
    """The external net plugin that loaded: 'aws-ofi-rccl 1.4.0', 'AWS Libfabric (v6)', a plugin path."""
    plugin_missing: str | None = None
    """Why no external plugin loaded (dlerror's text, or 'libnccl-net.so not found'); NCCL then uses its own IB/Socket."""
    network: str | None = None
    """The network NCCL chose, by its name: 'IB', 'Socket', 'AWS Libfabric', 'IBext_v8', 'OFI', ..."""
    ofi_provider: str | None = None
    ofi_fabric: str | None = None
    ofi_nics: int | None = None
    ib_devices: list[str] = field(default_factory=list)
    """'mlx5_0:1/IB', 'mlx5_4:1/RoCE', ... as NET/IB listed them."""
    ib_oob: str | None = None
    """The interface NET/IB uses out of band, 'ib0:10.1.1.1'."""
    socket_interfaces: list[str] = field(default_factory=list)
    """'eth0:10.0.0.5', ... as NET/Socket listed them (only when the socket transport was set up)."""
    bootstrap: list[str] = field(default_factory=list)
    """The interface(s) of the bootstrap ring, 'eth0:10.0.0.5'."""
    settings: dict[str, str] = field(default_factory=dict)
    """NCCL_* settings NCCL echoed: {'NCCL_SOCKET_IFNAME': 'hsn0,hsn1', 'NCCL_IB_HCA': 'mlx5_4'}."""
    gdr_disabled: list[str] = field(default_factory=list)
    """HCAs for which NCCL said 'GPU Direct RDMA Disabled'."""
    net_paths: list[str] = field(default_factory=list)
    """The distinct cross-node channel paths, 'NET/IB/0/GDRDMA', 'NET/Socket/1', 'NET/AWS Libfabric/0/GDRDMA/Shared'."""
    local_paths: list[str] = field(default_factory=list)
    """The distinct within-node channel paths, 'P2P/IPC/read', 'SHM/direct/direct', 'P2P/CUMEM'."""
    nodes: int | None = None
    """nNodes NCCL counted in the communicator (NCCL 2.19 and later)."""
    complete: bool = False
    """'Init COMPLETE' was seen."""
    problems: list[str] = field(default_factory=list)
    """Recognised trouble, as the module's constants: NO_INTERFACE, NO_IB_DEVICE, NO_OFI_PROVIDER, ..."""
    warnings: list[str] = field(default_factory=list)
    """Every NCCL WARN message, in order (without the prefix)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NcclInit:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @property
    def transport(self) -> str | None:
        """'IB', 'OFI', 'Socket' or another network's own name; from the 'Using network' line, else the channel paths."""
        if self.network:
            return transport_kind(self.network)
        names = {m.group("name") for m in map(_NET_VIA.match, self.net_paths) if m}
        return transport_kind(sorted(names)[0]) if len(names) == 1 else None

    @property
    def gdrdma(self) -> bool | None:
        """Whether cross-node channels use GPUDirect RDMA (None: no cross-node channel in the log)."""
        if not self.net_paths:
            return None
        return any("/GDRDMA" in p for p in self.net_paths)

    @property
    def net_devices(self) -> list[int]:
        """The NET device indices the channels use (the NICs in use, where the plugin did not count them)."""
        return sorted({int(m.group("dev")) for p in self.net_paths if (m := _NET_VIA.match(p))})


def transport_kind(network: str) -> str:
    """NCCL's network name -> 'IB' (its own verbs or the IBext plugin), 'OFI' (libfabric plugins), 'Socket', or the name."""
    if network.startswith("IB"):
        return "IB"
    if network in ("AWS Libfabric", "Libfabric", "OFI") or "libfabric" in network.lower():
        return "OFI"
    return network


def parse_interfaces(text: str) -> list[str]:
    """'[0]eth0:10.0.0.5<0> [1]hsn0:10.1.0.5<0>' -> ['eth0:10.0.0.5', 'hsn0:10.1.0.5']."""
    return [f"{m.group('name')}:{m.group('addr')}" for m in _INTERFACE.finditer(text)]


def _add(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)


def _read_plugin(init: NcclInit, msg: str) -> bool:
    """Plugin lines: loaded (OFI's own line, NCCL's 'Loaded net plugin', a plugin path) or not found."""
    if m := _OFI_PLUGIN.match(msg):
        init.plugin = m.group("plugin")
    elif m := re.match(r"^NET/Plugin ?: Loaded net plugin (?P<name>.+)$", msg):
        init.plugin = init.plugin or m.group("name")
    elif m := re.match(r"^Plugin Path : (?P<path>\S+)$", msg):
        init.plugin = init.plugin or m.group("path")
    elif m := re.match(r"^NET/Plugin ?: dlerror=(?P<err>.*?) No plugin found", msg):
        init.plugin_missing = m.group("err").strip()
    elif m := re.match(r"^NET/Plugin ?: Plugin load (?:\((?P<lib>[^)]+)\) )?returned \d+ : (?P<err>.*?)(?: : when loading \S+)?$", msg):
        init.plugin_missing = m.group("err").strip()
    elif m := re.match(r"^NET/Plugin ?: (?:No plugin found \((?P<lib>[^)]+)\)|Could not find: (?P<lib2>\S+))", msg):
        init.plugin_missing = init.plugin_missing or f"{m.group('lib') or m.group('lib2')} not found"
    elif re.match(r"^NET/Plugin ?: No plugin found", msg):
        init.plugin_missing = init.plugin_missing or "no plugin found"
    else:
        return False
    return True


def _read_network(init: NcclInit, msg: str) -> bool:
    """The network chosen and what it runs over: IB devices, socket interfaces, OFI provider."""
    if m := re.match(r"^Using (?:internal )?[Nn]etwork (?P<net>.+)$", msg):
        init.network = m.group("net")
    elif m := re.match(r"^Assigned NET plugin (?P<net>.+) to comm$", msg):
        init.network = init.network or m.group("net")
    elif m := _OFI_PROVIDER.match(msg):
        init.ofi_provider, init.ofi_fabric = m.group("prov"), m.group("fabric")
        init.ofi_nics = int(m.group("nics")) if m.group("nics") else init.ofi_nics
    elif msg.startswith("NET/IB : Using") or msg.startswith("NET/IB: Using"):
        devices, _, oob = msg.partition("OOB ")
        for dev in _IB_DEVICE.finditer(devices):
            _add(init.ib_devices, dev.group("dev"))
        oob_ifs = parse_interfaces(oob)
        init.ib_oob = oob_ifs[0] if oob_ifs else init.ib_oob
    elif msg.startswith("NET/Socket : Using") or msg.startswith("NET/Socket: Using"):
        for iface in parse_interfaces(msg):
            _add(init.socket_interfaces, iface)
    elif re.match(r"^Bootstrap ?: Using", msg):
        for iface in parse_interfaces(msg):
            _add(init.bootstrap, iface)
    elif m := re.match(r"^NET/IB ?: GPU Direct RDMA Disabled for HCA \d+ '(?P<hca>[^']+)'", msg):
        _add(init.gdr_disabled, m.group("hca"))
    else:
        return False
    return True


def _read_channel(init: NcclInit, msg: str) -> bool:
    """A connection line: cross-node (via NET/...) or within the node (P2P, SHM, direct shared memory)."""
    m = _CHANNEL.match(msg)
    if not m:
        return False
    via = m.group("via").strip()
    _add(init.net_paths if via.startswith("NET/") else init.local_paths, via)
    return True


_PROBLEMS = (
    (re.compile(r"no (?:NCCL_SOCKET_IFNAME )?(?:socket )?interface found", re.I), NO_INTERFACE),
    (re.compile(r"^NET/IB ?: No device found"), NO_IB_DEVICE),
    (re.compile(r"Failed to open libibverbs"), NO_IBVERBS),
    (re.compile(r"Couldn't find any optimal provider|No eligible providers", re.I), NO_OFI_PROVIDER),
    (re.compile(r"Error: network .+ not found"), NET_NOT_FOUND),
    (re.compile(r"aws-ofi-[rn]ccl initialization failed|Failed to initialize NET plugin (?!IB$)"), PLUGIN_INIT_FAILED),
)


def _read_problem(init: NcclInit, msg: str) -> None:
    for pattern, problem in _PROBLEMS:
        if pattern.search(msg):
            _add(init.problems, problem)


def _read_message(init: NcclInit, level: str, msg: str) -> None:
    """One prefixed message of this process."""
    if level == "WARN":
        init.warnings.append(msg)
    _read_problem(init, msg)
    if m := _VERSION.match(msg):
        _set_version(init, m)
    elif m := _ENV_ECHO.match(msg):
        init.settings[m.group("name")] = m.group("value")
    elif _read_plugin(init, msg) or _read_network(init, msg) or _read_channel(init, msg):
        pass
    else:
        if m := _NNODES.search(msg):
            init.nodes = int(m.group("n"))
        if "Init COMPLETE" in msg:
            init.complete = True


def _set_version(init: NcclInit, m: re.Match[str]) -> None:
    init.library, init.version, init.build = m.group("lib"), m.group("version"), m.group("build") or None


def parse_log(text: str) -> list[NcclInit]:
    """Every process's NcclInit, in the order the processes first appear in `text` (a file or a pasted log)."""
    found: dict[tuple[str, int], NcclInit] = {}
    current: NcclInit | None = None
    for line in text.splitlines():
        prefixed = _PREFIX.search(line)
        if prefixed:
            key = (prefixed.group("host"), int(prefixed.group("pid")))
            current = found.setdefault(key, NcclInit(host=key[0] or None, pid=key[1]))
            _read_message(current, prefixed.group("level"), prefixed.group("msg"))
        elif version := _VERSION.search(line):
            if current is None:  # a version line before any prefixed one: a process of its own, not yet named
                current = found.setdefault(("", -1), NcclInit())
            _set_version(current, version)
    return list(found.values())


def parse_process(text: str, pid: int | None = None) -> NcclInit:
    """The NcclInit of process `pid` in `text` (a file NCCL_DEBUG_FILE wrote for one process, or a shared one).

    Without `pid`, or when `pid` printed nothing, the processes in the text are merged: a log
    written by one process parses to exactly that process.
    """
    processes = parse_log(text)
    mine = [p for p in processes if pid is not None and p.pid == pid]
    if mine:
        return mine[0]
    merged = NcclInit(pid=pid)
    for p in processes:
        merge(merged, p)
    return merged


def merge(into: NcclInit, other: NcclInit) -> None:
    """Fold `other` into `into`: lists united, settings updated, fields `into` lacks taken from `other`."""
    for name in NcclInit.__dataclass_fields__:
        value = getattr(other, name)
        current = getattr(into, name)
        if name == "warnings":
            current.extend(value)
        elif isinstance(current, list):
            for item in value:
                _add(current, item)
        elif isinstance(current, dict):
            current.update(value)
        elif current in (None, False) and value not in (None, False):
            setattr(into, name, value)
