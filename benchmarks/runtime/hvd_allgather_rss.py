"""Does Horovod's allgather itself hold on to memory? (the soak benchmark's residual growth)

    python benchmarks/runtime/hvd_allgather_rss.py [--np 2] [--ops 20000]

Runs ``--ops`` polled ``hvd.allgather_async`` calls under one stable name on ``--np`` gloo ranks,
twice: every call the same size (a control row), then sizes varying across calls and ranks (a
control row alone, or with a 2,242-float payload, as in pgc_hvd's optimistic rounds), and prints
rank 0's VmRSS before and after each.
"""

from __future__ import annotations

import argparse
import sys

from pgc_hvd.apps.local_ranks import print_result, run_ranks
from soak import rss_mb


def worker(args) -> None:
    import horovod.torch as hvd
    import torch

    hvd.init()
    out = {}
    for mode in ("fixed", "varying"):
        xs = [torch.zeros(26), torch.zeros(26 + 2242)]
        before = rss_mb()
        for t in range(args.ops):
            x = xs[0] if mode == "fixed" or t % 3 == 0 else xs[(t + hvd.rank()) % 2]
            h = hvd.allgather_async(x, name=f"rss.{mode}")
            while not hvd.poll(h):
                pass
            hvd.synchronize(h)
        out[mode] = [round(before, 2), round(rss_mb(), 2)]
    if hvd.rank() == 0:
        print_result(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    res = run_ranks(args.np, __file__, ["--ops", args.ops], 1800)
    for mode, (a, b) in res.items():
        print(f"{mode:>8} sizes, {args.ops} allgathers: RSS {a:.2f} -> {b:.2f} MB "
              f"({(b - a) * 1024 * 1024 / args.ops:.0f} bytes per op)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
