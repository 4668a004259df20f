"""Runs on every rank under horovodrun -np 2 (the fixture pins gloo to ``lo``): rank 0's control
store listens on the ranks' address only.

    python store_bind_checks.py

1. ``open_store``: rank 0's listening socket for the store's port is bound to 127.0.0.1 (the
   address of ``lo``, the interface gloo uses), not to every interface; a connection to any
   other address of this host on that port is refused; control rounds through it
   (``StoreChannel``) give both ranks the same rows.
2. ``PGC_HVD_STORE_ADDR`` naming an address that is not rank 0's: every rank raises a
   ValueError naming the address, the setting and the fix (no rank waits for a server).

Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import socket

import horovod.torch as hvd
import psutil
import torch

from pgc_hvd.runtime.control_store import StoreChannel, open_store
from checks import ok   # tests/checks.py


def other_addresses() -> list:
    """This host's IPv4 addresses that are not loopback."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


def main():
    hvd.init()
    r = hvd.rank()
    assert os.environ.get("HOROVOD_GLOO_IFACE") == "lo", os.environ.get("HOROVOD_GLOO_IFACE")
    store, connect = open_store(hvd, r, "bind", 30)
    port = hvd.broadcast(torch.tensor([store.port if r == 0 else 0]), 0, name="port").item()
    if r == 0:
        mine = [c for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        bound = sorted({c.laddr.ip for c in mine})
        assert bound == ["127.0.0.1"], f"the store listens on {bound}, not only on 127.0.0.1"
        for addr in other_addresses():
            with socket.socket() as s:
                s.settimeout(5)
                err = s.connect_ex((addr, port))
            assert err != 0, f"a connection to {addr}:{port} was accepted"
        print(f"STORE listens on {bound} port {port}; refused from {other_addresses()}",
              flush=True)
    chan = StoreChannel(store, r, 2, "bind", 30)
    for k in range(3):
        rows, _ = chan.exchange(torch.tensor([float(r), float(k)], dtype=torch.float64))
        assert rows == [[0.0, float(k)], [1.0, float(k)]], rows
    chan.close()
    ok("listens_on_the_ranks_address")

    os.environ["PGC_HVD_STORE_ADDR"] = "203.0.113.7"    # TEST-NET-3: not an address of this host
    try:
        open_store(hvd, r, "elsewhere", 30)
    except ValueError as err:
        msg = str(err)
        assert f"rank {r}: control store of 'elsewhere': rank 0 cannot listen on 203.0.113.7 " \
               f"(PGC_HVD_STORE_ADDR=203.0.113.7)" in msg, msg
        assert "Set PGC_HVD_STORE_ADDR to an address of rank 0's host" in msg, msg
    else:
        raise AssertionError("open_store served on an address that is not rank 0's")
    ok("unbindable_address_named")
    print(f"ALL OK rank={r}", flush=True)


if __name__ == "__main__":
    main()
