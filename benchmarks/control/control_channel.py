"""Control channel: Horovod allgather of control rows against a TCPStore key-value exchange.

    python benchmarks/control/control_channel.py [--np 2,4] [--rounds 300] [--row 12]

DESIGN.md asks to measure both ways of agreeing, every control round, on which ranks are ready:
a tiny collective (what ``pgc_hvd.runtime.agent`` does: one ``hvd.allgather`` of one float64
control row per rank) and an event-driven key-value store (the runtime's ``control="store"``
channel, :class:`pgc_hvd.runtime.control_store.StoreChannel`: a TCPStore hosted by rank 0, each
rank ``set``s its row under the round's key and ``multi_get``s every rank's row, waiting for the
keys that are missing). A round is over on a rank when it holds all n rows.

Launches ``horovodrun --gloo`` once per ``--np`` on this machine and prints, from that one
invocation, per channel the median and 90th percentile of one round (rank 0, after 20 warm-up
rounds), and the ratio TCPStore / allgather. Also timed: the agent's way of issuing the
allgather (``allgather_async`` polled by ``pgc_hvd.runtime.communicator.wait_for_handle``). All
ranks run the rounds back to back, so this is the latency of one round, not a straggler test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks


def _summary(samples: list[float]) -> dict:
    xs = sorted(samples)
    return {"median_ms": 1e3 * statistics.median(xs), "p90_ms": 1e3 * xs[int(0.9 * (len(xs) - 1))]}


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    import horovod.torch as hvd
    import torch

    from pgc_hvd.runtime.communicator import wait_for_handle
    from pgc_hvd.runtime.control_store import StoreChannel

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    row = torch.full((1, args.row), float(rank), dtype=torch.float64)
    warm, rounds = 20, args.rounds

    def barrier(tag):
        hvd.allreduce(torch.zeros(1), name=f"barrier.{tag}")

    def timed(fn) -> list[float]:
        out = []
        for t in range(warm + rounds):
            t0 = time.perf_counter()
            fn(t)
            if t >= warm:
                out.append(time.perf_counter() - t0)
        return out

    # 1. synchronous allgather
    barrier("a")
    sync = timed(lambda t: hvd.allgather(row, name="ctl.sync"))

    # 2. the agent's way: allgather_async, polled by the agent's own wait_for_handle
    def polled(t):
        h = hvd.allgather_async(row, name="ctl.poll")
        assert wait_for_handle(hvd, h, 60.0)
        hvd.synchronize(h)

    barrier("b")
    poll = timed(polled)

    # 3. the runtime's TCPStore channel (control="store"), rounds exactly as the agent runs them
    channel = StoreChannel.create(hvd, rank, n, "bench", 60.0)
    flat = row.view(-1)

    def kv(t):
        got = channel.exchange(flat)
        assert len(got) == n and all(len(g) == args.row for g in got)

    barrier("c")
    kv_times = timed(kv)
    channel.close()
    barrier("d")
    if rank == 0:
        res = {"np": n, "rounds": rounds, "row_floats": args.row,
               "allgather": _summary(sync), "allgather_polled": _summary(poll),
               "tcpstore": _summary(kv_times)}
        print_result(res)


# ----------------------------------------------------------------------------- driver
def launch(np_: int, args) -> dict:
    return run_ranks(np_, __file__, ["--rounds", args.rounds, "--row", args.row], args.timeout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,4", help="comma-separated numbers of ranks (default 2,4)")
    p.add_argument("--rounds", type=int, default=300, help="timed rounds per channel")
    p.add_argument("--row", type=int, default=12, help="float64 fields per control row")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = [launch(int(k), args) for k in args.np.split(",") if k.strip()]
    print("| np | allgather median / p90 (ms) | agent's polled allgather (ms) | store channel "
          "round (ms) | store / allgather (median) |")
    print("|---|---|---|---|---|")
    for r in rows:
        a, q, k = r["allgather"], r["allgather_polled"], r["tcpstore"]
        print(f"| {r['np']} | {a['median_ms']:.2f} / {a['p90_ms']:.2f} | {q['median_ms']:.2f} / "
              f"{q['p90_ms']:.2f} | {k['median_ms']:.2f} / {k['p90_ms']:.2f} | "
              f"{k['median_ms'] / a['median_ms']:.2f}x |")
    print(f"\n{args.rounds} rounds per channel after 20 warm-up rounds, rank 0, "
          f"{args.row} float64 fields per row, `horovodrun --gloo` on this machine")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
