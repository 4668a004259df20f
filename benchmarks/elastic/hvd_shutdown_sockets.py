"""How many of Horovod's gloo sockets ``hvd.shutdown()`` closes (what
pgc_hvd/runtime/elastic/cascade.py closes itself on leaving a broken world).

    horovodrun --gloo -np 3 -H localhost:3 --network-interface lo \\
        python benchmarks/elastic/hvd_shutdown_sockets.py

Each rank counts its established TCP connections (``/proc/net/tcp``, its own ``/proc/self/fd``
sockets) after ``hvd.init()`` and 200 small allreduces, then after ``hvd.shutdown()``, with the
bytes each has received: the connections that carried the collectives (the most bytes) are the
ones to watch. Prints one line per rank: ``SOCKETS rank=R init=N shutdown=M busiest_open=B``
(``busiest_open``: whether the connection with the most bytes received is still open after
shutdown, i.e. whether a peer blocked on a receive from this rank would be told it left).
Then ``CYCLES`` (default 8) more ``hvd.init()`` / allreduce / ``hvd.shutdown()`` rounds, as an
elastic job's world changes do, print ``FDS rank=R [(after init, after shutdown), ...]``: the
descriptors a shutdown leaves open are released by the next init (the count stays flat), so
repeated world changes do not accumulate sockets.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import horovod.torch as hvd
import torch


def established() -> dict:
    """local port -> bytes received, of this process's established TCP connections (ss -i)."""
    out = subprocess.run(["ss", "-tanpi"], capture_output=True, text=True).stdout.splitlines()
    got = {}
    for i, line in enumerate(out):
        if line.startswith("ESTAB") and f"pid={os.getpid()}," in line:
            m = re.search(r"bytes_received:(\d+)", out[i + 1] if i + 1 < len(out) else "")
            got[line.split()[3]] = int(m.group(1)) if m else 0
    return got


def main() -> int:
    hvd.init()
    for _ in range(200):
        hvd.allreduce(torch.ones(4), name="x")
    at_init = established()
    busiest = max(at_init, key=at_init.get)
    hvd.shutdown()
    time.sleep(0.5)
    after = established()
    rank = os.environ.get("HOROVOD_RANK")
    print(f"SOCKETS rank={rank} init={len(at_init)} "
          f"shutdown={len(after)} busiest_open={busiest in after}", flush=True)
    counts = []
    for k in range(int(os.environ.get("CYCLES", "8"))):
        hvd.init()
        hvd.allreduce(torch.ones(4), name=f"cycle.{k}")
        at = len(os.listdir("/proc/self/fd"))
        hvd.shutdown()
        time.sleep(0.2)
        counts.append((at, len(os.listdir("/proc/self/fd"))))
    print(f"FDS rank={rank} {counts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
