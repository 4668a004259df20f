"""The sum allreduce of the agents' data groups against gloo's ``all_reduce``, on the CPU: the
time of one in-place sum of d float32 words over the ranks, each size interleaved call by call.

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 \\
        benchmarks/doors/allreduce_cost.py [--sizes 16,61706,1048576,11689512] [--calls 60]

``gloo``: torch's ``dist.all_reduce`` (what DDP's reducer calls; pgc_hvd's ``train`` group);
``direct``: an agent's data group (:mod:`pgc_hvd.torchdist.direct_sum`, a reduce-scatter and
an allgather by direct point-to-point exchanges; gloo's allreduce where it does not apply).
Prints rank 0's median ms per call of each, the ratio, and the words each rank sends per call
(both 2 (n - 1)/n d: the ring's).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,61706,1048576,11689512")
    p.add_argument("--calls", type=int, default=60)
    args = p.parse_args(argv)
    import pgc_hvd.torch as hvd
    from pgc_hvd import torchdist

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    data = torchdist.agent_ops("allreduce_cost", timeout=120).data
    if r == 0:
        print(f"{n} ranks; median ms per in-place sum of d float32 words, calls interleaved\n")
        print("| d | gloo all_reduce ms | direct ms | direct / gloo | words sent per rank |")
        print("|---|---|---|---|---|")
    for d in (int(x) for x in args.sizes.split(",")):
        calls = args.calls if d < 2_000_000 else max(6, args.calls // 6)
        x = torch.ones(d)
        times = {"gloo": [], "direct": []}
        for i in range(calls + 2):
            for how in times:
                t = time.perf_counter()
                if how == "gloo":
                    hvd.allreduce_(x, op=hvd.Sum, name="gloo")
                else:
                    data.synchronize(data.allreduce_async_(x, op=data.Sum))
                if i >= 2:
                    times[how].append(time.perf_counter() - t)
                x.fill_(1.0)
        if r == 0:
            g, h = (1000 * statistics.median(times[k]) for k in ("gloo", "direct"))
            print(f"| {d:,} | {g:.2f} | {h:.2f} | {h / g:.2f} | {2 * (n - 1) * d // n:,} |",
                  flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
