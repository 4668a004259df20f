"""Runs on every rank (horovodrun, torchrun, launch/run_local.sh, pgc_hvd.apps.local_ranks):
which addresses did this rank's collectives actually use?

    python loopback_checks.py            # every rank prints one "LOOPBACK rank=R ..." line
    python loopback_checks.py --worker   # also "RESULT <json>" on rank 0 (run_ranks)

Each rank joins the world (``pgc_hvd.engine()``: Horovod under horovodrun, the torch engine
under torchrun), runs an allreduce and an allgather (so gloo's connections to every peer are
open), then lists its own TCP connections from ``/proc`` (the socket inodes among its open
files, looked up in ``/proc/self/net/tcp`` and ``tcp6``) and prints the established ones whose
local or remote address is not a loopback address, with the interface the launcher pinned
(``HOROVOD_GLOO_IFACE``, ``GLOO_SOCKET_IFNAME``). It exits non-zero when there is one: tests
and examples that start several ranks on one machine keep their traffic on loopback.
tests/checks.py's ``on_loopback`` is the tests' reading of those lines (tests/multirank/
test_loopback.py, tests/multihost/test_loopback_hosts.py).
"""

from __future__ import annotations

import ipaddress
import os
import sys

import torch

import pgc_hvd
from pgc_hvd.apps.local_ranks import print_result

ESTABLISHED = "01"


def _socket_inodes() -> set:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hexaddr: str) -> str:
    """``/proc/net/tcp{,6}``'s ``HEXIP:HEXPORT`` as an IP address string (port dropped)."""
    ip = hexaddr.split(":")[0]
    raw = bytes.fromhex(ip)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def tcp_connections() -> list:
    """``[(local ip, remote ip), ...]`` of this process's established TCP connections."""
    mine, out = _socket_inodes(), []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == ESTABLISHED and f[9] in mine:
                out.append((_address(f[1]), _address(f[2])))
    return out


def main() -> None:
    hvd = pgc_hvd.engine()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="lo.sum")
    assert total.tolist() == [float(n)] * 3, total
    ranks = hvd.allgather(torch.tensor([r]), name="lo.ranks")
    assert ranks.tolist() == list(range(n)), ranks
    conns = tcp_connections()
    outside = sorted({f"{a}->{b}" for a, b in conns
                      if not (ipaddress.ip_address(a).is_loopback
                              and ipaddress.ip_address(b).is_loopback)})
    pinned = os.environ.get("HOROVOD_GLOO_IFACE") or os.environ.get("GLOO_SOCKET_IFNAME") or "-"
    print(f"LOOPBACK rank={r} n={n} established={len(conns)} pinned={pinned} "
          f"outside={','.join(outside) or '-'}", flush=True)
    if "--worker" in sys.argv and r == 0:
        print_result({"n": n, "established": len(conns), "outside": outside, "pinned": pinned})
    if hasattr(hvd, "shutdown"):
        hvd.shutdown()
    if outside:
        sys.exit(f"rank {r}: connections outside loopback: {outside} (pinned: {pinned})")


if __name__ == "__main__":
    main()
