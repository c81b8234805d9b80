"""Which interface and address gloo, torch's CPU backend, binds to: torch's own rule, replayed without torch.

gloo leaves no log to read, but its choice is deterministic. torch makes gloo's TCP device in
ProcessGroupGloo (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp; the Python binding in
torch/csrc/distributed/c10d/init.cpp reads the variable):

* ``GLOO_SOCKET_IFNAME`` set: one device per comma-separated interface name, each bound to that
  interface's address (``createDeviceForInterface``); a name that is not an interface fails there.
* otherwise ``createDefaultDevice``: ``gethostname()``, then ``getaddrinfo(hostname)``, and the first
  address a socket can bind to (``doesHostnameResolveToUsableAddress``). When the host name resolves
  to nothing bindable, gloo binds to the loopback address 127.0.0.1 and torch warns once: "Unable to
  resolve hostname to a (local) address. Using the loopback address as fallback. Manually set the
  network interface to bind to with GLOO_SOCKET_IFNAME."

Every peer connects to the address a rank advertises. A rank bound to a loopback address (a host
name that /etc/hosts maps to 127.0.1.1, Debian's and Ubuntu's default, or the fallback above) can be
reached only from its own node: across nodes the other ranks cannot connect, the classic multi-node
hang of gloo groups (and of every gloo side channel that NCCL jobs open too).

No torch here: sockets, an ioctl and /proc only, each behind a parameter so that tests can replace them.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["gloo_endpoint", "interface_addresses", "resolve_host", "can_bind", "is_loopback"]

SIOCGIFADDR = 0x8915
IF_INET6 = Path("/proc/net/if_inet6")


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1 (a scope suffix like %lo is ignored)."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _ipv4_of(name: str) -> str | None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_addresses(path: Path = IF_INET6) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) == 6:
            found.setdefault(parts[5], []).append(str(ipaddress.IPv6Address(int(parts[0], 16))))
    return found


def interface_addresses() -> dict[str, list[str]]:
    """This node's interfaces and their addresses, IPv4 first: {'lo': ['127.0.0.1', '::1'], 'eth0': ['10.0.0.5', ...]}."""
    v6 = _ipv6_addresses()
    found = {}
    for _, name in socket.if_nameindex():
        v4 = _ipv4_of(name)
        found[name] = ([v4] if v4 else []) + v6.get(name, [])
    return found


def resolve_host(hostname: str) -> list[str]:
    """What getaddrinfo(hostname) returns for a stream socket, in its order, duplicates dropped ([] if it fails)."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def can_bind(address: str) -> bool:
    """Whether a TCP socket can bind to `address` here (gloo's test of a usable local address)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def _interface_of(address: str, interfaces: Mapping[str, list[str]]) -> str | None:
    for name, addresses in interfaces.items():
        if address in addresses:
            return name
    if is_loopback(address):
        return next((n for n in interfaces if n == "lo" or n.startswith("lo")), "lo")
    return None


def gloo_endpoint(environ: Mapping[str, str], hostname: str | None = None, *,
                  resolve: Callable[[str], list[str]] = resolve_host, bindable: Callable[[str], bool] = can_bind,
                  interfaces: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """The interface(s) and address(es) gloo binds to in a process with `environ`, by torch's rule (module docstring).

    Returns {'rule': 'GLOO_SOCKET_IFNAME' | 'host name' | 'loopback fallback', 'hostname': ...,
    'resolves_to': [...], 'devices': [{'interface': ..., 'address': ...}], 'loopback': bool}; an
    interface named in GLOO_SOCKET_IFNAME that does not exist has address None.
    """
    hostname = hostname or socket.gethostname()
    interfaces = interface_addresses() if interfaces is None else interfaces
    spec = environ.get("GLOO_SOCKET_IFNAME", "")
    result: dict[str, Any] = {"hostname": hostname, "resolves_to": [], "devices": []}
    if spec:
        result["rule"] = "GLOO_SOCKET_IFNAME"
        for name in [n.strip() for n in spec.split(",") if n.strip()]:
            addresses = interfaces.get(name) or []
            result["devices"].append({"interface": name, "address": addresses[0] if addresses else None})
    else:
        result["resolves_to"] = resolve(hostname)
        usable = next((a for a in result["resolves_to"] if bindable(a)), None)
        result["rule"] = "host name" if usable else "loopback fallback"
        address = usable or "127.0.0.1"
        result["devices"].append({"interface": _interface_of(address, interfaces), "address": address})
    result["loopback"] = any(d["address"] and is_loopback(d["address"]) for d in result["devices"])
    return result
