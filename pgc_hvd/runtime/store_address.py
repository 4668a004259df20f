"""Where rank 0's control store listens: the one address the ranks use, not every interface.

``torch.distributed.TCPStore`` binds its server to every interface (``*:port``) whatever host
name it is given, and it has no authentication: anyone who can reach the port can read and
write keys. pgc_hvd's control store (``control="store"`` and ``"log"``,
:mod:`pgc_hvd.runtime.control_store`) therefore opens the listening socket itself, bound to one
address, and hands it to the TCPStore (``master_listen_fd``). The address, on rank 0, is the
first of:

1. ``PGC_HVD_STORE_ADDR`` (a host name or an IPv4 address of rank 0's host; the user's choice);
2. the interface the job's gloo traffic is pinned to: ``HOROVOD_GLOO_IFACE`` (horovodrun sets it
   to the interface it found common to all hosts, ``lo`` when they are all this machine, or
   the one ``--network-interface`` names), else ``GLOO_SOCKET_IFNAME`` (torch's) -- its IPv4
   address;
3. ``MASTER_ADDR`` (torchrun and other torch launchers: the address every rank already uses to
   reach rank 0's host; ``localhost`` under ``torchrun --standalone``);
4. the address rank 0's host name resolves to.

Every rank connects to that address (it is broadcast with the port). A rank on another host
that is handed a loopback address is stopped with the fix instead of waiting for a connection
that cannot come.

Owns the choice of the store's address (:func:`bind_address`), its listening socket
(:func:`listen`) and the check that a rank can reach it (:func:`check_reachable`); no state.
Thread: the training thread, at the control store's set-up (the agent's construction).
May import: the standard library only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

SIOCGIFADDR = 0x8915   # Linux: an interface's IPv4 address


def interface_ipv4(name: str) -> str:
    """The IPv4 address of network interface ``name`` (``lo`` -> ``127.0.0.1``); ValueError
    naming the interface when it has none or does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as err:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise ValueError(f"network interface {name!r} has no IPv4 address ({err.strerror}); "
                             f"this host's interfaces: {known}") from None
    return socket.inet_ntoa(packed[20:24])


def _resolve(host: str, what: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as err:
        raise ValueError(f"{what}: host name {host!r} does not resolve to an IPv4 address "
                         f"({err})") from None


def bind_address(env=None) -> tuple[str, str]:
    """``(IPv4 address, why)`` rank 0's store binds to and the ranks connect to (module doc)."""
    env = os.environ if env is None else env
    if env.get("PGC_HVD_STORE_ADDR"):
        v = env["PGC_HVD_STORE_ADDR"]
        return _resolve(v, "PGC_HVD_STORE_ADDR"), f"PGC_HVD_STORE_ADDR={v}"
    for var in ("HOROVOD_GLOO_IFACE", "GLOO_SOCKET_IFNAME"):
        if env.get(var):
            iface = env[var].split(",")[0].strip()
            try:
                return interface_ipv4(iface), f"{var}={env[var]}, the interface gloo uses"
            except ValueError as err:
                raise ValueError(f"{var}: {err}; set PGC_HVD_STORE_ADDR to the address of rank "
                                 f"0's host that every rank reaches") from None
    if env.get("MASTER_ADDR"):
        v = env["MASTER_ADDR"]
        return _resolve(v, "MASTER_ADDR"), f"MASTER_ADDR={v}"
    host = socket.gethostname()
    return _resolve(host, "rank 0's host name"), f"rank 0's host name {host}"


def listen(address: str, why: str) -> tuple[int, int]:
    """A TCP socket listening on ``address`` (a free port): ``(fd, port)``; the caller owns the
    fd (TCPStore's ``master_listen_fd`` takes it over). ValueError naming the address and the
    fix when this host cannot bind it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
        sock.listen(1024)
    except OSError as err:
        sock.close()
        raise ValueError(f"rank 0 cannot listen on {address} ({why}): {err.strerror}; it is not "
                         f"an address of rank 0's host. Set PGC_HVD_STORE_ADDR to an address of "
                         f"rank 0's host that every rank reaches") from None
    port = sock.getsockname()[1]
    return sock.detach(), port


def check_reachable(address: str, server_host: str) -> None:
    """ValueError when a rank on another host than rank 0 (``server_host``) is handed a loopback
    ``address``: it could never connect."""
    if ipaddress.ip_address(address).is_loopback and server_host != socket.gethostname():
        raise ValueError(f"rank 0's control store listens on {address}, a loopback address, but "
                         f"this rank runs on {socket.gethostname()}, not on rank 0's host "
                         f"{server_host}: set PGC_HVD_STORE_ADDR (or pin gloo with "
                         f"--network-interface / GLOO_SOCKET_IFNAME) to the network the hosts "
                         f"share")
